//! Contractions: one dot_general summed in float32 for 16-bit floats, at HIGHEST precision for
//! float32 and wider (`contract`, `acc_dtype`).
use crate::cx::Cx;
use crate::dtype::DType;
use stablehlo::{Precision, Value};

/// One contraction of `a` and `b` (same dtype), summed in `acc_dtype`. Result dims: batch,
/// then a's free dims, then b's free dims.
pub(crate) fn contract(cx: &mut Cx, a: Value, b: Value, batch: (&[i64], &[i64]), contracting: (&[i64], &[i64])) -> Value {
    let d = cx.dtype(a);
    let acc = d.opmath();
    // f32 (and wider) must not run as reduced-precision passes; 16-bit inputs are exact anyway.
    let precise = matches!(d, DType::F32 | DType::F64 | DType::C64 | DType::C128);
    cx.set_precision(if precise { Some(Precision::Highest) } else { None });
    cx.dot_general(a, b, batch.0, batch.1, contracting.0, contracting.1, acc.elem())
}
