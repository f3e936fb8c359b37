//! Softmax, normalization and losses: _softmax/_log_softmax and their backward ops,
//! native_batch_norm (which also carries layer_norm on this backend: PyTorch's composite
//! native_layer_norm calls it) and its backward, native_layer_norm_backward, nll_loss(2d),
//! mse_loss and binary_cross_entropy with their backward ops; the fused weight norm
//! (_weight_norm_interface) and its backward.
//!
//! 16-bit floats are computed in float32 and rounded once at the end.
use crate::args::{Args, Tensor};
use crate::blocks::reduce::{acc_type, opt_dtype, reduce, unreduce, Red};
use crate::blocks::round16::{is_16bit, round_to};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::{result_type, DType};
use crate::error::Result;
use crate::{bail, check, one, Out, Registry};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("_softmax", |cx, a| softmax(cx, a, false));
    r.add("_log_softmax", |cx, a| softmax(cx, a, true));
    r.add("_softmax_backward_data", |cx, a| softmax_backward(cx, a, false));
    r.add("_log_softmax_backward_data", |cx, a| softmax_backward(cx, a, true));
    r.add_writing("native_batch_norm", &["running_mean", "running_var"], native_batch_norm);
    r.add("_native_batch_norm_legit", native_batch_norm_legit);
    r.add("_native_batch_norm_legit_functional", native_batch_norm_legit_functional);
    r.add("_native_batch_norm_legit_no_training", native_batch_norm_legit_no_training);
    r.add("native_layer_norm", native_layer_norm);
    r.add("native_batch_norm_backward", native_batch_norm_backward);
    r.add("native_layer_norm_backward", native_layer_norm_backward);
    r.add("nll_loss_forward", |cx, a| nll_loss_forward(cx, a, false));
    r.add("nll_loss2d_forward", |cx, a| nll_loss_forward(cx, a, true));
    r.add("nll_loss_backward", |cx, a| nll_loss_backward(cx, a, false));
    r.add("nll_loss2d_backward", |cx, a| nll_loss_backward(cx, a, true));
    r.add("mse_loss", mse_loss);
    // The threshold decides the program's shape (beta = 0 is plain L1) and is validated.
    r.add_specialized("huber_loss", |cx, a| robust_loss(cx, a, false));
    r.add_specialized("huber_loss_backward", |cx, a| robust_loss_backward(cx, a, false));
    r.add_specialized("smooth_l1_loss", |cx, a| robust_loss(cx, a, true));
    r.add_specialized("smooth_l1_loss_backward", |cx, a| robust_loss_backward(cx, a, true));
    r.add("mse_loss_backward", mse_loss_backward);
    r.add_writing("batch_norm_update_stats", &["running_mean", "running_var"], batch_norm_update_stats);
    r.add("binary_cross_entropy", binary_cross_entropy);
    r.add("binary_cross_entropy_backward", binary_cross_entropy_backward);
    r.add("_weight_norm_interface", weight_norm_interface);
    r.add("_weight_norm_interface_backward", weight_norm_interface_backward);
}

// ---- helpers ----------------------------------------------------------------------------------

/// The single reduced dim of a softmax-like op along `dim` (none for a 0-d input).
fn along(dim: i64, ndim: usize) -> Result<Vec<i64>> {
    let d = wrap_dim(dim, ndim)?;
    Ok(if ndim == 0 { vec![] } else { vec![d as i64] })
}

/// `v` reduced with `red` over `dims` and broadcast back to `v`'s shape.
fn reduce_back(cx: &mut Cx, v: Value, dims: &[i64], red: Red) -> Value {
    let in_dims = cx.dims(v);
    let r = reduce(cx, v, dims, red);
    unreduce(cx, r, &in_dims, dims)
}

/// A per-channel vector of shape [C] broadcast along `dim` of `dims`.
fn along_dim(cx: &mut Cx, v: Value, dims: &[i64], dim: usize) -> Value {
    cx.broadcast_in_dim(v, dims, &[dim as i64])
}

fn constant(cx: &mut Cx, x: f64, like: Value) -> Value {
    let dt = cx.dtype(like);
    let dims = cx.dims(like);
    cx.full(x, dt, &dims)
}

/// Loss reductions as at::Reduction numbers them.
#[derive(Copy, Clone, PartialEq, Eq)]
pub(crate) enum Reduction {
    None,
    Mean,
    Sum,
}

pub(crate) fn reduction(args: &Args) -> Result<Reduction> {
    Ok(match args.int_or("reduction", 1)? {
        0 => Reduction::None,
        1 => Reduction::Mean,
        2 => Reduction::Sum,
        r => bail!(Value, "{} is not a valid value for reduction", r),
    })
}

/// at::native's apply_loss_reduction: the elementwise loss, its sum, or its mean.
fn apply_reduction(cx: &mut Cx, loss: Value, red: Reduction) -> Value {
    let all: Vec<i64> = (0..cx.dims(loss).len() as i64).collect();
    match red {
        Reduction::None => loss,
        Reduction::Sum => reduce(cx, loss, &all, Red::Sum),
        Reduction::Mean => {
            let n = cx.numel(loss);
            let s = reduce(cx, loss, &all, Red::Sum);
            let nv = constant(cx, n as f64, s);
            cx.div(s, nv)
        }
    }
}

fn scalar_float(args: &Args, name: &str, dt: DType, cx: &mut Cx) -> Result<Value> {
    let s = args.scalar(name)?;
    Ok(cx.scalar(s, dt))
}

// ---- softmax --------------------------------------------------------------------------------------

