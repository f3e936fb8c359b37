//! Storage cells: what a "tpu" storage's data pointer points at. A cell holds the storage's
//! current device buffer (dense, in the shape of the tensor that last wrote all of it), or
//! nothing yet (reads as zeros). Views share the cell; writes swap in a new buffer. The buffer
//! slot is a `lock::Guarded`: reading it takes the engine lock's token `&Held`, writing it
//! `&mut Held`. Also here: device buffers counted in memory.rs, and the pending work that
//! `synchronize` and `Marker` wait for.
use crate::address;
use crate::lock::{Guarded, Held};
use lowerings::DType;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A device buffer counted in its device's memory statistics (memory.rs).
pub struct DevBuf {
    pub buf: pjrt::Buffer,
    bytes: i64,
    device: i32,
}

/// Buffers whose computation may still be running, for `synchronize` (weak: a buffer dropped
/// before its computation finished leaves that computation's event in `dropped` instead).
/// Finished ones are pruned whenever a list doubles.
struct Pending {
    bufs: Vec<Weak<DevBuf>>,
    prune_at: usize,
    dropped: Vec<Arc<pjrt::Event>>,
    prune_dropped_at: usize,
    /// Non-blocking copies between host memory and the device (host.rs), with what must stay
    /// alive until each is done: its host memory, its device buffer.
    transfers: Vec<Transfer>,
}

/// A started copy: its event, the host memory it reads or writes (start, end), and what it
/// keeps alive.
pub struct Transfer {
    pub event: Arc<pjrt::Event>,
    pub host: (usize, usize),
    pub keep: Box<dyn Send>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending { bufs: Vec::new(), prune_at: 1024, dropped: Vec::new(), prune_dropped_at: 64, transfers: Vec::new() });

/// Adds a started copy; releases what finished copies kept (after the lock: a release may
/// free host memory through PyTorch's allocator).
pub fn add_transfer(t: Transfer) {
    let finished: Vec<Transfer> = {
        let mut p = PENDING.lock().unwrap();
        let (done, running): (Vec<Transfer>, Vec<Transfer>) = std::mem::take(&mut p.transfers).into_iter().partition(|t| t.event.is_ready());
        p.transfers = running;
        p.transfers.push(t);
        done
    };
    drop(finished);
}

/// Waits for the started copies that read or write host memory in `start..end`: a copy
/// queued after them on that memory comes after them, as copies on one CUDA stream do.
pub fn wait_host_range(start: usize, end: usize) -> Result<(), pjrt::Error> {
    let overlapping: Vec<Transfer> = {
        let mut p = PENDING.lock().unwrap();
        if p.transfers.is_empty() {
            return Ok(());
        }
        let (hit, rest): (Vec<Transfer>, Vec<Transfer>) = std::mem::take(&mut p.transfers).into_iter().partition(|t| t.host.0 < end && start < t.host.1);
        p.transfers = rest;
        hit
    };
    overlapping.iter().try_for_each(|t| t.event.wait())
}

/// Waits for every started copy (torch.tpu.synchronize, torch.accelerator.synchronize);
/// returns the first failed one's error.
pub fn wait_transfers() -> Result<(), pjrt::Error> {
    let transfers = std::mem::take(&mut PENDING.lock().unwrap().transfers);
    let mut first = Ok(());
    for t in &transfers {
        if let Err(e) = t.event.wait() {
            first = first.and(Err(e));
        }
    }
    drop(transfers);
    first
}

impl DevBuf {
    pub fn new(buf: pjrt::Buffer, bytes: i64, device: i32) -> Arc<DevBuf> {
        crate::memory::on_alloc(device, bytes);
        let b = Arc::new(DevBuf { buf, bytes, device });
        // Buffers looked at while pruning are released after the lock: dropping a last
        // reference takes the lock (DevBuf's drop).
        let mut looked_at = Vec::new();
        let mut p = PENDING.lock().unwrap();
        if p.bufs.len() >= p.prune_at {
            p.bufs.retain(|w| match w.upgrade() {
                Some(b) => {
                    let running = b.buf.ready_event().is_ok_and(|e| !e.is_ready());
                    looked_at.push(b);
                    running
                }
                None => false,
            });
            p.prune_at = (2 * p.bufs.len()).max(1024);
        }
        p.bufs.push(Arc::downgrade(&b));
        drop(p);
        drop(looked_at);
        b
    }
}

/// Waits until every buffer made so far is computed (torch.tpu.synchronize); returns the
/// first failed computation's error.
pub fn synchronize() -> Result<(), pjrt::Error> {
    let mark = crate::trace::sync_mark();
    let (bufs, dropped) = {
        let mut p = PENDING.lock().unwrap();
        (std::mem::take(&mut p.bufs), std::mem::take(&mut p.dropped))
    };
    // Computations whose results were all dropped still run (a timing loop's, a script's last
    // ones): waited for too, so that nothing runs past synchronize or into the process's exit.
    // (Their failures have no tensor to report them on.)
    for e in dropped {
        let _ = e.wait();
    }
    // Copies are waited for (and release what they keep) even where a computation failed.
    let transfers = wait_transfers();
    for w in bufs {
        if let Some(b) = w.upgrade() {
            b.buf.ready()?;
        }
    }
    transfers?;
    crate::trace::synced(mark);
    Ok(())
}

