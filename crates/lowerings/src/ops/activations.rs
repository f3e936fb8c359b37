//! Activation functions and their backward ops: relu (threshold_backward), gelu, silu,
//! leaky_relu, elu, hardtanh, softplus, hardsigmoid, hardswish, mish, log_sigmoid,
//! hard/softshrink, threshold, glu, prelu and rrelu; the backward ops of sigmoid and tanh; and
//! native_dropout. 16-bit floats compute in f32 and round once, like PyTorch's CPU kernels.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::consts::k;
use crate::blocks::type_names::{check_float_kernel, check_scalar_type};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::{result_type, DType};
use crate::error::{Result, TorchError};
use crate::{bail, check, one, Out, op, Op};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("threshold", threshold).pointwise(),
    op("threshold_backward", threshold_backward).pointwise(),
    op("gelu_backward", gelu_backward).pointwise(),
    op("silu_backward", silu_backward).pointwise(),
    op("sigmoid_backward", sigmoid_backward).pointwise(),
    op("tanh_backward", tanh_backward).pointwise(),
    op("leaky_relu", leaky_relu).pointwise(),
    // Both check a float argument's value: compiled in, so a cached program never skips it.
    op("leaky_relu_backward", leaky_relu_backward).specialized(),
    op("elu", elu).pointwise(),
    op("elu_backward", elu_backward).specialized(),
    op("hardtanh", hardtanh).pointwise(),
    op("hardtanh_backward", hardtanh_backward).pointwise(),
    op("softplus", softplus).pointwise(),
    op("softplus_backward", softplus_backward).pointwise(),
    op("hardsigmoid", hardsigmoid).pointwise(),
    op("hardsigmoid_backward", hardsigmoid_backward).pointwise(),
    op("hardswish", hardswish).pointwise(),
    op("hardswish_backward", hardswish_backward).pointwise(),
    op("mish", mish).pointwise(),
    op("mish_backward", mish_backward).pointwise(),
    op("log_sigmoid_forward", log_sigmoid_forward),
    op("log_sigmoid_backward", log_sigmoid_backward),
    op("hardshrink", hardshrink),
    op("hardshrink_backward", hardshrink_backward),
    op("softshrink", softshrink).specialized(),
    op("softshrink_backward", softshrink_backward),
    op("glu", glu),
    op("glu_backward", glu_backward),
    op("glu_jvp", glu_jvp),
    op("glu_backward_jvp", glu_backward_jvp),
    op("_prelu_kernel", prelu_kernel),
    op("_prelu_kernel_backward", prelu_kernel_backward),
    op("native_dropout", native_dropout).specialized(),
    op("native_dropout_backward", native_dropout_backward),
    // lower <= upper is checked, so the bounds are compiled in.
    op("rrelu_with_noise", rrelu_with_noise).specialized(),
    op("rrelu_with_noise_functional", rrelu_with_noise_functional).specialized(),
    op("relu", relu).pointwise(),
    op("gelu", gelu).pointwise(),
    op("silu", silu).pointwise(),
];

// ---- helpers ---------------------------------------------------------------------------------

fn float_kernel(d: DType, kernel: &str) -> Result<()> {
    check!(d.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, d.torch_name());
    Ok(())
}

/// A Scalar argument shaped like `like` (a runtime input for floats unless specialized).
fn s(cx: &mut Cx, args: &Args, name: &str, like: Value) -> Result<Value> {
    let sc = args.scalar(name)?;
    let (dt, dims) = (cx.dtype(like), cx.dims(like));
    Ok(cx.scalar_like(sc, dt, &dims))
}

/// A float-only unary activation: `f` gets `self` in the compute dtype.
fn unary(
    cx: &mut Cx,
    args: &Args,
    kernel: &str,
    f: impl FnOnce(&mut Cx, &Args, Value) -> Result<Value>,
) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    float_kernel(x.dtype, kernel)?;
    let v = cx.cast(x.v, x.dtype.opmath());
    let out = f(cx, args, v)?;
    one(cx.cast(out, x.dtype))
}

/// A backward op over (grad, x): both promoted together, broadcast, lifted to the compute
/// dtype; `f(grad, x)` gives the gradient.
fn backward(
    cx: &mut Cx,
    args: &Args,
    grad_name: &str,
    x_name: &str,
    kernel: &str,
    f: impl FnOnce(&mut Cx, &Args, Value, Value, DType) -> Result<Value>,
) -> Result<Vec<Out>> {
    let g = args.tensor(grad_name)?;
    let x = args.tensor(x_name)?;
    let dt = result_type(&[(g.dtype, g.rank), (x.dtype, x.rank)]).unwrap();
    float_kernel(dt, kernel)?;
    let cdt = dt.opmath();
    let gv = cx.cast(g.v, cdt);
    let xv = cx.cast(x.v, cdt);
    let vs = cx.broadcast_all(&[gv, xv])?;
    let out = f(cx, args, vs[0], vs[1], dt)?;
    one(cx.cast(out, dt))
}

/// `cond ? a : b` with `b` (or `a`) zero.
fn zero_where(cx: &mut Cx, cond: Value, v: Value) -> Value {
    let z = k(cx, 0.0, v);
    cx.select(cond, z, v)
}

fn softplus_value(cx: &mut Cx, x: Value) -> Value {
    // log1p(exp(x)), as PyTorch's mish computes it.
    let e = cx.exp(x);
    cx.log1p(e)
}

