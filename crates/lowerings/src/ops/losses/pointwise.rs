//! Losses of elementwise terms: mse_loss, huber_loss, smooth_l1_loss, binary_cross_entropy and
//! their backward ops. The arithmetic rounds to 16-bit floats where PyTorch's CPU kernels
//! compute in them (`round_to`).
use crate::args::{Args, Tensor};
// `constant` is this file's name for consts::k.
use crate::blocks::consts::k as constant;
use crate::blocks::round16::round_to;
use crate::cx::Cx;
use crate::dtype::{result_type, DType};
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{apply_reduction, reduction, Reduction};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("mse_loss", mse_loss),
    // The threshold decides the program's shape (beta = 0 is plain L1) and is validated.
    op("huber_loss", |cx, a| robust_loss(cx, a, false)).specialized(),
    op("huber_loss_backward", |cx, a| robust_loss_backward(cx, a, false)).specialized(),
    op("smooth_l1_loss", |cx, a| robust_loss(cx, a, true)).specialized(),
    op("smooth_l1_loss_backward", |cx, a| robust_loss_backward(cx, a, true)).specialized(),
    op("mse_loss_backward", mse_loss_backward),
    op("binary_cross_entropy", binary_cross_entropy),
    op("binary_cross_entropy_backward", binary_cross_entropy_backward),
];

// ---- mse_loss ------------------------------------------------------------------------------------

/// The promoted float dtype of a loss's operands, with PyTorch's error for integers.
/// A loss kernel's norm converted to an integer dtype like c10's checked Scalar conversion
/// (a mean over no elements is infinite and raises).
fn int_norm(norm: f64, dt: DType) -> Result<f64> {
    check!(norm.is_finite(), Runtime, "value cannot be converted to type {} without overflow", crate::blocks::type_names::convert_type_name(dt));
    Ok(norm.trunc())
}

/// The dtype of a loss backward whose CPU kernel also runs integers (mse, smooth_l1): Some
/// for an integral (not bool) result.
fn int_loss_dtype(ts: &[Tensor]) -> Option<DType> {
    let dt = result_type(&ts.iter().map(|t| (t.dtype, t.rank)).collect::<Vec<_>>()).unwrap();
    (dt.is_integral() && dt != DType::Bool).then_some(dt)
}

fn loss_dtype(ts: &[Tensor], kernel: &str) -> Result<DType> {
    let dt = result_type(&ts.iter().map(|t| (t.dtype, t.rank)).collect::<Vec<_>>()).unwrap();
    check!(dt.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    Ok(dt)
}

/// mse_loss(self, target, reduction): (self - target)^2, broadcast, reduced.
fn mse_loss(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let y = args.tensor("target")?;
    let dt = loss_dtype(&[x, y], "mse_cpu")?;
    let red = reduction(args)?;
    let acc = dt.opmath();
    let a = cx.cast(x.v, dt);
    let a = cx.cast(a, acc);
    let b = cx.cast(y.v, dt);
    let b = cx.cast(b, acc);
    let vs = cx.broadcast_all(&[a, b])?;
    let d = cx.sub(vs[0], vs[1]);
    let d = round_to(cx, d, dt);
    let l = cx.mul(d, d);
    let l = round_to(cx, l, dt);
    let r = apply_reduction(cx, l, red);
    one(cx.cast(r, dt))
}

/// mse_loss_backward(grad_output, self, target, reduction) = 2 (self - target) grad / N.
fn mse_loss_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let y = args.tensor("target")?;
    let red = reduction(args)?;
    if let Some(dt) = int_loss_dtype(&[x, y, g]) {
        // PyTorch's integer kernel: the norm (2 / numel for a mean) truncated to the dtype.
        let norm = int_norm(if red == Reduction::Mean { 2.0 / cx.numel(x.v) as f64 } else { 2.0 }, dt)?;
        let vals: Vec<Value> = [x, y, g].iter().map(|t| cx.cast(t.v, dt)).collect();
        let vs = cx.broadcast_all(&vals)?;
        let d = cx.sub(vs[0], vs[1]);
        let k = constant(cx, norm, d);
        let d = cx.mul(k, d);
        return one(cx.mul(d, vs[2]));
    }
    let dt = loss_dtype(&[x, y, g], "mse_backward_cpu")?;
    let acc = dt.opmath();
    let norm = if red == Reduction::Mean { 2.0 / cx.numel(x.v) as f64 } else { 2.0 };
    let vals: Vec<Value> = [x, y, g]
        .iter()
        .map(|t| {
            let v = cx.cast(t.v, dt);
            cx.cast(v, acc)
        })
        .collect();
    let vs = cx.broadcast_all(&vals)?;
    let d = cx.sub(vs[0], vs[1]);
    let d = round_to(cx, d, dt);
    let k = constant(cx, norm, d);
    let k = round_to(cx, k, dt);
    let d = cx.mul(k, d);
    let d = round_to(cx, d, dt);
    let r = cx.mul(d, vs[2]);
    one(cx.cast(r, dt))
}

