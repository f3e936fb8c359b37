//! Distances, margin and CTC losses, rrelu, group norm and the batch norm entry points of
//! PyTorch's newer stack:
//! - _cdist_forward / _cdist_backward (torch.cdist; p = 0, 1, 2, inf and general p, with the
//!   matrix-multiplication form for p = 2 where compute_mode asks for it) and _pdist_forward /
//!   _pdist_backward (F.pdist);
//! - multi_margin_loss(_backward) and multilabel_margin_loss_forward / _backward;
//! - _ctc_loss / _ctc_loss_backward (both the int[] and the Tensor length overloads): the
//!   log-space alpha and beta recursions run as stablehlo while loops over time;
//! - rrelu_with_noise (random slopes from the device generator in training, the mean slope in
//!   evaluation) and its functional form;
//! - native_group_norm (routed past its composite, which rounds 16-bit statistics) and
//!   native_group_norm_backward;
//! - _batch_norm_with_update(_functional) and batch_norm_backward, which reuse the batch norm
//!   lowerings of nn.rs through the registry.
//!
//! Every op computes 16-bit floats in float32 and rounds once, like PyTorch's CPU kernels.
//! Checks that need tensor data (class indices out of range, lengths of the Tensor overload of
//! _ctc_loss) are not made: PyTorch raises for them on CPU.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::contract::contract;
use crate::blocks::reduce::{acc_type, reduce, Red};
use crate::blocks::round16::{is_16bit, round_to};
use crate::blocks::type_names::{check_scalar_type, tensor_type_name};
use crate::cx::{broadcast_shapes, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::normalization::{reduction, Reduction};
use crate::{bail, check, one, Out, Registry};
use stablehlo::{CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub fn register(r: &mut Registry) {
    // p decides which norm the program computes, so float arguments are compiled in.
    r.add_specialized("_cdist_forward", cdist_forward);
    r.add_specialized("_cdist_backward", cdist_backward);
    r.add_specialized("_pdist_forward", pdist_forward);
    r.add_specialized("_pdist_backward", pdist_backward);
    // p (1 or 2) decides the program; margin is compiled in with it.
    r.add_specialized("multi_margin_loss", multi_margin_loss);
    r.add_specialized("multi_margin_loss_backward", multi_margin_loss_backward);
    r.add("multilabel_margin_loss_forward", multilabel_margin_loss_forward);
    r.add("multilabel_margin_loss_backward", multilabel_margin_loss_backward);
    // log_alpha's last dim is 2 * max(target_lengths) + 1: read from the data for the Tensor
    // overload by a size program (a constant one for the int[] overload).
    r.add_sized("_ctc_loss", ctc_max_target_length, ctc_loss);
    r.add("_ctc_loss_backward", ctc_loss_backward);
    // lower <= upper is checked, so the bounds are compiled in.
    r.add_specialized("rrelu_with_noise", rrelu_with_noise);
    r.add_specialized("rrelu_with_noise_functional", rrelu_with_noise_functional);
    r.add("native_group_norm", native_group_norm);
    r.add("native_group_norm_backward", native_group_norm_backward);
    r.add("_batch_norm_with_update", batch_norm_with_update);
    r.add("_batch_norm_with_update_functional", batch_norm_with_update_functional);
    r.add("batch_norm_backward", batch_norm_backward);
}

// ---- helpers ----------------------------------------------------------------------------------

/// A constant of `like`'s dtype and dims.
fn k(cx: &mut Cx, x: f64, like: Value) -> Value {
    let dt = cx.dtype(like);
    let dims = cx.dims(like);
    cx.full(x, dt, &dims)
}

fn ik(cx: &mut Cx, x: i64, dims: &[i64]) -> Value {
    cx.b.splat_i64(x, &TensorType::new(ElemType::I64, dims))
}

fn iota(cx: &mut Cx, dims: &[i64], dim: i64) -> Value {
    cx.iota(&TensorType::new(ElemType::I64, dims), dim)
}

/// The value of a `float` argument (compiled in: these ops are specialized).
fn float_arg(args: &Args, name: &str) -> Result<f64> {
    Ok(match args.get(name) {
        Some(Arg::Float(f)) => f.value,
        Some(Arg::Int(i)) => *i as f64,
        Some(Arg::Bool(b)) => *b as i64 as f64,
        _ => bail!(Type, "{}(): expected argument '{}' to be a float", args.op, name),
    })
}

fn scalar_value(s: Scalar) -> f64 {
    match s {
        Scalar::Int(i) => i as f64,
        Scalar::Bool(b) => b as i64 as f64,
        Scalar::Float(f) => f.value,
    }
}

/// `v[idx]` for a 1-d `v` and integer indices of any shape (clamped into range).
fn take_1d(cx: &mut Cx, v: Value, idx: Value) -> Value {
    let mut id = cx.dims(idx);
    let r = id.len() as i64;
    id.push(1);
    let idx = cx.reshape(idx, &id);
    let dn = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: vec![0],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![0],
        index_vector_dim: r,
    };
    cx.gather(v, idx, &dn, &[1], false)
}

fn check_float_kernel(dt: DType, kernel: &str, allow_16: bool) -> Result<()> {
    let ok = matches!(dt, DType::F32 | DType::F64) || (allow_16 && dt == DType::BF16);
    check!(ok, NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    Ok(())
}

// ---- cdist / pdist ------------------------------------------------------------------------------

/// The p-norm of `ad` (absolute differences, float) along `axis`, as PyTorch's distance kernels
/// compute it: p = 0 counts nonzeros, inf takes the maximum (ignoring NaN when `skip_nan`, as
/// cdist's scalar loop does), other p sum |d|^p and take the 1/p power.
fn norm_along(cx: &mut Cx, ad: Value, p: f64, axis: i64, skip_nan: bool) -> Value {
    if p == 0.0 {
        let c = cx.ceil(ad);
        let one_ = k(cx, 1.0, ad);
        let m = cx.min(c, one_);
        reduce(cx, m, &[axis], Red::Sum)
    } else if p == 1.0 {
        reduce(cx, ad, &[axis], Red::Sum)
    } else if p == 2.0 {
        let sq = cx.mul(ad, ad);
        let s = reduce(cx, sq, &[axis], Red::Sum);
        cx.sqrt(s)
    } else if p.is_infinite() {
        if skip_nan {
            // agg = agg < x ? x : agg, from 0.
            let elem = cx.elem(ad);
            let init = cx.b.constant_f64(0.0, elem);
            cx.reduce(&[ad], &[init], &[axis], |b, a| {
                let lt = b.compare(CmpDir::Lt, a[0], a[1]);
                vec![b.select(lt, a[1], a[0])]
            })[0]
        } else {
            reduce(cx, ad, &[axis], Red::Max)
        }
    } else {
        let pv = k(cx, p, ad);
        let pw = cx.pow(ad, pv);
        let s = reduce(cx, pw, &[axis], Red::Sum);
        let inv = k(cx, 1.0 / p, s);
        cx.pow(s, inv)
    }
}

/// The gradient of one distance with respect to the first point, for signed differences
/// `diff`, incoming gradient `g` and the distance `dist` (all broadcast alike), following
/// PyTorch's CPU kernels term by term.
fn norm_grad(cx: &mut Cx, diff: Value, g: Value, dist: Value, p: f64) -> Value {
    let zero = k(cx, 0.0, diff);
    if p == 0.0 {
        return zero;
    }
    let sign = cx.sign(diff);
    let dist0 = cx.compare(CmpDir::Eq, dist, zero);
    if p == 1.0 {
        cx.mul(g, sign)
    } else if p < 2.0 {
        let ad = cx.abs(diff);
        let pm1 = k(cx, p - 1.0, diff);
        let a = cx.pow(ad, pm1);
        let t = cx.mul(sign, a);
        let t = cx.mul(t, g);
        let dp = cx.pow(dist, pm1);
        let t = cx.div(t, dp);
        let t = cx.select(dist0, zero, t);
        if p < 1.0 {
            let d0 = cx.compare(CmpDir::Eq, diff, zero);
            cx.select(d0, zero, t)
        } else {
            t
        }
    } else if p == 2.0 {
        let t = cx.mul(g, diff);
        let t = cx.div(t, dist);
        cx.select(dist0, zero, t)
    } else if p.is_infinite() {
        // g * sign(diff) * (1 - min(1, ceil(| |diff| - dist |)))
        let ad = cx.abs(diff);
        let e = cx.sub(ad, dist);
        let e = cx.abs(e);
        let e = cx.ceil(e);
        let one_ = k(cx, 1.0, diff);
        let e = cx.min(one_, e);
        let f = cx.sub(one_, e);
        let t = cx.mul(g, sign);
        cx.mul(t, f)
    } else {
        let ad = cx.abs(diff);
        let pm2 = k(cx, p - 2.0, diff);
        let pm1 = k(cx, p - 1.0, diff);
        let a = cx.pow(ad, pm2);
        let t = cx.mul(diff, a);
        let t = cx.mul(t, g);
        let dp = cx.pow(dist, pm1);
        let t = cx.div(t, dp);
        cx.select(dist0, zero, t)
    }
}

/// The shapes of a cdist call: broadcast batch dims, rows of each input and columns.
struct CdistShape {
    batch: Vec<i64>,
    r1: i64,
    r2: i64,
    c: i64,
}

fn cdist_shape(cx: &Cx, x1: &Tensor, x2: &Tensor) -> Result<CdistShape> {
    let d1 = cx.dims(x1.v);
    let d2 = cx.dims(x2.v);
    check!(d1.len() >= 2, Runtime, "cdist only supports at least 2D tensors, X1 got: {}D", d1.len());
    check!(d2.len() >= 2, Runtime, "cdist only supports at least 2D tensors, X2 got: {}D", d2.len());
    let (c1, c2) = (d1[d1.len() - 1], d2[d2.len() - 1]);
    check!(c1 == c2, Runtime, "X1 and X2 must have the same number of columns. X1: {} X2: {}", c1, c2);
    let batch = broadcast_shapes(&[d1[..d1.len() - 2].to_vec(), d2[..d2.len() - 2].to_vec()])?;
    Ok(CdistShape { batch, r1: d1[d1.len() - 2], r2: d2[d2.len() - 2], c: c1 })
}

/// `x` ([..., r, c]) broadcast to `batch + [r, c]` and flattened to [B, r, c].
fn batched(cx: &mut Cx, x: Value, batch: &[i64]) -> Value {
    let d = cx.dims(x);
    let (r, c) = (d[d.len() - 2], d[d.len() - 1]);
    let mut full = batch.to_vec();
    full.extend([r, c]);
    let v = cx.broadcast_to(x, &full);
    let b: i64 = batch.iter().product();
    cx.reshape(v, &[b, r, c])
}

/// _cdist_forward(x1, x2, p, compute_mode): distances between the rows of x1 and x2 over
/// broadcast batch dims, [*, r1, r2].
fn cdist_forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x1 = args.tensor("x1")?;
    let x2 = args.tensor("x2")?;
    let p = float_arg(args, "p")?;
    let s = cdist_shape(cx, &x1, &x2)?;
    check!(x1.dtype.is_float(), Runtime, "cdist only supports floating-point dtypes, X1 got: {}", x1.dtype.torch_name());
    check!(p >= 0.0, Runtime, "cdist only supports non-negative p values");
    let mode = args.opt_int("compute_mode")?.unwrap_or(0);
    check!((0..=2).contains(&mode), Runtime, "possible modes: 0, 1, 2, but was: {}", mode);
    let dt = x1.dtype;
    let mut out_shape = s.batch.clone();
    out_shape.extend([s.r1, s.r2]);
    let b: i64 = s.batch.iter().product();
    if s.r1 == 0 || s.r2 == 0 || b == 0 || s.c == 0 {
        return one(cx.full(0.0, dt, &out_shape));
    }
    let euclid = p == 2.0 && (mode == 1 || (mode == 0 && (s.r1 > 25 || s.r2 > 25)));
    check_scalar_type(dt, x2.dtype)?;
    let acc = acc_type(dt);
    let a = batched(cx, x1.v, &s.batch);
    let bv = batched(cx, x2.v, &s.batch);
    let res = if euclid {
        // PyTorch's _euclidean_dist: [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T, clamped at 0.
        let sqnorm = |cx: &mut Cx, v: Value| {
            let v32 = cx.cast(v, acc);
            let sq = cx.mul(v32, v32);
            let sq = round_to(cx, sq, dt);
            let n = reduce(cx, sq, &[2], Red::Sum);
            let n = cx.cast(n, dt);
            let d = cx.dims(n);
            cx.reshape(n, &[d[0], d[1], 1])
        };
        let n1 = sqnorm(cx, a);
        let n2 = sqnorm(cx, bv);
        let ones1 = cx.full(1.0, dt, &[b, s.r1, 1]);
        let ones2 = cx.full(1.0, dt, &[b, s.r2, 1]);
        let m2 = k(cx, -2.0, a);
        let a2 = cx.mul(a, m2);
        let l = cx.concatenate(&[a2, n1, ones1], 2);
        let r = cx.concatenate(&[bv, ones2, n2], 2);
        let d = contract(cx, l, r, (&[0], &[0]), (&[2], &[2]));
        let d = cx.cast(d, dt);
        let d = cx.cast(d, acc);
        let zero = k(cx, 0.0, d);
        let d = cx.max(d, zero);
        cx.sqrt(d)
    } else {
        check_float_kernel(dt, "cdist", false)?;
        let d = row_diffs(cx, a, bv);
        let ad = cx.abs(d);
        norm_along(cx, ad, p, 3, true)
    };
    let res = cx.cast(res, dt);
    one(cx.reshape(res, &out_shape))
}

/// The incoming gradient of _cdist_backward/_pdist_backward: `grad_output` from torch 2.14,
/// `grad` before.
fn incoming_grad(args: &Args) -> Result<Tensor> {
    args.tensor(if args.get("grad_output").is_some() { "grad_output" } else { "grad" })
}

/// _cdist_backward(grad, x1, x2, p, cdist): the gradient for x1 (over the broadcast batch;
/// autograd reduces it). PyTorch computes x2's gradient with the same op, arguments swapped.
fn cdist_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = incoming_grad(args)?;
    let x1 = args.tensor("x1")?;
    let x2 = args.tensor("x2")?;
    let dist = args.tensor("cdist")?;
    let p = float_arg(args, "p")?;
    let s = cdist_shape(cx, &x1, &x2)?;
    let dt = x1.dtype;
    let b: i64 = s.batch.iter().product();
    if s.r1 == 0 || s.r2 == 0 || s.c == 0 || b == 0 {
        let d = cx.dims(x1.v);
        return one(cx.full(0.0, dt, &d));
    }
    check_float_kernel(dt, "cdist_backward", false)?;
    for t in [&x2, &g, &dist] {
        check_scalar_type(dt, t.dtype)?;
    }
    for (t, name) in [(&g, "grad"), (&dist, "cdist")] {
        check!(
            cx.numel(t.v) == b * s.r1 * s.r2,
            Runtime,
            "_cdist_backward: {} has {} elements, expected {}",
            name,
            cx.numel(t.v),
            b * s.r1 * s.r2
        );
    }
    let a = batched(cx, x1.v, &s.batch);
    let bv = batched(cx, x2.v, &s.batch);
    let diff = row_diffs(cx, a, bv);
    let full = cx.dims(diff);
    let gv = cx.reshape(g.v, &[b, s.r1, s.r2]);
    let gv = cx.broadcast_in_dim(gv, &full, &[0, 1, 2]);
    let dv = cx.reshape(dist.v, &[b, s.r1, s.r2]);
    let dv = cx.broadcast_in_dim(dv, &full, &[0, 1, 2]);
    let t = norm_grad(cx, diff, gv, dv, p);
    let r = reduce(cx, t, &[2], Red::Sum);
    let mut shape = s.batch.clone();
    shape.extend([s.r1, s.c]);
    one(cx.reshape(r, &shape))
}