/// A recorded point in the device's work (torch.tpu.Event): the computations pending when it
/// was recorded. With timing, completion callbacks note when the last of them finished.
pub struct Marker {
    events: Vec<Arc<pjrt::Event>>,
    timing: Option<Arc<Timing>>,
}

struct Timing {
    remaining: std::sync::atomic::AtomicUsize,
    done_at: Mutex<Option<std::time::Instant>>,
}

impl Timing {
    fn finish_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.done_at.lock().unwrap() = Some(std::time::Instant::now());
        }
    }
}

impl Marker {
    /// Marks the work queued so far.
    pub fn record(timing: bool) -> Result<Marker, pjrt::Error> {
        let (pending, mut events): (Vec<Arc<DevBuf>>, Vec<Arc<pjrt::Event>>) = {
            let p = PENDING.lock().unwrap();
            let running = p.dropped.iter().chain(p.transfers.iter().map(|t| &t.event)).filter(|e| !e.is_ready()).cloned();
            (p.bufs.iter().filter_map(|w| w.upgrade()).collect(), running.collect())
        };
        for b in pending {
            let e = b.buf.ready_event()?;
            if !e.is_ready() {
                events.push(Arc::new(e));
            }
        }
        let timing = timing.then(|| {
            // One count for the recording itself, released after the callbacks are registered,
            // so that the time is set exactly once, by the last to finish.
            let t = Arc::new(Timing { remaining: (events.len() + 1).into(), done_at: Mutex::new(None) });
            for e in &events {
                let t2 = t.clone();
                if e.on_ready(Box::new(move |_| t2.finish_one())).is_err() {
                    t.finish_one(); // the plugin cannot call back: count it as done now
                }
            }
            t.finish_one();
            t
        });
        Ok(Marker { events, timing })
    }

    /// Whether the marked work finished (and, with timing, its finish time is known).
    pub fn is_done(&self) -> bool {
        match &self.timing {
            Some(t) => t.done_at.lock().unwrap().is_some(),
            None => self.events.iter().all(|e| e.is_ready()),
        }
    }

    /// Waits for the marked work; returns the first failed computation's error.
    pub fn wait(&self) -> Result<(), pjrt::Error> {
        self.events.iter().try_for_each(|e| e.wait())?;
        // A completion callback runs on a plugin thread just after the event is ready.
        while !self.is_done() {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// When the marked work finished, if this marker times and it has.
    pub fn done_at(&self) -> Option<std::time::Instant> {
        *self.timing.as_ref()?.done_at.lock().unwrap()
    }

    pub fn timed(&self) -> bool {
        self.timing.is_some()
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        crate::memory::on_free(self.device, self.bytes);
        if let Ok(event) = self.buf.ready_event() {
            if !event.is_ready() {
                let mut p = PENDING.lock().unwrap();
                if p.dropped.len() >= p.prune_dropped_at {
                    p.dropped.retain(|e| !e.is_ready());
                    p.prune_dropped_at = (2 * p.dropped.len()).max(64);
                }
                p.dropped.push(Arc::new(event));
            }
        }
    }
}

#[derive(Clone)]
pub struct Stored {
    pub buf: Buf,
    pub dtype: DType,
    pub dims: Vec<i64>,
    /// A constant a recorded op returned (dispatch/cache.rs: `Entry::constants`): reading it is no
    /// synchronization.
    pub constant: bool,
}

/// A cell's buffer: computed (or being computed: PJRT runs programs asynchronously), or the
/// result of an op that fused eager mode has recorded and not run yet (fused.rs).
#[derive(Clone)]
pub enum Buf {
    Ready(Arc<DevBuf>),
    Pending(Arc<PendingOut>),
}

/// One result of a recorded op: filled when its graph runs.
pub struct PendingOut {
    pub done: std::sync::OnceLock<Arc<DevBuf>>,
    /// The recording graph's generation, the op's index there and the result's.
    pub generation: u64,
    pub node: usize,
    pub out: usize,
}

impl Stored {
    pub fn ready(buf: Arc<DevBuf>, dtype: DType, dims: Vec<i64>) -> Stored {
        Stored { buf: Buf::Ready(buf), dtype, dims, constant: false }
    }

    /// The device buffer, once computed (None: its recorded op has not run; see
    /// `dispatch::ready`, which runs pending work first).
    pub fn dev(&self) -> Option<&Arc<DevBuf>> {
        match &self.buf {
            Buf::Ready(b) => Some(b),
            Buf::Pending(p) => p.done.get(),
        }
    }
}

pub struct Cell {
    nbytes: AtomicI64,
    pub device: i32,
    /// The storage's data pointer as PyTorch sees it (address.rs); 0 until first asked for.
    addr: AtomicUsize,
    /// The current buffer; opened with the engine lock's token (see lock.rs).
    state: Guarded<Option<Stored>>,
}

// Cells are shared between threads (PyTorch frees storages on any thread); their buffer slot
// is safe to share because it opens only with the engine lock's token.
const _: () = {
    fn shared<T: Send + Sync>() {}
    let _ = shared::<Cell>;
};

impl Drop for Cell {
    fn drop(&mut self) {
        let a = *self.addr.get_mut();
        if a != 0 {
            address::release(a);
        }
    }
}

impl Cell {
    pub fn new(nbytes: i64, device: i32, state: Option<Stored>) -> *mut Cell {
        Box::into_raw(Box::new(Cell {
            nbytes: AtomicI64::new(nbytes),
            device,
            addr: AtomicUsize::new(0),
            state: Guarded::new(state),
        }))
    }

    pub fn nbytes(&self) -> i64 {
        self.nbytes.load(Ordering::Relaxed)
    }

    /// Growing past the address range moves the storage to a new one (see `address`).
    pub fn set_nbytes(&self, n: i64) {
        let old = self.nbytes.swap(n, Ordering::Relaxed);
        if address::capacity(n) > address::capacity(old) {
            let a = self.addr.swap(0, Ordering::AcqRel);
            if a != 0 {
                address::release(a);
            }
        }
    }

    /// The storage's data pointer: an address in the inaccessible region of address.rs that
    /// maps back to this cell. None when the storage is too large for the region.
    pub fn address(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return Some(a);
        }
        let new = address::allocate(self as *const Cell as *const c_void, self.nbytes())?;
        match self.addr.compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Some(new),
            Err(other) => {
                address::release(new); // another thread gave it one first
                Some(other)
            }
        }
    }

