//! Programs compiled on worker threads. Fused eager mode records an op without running it, so
//! the op's program need not be ready yet: the programs of a graph's new ops compile side by
//! side on the machine's cores while the caller records on (or, with new graphs fused at their
//! first run, from when the graph runs op by op), and the graph's run waits for each program
//! as it reaches it. Programs compiled ahead of need (fused graphs' programs,
//! the exact programs of shapes that bucketed programs served often: dispatch/lookup.rs' promotion)
//! compile here too, after the needed ones and never on every worker at once, so a needed
//! program does not queue behind them. A program waited for before any worker took it
//! compiles on the waiting thread. A program compiled at the quick tier to be ready soon, where
//! its size asks for full optimization, tiers up: its full-tier build compiles here after a few
//! runs and takes over at a fixed run (`TierUp`).
use crate::error::Error;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

pub type Exe = Arc<pjrt::LoadedExecutable>;

type Compile = Box<dyn FnOnce() -> Result<Exe, String> + Send>;

/// How soon a program is needed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// A recorded call will run it.
    Needed,
    /// It may take over from other programs later.
    Ahead,
}

/// A program: compiled, or being compiled (then the compile's error, if it fails).
pub struct Program {
    done: OnceLock<Result<Exe, String>>,
    /// The compile, until a worker or a waiting thread takes it.
    compile: Mutex<Option<Compile>>,
    /// Nanoseconds its compile (or load from the persistent cache) took, once done.
    nanos: AtomicU64,
    /// Whether its compile was asked for (queued, or run by a waiting thread); a deferred
    /// program's is not until then.
    requested: AtomicBool,
    /// Its full-tier build, where it compiled at the quick tier first (`tier_up_to`).
    tier_up: OnceLock<TierUp>,
}

/// A quick-tier program's way to its full-tier one: the build runs on a worker thread from its
/// TIER_UP_AFTER-th run, and takes over at run TIER_UP_AFTER + TIER_UP_RUNS + 1 (waited for
/// there if not done). A fixed run, as bucketed programs' promotions: the tiers may round
/// differently in the last place, and a script run twice must give the same numbers.
struct TierUp {
    full: Mutex<Option<Compile>>,
    runs: AtomicU64,
    program: OnceLock<Arc<Program>>,
}

/// Runs of a quick-tier program before its full-tier build starts, and runs after that before
/// the build takes over. Most programs of a test or a first call never get there; a loop's
/// programs do within its first steps.
pub const TIER_UP_AFTER: u64 = 8;
pub const TIER_UP_RUNS: u64 = 16;

/// Whether a tier-up's full-tier program runs the `run`-th run.
fn taken_over(run: u64) -> bool {
    run > TIER_UP_AFTER + TIER_UP_RUNS
}

impl Program {
    /// A program compiled here, on the caller's thread, by `compile`.
    pub fn compile_here<E>(compile: impl FnOnce() -> Result<Exe, E>) -> Result<Arc<Program>, E> {
        let t0 = std::time::Instant::now();
        let exe = compile()?;
        let nanos = AtomicU64::new(t0.elapsed().as_nanos() as u64);
        Ok(Arc::new(Program { done: OnceLock::from(Ok(exe)), compile: Mutex::new(None), nanos, requested: AtomicBool::new(true), tier_up: OnceLock::new() }))
    }

    /// Makes this quick-tier program tier up to the program `full` compiles.
    pub fn tier_up_to(&self, full: impl FnOnce() -> Result<Exe, String> + Send + 'static) {
        let _ = self.tier_up.set(TierUp { full: Mutex::new(Some(Box::new(full))), runs: AtomicU64::new(0), program: OnceLock::new() });
    }

    /// Where it tiers up: whether its full-tier program runs it now.
    pub fn tiered_up(&self) -> Option<bool> {
        let t = self.tier_up.get()?;
        Some(taken_over(t.runs.load(Ordering::Relaxed)) && matches!(t.program.get().and_then(|p| p.finished()), Some(Ok(_))))
    }

