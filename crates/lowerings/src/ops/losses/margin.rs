//! Margin losses: multi_margin_loss(_backward) and multilabel_margin_loss_forward / _backward.
//! 16-bit floats are computed in float32 and rounded once, like PyTorch's CPU kernels. Target
//! indices out of range are not checked (that needs the data): PyTorch raises for them on CPU.
use crate::args::{Args, Scalar, Tensor};
use crate::blocks::consts::{ik, iota, k};
use crate::blocks::reduce::{reduce, Red};
use crate::blocks::round16::round_to;
use crate::blocks::type_names::{check_float_kernel, check_scalar_type};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{reduction, Reduction};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    // p (1 or 2) decides the program; margin is compiled in with it.
    op("multi_margin_loss", multi_margin_loss).specialized(),
    op("multi_margin_loss_backward", multi_margin_loss_backward).specialized(),
    op("multilabel_margin_loss_forward", multilabel_margin_loss_forward),
    op("multilabel_margin_loss_backward", multilabel_margin_loss_backward),
];

// ---- multi_margin_loss ----------------------------------------------------------------------------

/// Checks shared by multi_margin_loss and its backward: (nframe, dim, p).
fn multi_margin_checks(cx: &Cx, args: &Args, x: &Tensor, t: &Tensor, w: Option<Tensor>) -> Result<(i64, i64, i64)> {
    let p = match args.scalar("p")?.to_real(DType::I32)? {
        Scalar::Int(i) => i,
        Scalar::Bool(b) => b as i64,
        s => s.to_f64().trunc() as i64,
    };
    check!(p == 1 || p == 2, Runtime, "only p == 1 and p == 2 supported");
    let xd = cx.dims(x.v);
    let td = cx.dims(t.v);
    let nd = xd.len();
    let valid = (nd == 2 && xd[1] != 0) || (nd == 1 && xd[0] != 0) || nd == 0;
    let (nframe, dim) = if nd <= 1 { (1, if nd == 0 { 1 } else { xd[0] }) } else { (xd[0], xd[1]) };
    check!(valid, Runtime, "Expected non-empty vector or matrix with optional 0-dim batch size, but got: {:?}", xd);
    check!(
        (td.len() == 1 && td[0] == nframe) || (nd <= 1 && td.is_empty()),
        Runtime,
        "multi_margin_loss: target tensor should be 1-D with size equal to the number of input samples (batch size). Expected target size [{}], but got {:?}. Input has shape {:?}.",
        nframe,
        td,
        xd
    );
    if let Some(w) = w {
        let wd = cx.dims(w.v);
        check!(
            wd.len() <= 1 && cx.numel(w.v) == dim,
            Runtime,
            "inconsistent weight size, expected {} but got {:?}",
            dim,
            wd
        );
    }
    check!(t.dtype == DType::I64, Runtime, "expected scalar type Long but found {}", t.dtype.torch_name());
    Ok((nframe, dim, p))
}

/// The per-element hinge terms of multi_margin_loss on x [N, D] with targets t [N]: the
/// one-hot target mask, the active mask (d != target and z > 0) and z = margin - x[t] + x[d].
fn multi_margin_terms(cx: &mut Cx, args: &Args, x: Value, t: Value, dt: DType) -> Result<(Value, Value, Value)> {
    let xd = cx.dims(x);
    let tb = cx.broadcast_in_dim(t, &xd, &[0]);
    let cls = iota(cx, &xd, 1);
    let onehot = cx.compare(CmpDir::Eq, cls, tb);
    let zero = k(cx, 0.0, x);
    let picked = cx.select(onehot, x, zero);
    let xt = reduce(cx, picked, &[1], Red::Sum);
    let margin = args.scalar("margin")?;
    let mg = cx.scalar_like(margin, dt, &[xd[0]]);
    let mg = cx.cast(mg, cx.dtype(x));
    let z = cx.sub(mg, xt);
    let z = round_to(cx, z, dt);
    let zb = cx.broadcast_in_dim(z, &xd, &[0]);
    let z = cx.add(zb, x);
    let z = round_to(cx, z, dt);
    let pos = cx.compare(CmpDir::Gt, z, zero);
    let not_t = cx.not(onehot);
    let active = cx.and(pos, not_t);
    Ok((onehot, active, z))
}