    /// The current buffer, read under the engine lock.
    pub fn get<'a>(&'a self, held: &'a Held) -> &'a Option<Stored> {
        self.state.get(held)
    }

    /// Replaces the current buffer (or clears it) under the engine lock.
    pub fn set(&self, held: &mut Held, s: Option<Stored>) {
        self.state.set(held, s)
    }
}

#[cfg(test)]
mod address_tests {
    //! address.rs's tests: they need cells, which that module does not know.
    use super::*;
    use crate::address::{capacity, region_bounds};

    /// address::cell_at, typed.
    fn cell_at(addr: usize) -> Option<*mut Cell> {
        address::cell_at(addr).map(|p| p.cast())
    }

    #[test]
    fn ranges_are_disjoint_inaccessible_and_map_back_to_their_cells() {
        let cells: Vec<*mut Cell> = [0i64, 1, 255, 256, 257, 4096, 1 << 20].iter().map(|&n| Cell::new(n, 0, None)).collect();
        let addrs: Vec<usize> = cells.iter().map(|&c| unsafe { &*c }.address().unwrap()).collect();
        let (base, len) = region_bounds();
        assert!(len >= 1 << 34);
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (&c, &a) in cells.iter().zip(&addrs) {
            let n = unsafe { &*c }.nbytes();
            assert!(a >= base && a + capacity(n) as usize <= base + len);
            assert_eq!(a % 256, 0);
            assert_eq!(cell_at(a), Some(c));
            assert_eq!(cell_at(a + n.max(1) as usize - 1), Some(c)); // an address inside the range
            spans.push((a, a + capacity(n) as usize));
        }
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "ranges overlap: {spans:?}");
        // The region holds no memory: touching it faults (checked from Python, in a subprocess).
        // SAFETY: cells made above and not used elsewhere.
        let freed = addrs[3];
        unsafe { drop(Box::from_raw(cells[3])) };
        assert_eq!(cell_at(freed), None);
        let again = Cell::new(200, 0, None);
        let again_addr = unsafe { &*again }.address().unwrap();
        assert_eq!(cell_at(again_addr), Some(again));
        for (i, c) in cells.into_iter().enumerate() {
            if i != 3 {
                unsafe { drop(Box::from_raw(c)) };
            }
        }
        unsafe { drop(Box::from_raw(again)) };
    }

    #[test]
    fn growing_past_the_range_moves_the_address() {
        let c = Cell::new(100, 0, None);
        let cell = unsafe { &*c };
        let a = cell.address().unwrap();
        cell.set_nbytes(200); // still within the 256-byte range
        assert_eq!(cell.address(), Some(a));
        cell.set_nbytes(1000);
        let b = cell.address().unwrap();
        assert_ne!(a, b);
        assert_eq!(cell_at(b), Some(c));
        assert_eq!(cell_at(a), None);
        unsafe { drop(Box::from_raw(c)) };
    }

    #[test]
    fn too_large_gets_no_address() {
        let c = Cell::new(i64::MAX / 2, 0, None);
        assert_eq!(unsafe { &*c }.address(), None);
        unsafe { drop(Box::from_raw(c)) };
    }
}
