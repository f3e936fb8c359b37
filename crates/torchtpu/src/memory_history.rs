//! Memory history (torch.tpu.memory._record_memory_history and _snapshot): what CUDA's caching
//! allocator records, for tpu storages. Every storage is one block in a segment of its own (the
//! allocator caches nothing), so its allocation is a segment_alloc and an alloc, its release a
//! free_requested, a free_completed and a segment_free. The shim reports each storage's birth
//! and death (csrc/allocator.cpp); stacks are PyTorch's own captured tracebacks
//! (csrc/memory_history.cpp), symbolized only when a snapshot asks, as CUDA's are.
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

extern "C" {
    fn tt_traceback_capture(cpp: i32) -> *mut c_void;
    fn tt_traceback_release(traceback: *mut c_void);
    fn tt_traceback_symbolize(
        tracebacks: *const *mut c_void,
        n: usize,
        frame: extern "C" fn(*mut c_void, *const c_char, *const c_char, u64),
        stack: extern "C" fn(*mut c_void, *const u64, usize),
        ctx: *mut c_void,
    );
}

/// A captured traceback, released with its last reference.
struct Traceback(*mut c_void);

// SAFETY: a CapturedTraceback is immutable once gathered, and its release defers freeing
// Python frames to a thread holding the GIL (PyTorch's combined_traceback.cpp).
unsafe impl Send for Traceback {}
unsafe impl Sync for Traceback {}

impl Drop for Traceback {
    fn drop(&mut self) {
        unsafe { tt_traceback_release(self.0) }
    }
}

#[derive(Clone)]
struct Block {
    address: u64,
    size: i64,
    device: i32,
    stack: Option<Arc<Traceback>>,
}

struct Event {
    action: &'static str,
    block: Block,
    time_us: i64,
}

#[derive(Default)]
struct History {
    /// Blocks are tracked ("state" or "all"), and events kept ("all").
    live: bool,
    trace: bool,
    /// Allocations carry a stack; releases too (context "all"); C++ frames too (stacks "all").
    alloc_stacks: bool,
    free_stacks: bool,
    cpp_frames: bool,
    max_entries: u64,
    events: VecDeque<Event>,
    blocks: HashMap<usize, Block>,
}

impl History {
    fn keep(&mut self, action: &'static str, block: &Block) {
        if !self.trace {
            return;
        }
        let time_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        self.events.push_back(Event { action, block: block.clone(), time_us });
        while self.events.len() as u64 > self.max_entries {
            self.events.pop_front();
        }
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static HISTORY: Mutex<Option<History>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut History) -> R) -> R {
    f(HISTORY.lock().unwrap().get_or_insert_with(History::default))
}

/// The current stack where `wanted` says so, gathered outside the lock: gathering Python frames
/// takes the GIL.
fn capture(wanted: fn(&History) -> bool) -> Option<Arc<Traceback>> {
    let (stacks, cpp) = with(|h| (wanted(h), h.cpp_frames));
    stacks.then(|| Arc::new(Traceback(unsafe { tt_traceback_capture(cpp as i32) })))
}

/// A storage came to be, or moved or grew (csrc/allocator.cpp).
#[no_mangle]
pub extern "C" fn tt_history_alloc(cell: *mut c_void, address: *const c_void, nbytes: usize, device: i32) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let stack = capture(|h| h.alloc_stacks);
    with(|h| {
        if h.live {
            let block = Block { address: address as u64, size: nbytes as i64, device, stack };
            h.keep("segment_alloc", &block);
            h.keep("alloc", &block);
            h.blocks.insert(cell as usize, block);
        }
    });
}

/// A storage was released (or is about to move or grow).
#[no_mangle]
pub extern "C" fn tt_history_free(cell: *mut c_void) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let stack = capture(|h| h.free_stacks);
    // Released after the lock: a traceback's release may run PyTorch code.
    let _released = with(|h| {
        let mut block = h.blocks.remove(&(cell as usize))?;
        let made = std::mem::replace(&mut block.stack, stack);
        for action in ["free_requested", "free_completed", "segment_free"] {
            h.keep(action, &block);
        }
        made
    });
}

/// enabled: 0 stops and forgets everything, 1 tracks live blocks ("state"), 2 also keeps events
/// ("all"). context: 0 none, 1 "state" (stacks of live blocks), 2 "alloc", 3 "all" (releases
/// too).
pub fn record(enabled: i32, context: i32, cpp_frames: bool, max_entries: u64) {
    let forgotten = with(|h| {
        h.live = enabled >= 1;
        h.trace = enabled >= 2;
        h.alloc_stacks = enabled >= 1 && context >= 1;
        h.free_stacks = enabled >= 1 && context >= 3;
        h.cpp_frames = cpp_frames;
        h.max_entries = max_entries;
        while h.events.len() as u64 > max_entries {
            h.events.pop_front();
        }
        ON.store(h.live, Ordering::Relaxed);
        if enabled == 0 {
            (std::mem::take(&mut h.events), std::mem::take(&mut h.blocks))
        } else {
            Default::default()
        }
    });
    drop(forgotten);
}

/// (filename, function, line) of a frame.
pub type Frame = (String, String, u64);
/// (device, address, size, stack): a stack is indices into the frames, innermost first.
pub type LiveBlock = (i32, u64, i64, Option<Vec<u64>>);
/// (device, action, address, size, time_us, stack).
pub type TraceEvent = (i32, &'static str, u64, i64, i64, Option<Vec<u64>>);

#[derive(Default)]
struct Symbolized {
    frames: Vec<Frame>,
    stacks: Vec<Vec<u64>>,
}

extern "C" fn on_frame(ctx: *mut c_void, file: *const c_char, name: *const c_char, line: u64) {
    let s = unsafe { &mut *(ctx as *mut Symbolized) };
    let text = |p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    s.frames.push((text(file), text(name), line));
}

extern "C" fn on_stack(ctx: *mut c_void, frames: *const u64, n: usize) {
    let s = unsafe { &mut *(ctx as *mut Symbolized) };
    s.stacks.push(if n == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(frames, n) }.to_vec() });
}

/// The live blocks and the kept events, their stacks symbolized (each distinct one once).
/// Call without the GIL: symbolizing takes it.
pub fn snapshot() -> (Vec<Frame>, Vec<LiveBlock>, Vec<TraceEvent>) {
    let (blocks, events): (Vec<Block>, Vec<(&'static str, Block, i64)>) =
        with(|h| (h.blocks.values().cloned().collect(), h.events.iter().map(|e| (e.action, e.block.clone(), e.time_us)).collect()));
    let mut index = HashMap::<usize, usize>::new();
    let mut distinct = Vec::new();
    for stack in blocks.iter().chain(events.iter().map(|e| &e.1)).filter_map(|b| b.stack.as_ref()) {
        index.entry(stack.0 as usize).or_insert_with(|| {
            distinct.push(stack.0);
            distinct.len() - 1
        });
    }
    let mut out = Symbolized::default();
    unsafe { tt_traceback_symbolize(distinct.as_ptr(), distinct.len(), on_frame, on_stack, &mut out as *mut Symbolized as *mut c_void) };
    let stack_of = |b: &Block| b.stack.as_ref().map(|t| out.stacks[index[&(t.0 as usize)]].clone());
    let live = blocks.iter().map(|b| (b.device, b.address, b.size, stack_of(b))).collect();
    let trace = events.iter().map(|(action, b, t)| (b.device, *action, b.address, b.size, *t, stack_of(b))).collect();
    (out.frames, live, trace)
}