// ---- threshold / relu --------------------------------------------------------------------------

/// threshold(self, threshold, value): x <= threshold ? value : x, in self's dtype.
fn threshold(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype != DType::Bool, NotImplemented, "\"threshold_cpu\" not implemented for 'Bool'");
    let cdt = x.dtype.opmath();
    let v = cx.cast(x.v, cdt);
    let th = s(cx, args, "threshold", v)?;
    let val = s(cx, args, "value", v)?;
    let le = cx.compare(CmpDir::Le, v, th);
    let out = cx.select(le, val, v);
    one(cx.cast(out, x.dtype))
}

/// threshold_backward(grad, self, threshold): self <= threshold ? 0 : grad.
fn threshold_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let dt = result_type(&[(g.dtype, g.rank), (x.dtype, x.rank)]).unwrap();
    check!(dt != DType::Bool, NotImplemented, "\"threshold_cpu\" not implemented for 'Bool'");
    let cdt = dt.opmath();
    let gv = cx.cast(g.v, cdt);
    let xv = cx.cast(x.v, cdt);
    let vs = cx.broadcast_all(&[gv, xv])?;
    let th = s(cx, args, "threshold", vs[1])?;
    let le = cx.compare(CmpDir::Le, vs[1], th);
    let out = zero_where(cx, le, vs[0]);
    one(cx.cast(out, dt))
}

// ---- relu, gelu, silu --------------------------------------------------------------------------

fn relu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype != DType::Bool, NotImplemented, "\"clamp_min_cpu\" not implemented for 'Bool'");
    let zero = cx.full(0.0, x.dtype, &cx.dims(x.v));
    let neg = cx.compare(CmpDir::Lt, x.v, zero);
    one(cx.select(neg, zero, x.v))
}

fn gelu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_float(), NotImplemented, "\"GeluKernelImpl\" not implemented for '{}'", x.dtype.torch_name());
    let approximate = args.str("approximate")?.unwrap_or("none");
    let (dt, dims) = (x.dtype, cx.dims(x.v));
    let c = |cx: &mut Cx, v: f64| cx.full(v, dt, &dims);
    let half = c(cx, 0.5);
    let one_ = c(cx, 1.0);
    let inner = match approximate {
        "none" => {
            let k = c(cx, std::f64::consts::FRAC_1_SQRT_2);
            let s = cx.mul(x.v, k);
            cx.chlo("erf", &[s])
        }
        "tanh" => {
            let k0 = c(cx, (2.0 / std::f64::consts::PI).sqrt());
            let k1 = c(cx, 0.044715);
            let x3 = cx.mul(x.v, x.v);
            let x3 = cx.mul(x3, x.v);
            let t = cx.mul(k1, x3);
            let t = cx.add(x.v, t);
            let t = cx.mul(k0, t);
            cx.tanh(t)
        }
        other => bail!(Runtime, "approximate argument must be either none or tanh. Got {}", other),
    };
    let t = cx.add(one_, inner);
    let t = cx.mul(x.v, t);
    one(cx.mul(half, t))
}

fn silu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_float() || x.dtype.is_complex(), NotImplemented, "\"silu_cpu\" not implemented for '{}'", x.dtype.torch_name());
    let s = cx.logistic(x.v);
    one(cx.mul(x.v, s))
}

// ---- gelu, silu, sigmoid, tanh backward -------------------------------------------------------

fn gelu_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let approximate = args.str("approximate")?.unwrap_or("none").to_string();
    backward(cx, args, "grad_output", "self", "GeluBackwardKernelImpl", |cx, _, g, x, _| {
        let d = match approximate.as_str() {
            "none" => {
                // cdf + x * pdf
                let r = k(cx, std::f64::consts::FRAC_1_SQRT_2, x);
                let xs = cx.mul(x, r);
                let erf = cx.chlo("erf", &[xs]);
                let one_ = k(cx, 1.0, x);
                let half = k(cx, 0.5, x);
                let cdf = cx.add(one_, erf);
                let cdf = cx.mul(half, cdf);
                let mh = k(cx, -0.5, x);
                let x2 = cx.mul(x, x);
                let e = cx.mul(mh, x2);
                let e = cx.exp(e);
                let c = k(cx, 1.0 / (2.0 * std::f64::consts::PI).sqrt(), x);
                let pdf = cx.mul(e, c);
                let xp = cx.mul(x, pdf);
                cx.add(cdf, xp)
            }
            "tanh" => {
                let beta = k(cx, (2.0 / std::f64::consts::PI).sqrt(), x);
                let kappa = k(cx, 0.044715, x);
                let x2 = cx.mul(x, x);
                let x3 = cx.mul(x2, x);
                let inner = cx.mul(kappa, x3);
                let inner = cx.add(x, inner);
                let inner = cx.mul(beta, inner);
                let t = cx.tanh(inner);
                let half = k(cx, 0.5, x);
                let one_ = k(cx, 1.0, x);
                let left = cx.mul(half, x);
                let right = cx.add(one_, t);
                let left_d = cx.mul(half, right);
                let t2 = cx.mul(t, t);
                let sech2 = cx.sub(one_, t2);
                let three_kappa = k(cx, 3.0 * 0.044715, x);
                let inner_d = cx.mul(three_kappa, x2);
                let inner_d = cx.add(one_, inner_d);
                let inner_d = cx.mul(beta, inner_d);
                let right_d = cx.mul(left, sech2);
                let right_d = cx.mul(right_d, inner_d);
                cx.add(left_d, right_d)
            }
            other => bail!(Runtime, "approximate argument must be either none or tanh. Got {}", other),
        };
        Ok(cx.mul(g, d))
    })
}

