//! Normalization layers and their backward ops: batch norm (native_batch_norm,
//! _native_batch_norm_legit*, batch_norm_update_stats, the newer entry points
//! _batch_norm_with_update(_functional) and batch_norm_backward), layer, group and weight norm.
//!
//! 16-bit floats are computed in float32 and rounded once at the end. native_layer_norm and
//! native_group_norm are routed past their composites (declared `.routed(...)`), which would
//! round 16-bit intermediates.
use crate::args::{Arg, Args, Tensor};
// `constant` is this file's name for consts::k.
use crate::blocks::consts::{k, k as constant};
use crate::blocks::reduce::{reduce, reduce_back, unreduce, Red};
use crate::blocks::round16::is_16bit;
use crate::blocks::type_names::check_scalar_type;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, Out, op, Op};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[
    op("native_batch_norm", native_batch_norm).writes(&["running_mean", "running_var"]),
    op("_native_batch_norm_legit", native_batch_norm_legit),
    op("_native_batch_norm_legit_functional", native_batch_norm_legit_functional),
    op("_native_batch_norm_legit_no_training", native_batch_norm_legit_no_training),
    // Routed: its composite would run several programs, rounding twice in 16-bit floats.
    op("native_layer_norm", native_layer_norm).routed(&["native_layer_norm"]),
    op("native_batch_norm_backward", native_batch_norm_backward),
    op("native_layer_norm_backward", native_layer_norm_backward),
    op("batch_norm_update_stats", batch_norm_update_stats).writes(&["running_mean", "running_var"]),
    op("_weight_norm_interface", weight_norm_interface),
    op("_weight_norm_interface_backward", weight_norm_interface_backward),
    // Routed: its composite (math_group_norm) computes 16-bit statistics in 16 bits.
    op("native_group_norm", native_group_norm).routed(&["native_group_norm"]),
    op("native_group_norm_backward", native_group_norm_backward),
    op("_batch_norm_with_update", batch_norm_with_update),
    op("_batch_norm_with_update_functional", batch_norm_with_update_functional),
    op("batch_norm_backward", batch_norm_backward),
];

// ---- helpers ----------------------------------------------------------------------------------

/// A per-channel vector of shape [C] broadcast along `dim` of `dims`.
fn along_dim(cx: &mut Cx, v: Value, dims: &[i64], dim: usize) -> Value {
    cx.broadcast_in_dim(v, dims, &[dim as i64])
}

