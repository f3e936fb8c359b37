//! Constants: `k` (a float constant of a value's dtype and dims), `ik` (an int64 splat),
//! `iota` (an int64 iota), `I64` (the index dtype) and `extremes` (a dtype's lowest and
//! highest values, as fills).
use crate::cx::Cx;
use crate::dtype::DType;
use stablehlo::{ElemType, TensorType, Value};

/// A constant of `like`'s dtype and dims.
pub(crate) fn k(cx: &mut Cx, x: f64, like: Value) -> Value {
    let dt = cx.dtype(like);
    let dims = cx.dims(like);
    cx.full(x, dt, &dims)
}

pub(crate) fn ik(cx: &mut Cx, x: i64, dims: &[i64]) -> Value {
    cx.b.splat_i64(x, &TensorType::new(ElemType::I64, dims))
}

pub(crate) fn iota(cx: &mut Cx, dims: &[i64], dim: i64) -> Value {
    cx.iota(&TensorType::new(ElemType::I64, dims), dim)
}

pub(crate) const I64: DType = DType::I64;

pub(crate) type Fill = Box<dyn Fn(&mut Cx, &[i64]) -> Value>;

/// The lowest and highest values of a dtype, as fills.
pub(crate) fn extremes(dtype: DType) -> (Fill, Fill) {
    use DType::*;
    if dtype.is_float() {
        return (
            Box::new(move |cx, d| cx.full(f64::NEG_INFINITY, dtype, d)),
            Box::new(move |cx, d| cx.full(f64::INFINITY, dtype, d)),
        );
    }
    let (lo, hi): (i64, i64) = match dtype {
        Bool => (0, 1),
        U8 => (0, u8::MAX as i64),
        I8 => (i8::MIN as i64, i8::MAX as i64),
        I16 => (i16::MIN as i64, i16::MAX as i64),
        I32 => (i32::MIN as i64, i32::MAX as i64),
        U16 => (0, u16::MAX as i64),
        U32 => (0, u32::MAX as i64),
        U64 => (0, -1),
        _ => (i64::MIN, i64::MAX),
    };
    let e = dtype.elem();
    (
        Box::new(move |cx, d| cx.splat_i64(lo, &TensorType::new(e, d))),
        Box::new(move |cx, d| cx.splat_i64(hi, &TensorType::new(e, d))),
    )
}