/// _softmax/_log_softmax(self, dim, half_to_float) and their out= forms. half_to_float (a
/// Half input giving a float result) is supported as on CUDA.
fn softmax(cx: &mut Cx, args: &Args, log: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let name = if log { "log_softmax" } else { "softmax" };
    check!(
        x.dtype.is_float(),
        NotImplemented,
        "\"{}_lastdim_kernel_impl\" not implemented for '{}'",
        name,
        x.dtype.torch_name()
    );
    let half_to_float = args.bool_or("half_to_float", false)?;
    check!(!half_to_float || x.dtype == DType::F16, Runtime, "conversion is supported for Half type only");
    let out_dt = if half_to_float { DType::F32 } else { x.dtype };
    let in_dims = cx.dims(x.v);
    let dim = args.int("dim")?;
    let dims = along(dim, in_dims.len())?;
    // PyTorch's CPU kernels for 16-bit floats round one intermediate to the input dtype: the
    // exponentials when the softmax dim is not innermost, the sum of exponentials for a
    // log_softmax over the innermost dim. Rounding the same way matches them to the last bit
    // far more often than a plain float32 computation does.
    let innermost = dims.iter().all(|&d| in_dims[d as usize + 1..].iter().all(|&s| s == 1));
    let round_16 = |cx: &mut Cx, v: Value| {
        if is_16bit(x.dtype) && !half_to_float {
            let r = cx.cast(v, x.dtype);
            cx.cast(r, DType::F32)
        } else {
            v
        }
    };
    let v = cx.cast(x.v, acc_type(x.dtype));
    let m = reduce_back(cx, v, &dims, Red::Max);
    let z = cx.sub(v, m);
    let e = cx.exp(z);
    let s = reduce_back(cx, e, &dims, Red::Sum);
    let r = if log {
        let s = if innermost { round_16(cx, s) } else { s };
        let l = cx.log(s);
        cx.sub(z, l)
    } else {
        let e = if innermost { e } else { round_16(cx, e) };
        cx.div(e, s)
    };
    one(cx.cast(r, out_dt))
}

/// _softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, input_dtype).
fn softmax_backward(cx: &mut Cx, args: &Args, log: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let out = args.tensor("output")?;
    let in_dt = opt_dtype(args, "input_dtype")?.unwrap_or(g.dtype);
    check!(
        g.dtype == in_dt || (g.dtype == DType::F32 && in_dt == DType::F16),
        Runtime,
        "expected input and grad types to match, or input to be at::Half and grad to be at::Float"
    );
    check!(
        cx.dims(g.v) == cx.dims(out.v),
        Runtime,
        "grad_output and output must have the same shape, got {:?} and {:?}",
        cx.dims(g.v),
        cx.dims(out.v)
    );
    let dims = along(args.int("dim")?, cx.dims(g.v).len())?;
    let acc = acc_type(g.dtype);
    let gv = cx.cast(g.v, acc);
    let ov = cx.cast(out.v, acc);
    let r = if log {
        let s = reduce_back(cx, gv, &dims, Red::Sum);
        let p = cx.exp(ov);
        let ps = cx.mul(p, s);
        cx.sub(gv, ps)
    } else {
        let go = cx.mul(gv, ov);
        let s = reduce_back(cx, go, &dims, Red::Sum);
        let d = cx.sub(gv, s);
        cx.mul(ov, d)
    };
    one(cx.cast(r, in_dt))
}

// ---- batch norm -----------------------------------------------------------------------------------

/// The parts of a batch norm call.
struct BatchNorm {
    x: Tensor,
    w: Option<Tensor>,
    b: Option<Tensor>,
    rm: Option<Tensor>,
    rv: Option<Tensor>,
}

fn batch_norm_args(cx: &mut Cx, args: &Args) -> Result<BatchNorm> {
    let x = args.tensor("input")?;
    check!(x.dtype.is_float(), NotImplemented, "\"batch_norm\" not implemented for '{}'", x.dtype.torch_name());
    let dims = cx.dims(x.v);
    check!(dims.len() >= 2, Runtime, "batch_norm: expected an input with at least 2 dims, but got {}", dims.len());
    let c = dims[1];
    let bn = BatchNorm {
        x,
        w: args.opt_tensor("weight")?,
        b: args.opt_tensor("bias")?,
        rm: args.opt_tensor("running_mean")?,
        rv: args.opt_tensor("running_var")?,
    };
    for (t, name) in [(bn.w, "weight"), (bn.b, "bias"), (bn.rm, "running_mean"), (bn.rv, "running_var")] {
        if let Some(t) = t {
            check!(cx.numel(t.v) == c, Runtime, "{} should contain {} elements not {}", name, c, cx.numel(t.v));
        }
    }
    Ok(bn)
}

