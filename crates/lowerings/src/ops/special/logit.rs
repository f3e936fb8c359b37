//! Log-domain functions: logit (and logit_backward), xlogy, xlog1py and entr.
use crate::args::{Arg, Args, Scalar};
use crate::cx::Cx;
use crate::dtype::{result_type, DType};
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{float_binary, float_result, float_unary, no_complex};
use stablehlo::{Ex, Value};

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
    let e = Ex::new(cx);
    let [v, eps] = e.all([v, eps]);
    let c = v.max(eps).min(1.0 - eps);
    // NaN stays NaN through the clamp, as std::min/max in PyTorch's kernel.
    let c = v.ne(v).select(v, c);
    let z = eps.lt(0.0).select(v, c);
    let r = (z / (1.0 - z)).ln().v;
    one(cx.cast(r, dt))
}

/// logit_backward(grad_output, self, eps): grad / (x (1 - x)); outside [eps, 1 - eps] zero
/// (eps >= 0) or NaN outside [0, 1] (no eps), and grad * inf at 0 and 1 without eps.
fn logit_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let dt = result_type(&[(g.dtype, g.rank), (x.dtype, x.rank)]).unwrap();
    check!(dt.is_float(), NotImplemented, "\"logit_backward_cpu\" not implemented for '{}'", dt.torch_name());
    let acc = dt.opmath();
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    let vs = cx.broadcast_all(&[gv, xv])?;
    let (gv, xv) = (vs[0], vs[1]);
    let dims = cx.dims(xv);
    let eps = logit_eps(cx, args, acc, &dims)?;
    let e = Ex::new(cx);
    let [g, x, eps] = e.all([gv, xv, eps]);
    let plain = g / (x * (1.0 - x));
    // With eps: zero outside [eps, 1 - eps].
    let clamped = (x.lt(eps) | x.gt(1.0 - eps)).select(0.0, plain);
    // Without: NaN outside [0, 1], grad * inf at the ends.
    let free = (x.eq(0.0) | x.eq(1.0)).select(g * f64::INFINITY, plain);
    let free = (x.lt(0.0) | x.gt(1.0)).select(f64::NAN, free);
    let r = eps.lt(0.0).select(free, clamped).v;
    one(cx.cast(r, dt))
}

/// xlogy(self, other) = x * log(y) (0 where x == 0, NaN where y is NaN); with `log1p`,
/// special_xlog1py = x * log1p(y). Either side may be a Python number.
fn xlog(cx: &mut Cx, args: &Args, log1p: bool) -> Result<Vec<Out>> {
    float_binary(cx, args, "self", "other", |cx, x, y| {
        let e = Ex::new(cx);
        let [x, y] = e.all([x, y]);
        let p = x * if log1p { y.ln_1p() } else { y.ln() };
        let r = x.eq(0.0).select(0.0, p);
        y.ne(y).select(f64::NAN, r).v
    })
}

/// special_entr: -x log x for x > 0, 0 at 0, -inf below, NaN for NaN.
fn entr(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    float_unary(cx, args, |cx, x| {
        let e = Ex::new(cx);
        let x = e.of(x);
        let p = -(x * x.ln());
        let r = x.eq(0.0).select(0.0, x.k(f64::NEG_INFINITY));
        let r = x.gt(0.0).select(p, r);
        x.ne(x).select(x, r).v
    })
}
