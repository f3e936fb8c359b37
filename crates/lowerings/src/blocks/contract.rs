//! Contractions: one dot_general summed in float32 for 16-bit floats, at the float32 matmul
//! precision for float32 (`contract`, `acc_dtype`).
use crate::cx::Cx;
use crate::blocks::precision;
use stablehlo::Value;

/// One contraction of `a` and `b` (same dtype), summed in `acc_dtype`. Result dims: batch,
/// then a's free dims, then b's free dims.
pub(crate) fn contract(cx: &mut Cx, a: Value, b: Value, batch: (&[i64], &[i64]), contracting: (&[i64], &[i64])) -> Value {
    let d = cx.dtype(a);
    let acc = d.opmath();
    precision::set_for(cx, d);
    cx.dot_general(a, b, batch.0, batch.1, contracting.0, contracting.1, acc.elem())
}