/// Batch norm over every dim but 1: (out, save_mean, save_invstd) and, when `update` and
/// training with running statistics, the updated (running_mean, running_var).
fn batch_norm_core(
    cx: &mut Cx,
    args: &Args,
    bn: &BatchNorm,
    training: bool,
    update: bool,
) -> Result<(Vec<Value>, Option<(Value, Value)>)> {
    let x = bn.x;
    let dims = cx.dims(x.v);
    let c = dims[1];
    let mixed = is_16bit(x.dtype) && [bn.w, bn.b, bn.rm, bn.rv].iter().flatten().any(|t| t.dtype == DType::F32);
    let stat_dt = if mixed { DType::F32 } else { x.dtype };
    let acc = acc_type(x.dtype);
    let red: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != 1).collect();
    let v = cx.cast(x.v, acc);
    let eps = scalar_float(args, "eps", acc, cx)?;
    let eps = cx.broadcast_in_dim(eps, &[c], &[]);
    let mut updated = None;
    let (mean, invstd) = if training {
        let (mean, var, unbiased) = channel_stats(cx, v, &dims, &red, acc, c);
        if let (true, Some(rm), Some(rv)) = (update, bn.rm, bn.rv) {
            let m = scalar_float(args, "momentum", acc, cx)?;
            updated = Some((running_update(cx, &rm, mean, m, acc, c), running_update(cx, &rv, unbiased, m, acc, c)));
        }
        let ve = cx.add(var, eps);
        (mean, cx.rsqrt(ve))
    } else {
        let (Some(rm), Some(rv)) = (bn.rm, bn.rv) else {
            bail!(Runtime, "running_mean and running_var must be defined in evaluation mode");
        };
        let mean = cx.cast(rm.v, acc);
        let mean = cx.reshape(mean, &[c]);
        let var = cx.cast(rv.v, acc);
        let var = cx.reshape(var, &[c]);
        let ve = cx.add(var, eps);
        (mean, cx.rsqrt(ve))
    };
    let mb = along_dim(cx, mean, &dims, 1);
    let d = cx.sub(v, mb);
    let mut scale = invstd;
    if let Some(w) = bn.w {
        let wv = cx.cast(w.v, acc);
        let wv = cx.reshape(wv, &[c]);
        scale = cx.mul(scale, wv);
    }
    let sb = along_dim(cx, scale, &dims, 1);
    let mut y = cx.mul(d, sb);
    if let Some(b) = bn.b {
        let bv = cx.cast(b.v, acc);
        let bv = cx.reshape(bv, &[c]);
        let bb = along_dim(cx, bv, &dims, 1);
        y = cx.add(y, bb);
    }
    let y = cx.cast(y, x.dtype);
    let (sm, si) = if training {
        (cx.cast(mean, stat_dt), cx.cast(invstd, stat_dt))
    } else {
        (cx.full(0.0, stat_dt, &[0]), cx.full(0.0, stat_dt, &[0]))
    };
    Ok((vec![y, sm, si], updated))
}

fn tensors(vs: Vec<Value>) -> Vec<Out> {
    vs.into_iter().map(Out::Tensor).collect()
}

/// native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
/// -> (out, save_mean, save_invstd). In training mode PyTorch also updates the running
/// statistics in place without declaring it in the schema: it is registered with
/// `add_writing`, so the new running statistics come first, like _native_batch_norm_legit.
fn native_batch_norm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    native_batch_norm_legit(cx, args)
}

/// _native_batch_norm_legit(input, weight, bias, running_mean!, running_var!, training,
/// momentum, eps) and its .no_stats form: the written running statistics come first.
fn native_batch_norm_legit(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let bn = batch_norm_args(cx, args)?;
    let training = args.bool("training")?;
    let (outs, updated) = batch_norm_core(cx, args, &bn, training, true)?;
    let mut res = Vec::new();
    if let (Some(rm), Some(rv)) = (bn.rm, bn.rv) {
        let (nm, nv) = updated.unwrap_or((rm.v, rv.v));
        res.push(Out::Tensor(nm));
        res.push(Out::Tensor(nv));
    }
    res.extend(tensors(outs));
    Ok(res)
}

/// _native_batch_norm_legit_functional(...) -> (out, save_mean, save_invstd,
/// running_mean_out, running_var_out), the functional form torch.compile graphs use.
fn native_batch_norm_legit_functional(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let bn = batch_norm_args(cx, args)?;
    let training = args.bool("training")?;
    let (mut outs, updated) = batch_norm_core(cx, args, &bn, training, true)?;
    let (Some(rm), Some(rv)) = (bn.rm, bn.rv) else {
        bail!(Runtime, "_native_batch_norm_legit_functional: running_mean and running_var are required");
    };
    let (nm, nv) = updated.unwrap_or((rm.v, rv.v));
    outs.push(nm);
    outs.push(nv);
    Ok(tensors(outs))
}

/// _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
/// momentum, eps): evaluation with the running statistics.
fn native_batch_norm_legit_no_training(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let bn = batch_norm_args(cx, args)?;
    let (outs, _) = batch_norm_core(cx, args, &bn, false, false)?;
    Ok(tensors(outs))
}

/// batch_norm_update_stats(input, running_mean, running_var, momentum) -> (mean, var): the
/// per-channel mean and biased variance (in the statistics' dtype: float32 for a 16-bit input
/// with float32 running statistics), with the running statistics updated in place like
/// training batch norm does (unbiased variance).
fn batch_norm_update_stats(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    let dims = cx.dims(x.v);
    check!(dims.len() >= 2, Index, "{}", if dims.is_empty() {
        "Dimension specified as 1 but tensor has no dimensions".to_string()
    } else {
        format!("Dimension out of range (expected to be in range of [-1, 0], but got 1)")
    });
    check!(
        dims.iter().product::<i64>() > 0,
        Runtime,
        "input tensor must have at least one element, but got input_sizes = {:?}",
        dims
    );
    check!(x.dtype.is_float(), NotImplemented, "\"batch_norm_update_stats_cpu\" not implemented for '{}'", x.dtype.torch_name());
    let c = dims[1];
    let rm = args.opt_tensor("running_mean")?;
    let rv = args.opt_tensor("running_var")?;
    for (t, name) in [(rm, "running_mean"), (rv, "running_var")] {
        if let Some(t) = t {
            check!(cx.numel(t.v) == c, Runtime, "{} should contain {} elements not {}", name, c, cx.numel(t.v));
        }
    }
    let mixed = is_16bit(x.dtype) && [rm, rv].iter().flatten().any(|t| t.dtype == DType::F32);
    let stat_dt = if mixed { DType::F32 } else { x.dtype };
    let acc = acc_type(x.dtype);
    let red: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != 1).collect();
    let v = cx.cast(x.v, acc);
    let (mean, var, unbiased) = channel_stats(cx, v, &dims, &red, acc, c);
    let m = scalar_float(args, "momentum", acc, cx)?;
    let mut res = Vec::new();
    for (old, stat) in [(rm, mean), (rv, unbiased)] {
        if let Some(old) = old {
            res.push(Out::Tensor(running_update(cx, &old, stat, m, acc, c)));
        }
    }
    res.push(Out::Tensor(cx.cast(mean, stat_dt)));
    res.push(Out::Tensor(cx.cast(var, stat_dt)));
    Ok(res)
}