// ---- binary_cross_entropy -----------------------------------------------------------------------

/// The operands of binary_cross_entropy(_backward): input, target and weight in `acc`,
/// broadcast to the input's shape.
fn bce_operands(cx: &mut Cx, args: &Args) -> Result<(Tensor, Vec<Value>, Option<Value>, DType)> {
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    check!(x.dtype.is_float(), NotImplemented, "\"binary_cross_entropy\" not implemented for '{}'", x.dtype.torch_name());
    check!(t.dtype == x.dtype, Runtime, "Found dtype {} but expected {}", t.dtype.torch_name(), x.dtype.torch_name());
    let acc = x.dtype.opmath();
    let xv = cx.cast(x.v, acc);
    let tv = cx.cast(t.v, acc);
    let vs = cx.broadcast_all(&[xv, tv])?;
    let w = match args.opt_tensor("weight")? {
        Some(w) => {
            check!(w.dtype == x.dtype, Runtime, "Found dtype {} but expected {}", w.dtype.torch_name(), x.dtype.torch_name());
            let wv = cx.cast(w.v, acc);
            let shape = cx.dims(vs[0]);
            let b = crate::broadcast_shapes(&[shape.clone(), cx.dims(wv)])?;
            check!(b == shape, Runtime, "output with shape {:?} doesn't match the broadcast shape {:?}", shape, b);
            Some(cx.broadcast_to(wv, &shape))
        }
        None => None,
    };
    Ok((x, vs, w, acc))
}

/// binary_cross_entropy(self, target, weight, reduction), logs clamped at -100 like PyTorch.
/// PyTorch's check that inputs lie in [0, 1] needs the data and is not made here.
fn binary_cross_entropy(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let red = reduction(args)?;
    let (x, vs, w, _) = bce_operands(cx, args)?;
    let dt = x.dtype;
    let (xv, tv) = (vs[0], vs[1]);
    let floor = constant(cx, -100.0, xv);
    let lx = cx.log(xv);
    let lx = round_to(cx, lx, dt);
    let lx = cx.max(lx, floor);
    let nx = cx.neg(xv);
    let l1x = cx.log1p(nx);
    let l1x = round_to(cx, l1x, dt);
    let l1x = cx.max(l1x, floor);
    // (t - 1) * log(1 - x) - t * log(x)
    let one_ = constant(cx, 1.0, tv);
    let tm1 = cx.sub(tv, one_);
    let tm1 = round_to(cx, tm1, dt);
    let a = cx.mul(tm1, l1x);
    let a = round_to(cx, a, dt);
    let b = cx.mul(tv, lx);
    let b = round_to(cx, b, dt);
    let mut l = cx.sub(a, b);
    l = round_to(cx, l, dt);
    if let Some(w) = w {
        l = cx.mul(l, w);
        l = round_to(cx, l, dt);
    }
    let r = apply_reduction(cx, l, red);
    one(cx.cast(r, dt))
}

/// binary_cross_entropy_backward(grad_output, self, target, weight, reduction):
/// grad * (x - t) / max((1 - x) x, 1e-12) * weight, over N for the mean.
fn binary_cross_entropy_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let red = reduction(args)?;
    let g = args.tensor("grad_output")?;
    let (x, vs, w, acc) = bce_operands(cx, args)?;
    let dt = x.dtype;
    let (xv, tv) = (vs[0], vs[1]);
    let shape = cx.dims(xv);
    let gv = cx.cast(g.v, dt);
    let gv = cx.cast(gv, acc);
    let gv = cx.broadcast_to(gv, &shape);
    let one_ = constant(cx, 1.0, xv);
    let omx = cx.sub(one_, xv);
    let omx = round_to(cx, omx, dt);
    let den = cx.mul(omx, xv);
    let den = round_to(cx, den, dt);
    let eps = constant(cx, 1e-12, xv);
    let eps = round_to(cx, eps, dt);
    let den = cx.max(den, eps);
    let num = cx.sub(xv, tv);
    let num = round_to(cx, num, dt);
    let num = cx.mul(gv, num);
    let num = round_to(cx, num, dt);
    let mut r = cx.div(num, den);
    r = round_to(cx, r, dt);
    if let Some(w) = w {
        r = cx.mul(r, w);
        r = round_to(cx, r, dt);
    }
    if red == Reduction::Mean {
        let count = cx.numel(xv) as f64;
        let n = constant(cx, count, r);
        r = cx.div(r, n);
    }
    one(cx.cast(r, dt))
}

// ---- huber_loss, smooth_l1_loss ----------------------------------------------------------------

