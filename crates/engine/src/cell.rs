//! Storage cells: what a "tpu" storage's data pointer points at. A cell holds the storage's
//! current device buffer (dense, in the shape of the tensor that last wrote all of it), or
//! nothing yet (reads as zeros). Views share the cell; writes swap in a new buffer.
use lowerings::DType;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

static LIVE_BUFFERS: AtomicI64 = AtomicI64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

/// A device buffer counted in the live-buffer statistics.
pub struct DevBuf {
    pub buf: pjrt::Buffer,
    bytes: i64,
}

impl DevBuf {
    pub fn new(buf: pjrt::Buffer, bytes: i64) -> Arc<DevBuf> {
        LIVE_BUFFERS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
        Arc::new(DevBuf { buf, bytes })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        LIVE_BUFFERS.fetch_sub(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

pub fn live_buffers() -> i64 {
    LIVE_BUFFERS.load(Ordering::Relaxed)
}

pub fn live_bytes() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

#[derive(Clone)]
pub struct Stored {
    pub buf: Arc<DevBuf>,
    pub dtype: DType,
    pub dims: Vec<i64>,
}

pub struct Cell {
    nbytes: AtomicI64,
    pub device: i32,
    // Read and written only while the engine lock is held (see dispatch::ENGINE).
    state: UnsafeCell<Option<Stored>>,
}

unsafe impl Send for Cell {}
unsafe impl Sync for Cell {}

impl Cell {
    pub fn new(nbytes: i64, device: i32, state: Option<Stored>) -> *mut Cell {
        Box::into_raw(Box::new(Cell { nbytes: AtomicI64::new(nbytes), device, state: UnsafeCell::new(state) }))
    }

    pub fn nbytes(&self) -> i64 {
        self.nbytes.load(Ordering::Relaxed)
    }

    pub fn set_nbytes(&self, n: i64) {
        self.nbytes.store(n, Ordering::Relaxed)
    }

    /// # Safety
    /// The caller holds the engine lock.
    pub unsafe fn get(&self) -> &Option<Stored> {
        &*self.state.get()
    }

    /// # Safety
    /// The caller holds the engine lock.
    pub unsafe fn set(&self, s: Option<Stored>) {
        *self.state.get() = s;
    }
}