/// The element count of each channel's statistics, as a [C] vector of `acc`.
fn constant_count(cx: &mut Cx, dims: &[i64], red: &[i64], acc: DType, c: i64) -> Value {
    let n: i64 = red.iter().map(|&d| dims[d as usize]).product();
    cx.full(n as f64, acc, &[c])
}

/// native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
/// save_invstd, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias).
fn native_batch_norm_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_out")?;
    let x = args.tensor("input")?;
    check!(x.dtype.is_float(), NotImplemented, "\"batch_norm_backward\" not implemented for '{}'", x.dtype.torch_name());
    let dims = cx.dims(x.v);
    check!(dims.len() >= 2, Runtime, "batch_norm: expected an input with at least 2 dims, but got {}", dims.len());
    let c = dims[1];
    let w = args.opt_tensor("weight")?;
    let train = args.bool("train")?;
    let acc = acc_type(x.dtype);
    let red: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != 1).collect();
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    let (mean, invstd) = if train {
        let (Some(m), Some(i)) = (args.opt_tensor("save_mean")?, args.opt_tensor("save_invstd")?) else {
            bail!(Runtime, "native_batch_norm_backward: save_mean and save_invstd must be defined in training mode");
        };
        (cx.cast(m.v, acc), cx.cast(i.v, acc))
    } else {
        let (Some(m), Some(v)) = (args.opt_tensor("running_mean")?, args.opt_tensor("running_var")?) else {
            bail!(Runtime, "native_batch_norm_backward: running_mean and running_var must be defined in evaluation mode");
        };
        let eps = scalar_float(args, "eps", acc, cx)?;
        let eps = cx.broadcast_in_dim(eps, &[c], &[]);
        let var = cx.cast(v.v, acc);
        let ve = cx.add(var, eps);
        (cx.cast(m.v, acc), cx.rsqrt(ve))
    };
    let wv = match w {
        Some(w) => {
            let wv = cx.cast(w.v, acc);
            cx.reshape(wv, &[c])
        }
        None => cx.full(1.0, acc, &[c]),
    };
    let mb = along_dim(cx, mean, &dims, 1);
    let xc = cx.sub(xv, mb);
    let sum_g = reduce(cx, gv, &red, Red::Sum);
    let gx = cx.mul(gv, xc);
    let dotp = reduce(cx, gx, &red, Red::Sum);
    let scale = cx.mul(invstd, wv);
    let sb = along_dim(cx, scale, &dims, 1);
    let gi = if train {
        let n = constant_count(cx, &dims, &red, acc, c);
        let grad_mean = cx.div(sum_g, n);
        let inv2 = cx.mul(invstd, invstd);
        let k = cx.mul(dotp, inv2);
        let k = cx.div(k, n);
        let kb = along_dim(cx, k, &dims, 1);
        let gmb = along_dim(cx, grad_mean, &dims, 1);
        let proj = cx.mul(xc, kb);
        let t = cx.sub(gv, gmb);
        let t = cx.sub(t, proj);
        cx.mul(t, sb)
    } else {
        cx.mul(gv, sb)
    };
    let gw = cx.mul(dotp, invstd);
    let param_dt = w.map(|w| w.dtype).unwrap_or(x.dtype);
    let gi = cx.cast(gi, x.dtype);
    let gw = cx.cast(gw, param_dt);
    let gb = cx.cast(sum_g, param_dt);
    Ok(vec![Out::Tensor(gi), Out::Tensor(gw), Out::Tensor(gb)])
}

// ---- layer norm -----------------------------------------------------------------------------------

/// Checks of layer_norm's arguments; the index of the first normalized dim.
fn layer_norm_axis(cx: &Cx, x: &Tensor, shape: &[i64], w: Option<Tensor>, b: Option<Tensor>) -> Result<usize> {
    let dims = cx.dims(x.v);
    let nd = dims.len();
    check!(
        !shape.is_empty(),
        Runtime,
        "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = {:?}",
        shape
    );
    for (t, name) in [(w, "weight"), (b, "bias")] {
        if let Some(t) = t {
            check!(
                cx.dims(t.v) == shape,
                Runtime,
                "Expected {} to be of same shape as normalized_shape, but got {} of shape {:?} and normalized_shape = {:?}",
                name,
                name,
                cx.dims(t.v),
                shape
            );
        }
    }
    check!(
        shape.len() <= nd && dims[nd - shape.len()..] == shape[..],
        Runtime,
        "Given normalized_shape={:?}, expected input with shape [*, {}], but got input of size{:?}",
        shape,
        shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
        dims
    );
    Ok(nd - shape.len())
}

