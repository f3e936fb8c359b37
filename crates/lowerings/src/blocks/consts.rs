//! Constants shaped like a value or a shape: `k` (a float constant of a value's dtype and dims),
//! `ik` (an int64 splat) and `iota` (an int64 iota).
use crate::cx::Cx;
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
