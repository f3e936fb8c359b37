//! The CTC loss: _ctc_loss / _ctc_loss_backward (both the int[] and the Tensor length
//! overloads). The log-space alpha and beta recursions run as stablehlo while loops over time.
//!
//! Checks that need tensor data (lengths of the Tensor overload) are not made: PyTorch raises
//! for them on CPU.
use crate::args::{Arg, Args, Tensor};
use crate::blocks::consts::{ik, iota, k};
use crate::blocks::gather::take_1d;
use crate::blocks::reduce::{reduce, Red};
use crate::blocks::type_names::{check_float_kernel, check_scalar_type, tensor_type_name};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, GatherDims, ScatterDims, Value};

pub(crate) const OPS: &[Op] = &[
    // log_alpha's last dim is 2 * max(target_lengths) + 1: read from the data for the Tensor
    // overload by a size program (a constant one for the int[] overload).
    op("_ctc_loss", ctc_loss).sized(ctc_max_target_length),
    op("_ctc_loss_backward", ctc_loss_backward),
];

// ---- ctc_loss ---------------------------------------------------------------------------------------

/// A length argument of _ctc_loss: a list (its values known) or a tensor (values on device).
enum Lengths {
    Known(Vec<i64>),
    Device(Value),
}

fn lengths(cx: &mut Cx, args: &Args, name: &str) -> Result<Lengths> {
    match args.get(name) {
        Some(Arg::Tensor(t)) => {
            check!(t.dtype.is_int(), Runtime, "{} must be integral", name);
            let n = cx.numel(t.v);
            let v = cx.reshape(t.v, &[n]);
            Ok(Lengths::Device(cx.cast(v, DType::I64)))
        }
        _ => Ok(Lengths::Known(args.ints(name)?)),
    }
}

impl Lengths {
    fn len(&self, cx: &Cx) -> i64 {
        match self {
            Lengths::Known(v) => v.len() as i64,
            Lengths::Device(v) => cx.numel(*v),
        }
    }

    fn value(&self, cx: &mut Cx) -> Value {
        match self {
            Lengths::Known(v) => cx.b.constant_array_i64(v, &[v.len() as i64], ElemType::I64),
            Lengths::Device(v) => *v,
        }
    }
}

/// The checked operands of a CTC call.
struct Ctc {
    lp: Tensor,
    targets: Tensor,
    il: Lengths,
    tl: Lengths,
    blank: i64,
    t: i64,
    n: i64,
    c: i64,
}

const CTC: &str = "(while checking arguments for ctc_loss_allocate_outputs)";

