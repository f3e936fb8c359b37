//! Device addresses: the data pointers "tpu" storages show PyTorch. Each storage gets a range of
//! its own inside one large region of address space that can never be read or written
//! (PROT_NONE, no memory behind it). A kernel that treats a tpu tensor's data as host memory
//! (a CPU kernel reached through a device-generic dispatcher entry, a user's extension, ctypes)
//! faults at once at an address the shim's fault handler recognizes, instead of reading or
//! corrupting the engine's state. The storage cell itself travels as the DataPtr's context.
//! Cells are opaque pointers here (cell.rs hands them in), so this module imports nothing of
//! the engine; its tests, which need cells, are in cell.rs.
//!
//! Ranges are powers of two, at least 256 bytes. The region is split into one part per size
//! class, so an address's part and slot give its cell through a table, without a search, and
//! distinct live storages never overlap (tools compare data pointer ranges to find shared
//! storage).
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

const MIN_CLASS: u32 = 8;
const PARTS: u32 = 64;

struct Region {
    base: usize,
    len: usize,
    /// Each part is 2^part_bits bytes: the largest storage that fits.
    part_bits: u32,
}

#[derive(Default)]
struct Class {
    /// Slots handed out so far (the next new slot).
    used: usize,
    free: Vec<usize>,
    /// The cell at each slot (0: free).
    cells: Vec<usize>,
}

static REGION: OnceLock<Option<Region>> = OnceLock::new();
static CLASSES: Mutex<Vec<Class>> = Mutex::new(Vec::new());

fn region() -> Option<&'static Region> {
    REGION.get_or_init(reserve).as_ref()
}

/// The largest region the kernel grants (16 TiB where virtual addresses have 47 bits or more;
/// less under a memory rlimit or a smaller address space).
fn reserve() -> Option<Region> {
    for bits in [44u32, 42, 40, 38, 36, 34] {
        let len = 1usize << bits;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a fresh anonymous mapping that nothing else uses.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags, -1, 0) };
        if p != libc::MAP_FAILED {
            return Some(Region { base: p as usize, len, part_bits: bits - PARTS.trailing_zeros() });
        }
    }
    None
}

/// (base, length) of the region, for the fault handler; (0, 0) when none could be reserved.
pub fn region_bounds() -> (usize, usize) {
    region().map_or((0, 0), |r| (r.base, r.len))
}

fn class_of(nbytes: i64) -> u32 {
    let n = nbytes.max(1) as u64;
    (64 - (n - 1).leading_zeros()).max(MIN_CLASS)
}

/// The size of the range an address of `nbytes` gets.
pub fn capacity(nbytes: i64) -> i64 {
    1i64 << class_of(nbytes)
}

/// A new range of at least `nbytes` for `cell`; None when it cannot have one (larger than a
/// part of the region, or no region).
pub(crate) fn allocate(cell: *const c_void, nbytes: i64) -> Option<usize> {
    let r = region()?;
    let k = class_of(nbytes);
    if k > r.part_bits {
        return None;
    }
    let part = (k - MIN_CLASS) as usize;
    let mut classes = CLASSES.lock().unwrap();
    if classes.len() <= part {
        classes.resize_with(part + 1, Class::default);
    }
    let c = &mut classes[part];
    let slot = match c.free.pop() {
        Some(s) => s,
        None if (c.used + 1) << k <= 1usize << r.part_bits => {
            c.used += 1;
            c.cells.push(0);
            c.used - 1
        }
        None => return None,
    };
    c.cells[slot] = cell as usize;
    Some(r.base + (part << r.part_bits) + (slot << k))
}

/// (part, slot) of an address inside a range, if it is in the region.
fn locate(addr: usize) -> Option<(usize, usize)> {
    let r = region()?;
    let off = addr.checked_sub(r.base).filter(|&o| o < r.len)?;
    let part = off >> r.part_bits;
    let k = part as u32 + MIN_CLASS;
    Some((part, (off & ((1usize << r.part_bits) - 1)) >> k))
}

pub(crate) fn release(addr: usize) {
    if let Some((part, slot)) = locate(addr) {
        let mut classes = CLASSES.lock().unwrap();
        if let Some(c) = classes.get_mut(part) {
            if c.cells.get(slot).is_some_and(|&p| p != 0) {
                c.cells[slot] = 0;
                c.free.push(slot);
            }
        }
    }
}

/// The cell (a `*mut cell::Cell`) whose range holds `addr`, if any.
pub fn cell_at(addr: usize) -> Option<*mut c_void> {
    let (part, slot) = locate(addr)?;
    let classes = CLASSES.lock().unwrap();
    let p = *classes.get(part)?.cells.get(slot)?;
    (p != 0).then_some(p as *mut c_void)
}
