//! Pairwise distances: _cdist_forward / _cdist_backward (torch.cdist; p = 0, 1, 2, inf and
//! general p, with the matrix-multiplication form for p = 2 where compute_mode asks for it) and
//! _pdist_forward / _pdist_backward (F.pdist).
use crate::args::{Arg, Args, Tensor};
use crate::blocks::consts::{ik, iota, k};
use crate::blocks::contract::contract;
use crate::blocks::gather::take_1d;
use crate::blocks::reduce::{reduce, Red};
use crate::blocks::round16::round_to;
use crate::blocks::type_names::{check_float_kernel, check_scalar_type};
use crate::cx::{broadcast_shapes, Cx};
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use stablehlo::{CmpDir, ScatterDims, Value};

pub(crate) const OPS: &[Op] = &[
    // p decides which norm the program computes, so float arguments are compiled in.
    op("_cdist_forward", cdist_forward).specialized(),
    op("_cdist_backward", cdist_backward).specialized(),
    op("_pdist_forward", pdist_forward).specialized(),
    op("_pdist_backward", pdist_backward).specialized(),
];

/// The value of a `float` argument (compiled in: these ops are specialized).
fn float_arg(args: &Args, name: &str) -> Result<f64> {
    Ok(match args.get(name) {
        Some(Arg::Float(f)) => f.value,
        Some(Arg::Int(i)) => *i as f64,
        Some(Arg::Bool(b)) => *b as i64 as f64,
        _ => bail!(Type, "{}(): expected argument '{}' to be a float", args.op, name),
    })
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
    let acc = dt.opmath();
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
    args.tensor(if args.probe("grad_output").is_some() { "grad_output" } else { "grad" })
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