fn ctc_args(cx: &mut Cx, args: &Args, forward: bool) -> Result<Ctc> {
    let lp = args.tensor("log_probs")?;
    let targets = args.tensor("targets")?;
    let il = lengths(cx, args, "input_lengths")?;
    let tl = lengths(cx, args, "target_lengths")?;
    let blank = args.int_or("blank", 0)?;
    check!(cx.numel(lp.v) > 0, Runtime, "log_probs tensor must not be empty");
    check_float_kernel(lp.dtype, if forward { "ctc_loss_cpu" } else { "ctc_loss_backward_cpu" }, false)?;
    let int_type = if targets.dtype == DType::I64 { DType::I64 } else { DType::I32 };
    check!(
        targets.dtype == int_type,
        Runtime,
        "Expected tensor for argument #2 'targets' to have scalar type Int; but got {} instead {}",
        tensor_type_name(targets.dtype),
        CTC
    );
    let ld = cx.dims(lp.v);
    check!(
        ld.len() == 3,
        Runtime,
        "Expected 3-dimensional tensor, but got {}-dimensional tensor for argument #1 'log_probs' {}",
        ld.len(),
        CTC
    );
    let td = cx.dims(targets.v);
    check!(
        (1..=2).contains(&td.len()),
        Runtime,
        "Expected 1 to 2 dimensions, but got {}-dimensional tensor for argument #2 'targets' {}",
        td.len(),
        CTC
    );
    let (t, n, c) = (ld[0], ld[1], ld[2]);
    check!((0..c).contains(&blank), Runtime, "blank must be in label range");
    check!(il.len(cx) == n, Runtime, "input_lengths must be of size batch_size");
    check!(tl.len(cx) == n, Runtime, "target_lengths must be of size batch_size");
    if forward {
        if let Lengths::Known(tls) = &tl {
            for &x in tls {
                check!(x >= 0, Runtime, "Expected target_lengths to have value at least 0, but got value {} {}", x, CTC);
            }
            if td.len() == 1 {
                let pos: i64 = tls.iter().sum();
                check!(
                    td[0] == pos,
                    Runtime,
                    "Expected tensor to have size {} at dimension 0, but got size {} for argument #2 'targets' {}",
                    pos,
                    td[0],
                    CTC
                );
            } else {
                let max = tls.iter().copied().max().unwrap_or(0);
                check!(
                    td[0] == n,
                    Runtime,
                    "Expected tensor to have size {} at dimension 0, but got size {} for argument #2 'targets' {}",
                    n,
                    td[0],
                    CTC
                );
                check!(
                    td[1] >= max,
                    Runtime,
                    "Expected tensor to have size at least {} at dimension 1, but got size {} for argument #2 'targets' {}",
                    max,
                    td[1],
                    CTC
                );
            }
        }
        if let Lengths::Known(ils) = &il {
            for &x in ils {
                check!(x >= 0, Runtime, "Expected input_lengths to have value at least 0, but got value {} {}", x, CTC);
                check!(x <= t, Runtime, "Expected input_lengths to have value at most {}, but got value {} {}", t, x, CTC);
            }
        }
    }
    Ok(Ctc { lp, targets, il, tl, blank, t, n, c })
}

/// The size program of _ctc_loss: max(target_lengths) (0 for an empty batch).
fn ctc_max_target_length(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    match lengths(cx, args, "target_lengths")? {
        Lengths::Known(v) => one(cx.b.constant_i64(v.iter().copied().max().unwrap_or(0).max(0), ElemType::I64)),
        Lengths::Device(v) => {
            let n = cx.numel(v);
            let zero = ik(cx, 0, &[n]);
            let v = cx.max(v, zero);
            one(reduce(cx, v, &[0], Red::Max))
        }
    }
}

/// The extended label sequence l' of each sample, [N, L]: blank, l_1, blank, l_2, ..., blank
/// (entries past 2 * target_length are whatever the clamped gather finds: callers mask them).
fn ctc_extended(cx: &mut Cx, ctc: &Ctc, tl: Value, l: i64) -> Value {
    let n = ctc.n;
    let dims = [n, l];
    let s = iota(cx, &dims, 1);
    let blank = ik(cx, ctc.blank, &dims);
    let m = cx.numel(ctc.targets.v);
    if m == 0 || l == 1 {
        return blank;
    }
    let flat = cx.reshape(ctc.targets.v, &[m]);
    let flat = cx.cast(flat, DType::I64);
    let td = cx.dims(ctc.targets.v);
    let base = if td.len() == 2 {
        let w = td[1];
        let ni = iota(cx, &[n], 0);
        let wv = ik(cx, w, &[n]);
        cx.mul(ni, wv)
    } else {
        // Exclusive prefix sums of the target lengths.
        let nn = [n, n];
        let row = iota(cx, &nn, 0);
        let col = iota(cx, &nn, 1);
        let before = cx.compare(CmpDir::Lt, col, row);
        let tb = cx.broadcast_in_dim(tl, &nn, &[1]);
        let zero = ik(cx, 0, &nn);
        let sel = cx.select(before, tb, zero);
        reduce(cx, sel, &[1], Red::Sum)
    };
    let two = ik(cx, 2, &dims);
    let j = cx.div(s, two);
    let bb = cx.broadcast_in_dim(base, &dims, &[0]);
    let idx = cx.add(bb, j);
    let lo = ik(cx, 0, &dims);
    let hi = ik(cx, m - 1, &dims);
    let idx = cx.clamp(lo, idx, hi);
    let lab = take_1d(cx, flat, idx);
    let r = cx.rem(s, two);
    let zero = ik(cx, 0, &dims);
    let even = cx.compare(CmpDir::Eq, r, zero);
    cx.select(even, blank, lab)
}