/// a[.., i, :] - b[.., j, :] for the rows of a [.., r1, c] and b [.., r2, c] (same leading
/// dims): [.., r1, r2, c], the differences cdist and pdist take norms of.
fn row_diffs(cx: &mut Cx, a: Value, b: Value) -> Value {
    let (da, db) = (cx.dims(a), cx.dims(b));
    let nb = da.len() - 2;
    let mut full = da[..nb].to_vec();
    full.extend([da[nb], db[nb], da[nb + 1]]);
    let lead: Vec<i64> = (0..nb as i64).collect();
    let nb = nb as i64;
    let at_a: Vec<i64> = lead.iter().copied().chain([nb, nb + 2]).collect();
    let at_b: Vec<i64> = lead.iter().copied().chain([nb + 1, nb + 2]).collect();
    let ab = cx.broadcast_in_dim(a, &full, &at_a);
    let bb = cx.broadcast_in_dim(b, &full, &at_b);
    cx.sub(ab, bb)
}

/// For an [n, n] grid: the index in pdist's order of the pair (min(i, j), max(i, j)) (for i = j
/// a value the callers mask), and the i1 mask of i < j.
fn pdist_pair_index(cx: &mut Cx, n: i64) -> (Value, Value) {
    let nn = [n, n];
    let i = iota(cx, &nn, 0);
    let j = iota(cx, &nn, 1);
    let a = cx.min(i, j);
    let b = cx.max(i, j);
    // a n - a (a + 1) / 2 + (b - a - 1)
    let nv = ik(cx, n, &nn);
    let one_ = ik(cx, 1, &nn);
    let two = ik(cx, 2, &nn);
    let an = cx.mul(a, nv);
    let a1 = cx.add(a, one_);
    let tri = cx.mul(a, a1);
    let tri = cx.div(tri, two);
    let base = cx.sub(an, tri);
    let off = cx.sub(b, a);
    let off = cx.sub(off, one_);
    let k = cx.add(base, off);
    let upper = cx.compare(CmpDir::Lt, i, j);
    (k, upper)
}