/// The threshold of huber_loss (delta > 0) or smooth_l1_loss (beta >= 0).
fn robust_threshold(args: &Args, smooth_l1: bool) -> Result<f64> {
    let (name, default) = if smooth_l1 { ("beta", 1.0) } else { ("delta", 1.0) };
    let t = match args.opt_scalar(name)? {
        None => default,
        Some(s) => s.to_real(DType::F64)?.to_f64(),
    };
    if smooth_l1 {
        check!(t >= 0.0, Runtime, "smooth_l1_loss does not support negative values for beta.");
    } else {
        check!(t > 0.0, Runtime, "huber_loss does not support non-positive values for delta.");
    }
    Ok(t)
}

/// huber_loss: 0.5 d^2 where |d| < delta, else delta (|d| - delta / 2);
/// smooth_l1_loss: the same divided by beta (plain |d| when beta = 0).
fn robust_loss(cx: &mut Cx, args: &Args, smooth_l1: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let y = args.tensor("target")?;
    let dt = loss_dtype(&[x, y], if smooth_l1 { "smooth_l1_cpu" } else { "huber_cpu" })?;
    let red = reduction(args)?;
    let t = robust_threshold(args, smooth_l1)?;
    let acc = dt.opmath();
    let a = cx.cast(x.v, acc);
    let b = cx.cast(y.v, acc);
    let vs = cx.broadcast_all(&[a, b])?;
    let d = cx.sub(vs[0], vs[1]);
    let ad = cx.abs(d);
    let l = if smooth_l1 && t == 0.0 {
        ad
    } else {
        let half = constant(cx, 0.5, ad);
        let sq = cx.mul(ad, ad);
        let sq = cx.mul(half, sq);
        let tv = constant(cx, t, ad);
        let ht = constant(cx, 0.5 * t, ad);
        let lin = cx.sub(ad, ht);
        let (quad, lin) = if smooth_l1 { (cx.div(sq, tv), lin) } else { (sq, cx.mul(tv, lin)) };
        let small = cx.compare(CmpDir::Lt, ad, tv);
        cx.select(small, quad, lin)
    };
    let r = apply_reduction(cx, l, red);
    one(cx.cast(r, dt))
}

/// The gradient of robust_loss with respect to self.
fn robust_loss_backward(cx: &mut Cx, args: &Args, smooth_l1: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let y = args.tensor("target")?;
    let red = reduction(args)?;
    let t = robust_threshold(args, smooth_l1)?;
    if let (true, Some(dt)) = (smooth_l1, int_loss_dtype(&[x, y, g])) {
        // PyTorch's integer kernel (its vectorized loop, which most elements take):
        // norm * (x >= beta ? sign(x) : x / beta) * grad, beta and norm truncated to the dtype
        // (norm is 1 / numel for a mean).
        let norm = int_norm(if red == Reduction::Mean { 1.0 / cx.numel(x.v) as f64 } else { 1.0 }, dt)?;
        let vals: Vec<Value> = [x, y, g].iter().map(|t| cx.cast(t.v, dt)).collect();
        let vs = cx.broadcast_all(&vals)?;
        let d = cx.sub(vs[0], vs[1]);
        let zero = constant(cx, 0.0, d);
        let pos = cx.compare(CmpDir::Gt, d, zero);
        let p1 = constant(cx, 1.0, d);
        let m1 = constant(cx, -1.0, d);
        let sign = cx.select(pos, p1, m1);
        let bt = t.trunc();
        let bv = constant(cx, bt, d);
        let ad = cx.abs(d);
        let big = cx.compare(CmpDir::Ge, ad, bv);
        // beta 0 never divides (|x| >= 0); keep the divisor nonzero for the unused lanes.
        let safe = if bt == 0.0 { p1 } else { bv };
        let q = cx.div(d, safe);
        let o = cx.select(big, sign, q);
        let k = constant(cx, norm, d);
        let o = cx.mul(k, o);
        return one(cx.mul(o, vs[2]));
    }
    let dt = loss_dtype(&[x, y, g], if smooth_l1 { "smooth_l1_backward_cpu" } else { "huber_backward_cpu" })?;
    let acc = dt.opmath();
    let vals: Vec<Value> = [x, y, g].iter().map(|t| cx.cast(t.v, acc)).collect();
    let vs = cx.broadcast_all(&vals)?;
    let d = cx.sub(vs[0], vs[1]);
    let ad = cx.abs(d);
    let sign = cx.sign(d);
    let dl = if smooth_l1 && t == 0.0 {
        sign
    } else {
        let tv = constant(cx, t, ad);
        let small = cx.compare(CmpDir::Lt, ad, tv);
        let (inner, outer) = if smooth_l1 { (cx.div(d, tv), sign) } else { (d, cx.mul(tv, sign)) };
        cx.select(small, inner, outer)
    };
    let mut gr = cx.mul(dl, vs[2]);
    if red == Reduction::Mean {
        let n = constant(cx, cx.numel(x.v) as f64, gr);
        gr = cx.div(gr, n);
    }
    one(cx.cast(gr, dt))
}