/// (n, l'[n, s]) index pairs [N, L, 2] into [N, C, ...] operands.
fn ctc_index(cx: &mut Cx, ext: Value) -> Value {
    let d = cx.dims(ext);
    let ni = iota(cx, &[d[0], d[1], 1], 0);
    let e = cx.reshape(ext, &[d[0], d[1], 1]);
    cx.concatenate(&[ni, e], 2)
}

/// The gather (and scatter) of [N, C, T] operands at the (n, l'[n, s]) pairs of `ctc_index`:
/// one [T] window per pair.
fn ctc_gather_dims() -> GatherDims {
    GatherDims {
        offset_dims: vec![2],
        collapsed_slice_dims: vec![0, 1],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![0, 1],
        index_vector_dim: 2,
    }
}

/// What both CTC recursions start from: the lengths [N], the extended labels l' [N, L],
/// their (n, l') index pairs and log_probs gathered at them, [T, N, L].
struct CtcStates {
    il: Value,
    tl: Value,
    ext: Value,
    idx: Value,
    lpe: Value,
}

fn ctc_states(cx: &mut Cx, ctc: &Ctc, l: i64) -> CtcStates {
    let il = ctc.il.value(cx);
    let tl = ctc.tl.value(cx);
    let ext = ctc_extended(cx, ctc, tl, l);
    let idx = ctc_index(cx, ext);
    let lpe = ctc_gather_lp(cx, ctc.lp.v, idx);
    CtcStates { il, tl, ext, idx, lpe }
}

/// log_probs[t, n, l'[n, s]] as [T, N, L].
fn ctc_gather_lp(cx: &mut Cx, lp: Value, idx: Value) -> Value {
    let t = cx.dims(lp)[0];
    let lpt = cx.transpose(lp, &[1, 2, 0]);
    let g = cx.gather(lpt, idx, &ctc_gather_dims(), &[1, 1, t], false);
    cx.transpose(g, &[2, 0, 1])
}

/// log(sum_i e^terms[i]) the way PyTorch's CTC kernels compute it (the maximum is taken out,
/// and 0 is used when every term is -inf).
fn lse(b: &mut stablehlo::Builder, terms: &[Value]) -> Value {
    let mut m = terms[0];
    for &x in &terms[1..] {
        m = b.max(m, x);
    }
    let ty = b.ty(m).clone();
    let ninf = b.splat_f64(f64::NEG_INFINITY, &ty);
    let zero = b.splat_f64(0.0, &ty);
    let is_ninf = b.compare(CmpDir::Eq, m, ninf);
    let m = b.select(is_ninf, zero, m);
    let mut s = None;
    for &x in terms {
        let e = b.sub(x, m);
        let e = b.exp(e);
        s = Some(match s {
            None => e,
            Some(acc) => b.add(acc, e),
        });
    }
    let l = b.log(s.unwrap());
    b.add(l, m)
}

/// One step of the alpha (`dir` 1) or beta (`dir` -1) recursion over the states [N, L]:
/// lse(v[s], v[s - dir], v[s - 2 dir] where `skip`) + the step's log_probs `row`.
fn ctc_step(b: &mut stablehlo::Builder, v: Value, row: Value, skip: Value, dir: i64) -> Value {
    let v2 = shift(b, v, dir);
    let v3 = shift(b, v, 2 * dir);
    let ty = b.ty(v).clone();
    let ninf = b.splat_f64(f64::NEG_INFINITY, &ty);
    let v3 = b.select(skip, v3, ninf);
    let new = lse(b, &[v, v2, v3]);
    b.add(new, row)
}