pub(crate) fn scalar_float(args: &Args, name: &str, dt: DType, cx: &mut Cx) -> Result<Value> {
    let s = args.scalar(name)?;
    Ok(cx.scalar(s, dt))
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
    let acc = x.dtype.opmath();
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
    let acc = x.dtype.opmath();
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
    let acc = x.dtype.opmath();
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
/// mean and rstd shaped [outer..., 1...]. Eager calls are routed here past PyTorch's composite
/// (`.routed(...)`); torch.compile graphs keep this op.
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
    let acc = x.dtype.opmath();
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
    let acc = x.dtype.opmath();
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
    let acc = v.dtype.opmath();
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
    let acc = v.dtype.opmath();
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
pub(crate) fn running_update(cx: &mut Cx, old: &Tensor, stat: Value, momentum: Value, acc: DType, c: i64) -> Value {
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

// ---- group norm -------------------------------------------------------------------------------------

fn group_norm_checks(cx: &Cx, x: &Tensor, w: Option<Tensor>, b: Option<Tensor>, c: i64, group: i64) -> Result<()> {
    let xd = cx.dims(x.v);
    check!(group > 0, Runtime, "Expected num groups to be greater than 0, got {}", group);
    check!(
        c % group == 0,
        Runtime,
        "Expected number of channels in input to be divisible by num_groups, but got input of shape {:?} and num_groups={}",
        xd,
        group
    );
    for (t, name) in [(w, "weight"), (b, "bias")] {
        if let Some(t) = t {
            let td = cx.dims(t.v);
            check!(
                td.len() == 1 && td[0] == c,
                Runtime,
                "Expected {} to be a vector of size equal to the number of channels in input, but got {} of shape {:?} and input of shape {:?}",
                name,
                name,
                td,
                xd
            );
        }
    }
    Ok(())
}

/// The (N, C, HxW, group) arguments of the group norm ops, checked against the input.
fn group_dims(cx: &Cx, args: &Args, x: &Tensor) -> Result<(i64, i64, i64, i64)> {
    let n = args.int("N")?;
    let c = args.int("C")?;
    let hw = args.int("HxW")?;
    let group = args.int("group")?;
    let xd = cx.dims(x.v);
    check!(
        xd.len() >= 2 && xd[0] == n && xd[1] == c && cx.numel(x.v) == n * c * hw,
        Runtime,
        "{}: input of shape {:?} does not have N = {}, C = {}, HxW = {}",
        args.op,
        xd,
        n,
        c,
        hw
    );
    Ok((n, c, hw, group))
}

/// PyTorch's mixed-type rule: a 16-bit input with float32 parameters keeps float32 statistics.
fn group_param_dtype(x: DType, params: &[Option<Tensor>]) -> Result<DType> {
    let mixed = is_16bit(x) && params.iter().flatten().any(|p| p.dtype == DType::F32);
    if mixed {
        for p in params.iter().flatten() {
            check!(p.dtype == DType::F32, Runtime, "mixed dtype (CPU): expect parameter to have scalar type of Float");
        }
        return Ok(DType::F32);
    }
    for p in params.iter().flatten() {
        check_scalar_type(x, p.dtype)?;
    }
    Ok(x)
}

/// A per-(sample, group) statistic [N, G] repeated for each channel of its group, [N, C].
fn group_to_channels(cx: &mut Cx, v: Value, c: i64) -> Value {
    let ng = cx.dims(v);
    let (n, group) = (ng[0], ng[1]);
    let b = cx.broadcast_in_dim(v, &[n, group, c / group], &[0, 1]);
    cx.reshape(b, &[n, c])
}

/// A per-channel parameter [C] in `acc` broadcast over `dims` ([N, C, ...], channels at 1;
/// `fill` when absent).
fn channel_param(cx: &mut Cx, p: Option<Tensor>, acc: DType, dims: &[i64], fill: f64) -> Value {
    match p {
        Some(p) => {
            let v = cx.cast(p.v, acc);
            cx.broadcast_in_dim(v, dims, &[1])
        }
        None => cx.full(fill, acc, dims),
    }
}

/// A per-(sample, group) statistic [N, G] broadcast over [N, C, HxW].
fn group_stat(cx: &mut Cx, v: Value, n: i64, c: i64, hw: i64, group: i64) -> Value {
    let d = c / group;
    let b = cx.broadcast_in_dim(v, &[n, group, d, hw], &[0, 1]);
    cx.reshape(b, &[n, c, hw])
}

/// native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd).
fn native_group_norm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    let w = args.opt_tensor("weight")?;
    let b = args.opt_tensor("bias")?;
    let (n, c, hw, group) = group_dims(cx, args, &x)?;
    group_norm_checks(cx, &x, w, b, c, group)?;
    if crate::torch_version::group_norm_rejects_empty_spatial() {
        check!(hw > 0, Runtime, "Expected HxW to be greater than 0, got {}", hw);
    }
    check!(x.dtype.is_float(), NotImplemented, "\"GroupNormKernelImpl\" not implemented for '{}'", x.dtype.torch_name());
    let stat_dt = group_param_dtype(x.dtype, &[w, b])?;
    let xd = cx.dims(x.v);
    if cx.numel(x.v) == 0 {
        let y = cx.full(0.0, x.dtype, &xd);
        let mean = cx.full(0.0, stat_dt, &[n, group]);
        let rstd = cx.full(f64::NAN, stat_dt, &[n, group]);
        return Ok(vec![Out::Tensor(y), Out::Tensor(mean), Out::Tensor(rstd)]);
    }
    let acc = x.dtype.opmath();
    let d = c / group;
    let xv = cx.cast(x.v, acc);
    let xg = cx.reshape(xv, &[n, group, d * hw]);
    let cnt = cx.full((d * hw) as f64, acc, &[n, group]);
    let s = reduce(cx, xg, &[2], Red::Sum);
    let mean = cx.div(s, cnt);
    let mb = cx.broadcast_in_dim(mean, &[n, group, d * hw], &[0, 1]);
    let dv = cx.sub(xg, mb);
    let d2 = cx.mul(dv, dv);
    let s2 = reduce(cx, d2, &[2], Red::Sum);
    let var = cx.div(s2, cnt);
    let zero = k(cx, 0.0, var);
    let var = cx.max(var, zero);
    let eps = cx.scalar(args.scalar("eps")?, acc);
    let eps = cx.broadcast_in_dim(eps, &[n, group], &[]);
    let ve = cx.add(var, eps);
    let sd = cx.sqrt(ve);
    let one_ = k(cx, 1.0, sd);
    let rstd = cx.div(one_, sd);
    // y = x * scale + bias with scale = rstd * gamma, bias = beta - scale * mean.
    let dims = [n, c, hw];
    let x3 = cx.reshape(xv, &dims);
    let rb = group_stat(cx, rstd, n, c, hw, group);
    let mb = group_stat(cx, mean, n, c, hw, group);
    let gm = channel_param(cx, w, acc, &dims, 1.0);
    let bt = channel_param(cx, b, acc, &dims, 0.0);
    let scale = cx.mul(rb, gm);
    let sm = cx.mul(scale, mb);
    let bias = cx.sub(bt, sm);
    let y = cx.mul(x3, scale);
    let y = cx.add(y, bias);
    let y = cx.cast(y, x.dtype);
    let y = cx.reshape(y, &xd);
    let mean = cx.cast(mean, stat_dt);
    let rstd = cx.cast(rstd, stat_dt);
    Ok(vec![Out::Tensor(y), Out::Tensor(mean), Out::Tensor(rstd)])
}

/// native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
/// output_mask) -> (grad_input, grad_weight, grad_bias), with PyTorch's CPU formulas.
fn native_group_norm_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let dy = args.tensor("grad_out")?;
    let x = args.tensor("input")?;
    let mean = args.tensor("mean")?;
    let rstd = args.tensor("rstd")?;
    let w = args.opt_tensor("weight")?;
    let (n, c, hw, group) = group_dims(cx, args, &x)?;
    check!(x.dtype == dy.dtype, Runtime, "Expected scalar types of X and dY are same.");
    check!(x.dtype.is_float(), NotImplemented, "\"GroupNormBackwardKernelImpl\" not implemented for '{}'", x.dtype.torch_name());
    check!(group > 0 && c % group == 0, Runtime, "Expected number of channels in input to be divisible by num_groups");
    for (t, name) in [(&mean, "mean"), (&rstd, "rstd")] {
        check!(cx.numel(t.v) == n * group, Runtime, "native_group_norm_backward: {} should have {} elements", name, n * group);
    }
    let xd = cx.dims(x.v);
    let pdt = w.map(|w| w.dtype).unwrap_or(x.dtype);
    if cx.numel(x.v) == 0 {
        let gx = cx.full(0.0, x.dtype, &xd);
        let gw = cx.full(0.0, pdt, &[c]);
        let gb = cx.full(0.0, pdt, &[c]);
        return Ok(vec![Out::Tensor(gx), Out::Tensor(gw), Out::Tensor(gb)]);
    }
    let acc = x.dtype.opmath();
    let d = c / group;
    let dims = [n, c, hw];
    let dyv = cx.cast(dy.v, acc);
    let dyv = cx.reshape(dyv, &dims);
    let xv = cx.cast(x.v, acc);
    let xv = cx.reshape(xv, &dims);
    let mv = cx.cast(mean.v, acc);
    let mv = cx.reshape(mv, &[n, group]);
    let rv = cx.cast(rstd.v, acc);
    let rv = cx.reshape(rv, &[n, group]);
    // ds = sum_hw dY X, db = sum_hw dY: [N, C].
    let dyx = cx.mul(dyv, xv);
    let ds = reduce(cx, dyx, &[2], Red::Sum);
    let db = reduce(cx, dyv, &[2], Red::Sum);
    let gamma = channel_param(cx, w, acc, &[n, c], 1.0);
    // Per group: ds_g = sum ds gamma, db_g = sum db gamma.
    let group_sum = |cx: &mut Cx, v: Value| {
        let vg = cx.mul(v, gamma);
        let vg = cx.reshape(vg, &[n, group, d]);
        reduce(cx, vg, &[2], Red::Sum)
    };
    let dsg = group_sum(cx, ds);
    let dbg = group_sum(cx, db);
    let sv = cx.full(1.0 / (d * hw) as f64, acc, &[n, group]);
    // c2 = (db_g mean - ds_g) rstd^3 s, c3 = -c2 mean - db_g rstd s.
    let t = cx.mul(dbg, mv);
    let t = cx.sub(t, dsg);
    let r3 = cx.mul(rv, rv);
    let r3 = cx.mul(r3, rv);
    let c2 = cx.mul(t, r3);
    let c2 = cx.mul(c2, sv);
    let c2m = cx.mul(c2, mv);
    let c3 = cx.neg(c2m);
    let dr = cx.mul(dbg, rv);
    let dr = cx.mul(dr, sv);
    let c3 = cx.sub(c3, dr);
    // dX = rstd gamma dY + c2 X + c3.
    let rb = group_stat(cx, rv, n, c, hw, group);
    let gb3 = cx.broadcast_in_dim(gamma, &dims, &[0, 1]);
    let c1 = cx.mul(rb, gb3);
    let c2b = group_stat(cx, c2, n, c, hw, group);
    let c3b = group_stat(cx, c3, n, c, hw, group);
    let a = cx.mul(c1, dyv);
    let bx = cx.mul(c2b, xv);
    let gx = cx.add(a, bx);
    let gx = cx.add(gx, c3b);
    let gx = cx.cast(gx, x.dtype);
    let gx = cx.reshape(gx, &xd);
    // dgamma = sum_n (ds - db mean) rstd, dbeta = sum_n db.
    let mc = group_to_channels(cx, mv, c);
    let rc = group_to_channels(cx, rv, c);
    let dbm = cx.mul(db, mc);
    let gw = cx.sub(ds, dbm);
    let gw = cx.mul(gw, rc);
    let gw = reduce(cx, gw, &[0], Red::Sum);
    let gbeta = reduce(cx, db, &[0], Red::Sum);
    let gw = cx.cast(gw, pdt);
    let gbeta = cx.cast(gbeta, pdt);
    Ok(vec![Out::Tensor(gx), Out::Tensor(gw), Out::Tensor(gbeta)])
}