fn silu_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "silu_backward_cpu", |cx, _, g, x, _| {
        // grad * sigmoid(x) * (1 + x * (1 - sigmoid(x)))
        let sg = cx.logistic(x);
        let one_ = k(cx, 1.0, x);
        let t = cx.sub(one_, sg);
        let t = cx.mul(x, t);
        let t = cx.add(one_, t);
        let t = cx.mul(sg, t);
        Ok(cx.mul(g, t))
    })
}

fn sigmoid_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "output", "sigmoid_backward_cpu", |cx, _, g, y, _| {
        let one_ = k(cx, 1.0, y);
        let t = cx.sub(one_, y);
        let t = cx.mul(g, t);
        Ok(cx.mul(t, y))
    })
}

fn tanh_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "output", "tanh_backward_cpu", |cx, _, g, y, _| {
        let one_ = k(cx, 1.0, y);
        let y2 = cx.mul(y, y);
        let t = cx.sub(one_, y2);
        Ok(cx.mul(g, t))
    })
}

// ---- leaky_relu, elu ------------------------------------------------------------------------

fn leaky_relu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    unary(cx, args, "leaky_relu_cpu", |cx, args, x| {
        let slope = s(cx, args, "negative_slope", x)?;
        let z = k(cx, 0.0, x);
        let pos = cx.compare(CmpDir::Gt, x, z);
        let neg = cx.mul(x, slope);
        Ok(cx.select(pos, x, neg))
    })
}

fn leaky_relu_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let slope = args.scalar("negative_slope")?.to_f64();
    check!(
        !(args.bool("self_is_result")? && slope < 0.0),
        Runtime,
        "In-place leakyReLu backward calculation is triggered with a negative slope which is not supported. \
         This is caused by calling in-place forward function with a negative slope, please call out-of-place \
         version instead. File an issue at https://github.com/pytorch/pytorch if you do require supporting \
         in-place leakRelu backward calculation with negative slope"
    );
    backward(cx, args, "grad_output", "self", "leaky_relu_backward_cpu", |cx, args, g, x, _| {
        let slope = s(cx, args, "negative_slope", x)?;
        let z = k(cx, 0.0, x);
        let pos = cx.compare(CmpDir::Gt, x, z);
        let neg = cx.mul(g, slope);
        Ok(cx.select(pos, g, neg))
    })
}

fn elu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    unary(cx, args, "elu_cpu", |cx, args, x| {
        let alpha = s(cx, args, "alpha", x)?;
        let scale = s(cx, args, "scale", x)?;
        let input_scale = s(cx, args, "input_scale", x)?;
        let z = k(cx, 0.0, x);
        let le = cx.compare(CmpDir::Le, x, z);
        let xs = cx.mul(x, input_scale);
        let e = cx.expm1(xs);
        let negcoef = cx.mul(alpha, scale);
        let neg = cx.mul(e, negcoef);
        let pos = cx.mul(x, scale);
        Ok(cx.select(le, neg, pos))
    })
}

fn elu_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let is_result = args.bool("is_result")?;
    check!(
        !(is_result && args.scalar("alpha")?.to_f64() < 0.0),
        Runtime,
        "In-place elu backward calculation is triggered with a negative slope which is not supported. \
         This is caused by calling in-place forward function with a negative slope, please call out-of-place \
         version instead."
    );
    backward(cx, args, "grad_output", "self_or_result", "elu_backward_cpu", |cx, args, g, x, _| {
        let alpha = s(cx, args, "alpha", x)?;
        let scale = s(cx, args, "scale", x)?;
        let input_scale = s(cx, args, "input_scale", x)?;
        let negcoef = cx.mul(alpha, scale);
        let z = k(cx, 0.0, x);
        let le = cx.compare(CmpDir::Le, x, z);
        let neg = if is_result {
            // x is the result: d/dx = input_scale * (y + negcoef)
            let t = cx.add(x, negcoef);
            let t = cx.mul(t, input_scale);
            cx.mul(g, t)
        } else {
            let xs = cx.mul(x, input_scale);
            let e = cx.exp(xs);
            let t = cx.mul(input_scale, negcoef);
            let t = cx.mul(t, e);
            cx.mul(g, t)
        };
        let pos = cx.mul(g, scale);
        Ok(cx.select(le, neg, pos))
    })
}

// ---- hardtanh, softplus, hard sigmoid/swish, mish ----------------------------------------------

fn hardtanh(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    if x.dtype == DType::Bool {
        return Err(TorchError::new(crate::torch_version::bool_activation_error(), "Bool inputs not supported for hardtanh"));
    }
    let cdt = x.dtype.opmath();
    let v = cx.cast(x.v, cdt);
    let lo = match args.opt_scalar("min_val")? {
        Some(sc) => cx.scalar_like(sc, cdt, &cx.dims(v)),
        None => k(cx, -1.0, v),
    };
    let hi = match args.opt_scalar("max_val")? {
        Some(sc) => cx.scalar_like(sc, cdt, &cx.dims(v)),
        None => k(cx, 1.0, v),
    };
    // clamp: NaN stays NaN.
    let out = crate::blocks::nan::nan_min_max(cx, v, lo, true);
    let out = crate::blocks::nan::nan_min_max(cx, out, hi, false);
    one(cx.cast(out, x.dtype))
}

