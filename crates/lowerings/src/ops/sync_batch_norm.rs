//! The per-rank pieces nn.SyncBatchNorm composes around its collectives (CUDA kernels in
//! PyTorch, no CPU ones): batch_norm_stats, batch_norm_gather_stats_with_counts,
//! batch_norm_elemt, batch_norm_backward_reduce and batch_norm_backward_elemt. Channels are
//! dim 1; statistics are in the accumulation dtype (float32 for 16-bit inputs), as on CUDA.
use crate::args::{Args, Tensor};
use crate::blocks::reduce::{reduce, Red};
use crate::ops::normalization::{running_update, scalar_float};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, Out, op, Op};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[
    op("batch_norm_stats", batch_norm_stats),
    // CUDA updates the running statistics in place without declaring it in the schema.
    op("batch_norm_gather_stats_with_counts", gather_stats_with_counts).writes(&["running_mean", "running_var"]),
    op("batch_norm_elemt", batch_norm_elemt),
    op("batch_norm_backward_reduce", backward_reduce),
    op("batch_norm_backward_elemt", backward_elemt),
];

/// The input, its dims and the dims every statistic sums over (all but 1).
fn channels(cx: &Cx, x: &Tensor, op: &str) -> Result<(Vec<i64>, Vec<i64>)> {
    check!(x.dtype.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", op, x.dtype.torch_name());
    let dims = cx.dims(x.v);
    check!(dims.len() >= 2, Runtime, "{}: expected an input with at least 2 dims, but got {}", op, dims.len());
    let red = (0..dims.len() as i64).filter(|&d| d != 1).collect();
    Ok((dims, red))
}

/// A per-channel tensor as a [C] vector of `acc`.
fn per_channel(cx: &mut Cx, t: &Tensor, c: i64, acc: DType, name: &str) -> Result<Value> {
    check!(cx.numel(t.v) == c, Runtime, "{} should contain {} elements not {}", name, c, cx.numel(t.v));
    let v = cx.cast(t.v, acc);
    Ok(cx.reshape(v, &[c]))
}

/// A float argument (a runtime value unless specialized) broadcast to `dims`.
fn float_arg(cx: &mut Cx, args: &Args, name: &str, acc: DType, dims: &[i64]) -> Result<Value> {
    let v = scalar_float(args, name, acc, cx)?;
    Ok(cx.broadcast_in_dim(v, dims, &[]))
}

fn along_channels(cx: &mut Cx, v: Value, dims: &[i64]) -> Value {
    cx.broadcast_in_dim(v, dims, &[1])
}

/// batch_norm_stats(input, eps) -> (mean, invstd): this rank's per-channel mean and
/// 1 / sqrt(biased variance + eps).
fn batch_norm_stats(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    let (dims, red) = channels(cx, &x, "batch_norm_stats")?;
    let acc = x.dtype.opmath();
    let c = dims[1];
    let n: i64 = red.iter().map(|&d| dims[d as usize]).product();
    let v = cx.cast(x.v, acc);
    let count = cx.full(n as f64, acc, &[c]);
    let s = reduce(cx, v, &red, Red::Sum);
    let mean = cx.div(s, count);
    let mb = along_channels(cx, mean, &dims);
    let d = cx.sub(v, mb);
    let d2 = cx.mul(d, d);
    let s2 = reduce(cx, d2, &red, Red::Sum);
    let var = cx.div(s2, count);
    let eps = float_arg(cx, args, "eps", acc, &[c])?;
    let ve = cx.add(var, eps);
    Ok(vec![Out::Tensor(mean), Out::Tensor(cx.rsqrt(ve))])
}

/// batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean?, running_var?,
/// momentum, eps, counts) -> (mean, invstd) of all ranks together, from each rank's [world, C]
/// statistics and element counts; the running statistics move toward the mean and the unbiased
/// variance. The variance sums each rank's own and its mean's distance from the whole mean.
fn gather_stats_with_counts(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let means = args.tensor("mean")?;
    let invstds = args.tensor("invstd")?;
    let counts = args.tensor("counts")?;
    let md = cx.dims(means.v);
    check!(md.len() == 2 && cx.dims(invstds.v) == md, Runtime, "batch_norm_gather_stats_with_counts: expected mean and invstd of shape [world_size, channels]");
    let (world, c) = (md[0], md[1]);
    check!(cx.numel(counts.v) == world, Runtime, "batch_norm_gather_stats_with_counts: expected {} counts, got {}", world, cx.numel(counts.v));
    let acc = means.dtype.opmath();
    let m = cx.cast(means.v, acc);
    let inv = cx.cast(invstds.v, acc);
    let k = cx.cast(counts.v, acc);
    let k = cx.reshape(k, &[world]);
    let kb = cx.broadcast_in_dim(k, &[world, c], &[0]);
    let total = reduce(cx, k, &[0], Red::Sum);
    let total_c = cx.broadcast_in_dim(total, &[c], &[]);
    // Each rank's biased variance from its invstd.
    let inv2 = cx.mul(inv, inv);
    let one = cx.full(1.0, acc, &[world, c]);
    let v = cx.div(one, inv2);
    let eps_wc = float_arg(cx, args, "eps", acc, &[world, c])?;
    let v = cx.sub(v, eps_wc);
    let km = cx.mul(kb, m);
    let sum_m = reduce(cx, km, &[0], Red::Sum);
    let mean = cx.div(sum_m, total_c);
    let mean_b = cx.broadcast_in_dim(mean, &[world, c], &[1]);
    let dm = cx.sub(m, mean_b);
    let dm2 = cx.mul(dm, dm);
    let spread = cx.add(v, dm2);
    let kspread = cx.mul(kb, spread);
    let sq = reduce(cx, kspread, &[0], Red::Sum);
    let var = cx.div(sq, total_c);
    let eps_c = float_arg(cx, args, "eps", acc, &[c])?;
    let ve = cx.add(var, eps_c);
    let invstd = cx.rsqrt(ve);
    let one_c = cx.full(1.0, acc, &[c]);
    let total_m1 = cx.sub(total_c, one_c);
    let unbiased = cx.div(sq, total_m1);
    let momentum = scalar_float(args, "momentum", acc, cx)?;
    let mut res = Vec::new();
    for (name, stat) in [("running_mean", mean), ("running_var", unbiased)] {
        if let Some(old) = args.opt_tensor(name)? {
            check!(cx.numel(old.v) == c, Runtime, "{} should contain {} elements not {}", name, c, cx.numel(old.v));
            res.push(Out::Tensor(running_update(cx, &old, stat, momentum, acc, c)));
        }
    }
    res.push(Out::Tensor(cx.cast(mean, means.dtype)));
    res.push(Out::Tensor(cx.cast(invstd, invstds.dtype)));
    Ok(res)
}

/// (input - mean) * invstd * weight + bias, with [C] statistics along dim 1.
fn batch_norm_elemt(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    let (dims, _) = channels(cx, &x, "batch_norm_elemt")?;
    let (acc, c) = (x.dtype.opmath(), dims[1]);
    let mean = per_channel(cx, &args.tensor("mean")?, c, acc, "mean")?;
    let mut scale = per_channel(cx, &args.tensor("invstd")?, c, acc, "invstd")?;
    if let Some(w) = args.opt_tensor("weight")? {
        let w = per_channel(cx, &w, c, acc, "weight")?;
        scale = cx.mul(scale, w);
    }
    let v = cx.cast(x.v, acc);
    let mb = along_channels(cx, mean, &dims);
    let sb = along_channels(cx, scale, &dims);
    let d = cx.sub(v, mb);
    let mut y = cx.mul(d, sb);
    if let Some(b) = args.opt_tensor("bias")? {
        let b = per_channel(cx, &b, c, acc, "bias")?;
        let bb = along_channels(cx, b, &dims);
        y = cx.add(y, bb);
    }
    Ok(vec![Out::Tensor(cx.cast(y, x.dtype))])
}

/// batch_norm_backward_reduce(grad_out, input, mean, invstd, weight?, input_g, weight_g,
/// bias_g) -> (sum_dy, sum_dy_xmu, grad_weight, grad_bias): this rank's per-channel sums of
/// grad_out and of grad_out * (input - mean), and from them the weight's and bias's gradients;
/// each only where asked for (undefined otherwise).
fn backward_reduce(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_out")?;
    let x = args.tensor("input")?;
    let (dims, red) = channels(cx, &x, "batch_norm_backward_reduce")?;
    check!(cx.dims(g.v) == dims, Runtime, "batch_norm_backward_reduce: grad_out of shape {:?} for an input of shape {:?}", cx.dims(g.v), dims);
    let mean_t = args.tensor("mean")?;
    let (acc, c) = (x.dtype.opmath(), dims[1]);
    let mean = per_channel(cx, &mean_t, c, acc, "mean")?;
    let invstd = per_channel(cx, &args.tensor("invstd")?, c, acc, "invstd")?;
    let weight = args.opt_tensor("weight")?;
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    let mb = along_channels(cx, mean, &dims);
    let xmu = cx.sub(xv, mb);
    let dy_xmu = cx.mul(gv, xmu);
    let sum_dy = reduce(cx, gv, &red, Red::Sum);
    let sum_dy_xmu = reduce(cx, dy_xmu, &red, Red::Sum);
    let stat_dt = mean_t.dtype;
    let grad_dt = weight.map_or(stat_dt, |w| w.dtype);
    let mut res = Vec::new();
    for (wanted, v, dt) in [("input_g", sum_dy, stat_dt), ("input_g", sum_dy_xmu, stat_dt)] {
        res.push(if args.bool(wanted)? { Out::Tensor(cx.cast(v, dt)) } else { Out::Undefined });
    }
    let grad_weight = cx.mul(sum_dy_xmu, invstd);
    res.push(if args.bool("weight_g")? { Out::Tensor(cx.cast(grad_weight, grad_dt)) } else { Out::Undefined });
    res.push(if args.bool("bias_g")? { Out::Tensor(cx.cast(sum_dy, grad_dt)) } else { Out::Undefined });
    Ok(res)
}

/// batch_norm_backward_elemt(grad_out, input, mean, invstd, weight?, sum_dy, sum_dy_xmu,
/// count) -> grad_input, from the sums all-reduced over the ranks and each rank's element
/// count: (grad_out - sum_dy / N - (input - mean) * invstd^2 * sum_dy_xmu / N) * invstd * weight.
fn backward_elemt(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_out")?;
    let x = args.tensor("input")?;
    let (dims, _) = channels(cx, &x, "batch_norm_backward_elemt")?;
    let (acc, c) = (x.dtype.opmath(), dims[1]);
    let mean = per_channel(cx, &args.tensor("mean")?, c, acc, "mean")?;
    let invstd = per_channel(cx, &args.tensor("invstd")?, c, acc, "invstd")?;
    let sum_dy = per_channel(cx, &args.tensor("sum_dy")?, c, acc, "sum_dy")?;
    let sum_dy_xmu = per_channel(cx, &args.tensor("sum_dy_xmu")?, c, acc, "sum_dy_xmu")?;
    let count = args.tensor("count")?;
    let k = cx.cast(count.v, acc);
    let ranks = cx.numel(count.v);
    let k = cx.reshape(k, &[ranks]);
    let total = reduce(cx, k, &[0], Red::Sum);
    let total = cx.broadcast_in_dim(total, &[c], &[]);
    let mean_dy = cx.div(sum_dy, total);
    let mean_dy_xmu = cx.div(sum_dy_xmu, total);
    let inv2 = cx.mul(invstd, invstd);
    let proj_scale = cx.mul(mean_dy_xmu, inv2);
    let mut scale = invstd;
    if let Some(w) = args.opt_tensor("weight")? {
        let w = per_channel(cx, &w, c, acc, "weight")?;
        scale = cx.mul(scale, w);
    }
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    let mb = along_channels(cx, mean, &dims);
    let xmu = cx.sub(xv, mb);
    let pb = along_channels(cx, proj_scale, &dims);
    let proj = cx.mul(xmu, pb);
    let mdb = along_channels(cx, mean_dy, &dims);
    let centered = cx.sub(gv, mdb);
    let centered = cx.sub(centered, proj);
    let sb = along_channels(cx, scale, &dims);
    let gi = cx.mul(centered, sb);
    Ok(vec![Out::Tensor(cx.cast(gi, x.dtype))])
}
