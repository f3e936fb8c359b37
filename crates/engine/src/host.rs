//! Moving data between the host and cells, and small host-side conversions.
use crate::abi::*;
use crate::cell::{Cell, DevBuf, Stored};
use crate::dispatch::{self, CallResult, Produced};
use crate::runtime::runtime;
use crate::view::{contiguous_strides, Geometry};
use crate::Error;
use lowerings::DType;
use stablehlo::ElemType;
use std::sync::OnceLock;

pub fn element_type(d: DType) -> pjrt::ElementType {
    use pjrt::ElementType as E;
    match d {
        DType::Bool => E::Pred,
        DType::U8 => E::U8,
        DType::I8 => E::S8,
        DType::I16 => E::S16,
        DType::I32 => E::S32,
        DType::I64 => E::S64,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        DType::C64 => E::C64,
        DType::C128 => E::C128,
        DType::F8E5M2 => E::F8E5M2,
        DType::F8E4M3FN => E::F8E4M3FN,
    }
}

/// A float scalar's bytes in `elem` (as PyTorch converts a Python number to a tensor dtype).
pub fn scalar_bytes(x: f64, elem: ElemType) -> ([u8; 16], usize) {
    let mut b = [0u8; 16];
    let n = match elem {
        ElemType::F64 => put(&mut b, &x.to_le_bytes()),
        ElemType::F32 => put(&mut b, &(x as f32).to_le_bytes()),
        ElemType::F16 => put(&mut b, &half::f16::from_f64(x).to_le_bytes()),
        ElemType::BF16 => put(&mut b, &half::bf16::from_f64(x).to_le_bytes()),
        ElemType::I64 => put(&mut b, &(x as i64).to_le_bytes()),
        ElemType::I32 => put(&mut b, &(x as i64 as i32).to_le_bytes()),
        ElemType::I16 => put(&mut b, &(x as i64 as i16).to_le_bytes()),
        ElemType::I8 => put(&mut b, &(x as i64 as i8).to_le_bytes()),
        ElemType::U8 => put(&mut b, &(x as i64 as u8).to_le_bytes()),
        ElemType::U16 => put(&mut b, &(x as i64 as u16).to_le_bytes()),
        ElemType::U32 => put(&mut b, &(x as i64 as u32).to_le_bytes()),
        ElemType::U64 => put(&mut b, &(x as u64).to_le_bytes()),
        ElemType::Pred => put(&mut b, &[(x != 0.0) as u8]),
        ElemType::C64 => {
            put(&mut b, &(x as f32).to_le_bytes());
            8
        }
        ElemType::C128 => {
            put(&mut b, &x.to_le_bytes());
            16
        }
        ElemType::F8E4M3FN | ElemType::F8E5M2 => put(&mut b, &[0]),
    };
    (b, n)
}

fn put(dst: &mut [u8; 16], src: &[u8]) -> usize {
    dst[..src.len()].copy_from_slice(src);
    src.len()
}

/// splitmix64: spreads (seed, offset) into independent random keys.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn internal_op(slot: &'static OnceLock<i32>, name: &str, args: &[&str], write_mask: u64) -> i32 {
    *slot.get_or_init(|| dispatch::register_op(name, "", args.iter().map(|s| s.to_string()).collect(), write_mask))
}

fn clone_op() -> i32 {
    static ID: OnceLock<i32> = OnceLock::new();
    internal_op(&ID, "aten::clone", &["self", "memory_format"], 0)
}

fn copy_op() -> i32 {
    static ID: OnceLock<i32> = OnceLock::new();
    internal_op(&ID, "aten::copy_", &["self", "src", "non_blocking"], 1)
}

fn none_arg() -> TtArg {
    TtArg { kind: TT_NONE, p: TtPayload { n: TtPair { i: 0, i2: 0 } } }
}