/// native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd), with
/// mean and rstd shaped [outer..., 1...]. Eager calls reach PyTorch's composite version (which
/// calls native_batch_norm); torch.compile graphs keep this op.
fn native_layer_norm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    check!(x.dtype.is_float(), NotImplemented, "\"LayerNormKernelImpl\" not implemented for '{}'", x.dtype.torch_name());
    let shape = args.ints("normalized_shape")?;
    let w = args.opt_tensor("weight")?;
    let b = args.opt_tensor("bias")?;
    let axis = layer_norm_axis(cx, &x, &shape, w, b)?;
    let dims = cx.dims(x.v);
    let inner: Vec<i64> = (axis as i64..dims.len() as i64).collect();
    let mixed = is_16bit(x.dtype) && [w, b].iter().flatten().any(|t| t.dtype == DType::F32);
    let stat_dt = if mixed { DType::F32 } else { x.dtype };
    let acc = acc_type(x.dtype);
    let v = cx.cast(x.v, acc);
    let n: i64 = shape.iter().product();
    let s = reduce(cx, v, &inner, Red::Sum);
    let nv = constant(cx, n as f64, s);
    let mean = cx.div(s, nv);
    let mb = unreduce(cx, mean, &dims, &inner);
    let d = cx.sub(v, mb);
    let d2 = cx.mul(d, d);
    let s2 = reduce(cx, d2, &inner, Red::Sum);
    let var = cx.div(s2, nv);
    let eps = scalar_float(args, "eps", acc, cx)?;
    let vd = cx.dims(var);
    let eps = cx.broadcast_in_dim(eps, &vd, &[]);
    let ve = cx.add(var, eps);
    let rstd = cx.rsqrt(ve);
    let rb = unreduce(cx, rstd, &dims, &inner);
    let mut y = cx.mul(d, rb);
    if let Some(w) = w {
        let wv = cx.cast(w.v, acc);
        let wb = cx.broadcast_in_dim(wv, &dims, &inner);
        y = cx.mul(y, wb);
    }
    if let Some(b) = b {
        let bv = cx.cast(b.v, acc);
        let bb = cx.broadcast_in_dim(bv, &dims, &inner);
        y = cx.add(y, bb);
    }
    let y = cx.cast(y, x.dtype);
    let stat_shape: Vec<i64> = dims.iter().enumerate().map(|(i, &d)| if i < axis { d } else { 1 }).collect();
    let mean = cx.cast(mean, stat_dt);
    let mean = cx.reshape(mean, &stat_shape);
    let rstd = cx.cast(rstd, stat_dt);
    let rstd = cx.reshape(rstd, &stat_shape);
    Ok(vec![Out::Tensor(y), Out::Tensor(mean), Out::Tensor(rstd)])
}

/// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
/// output_mask) -> (grad_input, grad_weight, grad_bias).
fn native_layer_norm_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_out")?;
    let x = args.tensor("input")?;
    check!(x.dtype.is_float(), NotImplemented, "\"LayerNormBackwardKernelImpl\" not implemented for '{}'", x.dtype.torch_name());
    let shape = args.ints("normalized_shape")?;
    let axis = layer_norm_axis(cx, &x, &shape, None, None)?;
    let dims = cx.dims(x.v);
    let nd = dims.len();
    let inner: Vec<i64> = (axis as i64..nd as i64).collect();
    let outer: Vec<i64> = (0..axis as i64).collect();
    let outer_dims = dims[..axis].to_vec();
    let mean = args.tensor("mean")?;
    let rstd = args.tensor("rstd")?;
    let w = args.opt_tensor("weight")?;
    let b = args.opt_tensor("bias")?;
    let acc = acc_type(x.dtype);
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    // mean and rstd hold one value per outer index (shaped [outer..., 1...] or flat).
    let stat = |cx: &mut Cx, t: Tensor| {
        let v = cx.cast(t.v, acc);
        let v = cx.reshape(v, &outer_dims);
        cx.broadcast_in_dim(v, &dims, &outer)
    };
    let mb = stat(cx, mean);
    let rb = stat(cx, rstd);
    let xc = cx.sub(xv, mb);
    let xhat = cx.mul(xc, rb);
    let gw = match w {
        Some(w) => {
            let wv = cx.cast(w.v, acc);
            let wv = cx.reshape(wv, &shape);
            let wb = cx.broadcast_in_dim(wv, &dims, &inner);
            cx.mul(gv, wb)
        }
        None => gv,
    };
    let n: i64 = shape.iter().product();
    let s1 = reduce_back(cx, gw, &inner, Red::Sum);
    let gwx = cx.mul(gw, xhat);
    let s2 = reduce_back(cx, gwx, &inner, Red::Sum);
    let nv = constant(cx, n as f64, s1);
    let m1 = cx.div(s1, nv);
    let m2 = cx.div(s2, nv);
    let t = cx.sub(gw, m1);
    let p = cx.mul(xhat, m2);
    let t = cx.sub(t, p);
    let gi = cx.mul(t, rb);
    let gxh = cx.mul(gv, xhat);
    let dgamma = reduce(cx, gxh, &outer, Red::Sum);
    let dbeta = reduce(cx, gv, &outer, Red::Sum);
    let wdt = w.map(|w| w.dtype).unwrap_or(x.dtype);
    let bdt = b.map(|b| b.dtype).unwrap_or(wdt);
    let gi = cx.cast(gi, x.dtype);
    let dgamma = cx.cast(dgamma, wdt);
    let dbeta = cx.cast(dbeta, bdt);
    Ok(vec![Out::Tensor(gi), Out::Tensor(dgamma), Out::Tensor(dbeta)])
}

// ---- nll_loss -----------------------------------------------------------------------------------

/// Checks of nll_loss(2d) and the input/target shaped as [N, C, rest...] / [N, rest...].
struct Nll {
    x: Tensor,
    t: Tensor,
    w: Option<Tensor>,
    /// An unbatched input ([C] with a 0-d target), computed as a batch of one.
    unbatched: bool,
}

