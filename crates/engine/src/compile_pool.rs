//! Programs compiled on worker threads. Fused eager mode records an op without running it, so
//! the op's program need not be ready yet: the programs of a graph's new ops compile side by
//! side on the machine's cores while the caller records on, and the graph's run waits for
//! each program as it reaches it. Fused graphs' own programs compile here too, and so do the
//! exact programs of shapes that bucketed programs served often (dispatch.rs: promotion).
use crate::error::Error;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

pub type Exe = Arc<pjrt::LoadedExecutable>;

/// A program: compiled, or being compiled (then the compile's error, if it fails).
pub struct Program {
    done: OnceLock<Result<Exe, String>>,
}

impl Program {
    pub fn compiled(exe: Exe) -> Arc<Program> {
        Arc::new(Program { done: OnceLock::from(Ok(exe)) })
    }

    /// The executable, once its compile is done (waiting for it).
    pub fn get(&self) -> Result<&Exe, Error> {
        if self.done.get().is_none() && pjrt::forked() {
            // Its compile thread stayed in the parent process.
            return Err(Error::runtime("torchtpu: a program compiling when the process forked is not available in the child".to_string()));
        }
        self.done.wait().as_ref().map_err(|e| Error::runtime(e.clone()))
    }

    /// None while it compiles.
    pub fn finished(&self) -> Option<&Result<Exe, String>> {
        self.done.get()
    }
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs being run, and worker threads started.
    running: usize,
    workers: usize,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { jobs: VecDeque::new(), running: 0, workers: 0 });
/// Signals a new job (to workers) and a finished one (to `wait_all`).
static NEW_JOB: Condvar = Condvar::new();
static JOB_DONE: Condvar = Condvar::new();
/// Seconds spent in background compiles (counted in compile_stats' compile_seconds).
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

/// Runs `compile` on a worker thread; the returned program is filled when it finishes.
pub fn submit(compile: impl FnOnce() -> Result<Exe, String> + Send + 'static) -> Arc<Program> {
    let program = Arc::new(Program { done: OnceLock::new() });
    let slot = program.clone();
    let job: Job = Box::new(move || {
        let t0 = std::time::Instant::now();
        let result = catch_unwind(AssertUnwindSafe(compile)).unwrap_or_else(|_| Err("torchtpu: compiling a program panicked".to_string()));
        NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let _ = slot.done.set(result);
    });
    let mut q = queue();
    q.jobs.push_back(job);
    let idle = q.workers - q.running;
    if idle < q.jobs.len() && q.workers < max_workers() {
        let started = std::thread::Builder::new().name("torchtpu-compile".into()).spawn(work).is_ok();
        q.workers += started as usize;
        if q.workers == 0 {
            // No thread could start: compile here.
            let job = q.jobs.pop_back().expect("the job just queued");
            drop(q);
            job();
            return program;
        }
    }
    NEW_JOB.notify_one();
    program
}

fn work() {
    let mut q = queue();
    loop {
        match q.jobs.pop_front() {
            Some(job) => {
                q.running += 1;
                drop(q);
                job();
                q = queue();
                q.running -= 1;
                JOB_DONE.notify_all();
            }
            None => q = NEW_JOB.wait(q).unwrap_or_else(|e| e.into_inner()),
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
    while !q.jobs.is_empty() || q.running > 0 {
        q = JOB_DONE.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

/// Seconds the workers have spent compiling.
pub fn seconds() -> f64 {
    NANOS.load(Ordering::Relaxed) as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_and_panicking_compiles_report_errors() {
        let failed = submit(|| Err("no such op".to_string()));
        let panicked = submit(|| panic!("boom"));
        wait_all();
        assert!(matches!(failed.finished(), Some(Err(m)) if m == "no such op"));
        assert!(matches!(panicked.finished(), Some(Err(m)) if m.contains("panicked")));
    }
}