/// Reads the view `t` into `dst` (dense row-major bytes of its dtype). A synchronization: a
/// failed check of an earlier op raises here first.
pub fn to_host(t: &TtTensor, dst: &mut [u8]) -> Result<(), Error> {
    crate::checks::raise_pending()?;
    let cell = unsafe { &*(t.cell as *const Cell) };
    let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
    let direct = dispatch::locked(|| match unsafe { cell.get() } {
        None => Some(None),
        Some(s) if s.dtype as i8 == t.dtype && s.dims.as_slice() == t.sizes() && g.covers(s.dims.iter().product()) => {
            Some(Some(s.buf.clone()))
        }
        Some(_) => None,
    });
    match direct {
        Some(None) => {
            dst.fill(0);
            Ok(())
        }
        Some(Some(buf)) => Ok(buf.buf.to_host(dst)?),
        None => {
            // A strided view or a part of the storage: materialize it on the device first.
            let args = [TtArg { kind: TT_TENSOR, p: TtPayload { t: *t } }, none_arg()];
            let produced = match dispatch::call(clone_op(), &args)? {
                CallResult::Done(p) => p,
                CallResult::Resize(..) => unreachable!("clone has no out= argument"),
            };
            let Some(Produced::Tensor { cell, .. }) = produced.into_iter().next() else { unreachable!() };
            let owned = unsafe { Box::from_raw(cell) };
            let buf = dispatch::locked(|| unsafe { owned.get() }.as_ref().map(|s| s.buf.clone()));
            buf.expect("clone produced a buffer").buf.to_host(dst)?;
            Ok(())
        }
    }
}

/// Writes dense host bytes into the view `t`.
pub fn from_host(t: &TtTensor, src: &[u8]) -> Result<(), Error> {
    let cell = unsafe { &*(t.cell as *const Cell) };
    let dtype = DType::from_code(t.dtype).ok_or_else(|| Error::runtime(format!("torchtpu: dtype code {} is not supported", t.dtype)))?;
    let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
    if g.covers(cell.nbytes() / dtype.size() as i64) {
        // The whole storage: upload straight into a new buffer.
        let rt = runtime()?;
        let buf = rt.client.buffer_from_host(src, element_type(dtype), t.sizes(), None, rt.device(cell.device)?)?;
        let stored = Stored { buf: DevBuf::new(buf, src.len() as i64, cell.device), dtype, dims: t.sizes().to_vec() };
        dispatch::locked(|| unsafe { cell.set(Some(stored)) });
        return Ok(());
    }
    let strides = contiguous_strides(t.sizes());
    let host = TtTensor {
        cell: std::ptr::null_mut(),
        host: src.as_ptr() as *const _,
        sizes: t.sizes,
        strides: strides.as_ptr(),
        offset: 0,
        ndim: t.ndim,
        dtype: t.dtype,
        flags: TT_HOST,
    };
    let args = [
        TtArg { kind: TT_TENSOR, p: TtPayload { t: *t } },
        TtArg { kind: TT_TENSOR, p: TtPayload { t: host } },
        TtArg { kind: TT_BOOL, p: TtPayload { n: TtPair { i: 0, i2: 0 } } },
    ];
    dispatch::call(copy_op(), &args)?;
    Ok(())
}

/// The whole cell's contents as bytes (zeros when never written).
pub fn cell_bytes(cell: &Cell) -> Result<(Option<(DType, Vec<i64>)>, Vec<u8>), Error> {
    let stored = dispatch::locked(|| unsafe { cell.get() }.clone());
    let mut bytes = vec![0u8; cell.nbytes() as usize];
    match stored {
        None => Ok((None, bytes)),
        Some(s) => {
            let n = (s.dims.iter().product::<i64>() as usize * s.dtype.size()).min(bytes.len());
            let mut tmp = vec![0u8; s.dims.iter().product::<i64>() as usize * s.dtype.size()];
            s.buf.buf.to_host(&mut tmp)?;
            bytes[..n].copy_from_slice(&tmp[..n]);
            Ok((Some((s.dtype, s.dims)), bytes))
        }
    }
}

/// Replaces a cell's contents with `bytes` as a 1-d buffer of `dtype` (or clears it).
pub fn set_cell_bytes(cell: &Cell, dtype: Option<DType>, bytes: &[u8]) -> Result<(), Error> {
    let Some(dtype) = dtype else {
        dispatch::locked(|| unsafe { cell.set(None) });
        return Ok(());
    };
    let n = bytes.len() / dtype.size();
    let rt = runtime()?;
    let buf = rt.client.buffer_from_host(&bytes[..n * dtype.size()], element_type(dtype), &[n as i64], None, rt.device(cell.device)?)?;
    let stored = Stored { buf: DevBuf::new(buf, (n * dtype.size()) as i64, cell.device), dtype, dims: vec![n as i64] };
    dispatch::locked(|| unsafe { cell.set(Some(stored)) });
    Ok(())
}