fn nll_args(cx: &mut Cx, args: &Args, two_d: bool) -> Result<Nll> {
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    let w = args.opt_tensor("weight")?;
    let xd = cx.dims(x.v);
    let td = cx.dims(t.v);
    if two_d {
        check!(
            td.len() == 3,
            Runtime,
            "only batches of spatial targets supported (3D tensors) but got targets of dimension: {}",
            td.len()
        );
        check!(
            xd.len() == 4,
            Runtime,
            "only batches of spatial inputs supported (4D tensors), but got input of dimension: {}",
            xd.len()
        );
        if let Some(w) = w {
            check!(cx.numel(w.v) == xd[1], Runtime, "weight tensor should be defined either for all or no classes");
        }
        check!(
            xd[0] == td[0] && xd[2] == td[1] && xd[3] == td[2],
            Runtime,
            "size mismatch (got input: {:?} , target: {:?}",
            xd,
            td
        );
    } else {
        check!(!xd.is_empty() && xd.len() <= 2, Runtime, "input tensor should be 1D or 2D");
        check!(td.len() <= 1, Runtime, "0D or 1D target tensor expected, multi-target not supported");
        let no_batch = xd.len() == 1 && td.is_empty();
        check!(
            no_batch || xd[0] == td[0] || (xd.len() == 1 && td[0] == 1),
            Runtime,
            "size mismatch (got input: {:?}, target: {:?})",
            xd,
            td
        );
        let n_classes = *xd.last().unwrap();
        if let Some(w) = w {
            let wd = cx.dims(w.v);
            check!(
                wd.len() == 1 && wd[0] == n_classes,
                Runtime,
                "weight tensor should be defined either for all {} classes or no classes but got weight tensor of shape: {:?}",
                n_classes,
                wd
            );
        }
    }
    check!(
        x.dtype.is_float(),
        NotImplemented,
        "\"{}\" not implemented for '{}'",
        if two_d { "nll_loss2d_forward_out_frame" } else { "nll_loss_out_frame" },
        x.dtype.torch_name()
    );
    check!(
        t.dtype == DType::I64 || t.dtype == DType::U8,
        Runtime,
        "expected scalar type Long but found {}",
        t.dtype.torch_name()
    );
    if let Some(w) = w {
        check!(w.dtype == x.dtype, Runtime, "expected scalar type {} but found {}", x.dtype.torch_name(), w.dtype.torch_name());
    }
    let unbatched = xd.len() == 1;
    let (mut x, mut t) = (x, t);
    if unbatched {
        x.v = cx.reshape(x.v, &[1, xd[0]]);
        t.v = cx.reshape(t.v, &[1]);
    }
    Ok(Nll { x, t, w, unbatched })
}

/// For x [N, C, rest...] and targets [N, rest...]: the one-hot mask of the target classes,
/// and each sample's weight (0 where the target is ignore_index), both in `acc`.
fn nll_select(cx: &mut Cx, n: &Nll, ignore_index: i64, acc: DType) -> (Value, Value) {
    let xd = cx.dims(n.x.v);
    let nd = xd.len() as i64;
    let t = cx.convert(n.t.v, ElemType::I64);
    let tdims: Vec<i64> = std::iter::once(0).chain(2..nd).collect();
    let tb = cx.broadcast_in_dim(t, &xd, &tdims);
    let classes = cx.iota(&TensorType::new(ElemType::I64, &xd), 1);
    let onehot = cx.compare(CmpDir::Eq, classes, tb);
    let td = cx.dims(t);
    let ig = cx.b.splat_i64(ignore_index, &TensorType::new(ElemType::I64, &td));
    let valid = cx.compare(CmpDir::Ne, t, ig);
    let wi = match n.w {
        Some(w) => {
            let wv = cx.cast(w.v, acc);
            let wb = cx.broadcast_in_dim(wv, &xd, &[1]);
            let zero = cx.full(0.0, acc, &xd);
            let picked = cx.select(onehot, wb, zero);
            reduce(cx, picked, &[1], Red::Sum)
        }
        None => cx.full(1.0, acc, &td),
    };
    let zero = cx.full(0.0, acc, &td);
    let wi = cx.select(valid, wi, zero);
    (onehot, wi)
}

/// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index)
/// -> (output, total_weight). Targets outside [0, C) other than ignore_index contribute
/// nothing here (PyTorch raises an IndexError on CPU).
fn nll_loss_forward(cx: &mut Cx, args: &Args, two_d: bool) -> Result<Vec<Out>> {
    let n = nll_args(cx, args, two_d)?;
    let red = reduction(args)?;
    let ignore = args.int("ignore_index")?;
    let acc = acc_type(n.x.dtype);
    let (onehot, wi) = nll_select(cx, &n, ignore, acc);
    let xv = cx.cast(n.x.v, acc);
    let xd = cx.dims(xv);
    let zero = cx.full(0.0, acc, &xd);
    let picked = cx.select(onehot, xv, zero);
    let xi = reduce(cx, picked, &[1], Red::Sum);
    let li = cx.mul(wi, xi);
    let li = cx.neg(li);
    // Ignored samples contribute exactly zero, whatever their input values.
    let zero_t = constant(cx, 0.0, li);
    let pos = constant(cx, 0.0, wi);
    let counted = cx.compare(CmpDir::Ne, wi, pos);
    let li = cx.select(counted, li, zero_t);
    let all: Vec<i64> = (0..cx.dims(li).len() as i64).collect();
    let total = reduce(cx, wi, &all, Red::Sum);
    let out = match red {
        Reduction::None => {
            if n.unbatched {
                cx.reshape(li, &[])
            } else {
                li
            }
        }
        Reduction::Sum => reduce(cx, li, &all, Red::Sum),
        Reduction::Mean => {
            let s = reduce(cx, li, &all, Red::Sum);
            cx.div(s, total)
        }
    };
    let total = if red == Reduction::None { cx.full(0.0, acc, &[]) } else { total };
    let out = cx.cast(out, n.x.dtype);
    let total = cx.cast(total, n.x.dtype);
    Ok(vec![Out::Tensor(out), Out::Tensor(total)])
}

/// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
/// ignore_index, total_weight) -> grad_input.
fn nll_loss_backward(cx: &mut Cx, args: &Args, two_d: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let n = nll_args(cx, args, two_d)?;
    let red = reduction(args)?;
    let ignore = args.int("ignore_index")?;
    let acc = acc_type(n.x.dtype);
    let (onehot, wi) = nll_select(cx, &n, ignore, acc);
    let xd = cx.dims(n.x.v);
    let td = cx.dims(wi);
    let gv = cx.cast(g.v, acc);
    let gi = match red {
        Reduction::None => {
            let gd = cx.dims(gv);
            check!(
                cx.numel(gv) == td.iter().product::<i64>(),
                Runtime,
                "Expected a tensor of dimension 1 and tensor.size[0] == {} but got: dimension {} and tensor.size[0] == {}",
                td[0],
                gd.len(),
                gd.first().copied().unwrap_or(1)
            );
            cx.reshape(gv, &td)
        }
        _ => {
            check!(
                cx.numel(gv) == 1,
                Runtime,
                "Expected a single element grad_output tensor, but got: {:?}",
                cx.dims(gv)
            );
            let gs = cx.reshape(gv, &[]);
            let gs = if red == Reduction::Mean {
                let tw = args.tensor("total_weight")?;
                let twv = cx.cast(tw.v, acc);
                let twv = cx.reshape(twv, &[]);
                cx.div(gs, twv)
            } else {
                gs
            };
            cx.broadcast_in_dim(gs, &td, &[])
        }
    };
    let per = cx.mul(wi, gi);
    let per = cx.neg(per);
    let nd = xd.len() as i64;
    let tdims: Vec<i64> = std::iter::once(0).chain(2..nd).collect();
    let pb = cx.broadcast_in_dim(per, &xd, &tdims);
    let zero = cx.full(0.0, acc, &xd);
    let out = cx.select(onehot, pb, zero);
    let out = if n.unbatched { cx.reshape(out, &[xd[1]]) } else { out };
    one(cx.cast(out, n.x.dtype))
}

// ---- mse_loss ------------------------------------------------------------------------------------