fn hardtanh_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "hardshrink_backward_cpu", |cx, args, g, x, _| {
        let lo = s(cx, args, "min_val", x)?;
        let hi = s(cx, args, "max_val", x)?;
        let a = cx.compare(CmpDir::Le, x, lo);
        let b = cx.compare(CmpDir::Ge, x, hi);
        let out_of = cx.or(a, b);
        Ok(zero_where(cx, out_of, g))
    })
}

fn softplus(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    unary(cx, args, "softplus_cpu", |cx, args, x| {
        let beta = s(cx, args, "beta", x)?;
        let th = s(cx, args, "threshold", x)?;
        let xb = cx.mul(x, beta);
        let big = cx.compare(CmpDir::Gt, xb, th);
        let e = cx.exp(xb);
        let l = cx.log1p(e);
        let l = cx.div(l, beta);
        Ok(cx.select(big, x, l))
    })
}

fn softplus_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "softplus_backward_cpu", |cx, args, g, x, _| {
        let beta = s(cx, args, "beta", x)?;
        let th = s(cx, args, "threshold", x)?;
        let xb = cx.mul(x, beta);
        let big = cx.compare(CmpDir::Gt, xb, th);
        let z = cx.exp(xb);
        let one_ = k(cx, 1.0, x);
        let z1 = cx.add(z, one_);
        let t = cx.mul(g, z);
        let t = cx.div(t, z1);
        Ok(cx.select(big, g, t))
    })
}

/// min(max(x + 3, 0), 6) / 6
fn hardsigmoid_value(cx: &mut Cx, x: Value) -> Value {
    let three = k(cx, 3.0, x);
    let zero = k(cx, 0.0, x);
    let six = k(cx, 6.0, x);
    let t = cx.add(x, three);
    let t = crate::blocks::nan::nan_min_max(cx, t, zero, true);
    let t = crate::blocks::nan::nan_min_max(cx, t, six, false);
    cx.div(t, six)
}

fn hardsigmoid(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    unary(cx, args, "hardsigmoid_cpu", |cx, _, x| Ok(hardsigmoid_value(cx, x)))
}

fn hardsigmoid_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "hardsigmoid_backward", |cx, _, g, x, _| {
        let lo = k(cx, -3.0, x);
        let hi = k(cx, 3.0, x);
        let a = cx.compare(CmpDir::Gt, x, lo);
        let b = cx.compare(CmpDir::Lt, x, hi);
        let inside = cx.and(a, b);
        let sixth = k(cx, 1.0 / 6.0, x);
        let d = cx.mul(g, sixth);
        let z = k(cx, 0.0, x);
        Ok(cx.select(inside, d, z))
    })
}

fn hardswish(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    unary(cx, args, "hardswish_cpu", |cx, _, x| {
        let h = hardsigmoid_value(cx, x);
        Ok(cx.mul(x, h))
    })
}

fn hardswish_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "hardswish_backward", |cx, _, g, x, _| {
        let lo = k(cx, -3.0, x);
        let hi = k(cx, 3.0, x);
        let below = cx.compare(CmpDir::Lt, x, lo);
        let mid = cx.compare(CmpDir::Le, x, hi);
        let half = k(cx, 0.5, x);
        let three = k(cx, 3.0, x);
        let d = cx.div(x, three);
        let d = cx.add(d, half);
        let d = cx.mul(g, d);
        let z = k(cx, 0.0, x);
        let out = cx.select(mid, d, g);
        Ok(cx.select(below, z, out))
    })
}

fn mish(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    unary(cx, args, "mish_cpu", |cx, _, x| {
        let sp = softplus_value(cx, x);
        let t = cx.tanh(sp);
        Ok(cx.mul(x, t))
    })
}

fn mish_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "mish_backward_cpu", |cx, _, g, x, _| {
        // grad * (tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2))
        let sg = cx.logistic(x);
        let sp = softplus_value(cx, x);
        let t = cx.tanh(sp);
        let one_ = k(cx, 1.0, x);
        let t2 = cx.mul(t, t);
        let d = cx.sub(one_, t2);
        let d = cx.mul(sg, d);
        let d = cx.mul(x, d);
        let d = cx.add(t, d);
        Ok(cx.mul(g, d))
    })
}

// ---- log_sigmoid -------------------------------------------------------------------------------

/// log_sigmoid_forward(self) -> (output, buffer): output = min(x, 0) - log1p(exp(-|x|)); the
/// buffer holds exp(-|x|) as on CPU.
fn log_sigmoid_forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    float_kernel(x.dtype, "log_sigmoid_cpu")?;
    let v = cx.cast(x.v, x.dtype.opmath());
    let zero = k(cx, 0.0, v);
    let a = cx.abs(v);
    let na = cx.neg(a);
    let z = cx.exp(na);
    let m = crate::blocks::nan::nan_min_max(cx, v, zero, false);
    let l = cx.log1p(z);
    let out = cx.sub(m, l);
    let out = cx.cast(out, x.dtype);
    let buf = cx.cast(z, x.dtype);
    Ok(vec![Out::Tensor(out), Out::Tensor(buf)])
}