/// h [N, D] times the weight of each sample's target class (h itself without weights).
fn times_target_weight(cx: &mut Cx, h: Value, w: Option<Tensor>, onehot: Value, acc: DType) -> Value {
    let Some(w) = w else {
        return h;
    };
    let xd = cx.dims(onehot);
    let wv = cx.cast(w.v, acc);
    let wv = cx.reshape(wv, &[xd[1]]);
    let wb = cx.broadcast_in_dim(wv, &xd, &[1]);
    let zero = cx.full(0.0, acc, &xd);
    let picked = cx.select(onehot, wb, zero);
    let wt = reduce(cx, picked, &[1], Red::Sum);
    let hd = cx.dims(h);
    let wb = cx.broadcast_in_dim(wt, &hd, &[0]);
    cx.mul(h, wb)
}

/// The result of a margin loss over an empty batch: [0] per sample; the sum is 0 and the mean
/// 0 / 0.
fn empty_margin_loss(cx: &mut Cx, red: Reduction, per_sample: bool, dt: DType) -> Value {
    match red {
        _ if per_sample => cx.full(0.0, dt, &[0]),
        Reduction::Mean if dt.is_float() => cx.full(f64::NAN, dt, &[]),
        _ => cx.full(0.0, dt, &[]),
    }
}

/// grad_input [N, D] of a margin loss times grad_output: one element for a reduced loss (or a
/// 0-d input), else one per sample [N]; `shape_msg` is the kernel's error for another shape.
fn times_grad_output(cx: &mut Cx, gi: Value, go: &Tensor, dt: DType, red: Reduction, shape_msg: impl FnOnce(&[i64]) -> String) -> Result<Value> {
    let nd = cx.dims(gi);
    let gov = cx.cast(go.v, dt);
    let god = cx.dims(gov);
    if red != Reduction::None || god.is_empty() {
        check!(cx.numel(gov) == 1, Runtime, "Expected a single element grad_output tensor, but got: {:?}", god);
        let gs = cx.reshape(gov, &[]);
        let gb = cx.broadcast_in_dim(gs, &nd, &[]);
        Ok(cx.mul(gi, gb))
    } else {
        check!(god.len() == 1 && god[0] == nd[0], Runtime, "{}", shape_msg(&god));
        let gb = cx.broadcast_in_dim(gov, &nd, &[0]);
        Ok(cx.mul(gi, gb))
    }
}

/// multi_margin_loss(self, target, p, margin, weight, reduction): per sample,
/// sum over d != y of max(0, margin - x[y] + x[d])^p * w[y] / C.
fn multi_margin_loss(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    let w = args.opt_tensor("weight")?;
    let red = reduction(args)?;
    let (nframe, dim, p) = multi_margin_checks(cx, args, &x, &t, w)?;
    let td = cx.dims(t.v);
    let per_sample = red == Reduction::None && !td.is_empty();
    let dt = x.dtype;
    if cx.numel(x.v) == 0 {
        return one(empty_margin_loss(cx, red, per_sample, dt));
    }
    check_float_kernel(dt, "multi_margin_loss_cpu_kernel", false)?;
    if let Some(w) = w {
        check_scalar_type(dt, w.dtype)?;
    }
    let xv = cx.reshape(x.v, &[nframe, dim]);
    let tv = cx.reshape(t.v, &[nframe]);
    let (onehot, active, z) = multi_margin_terms(cx, args, xv, tv, dt)?;
    let h = if p == 1 { z } else { cx.mul(z, z) };
    let h = times_target_weight(cx, h, w, onehot, dt);
    let zero = k(cx, 0.0, h);
    let h = cx.select(active, h, zero);
    let s = reduce(cx, h, &[1], Red::Sum);
    let dv = k(cx, dim as f64, s);
    let per = cx.div(s, dv);
    let out = if per_sample {
        per
    } else {
        let tot = reduce(cx, per, &[0], Red::Sum);
        if red == Reduction::Mean {
            let nv = k(cx, nframe as f64, tot);
            cx.div(tot, nv)
        } else {
            tot
        }
    };
    one(out)
}

