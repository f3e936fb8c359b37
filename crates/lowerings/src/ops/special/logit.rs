//! Log-domain functions: logit (and logit_backward), xlogy, xlog1py and entr.
use crate::args::{Arg, Args, Scalar};
use crate::blocks::reduce::acc_type;
use crate::cx::Cx;
use crate::dtype::{result_type, DType};
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{float_binary, float_result, float_unary, is_nan, k, no_complex};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("logit", logit),
    op("special_logit", logit),
    op("logit_backward", logit_backward),
    op("xlogy", |cx, a| xlog(cx, a, false)),
    op("special_xlogy", |cx, a| xlog(cx, a, false)),
    op("special_xlog1py", |cx, a| xlog(cx, a, true)),
    op("special_entr", entr),
];

// ---- logit, xlogy, entr ------------------------------------------------------------------------------

/// The `eps` of logit: a runtime value; None behaves like a negative eps (no clamping).
fn logit_eps(cx: &mut Cx, args: &Args, dt: DType, dims: &[i64]) -> Result<Value> {
    let s = match args.get("eps") {
        None | Some(Arg::None) => Scalar::Int(-1),
        _ => args.scalar("eps")?,
    };
    Ok(cx.scalar_like(s, dt, dims))
}

/// logit(self, eps): log(z / (1 - z)) with z = clamp(x, eps, 1 - eps) when eps >= 0.
fn logit(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(x.dtype, "logit")?;
    let dt = float_result(x.dtype);
    // PyTorch's vectorized kernel rounds each step in 16-bit floats: compute in `dt`.
    let v = cx.cast(x.v, dt);
    let dims = cx.dims(v);
    let eps = logit_eps(cx, args, dt, &dims)?;
    let one_ = k(cx, 1.0, v);
    let hi = cx.sub(one_, eps);
    let c = cx.max(v, eps);
    let c = cx.min(c, hi);
    // NaN stays NaN through the clamp, as std::min/max in PyTorch's kernel.
    let nan = is_nan(cx, v);
    let c = cx.select(nan, v, c);
    let zero = k(cx, 0.0, v);
    let no_clamp = cx.compare(CmpDir::Lt, eps, zero);
    let z = cx.select(no_clamp, v, c);
    let d = cx.sub(one_, z);
    let q = cx.div(z, d);
    let r = cx.log(q);
    one(cx.cast(r, dt))
}

/// logit_backward(grad_output, self, eps): grad / (x (1 - x)); outside [eps, 1 - eps] zero
/// (eps >= 0) or NaN outside [0, 1] (no eps), and grad * inf at 0 and 1 without eps.
fn logit_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let dt = result_type(&[(g.dtype, g.rank), (x.dtype, x.rank)]).unwrap();
    check!(dt.is_float(), NotImplemented, "\"logit_backward_cpu\" not implemented for '{}'", dt.torch_name());
    let acc = acc_type(dt);
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    let vs = cx.broadcast_all(&[gv, xv])?;
    let (gv, xv) = (vs[0], vs[1]);
    let dims = cx.dims(xv);
    let eps = logit_eps(cx, args, acc, &dims)?;
    let one_ = k(cx, 1.0, xv);
    let zero = k(cx, 0.0, xv);
    let omx = cx.sub(one_, xv);
    let den = cx.mul(xv, omx);
    let plain = cx.div(gv, den);
    // With eps: zero outside [eps, 1 - eps].
    let hi = cx.sub(one_, eps);
    let below = cx.compare(CmpDir::Lt, xv, eps);
    let above = cx.compare(CmpDir::Gt, xv, hi);
    let outside = cx.or(below, above);
    let clamped = cx.select(outside, zero, plain);
    // Without: NaN outside [0, 1], grad * inf at the ends.
    let nanv = k(cx, f64::NAN, xv);
    let inf = k(cx, f64::INFINITY, xv);
    let ginf = cx.mul(gv, inf);
    let at0 = cx.compare(CmpDir::Eq, xv, zero);
    let at1 = cx.compare(CmpDir::Eq, xv, one_);
    let ends = cx.or(at0, at1);
    let free = cx.select(ends, ginf, plain);
    let lo0 = cx.compare(CmpDir::Lt, xv, zero);
    let hi1 = cx.compare(CmpDir::Gt, xv, one_);
    let out01 = cx.or(lo0, hi1);
    let free = cx.select(out01, nanv, free);
    let no_eps = cx.compare(CmpDir::Lt, eps, zero);
    let r = cx.select(no_eps, free, clamped);
    one(cx.cast(r, dt))
}

/// xlogy(self, other) = x * log(y) (0 where x == 0, NaN where y is NaN); with `log1p`,
/// special_xlog1py = x * log1p(y). Either side may be a Python number.
fn xlog(cx: &mut Cx, args: &Args, log1p: bool) -> Result<Vec<Out>> {
    float_binary(cx, args, "self", "other", |cx, x, y| {
        let l = if log1p { cx.log1p(y) } else { cx.log(y) };
        let p = cx.mul(x, l);
        let zero = k(cx, 0.0, x);
        let x0 = cx.compare(CmpDir::Eq, x, zero);
        let r = cx.select(x0, zero, p);
        let yn = is_nan(cx, y);
        let nan = k(cx, f64::NAN, x);
        cx.select(yn, nan, r)
    })
}

/// special_entr: -x log x for x > 0, 0 at 0, -inf below, NaN for NaN.
fn entr(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    float_unary(cx, args, |cx, x| {
        let l = cx.log(x);
        let p = cx.mul(x, l);
        let p = cx.neg(p);
        let zero = k(cx, 0.0, x);
        let ninf = k(cx, f64::NEG_INFINITY, x);
        let pos = cx.compare(CmpDir::Gt, x, zero);
        let is0 = cx.compare(CmpDir::Eq, x, zero);
        let r = cx.select(is0, zero, ninf);
        let r = cx.select(pos, p, r);
        let nan = is_nan(cx, x);
        cx.select(nan, x, r)
    })
}