    /// The executable for a run: `get`'s, or once a tier-up takes over, the full tier's (the
    /// quick one's still if that build failed).
    pub fn for_run(&self) -> Result<&Exe, Error> {
        if let Some(t) = self.tier_up.get() {
            let run = t.runs.fetch_add(1, Ordering::Relaxed) + 1;
            if run == TIER_UP_AFTER {
                if let Some(full) = t.full.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    TIER_UPS.fetch_add(1, Ordering::Relaxed);
                    let program = new_program(full, true);
                    enqueue(program.clone(), Urgency::Ahead);
                    let _ = t.program.set(program);
                }
            }
            if taken_over(run) {
                if let Some(Ok(exe)) = t.program.get().map(|p| p.get()) {
                    return Ok(exe);
                }
            }
        }
        self.get()
    }

    /// Whether nothing has asked for its compile yet (`deferred`).
    pub fn deferred(&self) -> bool {
        !self.requested.load(Ordering::Relaxed)
    }

    /// Queues a deferred program's compile for a worker thread (nothing if it was asked for).
    pub fn request(self: &Arc<Self>) {
        // A load first: every op-by-op run asks, and nearly every program was asked for.
        if self.deferred() && !self.requested.swap(true, Ordering::Relaxed) {
            enqueue(self.clone(), Urgency::Needed);
        }
    }

    /// Seconds its compile took; None while it compiles or when it failed.
    pub fn compile_seconds(&self) -> Option<f64> {
        matches!(self.done.get(), Some(Ok(_))).then(|| self.nanos.load(Ordering::Relaxed) as f64 * 1e-9)
    }

    /// The executable, once its compile is done (compiling it here if no worker has taken it
    /// yet, else waiting for it).
    pub fn get(&self) -> Result<&Exe, Error> {
        if self.done.get().is_none() {
            self.requested.store(true, Ordering::Relaxed);
            if pjrt::forked() {
                // Its compile belongs to the parent process, whose client this child cannot use.
                return Err(Error::runtime("torchtpu: a program compiling when the process forked is not available in the child".to_string()));
            }
            self.run();
        }
        self.done.wait().as_ref().map_err(|e| Error::runtime(e.clone()))
    }

    /// None while it compiles.
    pub fn finished(&self) -> Option<&Result<Exe, String>> {
        self.done.get()
    }

    /// Runs the compile, if no other thread has taken it.
    fn run(&self) {
        let Some(compile) = self.compile.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        queue().running += 1;
        let t0 = std::time::Instant::now();
        let result = catch_unwind(AssertUnwindSafe(compile)).unwrap_or_else(|_| Err("torchtpu: compiling a program panicked".to_string()));
        let nanos = t0.elapsed().as_nanos() as u64;
        NANOS.fetch_add(nanos, Ordering::Relaxed);
        self.nanos.store(nanos, Ordering::Relaxed);
        let _ = self.done.set(result);
        queue().running -= 1;
        JOB_DONE.notify_all();
    }
}

struct Queue {
    needed: VecDeque<Arc<Program>>,
    ahead: VecDeque<Arc<Program>>,
    /// Compiles running (on workers or waiting threads), workers busy, workers busy with a
    /// program compiled ahead, and worker threads started.
    running: usize,
    busy: usize,
    busy_ahead: usize,
    workers: usize,
    /// Set at interpreter exit (`close`).
    closed: bool,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { needed: VecDeque::new(), ahead: VecDeque::new(), running: 0, busy: 0, busy_ahead: 0, workers: 0, closed: false });
/// Signals work for the workers (a new program, a worker free for one compiled ahead).
static NEW_JOB: Condvar = Condvar::new();
/// Signals a finished compile (to `wait_all`).
static JOB_DONE: Condvar = Condvar::new();
/// Seconds spent in compiles here (counted in compile_stats' compile_seconds).
static NANOS: AtomicU64 = AtomicU64::new(0);
/// Full-tier builds of quick-tier programs started (compile_stats' tier_ups).
static TIER_UPS: AtomicU64 = AtomicU64::new(0);

fn queue() -> std::sync::MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Worker threads at most (TORCHTPU_COMPILE_THREADS; default: the machine's cores, up to 16).
fn max_workers() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
        std::env::var("TORCHTPU_COMPILE_THREADS").ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n > 0).unwrap_or(cores)
    })
}

/// Workers that may compile programs ahead of need at once: all but one, so one stays free
/// for a needed program.
fn max_ahead() -> usize {
    max_workers().saturating_sub(1).max(1)
}

/// Queues `compile` for a worker thread; the returned program is filled when it finishes.
/// Once the pool is closed (`close`), nothing is queued: a program compiles on the thread
/// that waits for it, or never.
pub fn submit(urgency: Urgency, compile: impl FnOnce() -> Result<Exe, String> + Send + 'static) -> Arc<Program> {
    let program = new_program(compile, true);
    enqueue(program.clone(), urgency);
    program
}

/// A program whose compile waits until a graph's run asks for it (`Program::request`) or a
/// thread waits for it: fused eager mode may compile a new graph as one program instead of
/// its ops' programs (fused.rs).
pub fn deferred(compile: impl FnOnce() -> Result<Exe, String> + Send + 'static) -> Arc<Program> {
    new_program(compile, false)
}

fn new_program(compile: impl FnOnce() -> Result<Exe, String> + Send + 'static, requested: bool) -> Arc<Program> {
    Arc::new(Program { done: OnceLock::new(), compile: Mutex::new(Some(Box::new(compile))), nanos: AtomicU64::new(0), requested: AtomicBool::new(requested), tier_up: OnceLock::new() })
}

fn enqueue(program: Arc<Program>, urgency: Urgency) {
    let mut q = queue();
    if q.closed {
        return;
    }
    match urgency {
        Urgency::Needed => q.needed.push_back(program.clone()),
        Urgency::Ahead => q.ahead.push_back(program.clone()),
    }
    if q.workers - q.busy < q.needed.len() + q.ahead.len() && q.workers < max_workers() {
        let started = std::thread::Builder::new().name("torchtpu-compile".into()).spawn(work).is_ok();
        q.workers += started as usize;
        if q.workers == 0 {
            // No thread could start: compile here.
            drop(q);
            program.run();
            return;
        }
    }
    drop(q);
    NEW_JOB.notify_all();
}