/// log_sigmoid_backward(grad, self, buffer): (max_deriv - sign * z / (1 + z)) * grad with
/// z = exp(-|x|), recomputed from self (the buffer may be empty, as CUDA leaves it).
fn log_sigmoid_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "log_sigmoid_backward_cpu", |cx, _, g, x, _| {
        let zero = k(cx, 0.0, x);
        let one_ = k(cx, 1.0, x);
        let neg = cx.compare(CmpDir::Lt, x, zero);
        let max_deriv = cx.select(neg, one_, zero);
        let m1 = k(cx, -1.0, x);
        let sign = cx.select(neg, one_, m1);
        let a = cx.abs(x);
        let na = cx.neg(a);
        let z = cx.exp(na);
        let z1 = cx.add(one_, z);
        let f = cx.div(z, z1);
        let f = cx.mul(sign, f);
        let d = cx.sub(max_deriv, f);
        Ok(cx.mul(d, g))
    })
}

// ---- shrink ------------------------------------------------------------------------------------

/// -lambd <= x <= lambd, with lambd rounded to the tensor's dtype `dt` first (PyTorch's
/// shrink kernels convert it to scalar_t).
fn in_band(cx: &mut Cx, args: &Args, x: Value, dt: DType) -> Result<Value> {
    let sc = args.scalar("lambd")?;
    let dims = cx.dims(x);
    let l = cx.scalar_like(sc, dt, &dims);
    let l = cx.cast(l, cx.dtype(x));
    let nl = cx.neg(l);
    let a = cx.compare(CmpDir::Ge, x, nl);
    let b = cx.compare(CmpDir::Le, x, l);
    Ok(cx.and(a, b))
}

fn hardshrink(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let dt = args.tensor("self")?.dtype;
    unary(cx, args, "hardshrink_cpu", |cx, args, x| {
        let band = in_band(cx, args, x, dt)?;
        Ok(zero_where(cx, band, x))
    })
}

fn hardshrink_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_out", "self", "hardshrink_backward_cpu", |cx, args, g, x, dt| {
        let band = in_band(cx, args, x, dt)?;
        Ok(zero_where(cx, band, g))
    })
}

fn softshrink(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    float_kernel(x.dtype, "softshrink_check")?;
    let lambd = args.scalar("lambd")?.to_f64();
    let (max, max_text) = match x.dtype {
        DType::F64 => (f64::MAX, "1.79769e+308"),
        DType::F16 => (65504.0, "65504"),
        DType::BF16 => (3.3895313892515355e38, "3.38953e+38"),
        _ => (f32::MAX as f64, "3.40282e+38"),
    };
    check!(
        (0.0..=max).contains(&lambd),
        Runtime,
        "lambda must be in range [0, {}] for input dtype {}, but found {}",
        max_text,
        x.dtype.torch_name(),
        lambd
    );
    let input_dtype = x.dtype;
    unary(cx, args, "softshrink_cpu", |cx, args, x| {
        let mut l = s(cx, args, "lambd", x)?;
        if crate::torch_version::softshrink_rounds_lambda() && input_dtype != cx.dtype(x) {
            let rounded = cx.cast(l, input_dtype);
            l = cx.cast(rounded, cx.dtype(x));
        }
        let nl = cx.neg(l);
        let above = cx.compare(CmpDir::Gt, x, l);
        let below = cx.compare(CmpDir::Lt, x, nl);
        let xm = cx.sub(x, l);
        let xp = cx.add(x, l);
        // x * 0 inside the band: NaN stays NaN and -0.0 stays -0.0, as in PyTorch.
        let z = k(cx, 0.0, x);
        let z = cx.mul(x, z);
        let out = cx.select(below, xp, z);
        Ok(cx.select(above, xm, out))
    })
}

fn softshrink_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    backward(cx, args, "grad_output", "self", "softshrink_backward_cpu", |cx, args, g, x, dt| {
        let band = in_band(cx, args, x, dt)?;
        Ok(zero_where(cx, band, g))
    })
}

// ---- glu, prelu ----------------------------------------------------------------------------

/// The two halves of `v` along `dim`.
fn halves(cx: &mut Cx, v: Value, dim: usize) -> (Value, Value) {
    let dims = cx.dims(v);
    let h = dims[dim] / 2;
    let n = dims.len();
    let strides = vec![1; n];
    let mut lim_a = dims.clone();
    lim_a[dim] = h;
    let mut start_b = vec![0; n];
    start_b[dim] = h;
    let a = cx.slice(v, &vec![0; n], &lim_a, &strides);
    let b = cx.slice(v, &start_b, &dims, &strides);
    (a, b)
}

fn glu_dim(cx: &Cx, x: &Tensor, args: &Args) -> Result<usize> {
    let dims = cx.dims(x.v);
    check!(!dims.is_empty(), Runtime, "glu does not support scalars because halving size must be even");
    let dim = wrap_dim(args.int_or("dim", -1)?, dims.len())?;
    check!(
        dims[dim] % 2 == 0,
        Runtime,
        "Halving dimension must be even, but dimension {} is size {}",
        dim,
        dims[dim]
    );
    Ok(dim)
}

