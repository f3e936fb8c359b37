//! NaN handling: `is_nan`, and `nan_min_max`, PyTorch's NaN-propagating maximum/minimum of
//! two values (torch.maximum, clamp).
use crate::cx::Cx;
use crate::dtype::DType;
use stablehlo::{CmpDir, Value};

pub(crate) fn is_nan(cx: &mut Cx, v: Value) -> Value {
    cx.compare(CmpDir::Ne, v, v)
}

/// max/min that propagate NaN like PyTorch.
pub(crate) fn nan_min_max(cx: &mut Cx, a: Value, b: Value, is_max: bool) -> Value {
    let m = if cx.dtype(a) == DType::Bool {
        if is_max { cx.or(a, b) } else { cx.and(a, b) }
    } else if is_max {
        cx.max(a, b)
    } else {
        cx.min(a, b)
    };
    if !cx.dtype(a).is_float() {
        return m;
    }
    let an = is_nan(cx, a);
    let bn = is_nan(cx, b);
    let m = cx.select(bn, b, m);
    cx.select(an, a, m)
}
