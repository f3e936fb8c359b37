//! Programs compiled on worker threads. Fused eager mode records an op without running it, so
//! the op's program need not be ready yet: the programs of a graph's new ops compile side by
//! side on the machine's cores while the caller records on, and the graph's run waits for
//! each program as it reaches it. Programs compiled ahead of need (fused graphs' programs,
//! the exact programs of shapes that bucketed programs served often: dispatch/lookup.rs' promotion)
//! compile here too, after the needed ones and never on every worker at once, so a needed
//! program does not queue behind them. A program waited for before any worker took it
//! compiles on the waiting thread.
use crate::error::Error;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl Program {
    pub fn compiled(exe: Exe) -> Arc<Program> {
        Arc::new(Program { done: OnceLock::from(Ok(exe)), compile: Mutex::new(None) })
    }

    /// The executable, once its compile is done (compiling it here if no worker has taken it
    /// yet, else waiting for it).
    pub fn get(&self) -> Result<&Exe, Error> {
        if self.done.get().is_none() {
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
        NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
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
    let program = Arc::new(Program { done: OnceLock::new(), compile: Mutex::new(Some(Box::new(compile))) });
    let mut q = queue();
    if q.closed {
        return program;
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
            return program;
        }
    }
    drop(q);
    NEW_JOB.notify_all();
    program
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

pub fn reset_seconds() {
    NANOS.store(0, Ordering::Relaxed);
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