/// The promoted float dtype of a loss's operands, with PyTorch's error for integers.
/// A loss kernel's norm converted to an integer dtype like c10's checked Scalar conversion
/// (a mean over no elements is infinite and raises).
fn int_norm(norm: f64, dt: DType) -> Result<f64> {
    let name = match dt {
        DType::I64 => "int64_t",
        DType::I32 => "int",
        DType::I16 => "int16_t",
        DType::I8 => "int8_t",
        _ => "uint8_t",
    };
    check!(norm.is_finite(), Runtime, "value cannot be converted to type {} without overflow", name);
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
    let acc = acc_type(dt);
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
    let acc = acc_type(dt);
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
    let acc = acc_type(x.dtype);
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

/// The threshold of huber_loss (delta > 0) or smooth_l1_loss (beta >= 0).
fn robust_threshold(args: &Args, smooth_l1: bool) -> Result<f64> {
    let (name, default) = if smooth_l1 { ("beta", 1.0) } else { ("delta", 1.0) };
    let t = match args.opt_scalar(name)? {
        None => default,
        Some(crate::Scalar::Int(i)) => i as f64,
        Some(crate::Scalar::Bool(b)) => b as i64 as f64,
        Some(crate::Scalar::Float(f)) => f.value,
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
    let acc = acc_type(dt);
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
    let acc = acc_type(dt);
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

// ---- weight norm ----------------------------------------------------------------------------------

/// The fused weight norm's layout of `v` along `dim`: the dims its norms reduce (all but
/// `dim`) and the number of norms (`v.size(dim)`). PyTorch's kernels exist for the first and
/// the last dim only (`dim` is not wrapped) and read `g` as one value per norm.
fn weight_norm_layout(cx: &Cx, v: &Tensor, g: &Tensor, dim: i64, kernel: &str) -> Result<(Vec<i64>, i64)> {
    check!(v.dtype.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, v.dtype.torch_name());
    let dims = cx.dims(v.v);
    let nd = dims.len() as i64;
    check!(nd > 0, Index, "Dimension specified as 0 but tensor has no dimensions");
    check!(
        dim == 0 || dim == nd - 1,
        Runtime,
        "fused kernels can only be applied for first or last dim (got dim {} of a {}-d tensor)",
        dim,
        nd
    );
    let n = dims[dim as usize];
    check!(
        cx.numel(g.v) == n,
        Runtime,
        "weight_norm: expected g to hold one value per slice of v along dim {} ({}), but got g of shape {:?}",
        dim,
        n,
        cx.dims(g.v)
    );
    let rest: Vec<i64> = (0..nd).filter(|&d| d != dim).collect();
    Ok((rest, n))
}

/// The dtype of weight norm's saved norms: float32 for a 16-bit `g` (as on CUDA), else g's.
fn weight_norm_norms_dtype(g: DType) -> DType {
    if is_16bit(g) {
        DType::F32
    } else {
        g
    }
}

/// PyTorch's kernels read every operand in v's dtype (the norms in their own): a mismatch is
/// "expected scalar type".
fn check_same_dtype(expected: DType, t: &Tensor) -> Result<()> {
    check!(
        t.dtype == expected,
        Runtime,
        "expected scalar type {} but found {}",
        expected.torch_name(),
        t.dtype.torch_name()
    );
    Ok(())
}

/// One value per norm (`g` or the norms, any shape holding `n` values) broadcast along `dim`.
fn per_norm(cx: &mut Cx, t: Value, n: i64, dims: &[i64], dim: i64, acc: DType) -> Value {
    let t = cx.cast(t, acc);
    let t = cx.reshape(t, &[n]);
    cx.broadcast_in_dim(t, dims, &[dim])
}

/// _weight_norm_interface(v, g, dim) -> (w, norms): w = v * g / ||v|| with the 2-norms taken
/// over every dim but `dim`; norms has g's shape. 16-bit inputs are computed in float32.
fn weight_norm_interface(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let v = args.tensor("v")?;
    let g = args.tensor("g")?;
    let dim = args.int_or("dim", 0)?;
    let (rest, n) = weight_norm_layout(cx, &v, &g, dim, "weight_norm_kernel")?;
    check_same_dtype(v.dtype, &g)?;
    let dims = cx.dims(v.v);
    let acc = acc_type(v.dtype);
    let x = cx.cast(v.v, acc);
    let sq = cx.mul(x, x);
    let ss = reduce(cx, sq, &rest, Red::Sum);
    let norm = cx.sqrt(ss);
    let nb = cx.broadcast_in_dim(norm, &dims, &[dim]);
    let gb = per_norm(cx, g.v, n, &dims, dim, acc);
    let scale = cx.div(gb, nb);
    let w = cx.mul(x, scale);
    let w = cx.cast(w, v.dtype);
    let g_dims = cx.dims(g.v);
    let norms = cx.reshape(norm, &g_dims);
    let norms = cx.cast(norms, weight_norm_norms_dtype(g.dtype));
    Ok(vec![Out::Tensor(w), Out::Tensor(norms)])
}

/// _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim) ->
/// (grad_v, grad_g): with a = sum(grad_w * v) over each slice, grad_g = a / norm and
/// grad_v = g / norm * (grad_w - v * a / norm^2), as PyTorch's fused kernels compute them.
fn weight_norm_interface_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let gw = args.tensor("grad_w")?;
    let v = args.tensor("saved_v")?;
    let g = args.tensor("saved_g")?;
    let norms = args.tensor("saved_norms")?;
    let dim = args.int("dim")?;
    let (rest, n) = weight_norm_layout(cx, &v, &g, dim, "weight_norm_backward_kernel")?;
    check_same_dtype(v.dtype, &gw)?;
    check_same_dtype(v.dtype, &g)?;
    check_same_dtype(weight_norm_norms_dtype(v.dtype), &norms)?;
    let dims = cx.dims(v.v);
    check!(
        cx.dims(gw.v) == dims && cx.numel(norms.v) == n,
        Runtime,
        "weight_norm backward: expected grad_w of shape {:?} and {} norms, but got grad_w of shape {:?} and norms of shape {:?}",
        dims,
        n,
        cx.dims(gw.v),
        cx.dims(norms.v)
    );
    let acc = acc_type(v.dtype);
    let x = cx.cast(v.v, acc);
    let dw = cx.cast(gw.v, acc);
    let prod = cx.mul(dw, x);
    let a = reduce(cx, prod, &rest, Red::Sum);
    let nrm = cx.cast(norms.v, acc);
    let nrm = cx.reshape(nrm, &[n]);
    let grad_g = cx.div(a, nrm);
    let g_dims = cx.dims(g.v);
    let grad_g_out = cx.reshape(grad_g, &g_dims);
    let grad_g_out = cx.cast(grad_g_out, g.dtype);
    let n2 = cx.mul(nrm, nrm);
    let coef = cx.div(a, n2);
    let coef = cx.broadcast_in_dim(coef, &dims, &[dim]);
    let vc = cx.mul(x, coef);
    let d = cx.sub(dw, vc);
    let gb = per_norm(cx, g.v, n, &dims, dim, acc);
    let nb = cx.broadcast_in_dim(nrm, &dims, &[dim]);
    let scale = cx.div(gb, nb);
    let grad_v = cx.mul(scale, d);
    let grad_v = cx.cast(grad_v, v.dtype);
    Ok(vec![Out::Tensor(grad_v), Out::Tensor(grad_g_out)])
}

/// Per-channel (dim 1) statistics of `v`, in its (accumulation) dtype, over the `red` dims:
/// (mean, biased variance, unbiased variance).
fn channel_stats(cx: &mut Cx, v: Value, dims: &[i64], red: &[i64], acc: DType, c: i64) -> (Value, Value, Value) {
    let n = constant_count(cx, dims, red, acc, c);
    let s = reduce(cx, v, red, Red::Sum);
    let mean = cx.div(s, n);
    let mb = along_dim(cx, mean, dims, 1);
    let d = cx.sub(v, mb);
    let d2 = cx.mul(d, d);
    let s2 = reduce(cx, d2, red, Red::Sum);
    let var = cx.div(s2, n);
    let one_ = cx.full(1.0, acc, &[c]);
    let nm1 = cx.sub(n, one_);
    let unbiased = cx.div(s2, nm1);
    (mean, var, unbiased)
}

/// A running statistic's new value: (1 - momentum) running + momentum stat, computed in `acc`,
/// in the running tensor's dtype and shape.
fn running_update(cx: &mut Cx, old: &Tensor, stat: Value, momentum: Value, acc: DType, c: i64) -> Value {
    let m = cx.broadcast_in_dim(momentum, &[c], &[]);
    let one_ = cx.full(1.0, acc, &[c]);
    let keep = cx.sub(one_, m);
    let o = cx.cast(old.v, acc);
    let o = cx.reshape(o, &[c]);
    let a = cx.mul(o, keep);
    let b = cx.mul(stat, m);
    let r = cx.add(a, b);
    let r = cx.cast(r, old.dtype);
    let od = cx.dims(old.v);
    cx.reshape(r, &od)
}