fn glu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dim = glu_dim(cx, &x, args)?;
    float_kernel(x.dtype, "glu_cpu")?;
    let v = cx.cast(x.v, x.dtype.opmath());
    let (a, b) = halves(cx, v, dim);
    let sb = cx.logistic(b);
    let out = cx.mul(a, sb);
    one(cx.cast(out, x.dtype))
}

/// glu_backward(grad, self, dim): d/da = grad * sigmoid(b), d/db = grad * a * s * (1 - s).
fn glu_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let dim = glu_dim(cx, &x, args)?;
    float_kernel(x.dtype, "glu_backward_cpu")?;
    let cdt = x.dtype.opmath();
    let v = cx.cast(x.v, cdt);
    let gv = cx.cast(g.v, cdt);
    let (a, b) = halves(cx, v, dim);
    let sb = cx.logistic(b);
    let ga = cx.mul(gv, sb);
    let one_ = k(cx, 1.0, sb);
    let t = cx.sub(one_, sb);
    let t = cx.mul(sb, t);
    let t = cx.mul(a, t);
    let gb = cx.mul(gv, t);
    let out = cx.concatenate(&[ga, gb], dim as i64);
    one(cx.cast(out, x.dtype))
}

/// The halves of `v` along `dim` when its size there is twice `h` (PyTorch's narrow calls,
/// with narrow's error otherwise).
fn glu_halves(cx: &mut Cx, v: Value, dim: usize, h: i64) -> Result<(Value, Value)> {
    let size = cx.dims(v)[dim];
    check!(h <= size - h, Runtime, "start ({}) + length ({}) exceeds dimension size ({}).", h, h, size);
    let n = cx.dims(v).len();
    let mut lim_a = cx.dims(v);
    lim_a[dim] = h;
    let mut start_b = vec![0; n];
    start_b[dim] = h;
    let mut lim_b = cx.dims(v);
    lim_b[dim] = 2 * h;
    let a = cx.slice(v, &vec![0; n], &lim_a, &vec![1; n]);
    let b = cx.slice(v, &start_b, &lim_b, &vec![1; n]);
    Ok((a, b))
}

/// `t.size(dim)` with its IndexError.
fn size_at(cx: &Cx, v: Value, dim: usize) -> Result<i64> {
    let d = cx.dims(v);
    check!(!d.is_empty(), Index, "Dimension specified as {} but tensor has no dimensions", dim);
    check!(dim < d.len(), Index, "Dimension out of range (expected to be in range of [-{}, {}], but got {})", d.len(), d.len() - 1, dim);
    Ok(d[dim])
}

/// glu_jvp(glu, x, dx, dim): the forward-mode derivative of glu, PyTorch's kernel
/// da * sigmoid(b) + glu * (db - sigmoid(b) * db) (b, da, db the halves of x and dx).
fn glu_jvp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let r = args.tensor("glu")?;
    let x = args.tensor("x")?;
    let dx = args.tensor("dx")?;
    let xd = cx.dims(x.v);
    let dim = wrap_dim(args.int("dim")?, xd.len())?;
    let h = size_at(cx, r.v, dim)?;
    check!(!xd.is_empty(), Runtime, "narrow() cannot be applied to a 0-dim tensor.");
    let cdt = r.dtype.opmath();
    let xv = cx.cast(x.v, cdt);
    let dv = cx.cast(dx.v, cdt);
    let (_, b) = glu_halves(cx, xv, dim, h)?;
    let (da, db) = glu_halves(cx, dv, dim, h)?;
    // PyTorch's CPU kernel has no 16-bit floats.
    check!(
        matches!(r.dtype, DType::F32 | DType::F64),
        NotImplemented,
        "\"glu_jvp_cpu\" not implemented for '{}'",
        r.dtype.torch_name()
    );
    let rv = cx.cast(r.v, cdt);
    let vs = cx.broadcast_all(&[rv, b, da, db])?;
    let sb = cx.logistic(vs[1]);
    let t2 = cx.mul(sb, vs[3]);
    let t2 = cx.sub(vs[3], t2);
    let t2 = cx.mul(vs[0], t2);
    let l = cx.mul(vs[2], sb);
    let out = cx.add(l, t2);
    one(cx.cast(out, r.dtype))
}

