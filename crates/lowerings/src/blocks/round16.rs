//! 16-bit float rounding: `is_16bit`, and `round_to`, which rounds a float32 intermediate to
//! float16/bfloat16 and back where PyTorch's CPU kernels compute in the 16-bit dtype.
use crate::cx::Cx;
use crate::dtype::DType;
use stablehlo::Value;

pub(crate) fn is_16bit(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Rounds a float32 intermediate to a 16-bit dtype and back: PyTorch's CPU loss kernels do
/// their elementwise arithmetic in the input dtype, rounding after every operation.
pub(crate) fn round_to(cx: &mut Cx, v: Value, dt: DType) -> Value {
    if !is_16bit(dt) {
        return v;
    }
    let acc = cx.dtype(v);
    let r = cx.cast(v, dt);
    cx.cast(r, acc)
}