fn pdist_checks(cx: &Cx, x: &Tensor, p: f64) -> Result<(i64, i64)> {
    let d = cx.dims(x.v);
    check!(d.len() == 2, Runtime, "pdist only supports 2D tensors, got: {}D", d.len());
    check!(x.dtype.is_float(), Runtime, "pdist only supports floating-point dtypes");
    check!(p >= 0.0, Runtime, "pdist only supports non-negative p values");
    Ok((d[0], d[1]))
}

/// _pdist_forward(self, p): distances between all pairs of rows i < j, [n (n - 1) / 2], in
/// row-major order of (i, j).
fn pdist_forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let p = float_arg(args, "p")?;
    let (n, m) = pdist_checks(cx, &x, p)?;
    if n <= 1 {
        return one(cx.full(0.0, x.dtype, &[0]));
    }
    let kk = n * (n - 1) / 2;
    if m == 0 {
        return one(cx.full(0.0, x.dtype, &[kk]));
    }
    check_float_kernel(x.dtype, "pdist", false)?;
    // All n x n distances, then the upper triangle scattered into place (the rest goes to a
    // spare last slot that is cut off).
    let d = row_diffs(cx, x.v, x.v);
    let ad = cx.abs(d);
    let dist = norm_along(cx, ad, p, 2, false);
    let (pair, upper) = pdist_pair_index(cx, n);
    let spare = ik(cx, kk, &[n, n]);
    let pair = cx.select(upper, pair, spare);
    let pair = cx.reshape(pair, &[n, n, 1]);
    let sd = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: vec![0],
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 2,
        indices_are_sorted: false,
        unique_indices: false,
    };
    let zero = cx.full(0.0, x.dtype, &[kk + 1]);
    let out = cx.scatter(zero, pair, dist, &sd, |_, _, y| y);
    one(cx.slice(out, &[0], &[kk], &[1]))
}