/// Row t (0-d) of v [T, N, L] as [N, L].
fn time_row(b: &mut stablehlo::Builder, v: Value, t: Value) -> Value {
    let d = b.dims(v).to_vec();
    let z = b.constant_i64(0, ElemType::I64);
    let row = b.dynamic_slice(v, &[t, z, z], &[1, d[1], d[2]]);
    b.reshape(row, &d[1..])
}

/// v [T, N, L] with row t replaced by `row` [N, L].
fn put_time_row(b: &mut stablehlo::Builder, v: Value, t: Value, row: Value) -> Value {
    let d = b.dims(v).to_vec();
    let z = b.constant_i64(0, ElemType::I64);
    let upd = b.reshape(row, &[1, d[1], d[2]]);
    b.dynamic_update_slice(v, upd, &[t, z, z])
}

/// The states a path ends in, 2 tl (the last blank) and 2 tl - 1 (the last label), [N] each.
fn ctc_end_states(cx: &mut Cx, tl: Value) -> (Value, Value) {
    let n = cx.dims(tl)[0];
    let two_n = ik(cx, 2, &[n]);
    let one_n = ik(cx, 1, &[n]);
    let e1 = cx.mul(tl, two_n);
    let e2 = cx.sub(e1, one_n);
    (e1, e2)
}

/// mask [N, L] where the sample's target is not empty (tl > 0).
fn and_target_nonempty(cx: &mut Cx, mask: Value, tl: Value) -> Value {
    let nl = cx.dims(mask);
    let z = ik(cx, 0, &[nl[0]]);
    let has = cx.compare(CmpDir::Gt, tl, z);
    let hasb = cx.broadcast_in_dim(has, &nl, &[0]);
    cx.and(mask, hasb)
}

/// `v` ([N, L]) shifted along L by `by` (> 0: towards higher s), filled with -inf.
fn shift(b: &mut stablehlo::Builder, v: Value, by: i64) -> Value {
    let elem = b.elem(v);
    let ninf = b.constant_f64(f64::NEG_INFINITY, elem);
    b.pad(v, ninf, &[0, by], &[0, -by], &[0, 0])
}

/// Masks of the valid time steps [T, N] (t < input_length) and states [N, L]
/// (s <= 2 target_length).
fn ctc_masks(cx: &mut Cx, il: Value, tl: Value, t: i64, n: i64, l: i64) -> (Value, Value) {
    let tn = [t, n];
    let ti = iota(cx, &tn, 0);
    let ilb = cx.broadcast_in_dim(il, &tn, &[1]);
    let vt = cx.compare(CmpDir::Lt, ti, ilb);
    let nl = [n, l];
    let si = iota(cx, &nl, 1);
    let two = ik(cx, 2, &[n]);
    let t2 = cx.mul(tl, two);
    let t2b = cx.broadcast_in_dim(t2, &nl, &[0]);
    let vs = cx.compare(CmpDir::Le, si, t2b);
    (vt, vs)
}

/// `v` [T, N, L] with entries outside the valid steps and states set to -inf.
fn ctc_mask_all(cx: &mut Cx, v: Value, vt: Value, vs: Value) -> Value {
    let d = cx.dims(v);
    let vtb = cx.broadcast_in_dim(vt, &d, &[0, 1]);
    let vsb = cx.broadcast_in_dim(vs, &d, &[1, 2]);
    let m = cx.and(vtb, vsb);
    let ninf = k(cx, f64::NEG_INFINITY, v);
    cx.select(m, v, ninf)
}