fn work() {
    let mut q = queue();
    loop {
        let ahead_allowed = q.busy_ahead < max_ahead();
        let next = match q.needed.pop_front() {
            Some(p) => Some((p, false)),
            None if ahead_allowed => q.ahead.pop_front().map(|p| (p, true)),
            None => None,
        };
        let Some((program, ahead)) = next else {
            q = NEW_JOB.wait(q).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        q.busy += 1;
        q.busy_ahead += ahead as usize;
        drop(q);
        program.run();
        q = queue();
        q.busy -= 1;
        q.busy_ahead -= ahead as usize;
        JOB_DONE.notify_all();
        if ahead {
            // A worker waiting for its turn at a program compiled ahead may take one now.
            NEW_JOB.notify_all();
        }
    }
}

/// Waits until every submitted compile has finished (statistics, interpreter exit). A forked
/// child has none to wait for: the workers stayed in the parent.
pub fn wait_all() {
    if pjrt::forked() {
        return;
    }
    let mut q = queue();
    loop {
        // A queued program counts until it is compiled, by a worker or by a waiting thread.
        // A worker counts as busy from taking a program off the queue, before its compile
        // starts running.
        let pending = q.needed.iter().chain(&q.ahead).any(|p| p.done.get().is_none());
        if !pending && q.running == 0 && q.busy == 0 {
            return;
        }
        q = JOB_DONE.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

/// Waits for every submitted compile, then queues no more (interpreter exit: a compile on a
/// worker thread would run on into the process's teardown, under XLA's and LLVM's static
/// destructors, and crash it).
pub fn close() {
    queue().closed = true;
    wait_all();
}

/// Seconds spent compiling here.
pub fn seconds() -> f64 {
    NANOS.load(Ordering::Relaxed) as f64 * 1e-9
}

/// Tier-ups started (`Program::for_run`).
pub fn tier_ups() -> u64 {
    TIER_UPS.load(Ordering::Relaxed)
}

/// Starts the seconds and the tier-ups over from zero.
pub fn reset_counts() {
    NANOS.store(0, Ordering::Relaxed);
    TIER_UPS.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_and_panicking_compiles_report_errors() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let failed = submit(Urgency::Needed, || Err("no such op".to_string()));
        let panicked = submit(Urgency::Ahead, || panic!("boom"));
        wait_all();
        assert!(matches!(failed.finished(), Some(Err(m)) if m == "no such op"));
        assert!(matches!(panicked.finished(), Some(Err(m)) if m.contains("panicked")));
    }

    /// The tests share the pool: one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// Submits `n` compiles that each hold a worker until `release` is dropped; `started`
    /// counts those a worker took.
    fn hold_workers(n: usize, urgency: Urgency) -> (std::sync::mpsc::Sender<()>, Arc<AtomicU64>) {
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let started = Arc::new(AtomicU64::new(0));
        for _ in 0..n {
            let (gate, started) = (gate.clone(), started.clone());
            submit(urgency, move || {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = gate.lock().unwrap_or_else(|e| e.into_inner()).recv();
                Err("released".to_string())
            });
        }
        (release, started)
    }

    #[test]
    fn a_program_no_worker_took_compiles_on_the_thread_that_waits_for_it() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (release, _) = hold_workers(max_workers(), Urgency::Needed);
        let here = std::thread::current().id();
        let program = submit(Urgency::Needed, move || Err(format!("{:?}", std::thread::current().id())));
        let ran_on = program.get().err().map(|e| e.to_string()).unwrap_or_default();
        drop(release);
        wait_all();
        assert_eq!(ran_on, format!("{here:?}"));
    }

    #[test]
    fn wait_all_returns_only_after_every_submitted_compile() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // A worker that finished one program and took the next from the queue has not
        // started it yet: wait_all must count it (it returned there, and a compile ran into
        // the process's exit).
        for _ in 0..200 {
            let programs: Vec<_> = (0..4)
                .map(|_| submit(Urgency::Ahead, || {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    Err("done".to_string())
                }))
                .collect();
            wait_all();
            assert!(programs.iter().all(|p| p.finished().is_some()), "wait_all returned before a compile finished");
        }
    }

    #[test]
    fn programs_compiled_ahead_leave_a_worker_for_needed_ones() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        if max_workers() < 2 {
            return;
        }
        let (release, started) = hold_workers(max_workers(), Urgency::Ahead);
        let wait = |done: &dyn Fn() -> bool| {
            let t0 = std::time::Instant::now();
            while !done() && t0.elapsed().as_secs() < 20 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        wait(&|| started.load(Ordering::SeqCst) >= max_ahead() as u64);
        // Time for a worker past the limit to take one (it must not).
        std::thread::sleep(std::time::Duration::from_millis(100));
        let program = submit(Urgency::Needed, || Err("needed".to_string()));
        wait(&|| program.finished().is_some());
        let finished = program.finished().is_some();
        drop(release);
        wait_all();
        assert!(finished, "a needed program waited behind programs compiled ahead");
    }
}
