//! Device activity for torch.profiler: while a profile records device activity, each program
//! run is kept with its name, the correlation id of the aten call that launched it (the
//! profiler's, set by the shim on the calling thread) and when the device ran it.
//!
//! The end is the moment the plugin reports the program's results ready, or a synchronize
//! that saw them ready before that report came. A device runs its programs in launch order, so
//! a program ends no later than any program launched after it on that device ends, and starts
//! when it was launched or when the one before it ended, whichever is later. Compiles are kept
//! too, as host activity on the thread that compiled.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One program run on a device, or one compile on the host.
#[derive(Clone, Debug)]
pub struct Activity {
    pub name: String,
    pub device: i32,
    /// For a compile: the compiling thread's id (its lane in the host's part of the trace).
    pub host_thread: Option<i32>,
    pub correlation: u64,
    /// Nanoseconds since the Unix epoch (the profiler's clock).
    pub start_ns: i64,
    pub end_ns: i64,
}

/// A launched program whose end is not known yet, in launch order.
struct Launch {
    sequence: u64,
    name: String,
    device: i32,
    correlation: u64,
    launched_ns: i64,
    end_ns: Arc<Mutex<Option<i64>>>,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static LAUNCHED: AtomicU64 = AtomicU64::new(0);

fn compiles() -> &'static Mutex<Vec<Activity>> {
    static COMPILES: OnceLock<Mutex<Vec<Activity>>> = OnceLock::new();
    COMPILES.get_or_init(|| Mutex::new(Vec::new()))
}

fn launches() -> &'static Mutex<Vec<Launch>> {
    static LAUNCHES: OnceLock<Mutex<Vec<Launch>>> = OnceLock::new();
    LAUNCHES.get_or_init(|| Mutex::new(Vec::new()))
}

thread_local! {
    static CORRELATION: Cell<u64> = const { Cell::new(0) };
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Starts (dropping what an earlier profile left) or stops recording.
pub fn set_recording(on: bool) {
    if on {
        launches().lock().unwrap().clear();
        compiles().lock().unwrap().clear();
    }
    RECORDING.store(on, Ordering::Release);
}

pub fn is_recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// The profiler's correlation id of the aten call now running on this thread (0: none).
pub fn set_correlation(id: u64) {
    CORRELATION.with(|c| c.set(id));
}

/// The launch time to give `launched` (taken before the execute call: a plugin may run a
/// program within it); 0 when not recording.
pub fn launch_clock() -> i64 {
    if is_recording() {
        now_ns()
    } else {
        0
    }
}

/// Notes a program launched on `device` at `launched_ns` (from `launch_clock`); `outputs` are
/// its results (their ready event ends it). `name` is only built while recording.
pub fn launched(name: impl FnOnce() -> String, device: i32, launched_ns: i64, outputs: &[pjrt::Buffer]) {
    if !is_recording() || launched_ns == 0 {
        return;
    }
    let end_ns = Arc::new(Mutex::new(None));
    let event = outputs.first().and_then(|b| b.ready_event().ok());
    let registered = event.is_some_and(|event| {
        let end = end_ns.clone();
        event.on_ready(Box::new(move |_| end_at(&end, now_ns()))).is_ok()
    });
    if !registered {
        // No result to wait for: the program ends where it was launched.
        *end_ns.lock().unwrap() = Some(launched_ns);
    }
    let correlation = CORRELATION.with(|c| c.get());
    let mut pending = launches().lock().unwrap();
    let sequence = LAUNCHED.fetch_add(1, Ordering::Relaxed);
    pending.push(Launch { sequence, name: name(), device, correlation, launched_ns, end_ns });
}

/// The first end known wins: a report after a synchronize that saw the program done is late.
fn end_at(end: &Mutex<Option<i64>>, ns: i64) {
    end.lock().unwrap().get_or_insert(ns);
}

/// Marks the programs launched so far, before a synchronize waits for them.
pub fn sync_mark() -> u64 {
    LAUNCHED.load(Ordering::Relaxed)
}

/// A synchronize begun at `mark` finished now: every program launched before it has ended.
pub fn synced(mark: u64) {
    if !is_recording() {
        return;
    }
    let now = now_ns();
    for l in launches().lock().unwrap().iter().filter(|l| l.sequence < mark) {
        end_at(&l.end_ns, now);
    }
}

/// Notes a compile (or a load from the persistent cache) that began at `start_ns` (from
/// `launch_clock`) and ends now; `what` names the program, `from` says where it came from.
pub fn compiled(what: &str, from: &str, start_ns: i64) {
    if !is_recording() || start_ns == 0 {
        return;
    }
    // SAFETY: gettid has no preconditions.
    let thread = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let name = format!("torchtpu compile {what} ({from})");
    let correlation = CORRELATION.with(|c| c.get());
    compiles().lock().unwrap().push(Activity { name, device: -1, host_thread: Some(thread), correlation, start_ns, end_ns: now_ns() });
}

/// The activity recorded so far, compiles first, then programs in launch order. The profiler
/// synchronizes the device before it asks, but a plugin reports a program's end on its own
/// thread: this waits up to a second for those reports, and leaves a program still running for
/// a later call.
pub fn take() -> Vec<Activity> {
    let finished_prefix = |pending: &[Launch]| pending.iter().take_while(|l| l.end_ns.lock().unwrap().is_some()).count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut pending = launches().lock().unwrap();
    while finished_prefix(&pending) < pending.len() && std::time::Instant::now() < deadline {
        drop(pending);
        std::thread::sleep(std::time::Duration::from_millis(1));
        pending = launches().lock().unwrap();
    }
    let finished = finished_prefix(&pending);
    let host = std::mem::take(&mut *compiles().lock().unwrap());
    let done: Vec<Launch> = pending.drain(..finished).collect();
    let mut ends: Vec<i64> = done.iter().map(|l| l.end_ns.lock().unwrap().expect("counted as finished")).collect();
    // A plugin thread can report an end late: a later program's earlier end bounds it.
    let mut earliest_later_end = std::collections::HashMap::<i32, i64>::new();
    for (l, end) in done.iter().zip(ends.iter_mut()).rev() {
        let bound = earliest_later_end.entry(l.device).or_insert(i64::MAX);
        *end = (*end).min(*bound).max(l.launched_ns);
        *bound = *end;
    }
    let mut device_free = std::collections::HashMap::<i32, i64>::new();
    let programs: Vec<Activity> = done
        .into_iter()
        .zip(ends)
        .map(|(l, end_ns)| {
            let free = device_free.entry(l.device).or_insert(i64::MIN);
            let start_ns = l.launched_ns.max(*free).min(end_ns);
            *free = end_ns;
            Activity { name: l.name, device: l.device, host_thread: None, correlation: l.correlation, start_ns, end_ns }
        })
        .collect();
    host.into_iter().chain(programs).collect()
}