/// _ctc_loss(log_probs [T, N, C], targets, input_lengths, target_lengths, blank, zero_infinity)
/// -> (neg_log_likelihood [N], log_alpha [N, T, 2 S + 1]) with S the longest target.
fn ctc_loss(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ctc = ctc_args(cx, args, true)?;
    let s_max = match &ctc.tl {
        Lengths::Known(v) => v.iter().copied().max().unwrap_or(0).max(0),
        Lengths::Device(_) => args.int("__size")?,
    };
    let (t, n) = (ctc.t, ctc.n);
    let l = 2 * s_max + 1;
    let dt = ctc.lp.dtype;
    let CtcStates { il, tl, ext, idx: _, lpe } = ctc_states(cx, &ctc, l);
    let nl = [n, l];
    // s >= 2 and l'[s - 2] != l'[s]: the transition that skips a blank.
    let ext2 = shift_i64(cx, ext, 2);
    let ne = cx.compare(CmpDir::Ne, ext2, ext);
    let si = iota(cx, &nl, 1);
    let two = ik(cx, 2, &nl);
    let ge2 = cx.compare(CmpDir::Ge, si, two);
    let skip = cx.and(ne, ge2);
    // alpha_0: blank and the first label.
    let row0 = cx.slice(lpe, &[0, 0, 0], &[1, n, l], &[1, 1, 1]);
    let row0 = cx.reshape(row0, &nl);
    let zero = ik(cx, 0, &nl);
    let onei = ik(cx, 1, &nl);
    let s0 = cx.compare(CmpDir::Eq, si, zero);
    let s1 = cx.compare(CmpDir::Eq, si, onei);
    let s1 = and_target_nonempty(cx, s1, tl);
    let first = cx.or(s0, s1);
    let ninf = cx.full(f64::NEG_INFINITY, dt, &nl);
    let alpha0 = cx.select(first, row0, ninf);
    let all = cx.full(f64::NEG_INFINITY, dt, &[t, n, l]);
    let a0 = cx.reshape(alpha0, &[1, n, l]);
    let zi = cx.b.constant_i64(0, ElemType::I64);
    let all = cx.dynamic_update_slice(all, a0, &[zi, zi, zi]);
    let t1 = cx.b.constant_i64(1, ElemType::I64);
    let tmax = cx.b.constant_i64(t, ElemType::I64);
    let res = cx.while_loop(
        &[t1, alpha0, all],
        |b, a| b.compare(CmpDir::Lt, a[0], tmax),
        |b, a| {
            let (ti, alpha, all) = (a[0], a[1], a[2]);
            let row = time_row(b, lpe, ti);
            let new = ctc_step(b, alpha, row, skip, 1);
            let all = put_time_row(b, all, ti, new);
            let one_ = b.constant_i64(1, ElemType::I64);
            let tn = b.add(ti, one_);
            vec![tn, new, all]
        },
    );
    let (vt, vs) = ctc_masks(cx, il, tl, t, n, l);
    let all = ctc_mask_all(cx, res[2], vt, vs);
    // The last valid row of each sample: alpha[input_length - 1].
    let tnl = [t, n, l];
    let ti = iota(cx, &tnl, 0);
    let one_n = ik(cx, 1, &[n]);
    let last = cx.sub(il, one_n);
    let lastb = cx.broadcast_in_dim(last, &tnl, &[1]);
    let at_last = cx.compare(CmpDir::Eq, ti, lastb);
    let ninf3 = k(cx, f64::NEG_INFINITY, all);
    let pick = cx.select(at_last, all, ninf3);
    let row = reduce(cx, pick, &[0], Red::Max);
    let (e1, e2) = ctc_end_states(cx, tl);
    let pick_s = |cx: &mut Cx, e: Value| {
        let eb = cx.broadcast_in_dim(e, &nl, &[0]);
        let at = cx.compare(CmpDir::Eq, si, eb);
        let ninf = k(cx, f64::NEG_INFINITY, row);
        let v = cx.select(at, row, ninf);
        reduce(cx, v, &[1], Red::Max)
    };
    let l1 = pick_s(cx, e1);
    let l2 = pick_s(cx, e2);
    let ll = lse(cx, &[l1, l2]);
    let nll = cx.neg(ll);
    // No input steps: likelihood 1 for an empty target, 0 otherwise.
    let z1 = ik(cx, 0, &[n]);
    let il0 = cx.compare(CmpDir::Eq, il, z1);
    let tl0 = cx.compare(CmpDir::Eq, tl, z1);
    let inf = k(cx, f64::INFINITY, nll);
    let nz = k(cx, -0.0, nll);
    let empty = cx.select(tl0, nz, inf);
    let nll = cx.select(il0, empty, nll);
    let log_alpha = cx.transpose(all, &[1, 0, 2]);
    Ok(vec![Out::Tensor(nll), Out::Tensor(log_alpha)])
}