/// glu_backward_jvp(grad_x, grad_glu, x, dgrad_glu, dx, dim): PyTorch's composite of the
/// derivative of glu_backward, in the inputs' float dtype.
fn glu_backward_jvp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let gx = args.tensor("grad_x")?;
    let gg = args.tensor("grad_glu")?;
    let x = args.tensor("x")?;
    let dgg = args.tensor("dgrad_glu")?;
    let dx = args.tensor("dx")?;
    let xd = cx.dims(x.v);
    let dim = wrap_dim(args.int("dim")?, xd.len())?;
    let h = size_at(cx, gg.v, dim)?;
    check!(!xd.is_empty(), Runtime, "narrow() cannot be applied to a 0-dim tensor.");
    check!(x.dtype != DType::Bool, Runtime, "\"sigmoid_cpu\" not implemented for 'Bool'");
    let ts = [gx, gg, x, dgg, dx];
    let dt = crate::dtype::result_type(&ts.iter().map(|t| (t.dtype, t.rank)).collect::<Vec<_>>()).unwrap();
    let dt = if dt.is_float() { dt } else { DType::F32 };
    let cdt = dt.opmath();
    let c = |cx: &mut Cx, t: &Tensor| cx.cast(t.v, cdt);
    let (xv, dxv, gxv, ggv, dggv) = (c(cx, &x), c(cx, &dx), c(cx, &gx), c(cx, &gg), c(cx, &dgg));
    let (a, b) = glu_halves(cx, xv, dim, h)?;
    let (da, db) = glu_halves(cx, dxv, dim, h)?;
    let (gxa, _) = glu_halves(cx, gxv, dim, h)?;
    let vs = cx.broadcast_all(&[a, b, da, db, gxa, ggv, dggv])?;
    let (a, b, da, db, gxa, _gg, dgg) = (vs[0], vs[1], vs[2], vs[3], vs[4], vs[5], vs[6]);
    let sb = cx.logistic(b);
    let glu = cx.mul(a, sb);
    let dbs = cx.mul(db, sb);
    let db_neg = cx.sub(db, dbs);
    let t1 = cx.mul(dgg, sb);
    let t2 = cx.mul(gxa, db_neg);
    let dgxa = cx.add(t1, t2);
    let amg = cx.sub(a, glu);
    let u1 = cx.mul(dgxa, amg);
    let das = cx.mul(da, sb);
    let w = cx.sub(da, das);
    let gdb = cx.mul(glu, db_neg);
    let w = cx.sub(w, gdb);
    let u2 = cx.mul(gxa, w);
    let dgxb = cx.add(u1, u2);
    let out = cx.concatenate(&[dgxa, dgxb], dim as i64);
    one(cx.cast(out, dt))
}

/// _prelu_kernel(self, weight): x > 0 ? x : weight * x (weight broadcasts against self).
fn prelu_kernel(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let w = args.tensor("weight")?;
    let dt = result_type(&[(x.dtype, x.rank), (w.dtype, w.rank)]).unwrap();
    float_kernel(dt, "prelu_cpu")?;
    let cdt = dt.opmath();
    let xv = cx.cast(x.v, cdt);
    let wv = cx.cast(w.v, cdt);
    let vs = cx.broadcast_all(&[xv, wv])?;
    let z = k(cx, 0.0, vs[0]);
    let pos = cx.compare(CmpDir::Gt, vs[0], z);
    let neg = cx.mul(vs[1], vs[0]);
    let out = cx.select(pos, vs[0], neg);
    one(cx.cast(out, dt))
}

/// _prelu_kernel_backward(grad, self, weight) -> (grad_self, grad_weight), both broadcast
/// shaped (autograd sums grad_weight back to weight's shape).
fn prelu_kernel_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let w = args.tensor("weight")?;
    let dt = result_type(&[(g.dtype, g.rank), (x.dtype, x.rank), (w.dtype, w.rank)]).unwrap();
    float_kernel(dt, "prelu_backward_cpu")?;
    let cdt = dt.opmath();
    let gv = cx.cast(g.v, cdt);
    let xv = cx.cast(x.v, cdt);
    let wv = cx.cast(w.v, cdt);
    let vs = cx.broadcast_all(&[gv, xv, wv])?;
    let (gv, xv, wv) = (vs[0], vs[1], vs[2]);
    let z = k(cx, 0.0, xv);
    let pos = cx.compare(CmpDir::Gt, xv, z);
    let wg = cx.mul(wv, gv);
    let gx = cx.select(pos, gv, wg);
    let xg = cx.mul(xv, gv);
    let gw = cx.select(pos, z, xg);
    let gx = cx.cast(gx, x.dtype);
    let gw = cx.cast(gw, w.dtype);
    Ok(vec![Out::Tensor(gx), Out::Tensor(gw)])
}

// ---- dropout -----------------------------------------------------------------------------------

/// native_dropout(input, p, train) -> (output, mask): in training, mask ~ Bernoulli(1 - p)
/// drawn from the device generator, output = input * mask / (1 - p) (0 when p == 1), as
/// PyTorch computes it (a dropped NaN stays NaN). `p` is compiled in: it is range-checked.
fn native_dropout(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    let p = match args.get("p") {
        Some(crate::args::Arg::Float(f)) => f.value,
        _ => args.scalar("p")?.to_f64(),
    };
    let train = args.get("train").map_or(true, |a| !matches!(a, crate::args::Arg::Bool(false)));
    let dims = cx.dims(x.v);
    if dims.iter().product::<i64>() == 0 {
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(cx.full(0.0, x.dtype, &dims))]);
    }
    if !train {
        let ones = cx.full(1.0, DType::Bool, &dims);
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(ones)]);
    }
    let p1m = 1.0 - p;
    check!((0.0..=1.0).contains(&p1m), Runtime, "bernoulli_ expects p to be in [0, 1], but got p={}", p1m);
    check!(
        x.dtype.is_float() || x.dtype.is_complex(),
        Runtime,
        "result type Float can't be cast to the desired output type {}",
        x.dtype.torch_name()
    );
    if !matches!(args.get("generator"), Some(crate::args::Arg::Generator(_))) {
        bail!(
            NotImplemented,
            "native_dropout on tpu needs the device generator: the engine must pass it to random ops \
             without a Generator argument (ops tagged nondeterministic_seeded)"
        );
    }
    let u = crate::blocks::rng::uniform01(cx, args, &dims, false)?;
    let thr = cx.full(p1m, DType::F32, &dims);
    let mask = cx.compare(CmpDir::Lt, u, thr);
    let scale = if p1m == 0.0 { 0.0 } else { 1.0 / p1m };
    let cdt = x.dtype.opmath();
    let xv = cx.cast(x.v, cdt);
    let s = cx.full(scale, cdt, &dims);
    let out = masked_scale(cx, xv, mask, s);
    Ok(vec![Out::Tensor(cx.cast(out, x.dtype)), Out::Tensor(mask)])
}