// ---- batch norm entry points ----------------------------------------------------------------------

/// Calls another registered lowering with renamed and extra arguments.
fn call_lowering(cx: &mut Cx, args: &Args, name: &str, renames: &[(&str, &str)], extra: &[(&str, Arg)]) -> Result<Vec<Out>> {
    let Some(l) = crate::registry().get(name) else {
        bail!(NotImplemented, "torchtpu: no lowering named {}", name);
    };
    let mut names: Vec<String> = args
        .names
        .iter()
        .map(|n| renames.iter().find(|(from, _)| from == n).map_or(n.clone(), |(_, to)| to.to_string()))
        .collect();
    let mut values: Vec<Arg> = args.values.to_vec();
    for (n, v) in extra {
        names.push(n.to_string());
        values.push(v.clone());
    }
    (l.f)(cx, &Args { op: args.op, names: &names, values: &values, strides: &[] })
}

/// _batch_norm_with_update(input, weight, bias, running_mean!, running_var!, momentum, eps)
/// -> (out, save_mean, save_invstd, reserve): training batch norm; the updated running
/// statistics come first (they are written).
fn batch_norm_with_update(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let mut outs = call_lowering(cx, args, "_native_batch_norm_legit", &[], &[("training", Arg::Bool(true))])?;
    check!(outs.len() == 5, Runtime, "_batch_norm_with_update: running_mean and running_var are required");
    outs.push(Out::Tensor(cx.full(0.0, DType::U8, &[0])));
    Ok(outs)
}

/// _batch_norm_with_update_functional(...) -> (out, save_mean, save_invstd, reserve,
/// running_mean_out, running_var_out).
fn batch_norm_with_update_functional(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let outs = call_lowering(cx, args, "_native_batch_norm_legit", &[], &[("training", Arg::Bool(true))])?;
    check!(outs.len() == 5, Runtime, "_batch_norm_with_update_functional: running_mean and running_var are required");
    let mut it = outs.into_iter();
    let (rm, rv) = (it.next().unwrap(), it.next().unwrap());
    let mut res: Vec<Out> = it.collect();
    res.push(Out::Tensor(cx.full(0.0, DType::U8, &[0])));
    res.push(rm);
    res.push(rv);
    Ok(res)
}

/// batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
/// save_var, update, eps, output_mask, reserve): native_batch_norm_backward with `update` as
/// its training flag and save_var holding the saved inverse standard deviation.
fn batch_norm_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    call_lowering(cx, args, "native_batch_norm_backward", &[("save_var", "save_invstd"), ("update", "train")], &[])
}