/// multi_margin_loss_backward(grad_output, self, target, p, margin, weight, reduction).
fn multi_margin_loss_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let go = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    let w = args.opt_tensor("weight")?;
    let red = reduction(args)?;
    let (nframe, dim, p) = multi_margin_checks(cx, args, &x, &t, w)?;
    let dt = x.dtype;
    let xdims = cx.dims(x.v);
    if cx.numel(x.v) == 0 {
        return one(cx.full(0.0, dt, &xdims));
    }
    check_float_kernel(dt, "multi_margin_loss_backward_cpu_kernel", false)?;
    if let Some(w) = w {
        check_scalar_type(dt, w.dtype)?;
    }
    let xv = cx.reshape(x.v, &[nframe, dim]);
    let tv = cx.reshape(t.v, &[nframe]);
    let (onehot, active, z) = multi_margin_terms(cx, args, xv, tv, dt)?;
    let g = if red == Reduction::Mean { 1.0 / (nframe * dim) as f64 } else { 1.0 / dim as f64 };
    let gv = k(cx, g, z);
    let h = if p == 1 {
        gv
    } else {
        let two = k(cx, 2.0, z);
        let t2 = cx.mul(two, gv);
        cx.mul(t2, z)
    };
    let h = times_target_weight(cx, h, w, onehot, dt);
    let zero = k(cx, 0.0, h);
    let h = cx.select(active, h, zero);
    let s = reduce(cx, h, &[1], Red::Sum);
    let s = cx.neg(s);
    let nd = [nframe, dim];
    let sb = cx.broadcast_in_dim(s, &nd, &[0]);
    let gi = cx.select(onehot, sb, h);
    let gi = times_grad_output(cx, gi, &go, dt, red, |god| format!("Expected grad_output to have shape [{}] but got {:?}", nframe, god))?;
    one(cx.reshape(gi, &xdims))
}

// ---- multilabel_margin_loss -------------------------------------------------------------------------

fn multilabel_checks(cx: &Cx, x: &Tensor, t: &Tensor) -> Result<(i64, i64)> {
    let xd = cx.dims(x.v);
    let td = cx.dims(t.v);
    let nd = xd.len();
    let valid = (nd == 2 && xd[1] != 0) || (nd == 1 && xd[0] != 0) || nd == 0;
    check!(valid, Runtime, "Expected non-empty vector or matrix with optional 0-dim batch size, but got: {:?}", xd);
    let (nframe, dim) = if nd <= 1 {
        let dim = if nd == 0 { 1 } else { xd[0] };
        check!(
            td.len() <= 1 && cx.numel(t.v) == dim,
            Runtime,
            "inconsistent target size: {:?} for input of size: {:?}",
            td,
            xd
        );
        (1, dim)
    } else {
        check!(
            td.len() == 2 && td[0] == xd[0] && td[1] == xd[1],
            Runtime,
            "inconsistent target size: {:?} for input of size: {:?}",
            td,
            xd
        );
        (xd[0], xd[1])
    };
    check!(t.dtype == DType::I64, Runtime, "expected scalar type Long but found {}", t.dtype.torch_name());
    Ok((nframe, dim))
}

/// For targets t [N, D] (class lists ended by the first negative entry): valid[n, k] (entry k
/// is before the end) and onehot[n, k, c] (valid entry k names class c), both i1.
fn multilabel_targets(cx: &mut Cx, t: Value) -> (Value, Value) {
    let td = cx.dims(t);
    let (n, d) = (td[0], td[1]);
    let zero = ik(cx, 0, &td);
    let neg = cx.compare(CmpDir::Lt, t, zero);
    let pos = iota(cx, &td, 1);
    let end = ik(cx, d, &td);
    let at = cx.select(neg, pos, end);
    let first = reduce(cx, at, &[1], Red::Min);
    let fb = cx.broadcast_in_dim(first, &td, &[0]);
    let valid = cx.compare(CmpDir::Lt, pos, fb);
    let full = [n, d, d];
    let tb = cx.broadcast_in_dim(t, &full, &[0, 1]);
    let cls = iota(cx, &full, 2);
    let eq = cx.compare(CmpDir::Eq, tb, cls);
    let vb = cx.broadcast_in_dim(valid, &full, &[0, 1]);
    let onehot = cx.and(eq, vb);
    (valid, onehot)
}

/// The hinge mask of multilabel_margin_loss: mask[n, k, d] = entry k valid, d not a target,
/// and z = 1 - x[t_k] + x[d] > 0; with z.
fn multilabel_hinge(cx: &mut Cx, x: Value, valid: Value, onehot: Value, is_target: Value) -> (Value, Value) {
    let xd = cx.dims(x);
    let (n, d) = (xd[0], xd[1]);
    let full = [n, d, d];
    // x[t_k]: the class each entry names (0 for entries past the end: masked below).
    let xb = cx.broadcast_in_dim(x, &full, &[0, 2]);
    let zero3 = k(cx, 0.0, xb);
    let picked = cx.select(onehot, xb, zero3);
    let xt = reduce(cx, picked, &[2], Red::Sum);
    let one_ = k(cx, 1.0, xt);
    let a = cx.sub(one_, xt);
    let ab = cx.broadcast_in_dim(a, &full, &[0, 1]);
    let z = cx.add(ab, xb);
    let pos = cx.compare(CmpDir::Gt, z, zero3);
    let vb = cx.broadcast_in_dim(valid, &full, &[0, 1]);
    let nt = cx.not(is_target);
    let ntb = cx.broadcast_in_dim(nt, &full, &[0, 2]);
    let m = cx.and(pos, vb);
    let m = cx.and(m, ntb);
    (m, z)
}