/// _pdist_backward(grad, self, p, pdist): each row gets the gradients of its pairs; the
/// pairwise gradient is odd in the difference, so row i sums it over all j != i.
fn pdist_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = incoming_grad(args)?;
    let x = args.tensor("self")?;
    let dist = args.tensor("pdist")?;
    let p = float_arg(args, "p")?;
    let (n, m) = pdist_checks(cx, &x, p)?;
    if n <= 1 || m == 0 {
        return one(cx.full(0.0, x.dtype, &[n, m]));
    }
    check_float_kernel(x.dtype, "pdist_backward", false)?;
    let kk = n * (n - 1) / 2;
    for (t, name) in [(&g, "grad"), (&dist, "pdist")] {
        check_scalar_type(x.dtype, t.dtype)?;
        check!(cx.numel(t.v) == kk, Runtime, "_pdist_backward: {} has {} elements, expected {}", name, cx.numel(t.v), kk);
    }
    let (pair, _) = pdist_pair_index(cx, n);
    let gf = cx.reshape(g.v, &[kk]);
    let df = cx.reshape(dist.v, &[kk]);
    let gs = take_1d(cx, gf, pair);
    let ds = take_1d(cx, df, pair);
    let diff = row_diffs(cx, x.v, x.v);
    let full = [n, n, m];
    let gb = cx.broadcast_in_dim(gs, &full, &[0, 1]);
    let db = cx.broadcast_in_dim(ds, &full, &[0, 1]);
    let t = norm_grad(cx, diff, gb, db, p);
    let ri = iota(cx, &full, 0);
    let ci = iota(cx, &full, 1);
    let off = cx.compare(CmpDir::Ne, ri, ci);
    let zero = k(cx, 0.0, t);
    let t = cx.select(off, t, zero);
    one(reduce(cx, t, &[1], Red::Sum))
}