/// x * mask * scale for a boolean mask, written as a select of x * scale and x * 0: XLA turns
/// a product with convert(mask) into a select with 0, which would lose the NaN and the sign of
/// zero that PyTorch's product keeps for dropped elements.
fn masked_scale(cx: &mut Cx, x: Value, mask: Value, scale: Value) -> Value {
    let kept = cx.mul(x, scale);
    let zero = k(cx, 0.0, x);
    let dropped = cx.mul(x, zero);
    cx.select(mask, kept, dropped)
}

/// native_dropout_backward(grad_output, mask, scale): grad * mask * scale.
fn native_dropout_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let m = args.tensor("mask")?;
    let gm = result_type(&[(g.dtype, g.rank), (m.dtype, m.rank)]).unwrap();
    // The float scale promotes like a Python number.
    let dt = result_type(&[(gm, crate::dtype::Rank::Dim), (DType::F64, crate::dtype::Rank::Wrapped)]).unwrap();
    let cdt = dt.opmath();
    let gv = cx.cast(g.v, cdt);
    let out = if m.dtype == DType::Bool {
        let vs = cx.broadcast_all(&[gv, m.v])?;
        let s = s(cx, args, "scale", vs[0])?;
        masked_scale(cx, vs[0], vs[1], s)
    } else {
        let mv = cx.cast(m.v, cdt);
        let vs = cx.broadcast_all(&[gv, mv])?;
        let out = cx.mul(vs[0], vs[1]);
        let s = s(cx, args, "scale", out)?;
        cx.mul(out, s)
    };
    one(cx.cast(out, dt))
}

// ---- rrelu ------------------------------------------------------------------------------------------

/// rrelu_with_noise(self, noise!, lower, upper, training, generator): in training, negative
/// inputs are scaled by a slope drawn uniformly from [lower, upper] (recorded in noise; 1
/// elsewhere); in evaluation by (lower + upper) / 2. Returns (noise, out): noise is written.
fn rrelu_with_noise(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (out, noise) = rrelu_core(cx, args)?;
    Ok(vec![Out::Tensor(noise), Out::Tensor(out)])
}

/// rrelu_with_noise_functional(...) -> (out, noise_out).
fn rrelu_with_noise_functional(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (out, noise) = rrelu_core(cx, args)?;
    Ok(vec![Out::Tensor(out), Out::Tensor(noise)])
}

fn rrelu_core(cx: &mut Cx, args: &Args) -> Result<(Value, Value)> {
    let x = args.tensor("self")?;
    let noise = args.tensor("noise")?;
    let lower = args.opt_scalar("lower")?.map_or(0.125, Scalar::to_f64);
    let upper = args.opt_scalar("upper")?.map_or(1.0 / 3.0, Scalar::to_f64);
    let training = args.bool_or("training", false)?;
    let xd = cx.dims(x.v);
    let nd = cx.dims(noise.v);
    check!(
        xd == nd,
        Runtime,
        "noise tensor shape must match self tensor shape. Got self.shape = {:?} noise.shape = {:?}",
        xd,
        nd
    );
    check!(lower <= upper, Runtime, "Lower bound should be less than or equal to the upper bound");
    let dt = x.dtype;
    if !training {
        check!(dt.is_float(), NotImplemented, "\"leaky_relu_cpu\" not implemented for '{}'", dt.torch_name());
        let acc = dt.opmath();
        let xv = cx.cast(x.v, acc);
        let slope = (lower + upper) / 2.0;
        let s = k(cx, slope, xv);
        let zero = k(cx, 0.0, xv);
        let pos = cx.compare(CmpDir::Gt, xv, zero);
        let neg = cx.mul(xv, s);
        let y = cx.select(pos, xv, neg);
        return Ok((cx.cast(y, dt), noise.v));
    }
    check_float_kernel(dt, "rrelu_with_noise_out_cpu", true)?;
    check_scalar_type(dt, noise.dtype)?;
    let numel = cx.numel(x.v);
    if numel == 0 {
        return Ok((x.v, noise.v));
    }
    if !matches!(args.get("generator"), Some(Arg::Generator(_))) {
        bail!(NotImplemented, "rrelu_with_noise on tpu needs the device generator");
    }
    let double = dt == DType::F64;
    let u = crate::blocks::rng::uniform01(cx, args, &[numel], double)?;
    let u = cx.reshape(u, &xd);
    let acc = if double { DType::F64 } else { DType::F32 };
    let lo = k(cx, lower, u);
    let range = k(cx, upper - lower, u);
    let r = cx.mul(u, range);
    let r = cx.add(r, lo);
    let xv = cx.cast(x.v, acc);
    let zero = k(cx, 0.0, xv);
    let one_ = k(cx, 1.0, xv);
    let le = cx.compare(CmpDir::Le, xv, zero);
    let scaled = cx.mul(xv, r);
    let y = cx.select(le, scaled, xv);
    let nz = cx.select(le, r, one_);
    Ok((cx.cast(y, dt), cx.cast(nz, dt)))
}