/// multilabel_margin_loss_forward(self, target, reduction) -> (output, is_target).
fn multilabel_margin_loss_forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    let red = reduction(args)?;
    let (nframe, dim) = multilabel_checks(cx, &x, &t)?;
    let dt = x.dtype;
    let td = cx.dims(t.v);
    let per_sample = red == Reduction::None && td.len() == 2;
    if cx.numel(x.v) == 0 {
        let out = empty_margin_loss(cx, red, per_sample, dt);
        let is_t = cx.full(0.0, dt, &td);
        return Ok(vec![Out::Tensor(out), Out::Tensor(is_t)]);
    }
    check_float_kernel(dt, "multilabel_margin_loss_forward_out_frame", false)?;
    let xv = cx.reshape(x.v, &[nframe, dim]);
    let tv = cx.reshape(t.v, &[nframe, dim]);
    let (valid, onehot) = multilabel_targets(cx, tv);
    let is_target = reduce(cx, onehot, &[1], Red::Or);
    let (m, z) = multilabel_hinge(cx, xv, valid, onehot, is_target);
    let zero = k(cx, 0.0, z);
    let h = cx.select(m, z, zero);
    let per = reduce(cx, h, &[1, 2], Red::Sum);
    let out = if per_sample {
        let dv = k(cx, dim as f64, per);
        cx.div(per, dv)
    } else {
        let tot = reduce(cx, per, &[0], Red::Sum);
        let dv = k(cx, dim as f64, tot);
        let tot = cx.div(tot, dv);
        if red == Reduction::Mean {
            let nv = k(cx, nframe as f64, tot);
            cx.div(tot, nv)
        } else {
            tot
        }
    };
    let is_t = cx.cast(is_target, dt);
    let is_t = cx.reshape(is_t, &td);
    Ok(vec![Out::Tensor(out), Out::Tensor(is_t)])
}

/// multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target).
fn multilabel_margin_loss_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let go = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    let it = args.tensor("is_target")?;
    let red = reduction(args)?;
    let (nframe, dim) = multilabel_checks(cx, &x, &t)?;
    let td = cx.dims(t.v);
    let itd = cx.dims(it.v);
    check!(
        td == itd,
        Runtime,
        "Expected tensor for argument #3 'target' to have same size as tensor for argument #5 'is_target'; but {:?} does not equal {:?} (while checking arguments for multilabel_margin_loss_backward_cpu_template)",
        td,
        itd
    );
    let dt = x.dtype;
    let xdims = cx.dims(x.v);
    if cx.numel(x.v) == 0 {
        return one(cx.full(0.0, dt, &xdims));
    }
    check_float_kernel(dt, "multilabel_margin_loss_backward_out_frame", false)?;
    let xv = cx.reshape(x.v, &[nframe, dim]);
    let tv = cx.reshape(t.v, &[nframe, dim]);
    let itv = cx.reshape(it.v, &[nframe, dim]);
    let is_target = cx.cast(itv, DType::Bool);
    let (valid, onehot) = multilabel_targets(cx, tv);
    let (m, z) = multilabel_hinge(cx, xv, valid, onehot, is_target);
    let g = if red == Reduction::Mean { 1.0 / (nframe * dim) as f64 } else { 1.0 / dim as f64 };
    let one3 = k(cx, 1.0, z);
    let zero3 = k(cx, 0.0, z);
    let mf = cx.select(m, one3, zero3);
    // +g for each active (k, d) at d; -g for each at the class entry k names.
    let cnt_d = reduce(cx, mf, &[1], Red::Sum);
    let cnt_k = reduce(cx, mf, &[2], Red::Sum);
    let full = cx.dims(z);
    let ckb = cx.broadcast_in_dim(cnt_k, &full, &[0, 1]);
    let at_t = cx.select(onehot, ckb, zero3);
    let cnt_t = reduce(cx, at_t, &[1], Red::Sum);
    let net = cx.sub(cnt_d, cnt_t);
    let gv = k(cx, g, net);
    let gi = cx.mul(net, gv);
    let gi = times_grad_output(cx, gi, &go, dt, red, |god| {
        format!(
            "Expected a tensor of dimension 1 and tensor.size[0] == {} but got: dimension {} and tensor.size[0] == {}",
            nframe,
            god.len(),
            god.first().copied().unwrap_or(1)
        )
    })?;
    one(cx.reshape(gi, &xdims))
}