// ---- multi_margin_loss ----------------------------------------------------------------------------

/// Checks shared by multi_margin_loss and its backward: (nframe, dim, p).
fn multi_margin_checks(cx: &Cx, args: &Args, x: &Tensor, t: &Tensor, w: Option<Tensor>) -> Result<(i64, i64, i64)> {
    let p = match args.scalar("p")? {
        Scalar::Int(i) => i,
        Scalar::Bool(b) => b as i64,
        Scalar::Float(f) => f.value.trunc() as i64,
    };
    check!(p == 1 || p == 2, Runtime, "only p == 1 and p == 2 supported");
    let xd = cx.dims(x.v);
    let td = cx.dims(t.v);
    let nd = xd.len();
    let valid = (nd == 2 && xd[1] != 0) || (nd == 1 && xd[0] != 0) || nd == 0;
    let (nframe, dim) = if nd <= 1 { (1, if nd == 0 { 1 } else { xd[0] }) } else { (xd[0], xd[1]) };
    check!(valid, Runtime, "Expected non-empty vector or matrix with optional 0-dim batch size, but got: {:?}", xd);
    check!(
        td.len() <= 1 && cx.numel(t.v) == nframe,
        Runtime,
        "inconsistent target size, expected {} but got {:?}",
        nframe,
        td
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
    let lower = args.opt_scalar("lower")?.map_or(0.125, scalar_value);
    let upper = args.opt_scalar("upper")?.map_or(1.0 / 3.0, scalar_value);
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
        let acc = acc_type(dt);
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
    let acc = acc_type(x.dtype);
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
    let acc = acc_type(x.dtype);
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
    (l.f)(cx, &Args { op: args.op, names: &names, values: &values })
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