/// An i64 [N, L] shifted by `by` towards higher s (lower for a negative `by`), filled with -1.
fn shift_i64(cx: &mut Cx, v: Value, by: i64) -> Value {
    let fill = cx.b.constant_i64(-1, ElemType::I64);
    let l = cx.dims(v)[1];
    if by.abs() >= l {
        let d = cx.dims(v);
        return ik(cx, -1, &d);
    }
    cx.pad(v, fill, &[0, by], &[0, -by], &[0, 0])
}

/// _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
/// neg_log_likelihood, log_alpha, blank, zero_infinity) -> grad of log_probs [T, N, C].
fn ctc_loss_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ctc = ctc_args(cx, args, false)?;
    let g = args.tensor("grad")?;
    let nll = args.tensor("neg_log_likelihood")?;
    let la = args.tensor("log_alpha")?;
    let zero_infinity = args.bool_or("zero_infinity", false)?;
    let (t, n, c) = (ctc.t, ctc.n, ctc.c);
    let dt = ctc.lp.dtype;
    let lad = cx.dims(la.v);
    check!(
        lad.len() == 3 && lad[0] == n && lad[1] == t && lad[2] % 2 == 1,
        Runtime,
        "_ctc_loss_backward: log_alpha of shape {:?} does not fit log_probs of shape {:?}",
        lad,
        [t, n, c]
    );
    check!(cx.numel(g.v) == n && cx.numel(nll.v) == n, Runtime, "_ctc_loss_backward: grad and neg_log_likelihood need {} elements", n);
    for x in [&g, &nll, &la] {
        check_scalar_type(dt, x.dtype)?;
    }
    let l = lad[2];
    let CtcStates { il, tl, ext, idx, lpe } = ctc_states(cx, &ctc, l);
    let nl = [n, l];
    let si = iota(cx, &nl, 1);
    // s + 2 < L and l'[s + 2] != l'[s].
    let ext_next2 = shift_i64(cx, ext, -2);
    let skip = cx.compare(CmpDir::Ne, ext_next2, ext);
    let lim = ik(cx, l - 2, &nl);
    let inside = cx.compare(CmpDir::Lt, si, lim);
    let skip = cx.and(skip, inside);
    let (vt, vs) = ctc_masks(cx, il, tl, t, n, l);
    // Where beta starts: s = 2 tl and s = 2 tl - 1 (if tl > 0) at t = input_length - 1.
    let (e1, e2) = ctc_end_states(cx, tl);
    let e1b = cx.broadcast_in_dim(e1, &nl, &[0]);
    let e2b = cx.broadcast_in_dim(e2, &nl, &[0]);
    let at1 = cx.compare(CmpDir::Eq, si, e1b);
    let at2 = cx.compare(CmpDir::Eq, si, e2b);
    let at2 = and_target_nonempty(cx, at2, tl);
    let start = cx.or(at1, at2);
    let one_n = ik(cx, 1, &[n]);
    let last = cx.sub(il, one_n);
    let lastb = cx.broadcast_in_dim(last, &nl, &[0]);
    let beta_init = cx.full(f64::NEG_INFINITY, dt, &nl);
    let all = cx.full(f64::NEG_INFINITY, dt, &[t, n, l]);
    let tstart = cx.b.constant_i64(t - 1, ElemType::I64);
    let res = cx.while_loop(
        &[tstart, beta_init, all],
        |b, a| {
            let z = b.constant_i64(0, ElemType::I64);
            b.compare(CmpDir::Ge, a[0], z)
        },
        |b, a| {
            let (ti, next, all) = (a[0], a[1], a[2]);
            let row = time_row(b, lpe, ti);
            let rec = ctc_step(b, next, row, skip, -1);
            let ty = b.ty(next).clone();
            let ninf = b.splat_f64(f64::NEG_INFINITY, &ty);
            let init = b.select(start, row, ninf);
            let tb = b.broadcast_in_dim(ti, &nl, &[]);
            let is_last = b.compare(CmpDir::Eq, tb, lastb);
            let before = b.compare(CmpDir::Lt, tb, lastb);
            let cur = b.select(before, rec, ninf);
            let cur = b.select(is_last, init, cur);
            let cur = b.select(vs, cur, ninf);
            let all = put_time_row(b, all, ti, cur);
            let one_ = b.constant_i64(1, ElemType::I64);
            let tn = b.sub(ti, one_);
            vec![tn, cur, all]
        },
    );
    let beta = res[2];
    let alpha = cx.transpose(la.v, &[1, 0, 2]);
    let ab = cx.add(alpha, beta);
    let ab = ctc_mask_all(cx, ab, vt, vs);
    // log-sum of alpha + beta over the states that emit each class: [N, C, T].
    let abt = cx.transpose(ab, &[1, 2, 0]);
    let sd = ScatterDims {
        update_window_dims: vec![2],
        inserted_window_dims: vec![0, 1],
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: vec![0, 1],
        index_vector_dim: 2,
        indices_are_sorted: false,
        unique_indices: false,
    };
    let nct = [n, c, t];
    let ninf_c = cx.full(f64::NEG_INFINITY, dt, &nct);
    let mx = cx.scatter(ninf_c, idx, abt, &sd, |b, x, y| b.max(x, y));
    let is_ninf = cx.compare(CmpDir::Eq, mx, ninf_c);
    let zero_c = cx.full(0.0, dt, &nct);
    let mx = cx.select(is_ninf, zero_c, mx);
    let mxg = cx.gather(mx, idx, &ctc_gather_dims(), &[1, 1, t], false);
    let e = cx.sub(abt, mxg);
    let e = cx.exp(e);
    let sm = cx.scatter(zero_c, idx, e, &sd, |b, x, y| b.add(x, y));
    let lcab = cx.log(sm);
    let lcab = cx.add(lcab, mx);
    let lcab = cx.transpose(lcab, &[2, 0, 1]);
    // (exp(lp) - exp(lcab + nll - lp)) * grad
    let tnc = [t, n, c];
    let lp = ctc.lp.v;
    let nllv = cx.reshape(nll.v, &[n]);
    let nllb = cx.broadcast_in_dim(nllv, &tnc, &[1]);
    let gv = cx.reshape(g.v, &[n]);
    let gb = cx.broadcast_in_dim(gv, &tnc, &[1]);
    let elp = cx.exp(lp);
    let r = cx.add(lcab, nllb);
    let r = cx.sub(r, lp);
    let r = cx.exp(r);
    let r = cx.sub(elp, r);
    let r = cx.mul(r, gb);
    let zero = cx.full(0.0, dt, &tnc);
    let vtb = cx.broadcast_in_dim(vt, &tnc, &[0, 1]);
    let r = cx.select(vtb, r, zero);
    let r = if zero_infinity {
        let inf = k(cx, f64::INFINITY, nllb);
        let bad = cx.compare(CmpDir::Eq, nllb, inf);
        cx.select(bad, zero, r)
    } else {
        r
    };
    one(r)
}
