//! The cache key of a call (`Scan`: everything that shapes its program, with its distinct cells
//! and float scalars), the key's hasher, and the keys of bucketed programs and their families.
use crate::abi::*;
use crate::buckets;
use crate::cell::Cell;
use crate::error::Error;
use crate::lock::Held;
use lowerings::DType;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-style mixing of the u64 words of a key: keys are short and built fresh per call.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Keys are u64 slices, hashed as their bytes: take them a word at a time.
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().unwrap()));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7cc1_b727_220a_95);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
}

pub(super) type KeyMap<V> = HashMap<Box<[u64]>, V, BuildHasherDefault<KeyHasher>>;

/// The parts of a call that are not in the arguments' values: distinct cells, float scalars.
#[derive(Default)]
pub(super) struct Scan {
    pub(super) key: Vec<u64>,
    pub(super) cells: Vec<*mut Cell>,
    pub(super) floats: Vec<f64>,
    pub(super) device: i32,
}

const UNINIT: u64 = u64::MAX;

impl Scan {
    fn slot(&mut self, cell: *mut Cell) -> (u32, bool) {
        if let Some(i) = self.cells.iter().position(|&c| c == cell) {
            return (i as u32, false);
        }
        self.cells.push(cell);
        ((self.cells.len() - 1) as u32, true)
    }

    fn tensor(&mut self, t: &TtTensor, held: &Held) -> Result<(), Error> {
        let sizes = t.sizes();
        if t.is_host() {
            self.key.push(1 << 40 | (t.flags as u64) << 8 | t.dtype as u8 as u64);
            self.key.push(sizes.len() as u64);
            self.key.extend(sizes.iter().map(|&s| s as u64));
            return Ok(());
        }
        let (slot, first) = self.slot(t.cell as *mut Cell);
        // SAFETY: the argument's storage keeps its cell alive for the call.
        let cell = unsafe { &*(t.cell as *const Cell) };
        if first {
            let device = cell.device;
            if self.cells.len() == 1 {
                self.device = device;
            } else if device != self.device {
                return Err(Error::runtime(format!(
                    "Expected all tensors to be on the same device, but found at least two devices, tpu:{} and tpu:{}!",
                    self.device, device
                )));
            }
        }
        self.key.push(2 << 40 | (slot as u64) << 8 | t.dtype as u8 as u64);
        self.key.push(sizes.len() as u64);
        self.key.extend(sizes.iter().map(|&s| s as u64));
        if sizes.contains(&0) {
            // An empty view reads and writes nothing wherever it starts: one program serves
            // every offset and stride (a step buffer's unused tail, cut at each step's count).
            self.key.extend(std::iter::repeat(0).take(sizes.len() + 1));
        } else {
            self.key.extend(t.strides().iter().map(|&s| s as u64));
            self.key.push(t.offset as u64);
        }
        if first {
            // The base's layout shapes the program: its dtype and dims, or "nothing yet".
            match cell.get(held) {
                Some(s) => {
                    self.key.push(s.dtype as u8 as u64);
                    self.key.push(s.dims.len() as u64);
                    self.key.extend(s.dims.iter().map(|&d| d as u64));
                }
                None => {
                    self.key.push(UNINIT);
                    self.key.push(cell.nbytes() as u64);
                }
            }
        }
        Ok(())
    }

    pub(super) fn arg(&mut self, a: &TtArg, specialize: bool, held: &Held) -> Result<(), Error> {
        self.key.push(a.kind as u64);
        match a.kind {
            TT_TENSOR => self.tensor(a.tensor(), held)?,
            TT_INT | TT_BOOL | TT_SCALAR_TYPE | TT_OTHER => self.key.push(a.int() as u64),
            TT_FLOAT => {
                let f = unsafe { a.p.f };
                self.floats.push(f);
                if specialize {
                    self.key.push(f.to_bits());
                }
            }
            TT_COMPLEX => {
                let c = unsafe { a.p.c };
                self.key.push(c.re.to_bits());
                self.key.push(c.im.to_bits());
            }
            TT_INT_LIST | TT_BOOL_LIST | TT_FLOAT_LIST => {
                let n = unsafe { a.p.list.len };
                self.key.push(n as u64);
                match a.kind {
                    TT_INT_LIST => self.key.extend(a.list::<i64>().iter().map(|&x| x as u64)),
                    TT_BOOL_LIST => self.key.extend(a.list::<u8>().iter().map(|&x| x as u64)),
                    _ => self.key.extend(a.list::<f64>().iter().map(|x| x.to_bits())),
                }
            }
            TT_STR => {
                let s = a.list::<u8>();
                self.key.push(s.len() as u64);
                for chunk in s.chunks(8) {
                    let mut w = [0u8; 8];
                    w[..chunk.len()].copy_from_slice(chunk);
                    self.key.push(u64::from_le_bytes(w));
                }
            }
            TT_TENSOR_LIST => {
                let items = a.list::<TtArg>();
                self.key.push(items.len() as u64);
                for item in items {
                    self.arg(item, specialize, held)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

pub(super) const SIZE_PROGRAM: u64 = u64::MAX - 1;

pub(super) const BUCKET_PROGRAM: u64 = u64::MAX - 2;

/// A call's argument in a bucketed program's key, or in its family's (see lookup_bucketed).
pub(super) fn bucket_key_arg(key: &mut Vec<u64>, a: &TtArg, specialize: bool, scan: &Scan, held: &Held, family: bool) {
    key.push(a.kind as u64);
    match a.kind {
        TT_TENSOR => {
            let t = a.tensor();
            if t.is_host() {
                key.push(1 << 40 | (t.flags as u64) << 8 | t.dtype as u8 as u64);
                return;
            }
            bucket_key_tensor(key, t, scan, held, family);
        }
        TT_TENSOR_LIST => {
            let items = a.list::<TtArg>();
            key.push(items.len() as u64);
            for item in items {
                bucket_key_tensor(key, item.tensor(), scan, held, family);
            }
        }
        TT_INT | TT_BOOL | TT_SCALAR_TYPE | TT_OTHER => key.push(a.int() as u64),
        TT_FLOAT if specialize => key.push(unsafe { a.p.f }.to_bits()),
        TT_COMPLEX => {
            let c = unsafe { a.p.c };
            key.push(c.re.to_bits());
            key.push(c.im.to_bits());
        }
        TT_INT_LIST | TT_BOOL_LIST | TT_FLOAT_LIST | TT_STR => {
            // Rare in pointwise ops: the exact scan's words for it.
            let mut scan = Scan::default();
            let _ = scan.arg(a, specialize, held);
            key.extend(scan.key);
        }
        _ => {}
    }
}

/// A device tensor in a bucketed program's key: its cell's slot, dtype, rank, and unless only
/// the family is keyed, its sizes' buckets and its storage's dims.
fn bucket_key_tensor(key: &mut Vec<u64>, t: &TtTensor, scan: &Scan, held: &Held, family: bool) {
    let slot = scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap();
    key.push(slot as u64);
    buckets::key_tensor(key, t, family);
    if family {
        return;
    }
    // SAFETY: the call's arguments keep their cells alive.
    let cell = unsafe { &*(t.cell as *const Cell) };
    match cell.get(held) {
        Some(s) => {
            key.push(s.dims.len() as u64);
            key.extend(s.dims.iter().map(|&d| d as u64));
        }
        // Not written yet: zeros of the storage's bucket (Builder::base).
        None => {
            let size = DType::from_code(t.dtype).map_or(1, |d| d.size() as i64);
            key.extend([u64::MAX, buckets::bucket(cell.nbytes() / size) as u64]);
        }
    }
}
