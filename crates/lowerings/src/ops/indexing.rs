//! Indexing: index_select, gather, scatter (and its reductions), advanced indexing (index,
//! index_put), index_add/copy/fill/reduce, masked_scatter, take and put.
//!
//! Index bounds: PyTorch raises for out-of-range indices. Gathers clamp such indices into
//! range (XLA's gather semantics) and scatters drop them, so every op here that reads
//! user-given indices attaches PyTorch's check (`Cx::check_index`), with PyTorch's CPU
//! exception class and message: at the call for CPU index tensors, at the next
//! synchronization for device ones (see engine/src/checks.rs). `_unsafe_index` and
//! `_unsafe_index_put` do not check, as in PyTorch. embedding.rs, nonzero_unique.rs and
//! search.rs follow the same rule.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::consts::{extremes, I64};
use crate::blocks::gather::{along_coords, combine, compact_positions, gather_points, index_select_check, inverse_perm, is_index_dtype, nonempty, nonzero_coords, numel, scatter_along, scatter_points, take_along, Combine};
use crate::blocks::type_names::{check_out_dtype, shape_str};
use crate::cx::{broadcast_shapes, wrap_dim, Bound, Cx};
use crate::dtype::{DType, Rank};
use crate::error::{ErrorKind, Result};
use crate::{bail, check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, GatherDims, ScatterDims, Value};

pub(crate) const OPS: &[Op] = &[
    op("index_select", index_select).float4(),
    // Bucketed in scopes (padded inputs, see the engine's buckets.rs): their index checks and
    // negative indices read self's real sizes, and scatters drop the index's padding lanes.
    op("gather", gather).bucketed_in_scopes(),
    op("scatter", scatter).bucketed_in_scopes(),
    op("scatter_add", scatter_add).bucketed_in_scopes(),
    op("scatter_reduce", scatter_reduce),
    // x[mask] keeps its composite: it sizes the output by counting the mask; the lowering reads it.
    op("index", index).host_tensors().keep_composite(&["index.Tensor"]).bucketed_in_scopes(),
    op("_unsafe_index", index).bucketed_in_scopes(),
    op("index_put", index_put).host_tensors(),
    op("_index_put_impl", index_put).host_tensors(),
    op("_unsafe_index_put", index_put),
    // The gradient of an index into a tensor captured by flex attention's score function.
    op("flex_lib::zeros_and_scatter", zeros_and_scatter),
    // Specialized: PyTorch's message for a bad index depends on whether alpha is 1.
    op("index_add", index_add).specialized(),
    op("index_copy", index_copy),
    op("index_fill", index_fill),
    op("index_reduce", index_reduce),
    op("masked_scatter", masked_scatter),
    op("take", take),
    op("put", put),
];

// ---- shared helpers ---------------------------------------------------------------------------

/// `i < 0 ? i + n : i` as int64 (Python-style negative indices).
pub(crate) fn wrap_negative(cx: &mut Cx, idx: Value, n: i64) -> Value {
    let n = cx.b.constant_i64(n, ElemType::I64);
    wrap_negative_by(cx, idx, n)
}

/// `wrap_negative` by a 0-d int64 size known at run time (a bucketed program's real size).
fn wrap_negative_by(cx: &mut Cx, idx: Value, n: Value) -> Value {
    let i = cx.convert(idx, ElemType::I64);
    let dims = cx.dims(i);
    let zero = cx.full(0.0, I64, &dims);
    let neg = cx.compare(CmpDir::Lt, i, zero);
    let nn = cx.broadcast_in_dim(n, &dims, &[]);
    let w = cx.add(i, nn);
    cx.select(neg, w, i)
}

/// A Scalar or 0-d tensor argument as a 0-d value of `dtype`.
fn value_arg(cx: &mut Cx, args: &Args, name: &str, dtype: DType, op: &str) -> Result<Value> {
    match args.get(name) {
        Some(Arg::Tensor(t)) => {
            let nd = cx.rank(t.v);
            check!(nd == 0, Runtime, "{} only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).", op, nd);
            Ok(cx.cast(t.v, dtype))
        }
        _ => {
            let s = args.scalar(name)?;
            Ok(cx.scalar(s, dtype))
        }
    }
}

// ---- index_select, gather, scatter --------------------------------------------------------------

fn index_select(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let idims = cx.dims(index.v);
    check!(idims.len() <= 1, Index, "index_select(): Index is supposed to be a vector");
    check!(is_index_dtype(index.dtype), Runtime, "index_select(): Expected dtype int32 or int64 for index");
    let xd = cx.dims(x.v);
    let dim = wrap_dim(args.int("dim")?, xd.len())?;
    let n = numel(&idims);
    if xd.is_empty() {
        check!(n == 1, Runtime, "index_select(): Index to scalar can have only 1 value, got {} value(s)", n);
        cx.check_index(index.v, 0, 1, ErrorKind::Index, "index out of range in self");
        return one(x.v);
    }
    let mut out = xd.clone();
    out[dim] = n;
    if !index_select_check(cx, &xd, dim, index.v)? {
        return one(cx.full(0.0, x.dtype, &out));
    }
    let idx = cx.reshape(index.v, &[n]);
    one(take_along(cx, x.v, dim, idx))
}

fn gather(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    if let Some(out) = args.opt_tensor("out")? {
        check_out_dtype(x.dtype, out.dtype)?;
    }
    let xd = cx.dims(x.v);
    let id = cx.dims(index.v);
    // PyTorch checks the index dtype only when there is something to gather.
    check!(numel(&id) == 0 || is_index_dtype(index.dtype), Runtime, "gather(): Expected dtype int32/int64 for index");
    let dim = wrap_dim(args.int("dim")?, xd.len())?;
    if numel(&id) == 0 {
        return one(cx.full(0.0, x.dtype, &id));
    }
    let (xs, is) = (nonempty(&xd), nonempty(&id));
    check!(xs.len() == is.len(), Runtime, "Index tensor must have the same number of dimensions as input tensor");
    for d in 0..xs.len() {
        if d != dim {
            check!(
                is[d] <= xs[d],
                Runtime,
                "Size does not match at dimension {} expected index {} to be no larger than self {} apart from dimension {}",
                d,
                shape_str(&id),
                shape_str(&xd),
                dim
            );
        }
    }
    if numel(&id) == 0 {
        return one(cx.full(0.0, x.dtype, &id));
    }
    let real_size = real_dim(cx, x.v, dim);
    check_along(cx, index.v, dim, xs[dim], real_size);
    if xs[dim] == 0 {
        // Every index fails the check.
        return one(cx.full(0.0, x.dtype, &id));
    }
    let xv = cx.reshape(x.v, &xs);
    let iv = cx.reshape(index.v, &is);
    let coords = along_coords(cx, iv, dim);
    let g = gather_points(cx, xv, coords);
    one(cx.reshape(g, &id))
}

/// gather's and scatter's bounds check: indices into dim `dim` (of size `size`) in 0..size.
/// In a bucketed program, the real size of dim `d` of the padded argument `v`.
fn real_dim(cx: &Cx, v: Value, d: usize) -> Option<Value> {
    cx.real_sizes(v).and_then(|r| r.get(d).copied())
}

fn check_along(cx: &mut Cx, index: Value, dim: usize, size: i64, real_size: Option<Value>) {
    let message = format!("index {{value}} is out of bounds for dimension {dim} with size {size}");
    cx.check_indices(ErrorKind::Runtime, vec![Bound { index, lo: 0, hi: size, message, real_size }]);
}

/// The shared checks of scatter, scatter_add and scatter_reduce, the bounds of the index
/// values included; returns the wrapped dim.
fn scatter_check(cx: &mut Cx, x: &Tensor, dim: i64, index: &Tensor, src: Option<&Tensor>) -> Result<usize> {
    check!(
        numel(&cx.dims(index.v)) == 0 || is_index_dtype(index.dtype),
        Runtime,
        "scatter(): Expected dtype int32/int64 for index"
    );
    if let Some(s) = src {
        check!(s.dtype == x.dtype, Runtime, "scatter(): Expected self.dtype to be equal to src.dtype");
    }
    let xd = cx.dims(x.v);
    let id = cx.dims(index.v);
    let dim = wrap_dim(dim, xd.len())?;
    if numel(&id) == 0 {
        return Ok(dim);
    }
    let (xs, is) = (nonempty(&xd), nonempty(&id));
    check!(xs.len() == is.len(), Runtime, "Index tensor must have the same number of dimensions as self tensor");
    if let Some(s) = src {
        let sd = cx.dims(s.v);
        let ss = nonempty(&sd);
        check!(ss.len() == is.len(), Runtime, "Index tensor must have the same number of dimensions as src tensor");
        let bad = (0..is.len()).any(|d| is[d] > ss[d] || (d != dim && is[d] > xs[d]));
        check!(
            !bad,
            Runtime,
            "Expected index {} to be no larger than self {} apart from dimension {} and to be no larger size than src {}",
            shape_str(&id),
            shape_str(&xd),
            dim,
            shape_str(&sd)
        );
    } else {
        let bad = (0..is.len()).any(|d| d != dim && is[d] > xs[d]);
        check!(
            !bad,
            Runtime,
            "Expected index {} to be no larger than self {} apart from dimension {}",
            shape_str(&id),
            shape_str(&xd),
            dim
        );
    }
    let real_size = real_dim(cx, x.v, dim);
    check_along(cx, index.v, dim, xs[dim], real_size);
    Ok(dim)
}

/// The updates of a scatter: `src` cut to the index's shape, or a scalar broadcast to it.
fn scatter_updates(cx: &mut Cx, src: &Option<Tensor>, value: Option<Value>, index_dims: &[i64]) -> Value {
    match src {
        Some(s) => {
            let sd = nonempty(&cx.dims(s.v));
            let sv = cx.reshape(s.v, &sd);
            let lim = nonempty(index_dims);
            let z = vec![0; lim.len()];
            let st = vec![1; lim.len()];
            cx.slice(sv, &z, &lim, &st)
        }
        None => cx.broadcast_in_dim(value.unwrap(), &nonempty(index_dims), &[]),
    }
}

/// scatter(self, dim, index, src|value, reduce=None|add|multiply) with `c` combining.
fn scatter_impl(cx: &mut Cx, x: &Tensor, dim: usize, index: &Tensor, updates: Value, c: Combine) -> Value {
    let xd = cx.dims(x.v);
    let id = cx.dims(index.v);
    if numel(&id) == 0 {
        return x.v;
    }
    let xv = cx.reshape(x.v, &nonempty(&xd));
    let iv = match cx.real_sizes(index.v).filter(|r| !r.is_empty()) {
        // In a bucketed program: the padding lanes of the index point past the dim, so their
        // updates are dropped (along another dim they would land on real elements).
        Some(real) => {
            let i = cx.convert(index.v, ElemType::I64);
            let mut real_lane: Option<Value> = None;
            for (d, r) in real.into_iter().enumerate() {
                let lane = cx.iota(&stablehlo::TensorType::new(ElemType::I64, &id), d as i64);
                let r = cx.broadcast_in_dim(r, &id, &[]);
                let inside = cx.compare(CmpDir::Lt, lane, r);
                real_lane = Some(match real_lane {
                    Some(m) => cx.and(m, inside),
                    None => inside,
                });
            }
            let past = cx.full(nonempty(&xd)[dim] as f64, I64, &id);
            let i = cx.select(real_lane.unwrap(), i, past);
            cx.reshape(i, &nonempty(&id))
        }
        None => cx.reshape(index.v, &nonempty(&id)),
    };
    let coords = along_coords(cx, iv, dim);
    let out = scatter_points(cx, xv, coords, updates, c);
    cx.reshape(out, &xd)
}

fn scatter(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let src = args.opt_tensor("src")?;
    let dim = scatter_check(cx, &x, args.int("dim")?, &index, src.as_ref())?;
    let c = match args.str("reduce")? {
        None => Combine::Replace,
        Some("add") => Combine::Add,
        Some("multiply") => Combine::Mul,
        Some(_) => bail!(Runtime, "reduce argument must be either add or multiply."),
    };
    let value = match src {
        Some(_) => None,
        None => {
            let s = args.scalar("value")?.to_real(x.dtype)?;
            Some(cx.scalar(s, x.dtype))
        }
    };
    let id = cx.dims(index.v);
    let upd = scatter_updates(cx, &src, value, &id);
    one(scatter_impl(cx, &x, dim, &index, upd, c))
}

fn scatter_add(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let src = args.tensor("src")?;
    let dim = scatter_check(cx, &x, args.int("dim")?, &index, Some(&src))?;
    let id = cx.dims(index.v);
    let upd = scatter_updates(cx, &Some(src), None, &id);
    one(scatter_impl(cx, &x, dim, &index, upd, Combine::Add))
}

/// The reductions of scatter_reduce and index_reduce.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Reduction {
    Sum,
    Prod,
    Mean,
    Amax,
    Amin,
}

impl Reduction {
    fn combine(self) -> Combine {
        match self {
            Reduction::Sum | Reduction::Mean => Combine::Add,
            Reduction::Prod => Combine::Mul,
            Reduction::Amax => Combine::Max,
            Reduction::Amin => Combine::Min,
        }
    }

    /// The value a position starts from when `self` is left out of the reduction.
    fn identity(self, cx: &mut Cx, dtype: DType, dims: &[i64]) -> Value {
        let (lo, hi) = extremes(dtype);
        match self {
            Reduction::Sum | Reduction::Mean => cx.full(0.0, dtype, dims),
            Reduction::Prod => cx.full(1.0, dtype, dims),
            Reduction::Amax => lo(cx, dims),
            Reduction::Amin => hi(cx, dims),
        }
    }
}

/// `total / count` where count > 0 (floor division for integers), `x` elsewhere.
fn mean_finish(cx: &mut Cx, total: Value, count: Value) -> Value {
    let dt = cx.dtype(total);
    let dims = cx.dims(total);
    let zero = cx.full(0.0, I64, &dims);
    let one_ = cx.full(1.0, I64, &dims);
    let empty = cx.compare(CmpDir::Eq, count, zero);
    let count = cx.select(empty, one_, count);
    let c = cx.convert(count, dt.elem());
    if dt.is_float() || dt.is_complex() {
        return cx.div(total, c);
    }
    // Floor division: truncate, then step down where the remainder has the other sign.
    let q = cx.div(total, c);
    let r = cx.rem(total, c);
    let z = cx.full(0.0, dt, &dims);
    let r_nz = cx.compare(CmpDir::Ne, r, z);
    let r_neg = cx.compare(CmpDir::Lt, r, z);
    let fix = cx.and(r_nz, r_neg);
    let o = cx.full(1.0, dt, &dims);
    let qm1 = cx.sub(q, o);
    cx.select(fix, qm1, q)
}

fn parse_reduction(s: &str, op: &str) -> Result<Reduction> {
    Ok(match (op, s) {
        (_, "sum") if op == "scatter_reduce" => Reduction::Sum,
        (_, "prod") => Reduction::Prod,
        (_, "mean") => Reduction::Mean,
        (_, "amax") => Reduction::Amax,
        (_, "amin") => Reduction::Amin,
        ("scatter_reduce", "max") => Reduction::Amax,
        ("scatter_reduce", "min") => Reduction::Amin,
        ("scatter_reduce", _) => bail!(Runtime, "reduce argument must be either sum, prod, mean, amax or amin, got {}", s),
        _ => bail!(Runtime, "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {}.", s),
    })
}

/// A reduction into `x` by `scatter(x, updates, c)`, honouring include_self and mean.
fn reduce_into(
    cx: &mut Cx,
    x: Value,
    red: Reduction,
    include_self: bool,
    scatter: &dyn Fn(&mut Cx, Value, Value, Combine) -> Value,
    updates: Value,
) -> Result<Value> {
    let dt = cx.dtype(x);
    let dims = cx.dims(x);
    if red == Reduction::Mean {
        check!(dt != DType::Bool, NotImplemented, "\"scatter_gather_tensor_cpu_reduce_mean\" not implemented for 'Bool'");
    }
    let ud = cx.dims(updates);
    let ones_u = cx.full(1.0, I64, &ud);
    let zeros = cx.full(0.0, I64, &dims);
    let hits = scatter(cx, zeros, ones_u, Combine::Add);
    let start = if include_self {
        x
    } else {
        let zero = cx.full(0.0, I64, &dims);
        let hit = cx.compare(CmpDir::Gt, hits, zero);
        let id = red.identity(cx, dt, &dims);
        cx.select(hit, id, x)
    };
    let out = scatter(cx, start, updates, red.combine());
    if red != Reduction::Mean {
        return Ok(out);
    }
    let count = if include_self {
        let one_ = cx.full(1.0, I64, &dims);
        cx.add(hits, one_)
    } else {
        hits
    };
    Ok(mean_finish(cx, out, count))
}

fn scatter_reduce(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let src = args.tensor("src")?;
    let dim = scatter_check(cx, &x, args.int("dim")?, &index, Some(&src))?;
    let red = parse_reduction(args.str("reduce")?.unwrap_or(""), "scatter_reduce")?;
    let include_self = args.bool_or("include_self", true)?;
    let id = cx.dims(index.v);
    if numel(&id) == 0 {
        return one(x.v);
    }
    let xd = cx.dims(x.v);
    let upd = scatter_updates(cx, &Some(src), None, &id);
    let iv = cx.reshape(index.v, &nonempty(&id));
    let coords = along_coords(cx, iv, dim);
    let xv = cx.reshape(x.v, &nonempty(&xd));
    let f = move |cx: &mut Cx, base: Value, u: Value, c: Combine| scatter_points(cx, base, coords, u, c);
    let out = reduce_into(cx, xv, red, include_self, &f, upd)?;
    one(cx.reshape(out, &xd))
}

// ---- advanced indexing ----------------------------------------------------------------------------

/// x[indices] addressing: the indexed dims moved to the front, the index tensors broadcast and
/// stacked into coordinates, and where the indexed block lands in the result.
struct Advanced {
    /// Transpose of self that puts the indexed dims first.
    perm: Vec<i64>,
    /// [B..., k] int64 coordinates into the indexed dims.
    coords: Value,
    /// The broadcast shape of the index tensors.
    bshape: Vec<i64>,
    k: usize,
    /// The dims of self that are not indexed, in order.
    rest: Vec<i64>,
    /// Where the B dims sit in the result.
    front: usize,
    /// Sizes of the indexed dims.
    indexed_sizes: Vec<i64>,
}

impl Advanced {
    fn result_dims(&self) -> Vec<i64> {
        let mut d = self.rest[..self.front].to_vec();
        d.extend(&self.bshape);
        d.extend(&self.rest[self.front..]);
        d
    }

    /// The permutation from the gathered layout [B..., rest...] to the result layout.
    fn result_perm(&self) -> Vec<i64> {
        let nb = self.bshape.len() as i64;
        let f = self.front as i64;
        let nr = self.rest.len() as i64;
        let mut p: Vec<i64> = (nb..nb + f).collect();
        p.extend(0..nb);
        p.extend(nb + f..nb + nr);
        p
    }
}

fn index_list(args: &Args) -> Result<Vec<Option<Tensor>>> {
    args.opt_tensors("indices")
}

/// Validates the index tensors (ints only: boolean masks are handled by the callers). `real`:
/// in a bucketed program, self's real sizes (negative indices count from them).
fn advanced(cx: &mut Cx, xd: &[i64], indices: &[Option<Tensor>], real: Option<&[Value]>) -> Result<Option<Advanced>> {
    check!(
        indices.len() <= xd.len(),
        Index,
        "too many indices for tensor of dimension {} (got {})",
        xd.len(),
        indices.len()
    );
    let mut pos = Vec::new();
    let mut shapes = Vec::new();
    for (i, t) in indices.iter().enumerate() {
        if let Some(t) = t {
            check!(
                matches!(t.dtype, DType::I64 | DType::I32 | DType::U8 | DType::Bool | DType::I16 | DType::I8),
                Index,
                "tensors used as indices must be long, int, byte or bool tensors"
            );
            pos.push(i);
            shapes.push(cx.dims(t.v));
        }
    }
    if pos.is_empty() {
        return Ok(None);
    }
    let bshape = broadcast_shapes(&shapes).map_err(|_| {
        let s: Vec<String> = shapes.iter().map(|s| shape_str(s)).collect();
        crate::TorchError::new(
            crate::ErrorKind::Index,
            format!("shape mismatch: indexing tensors could not be broadcast together with shapes {}", s.join(", ")),
        )
    })?;
    let k = pos.len();
    let contiguous = pos[k - 1] - pos[0] + 1 == k;
    let rest_pos: Vec<usize> = (0..xd.len()).filter(|d| !pos.contains(d)).collect();
    let rest: Vec<i64> = rest_pos.iter().map(|&d| xd[d]).collect();
    let mut perm: Vec<i64> = pos.iter().map(|&d| d as i64).collect();
    perm.extend(rest_pos.iter().map(|&d| d as i64));
    let indexed_sizes: Vec<i64> = pos.iter().map(|&d| xd[d]).collect();
    let mut cshape = bshape.clone();
    cshape.push(1);
    let mut parts = Vec::new();
    for &p in &pos {
        let t = indices[p].unwrap();
        let b = cx.broadcast_to(t.v, &bshape);
        let w = match real {
            Some(r) => wrap_negative_by(cx, b, r[p]),
            None => wrap_negative(cx, b, xd[p]),
        };
        parts.push(cx.reshape(w, &cshape));
    }
    let coords = cx.concatenate(&parts, bshape.len() as i64);
    Ok(Some(Advanced { perm, coords, bshape, k, rest, front: if contiguous { pos[0] } else { 0 }, indexed_sizes }))
}

/// PyTorch's bounds check of advanced indices: the index tensors the user gave (`user`; not the
/// coordinates a boolean mask expanded to) in -size..size of their dims. PyTorch names a dim
/// by its place among the index tensors (after mask expansion).
fn check_advanced(cx: &mut Cx, xd: &[i64], indices: &[Option<Tensor>], user: &[Value], real: Option<&[Value]>) {
    let mut bounds = Vec::new();
    for (j, (d, t)) in indices.iter().enumerate().filter_map(|(d, t)| t.map(|t| (d, t))).enumerate() {
        if user.contains(&t.v) {
            let size = xd[d];
            let message = format!("index {{value}} is out of bounds for dimension {j} with size {size}");
            bounds.push(Bound { index: t.v, lo: -size, hi: size, message, real_size: real.map(|r| r[d]) });
        }
    }
    cx.check_indices(ErrorKind::Index, bounds);
}

/// The index tensors as the user gave them (their values, for `check_advanced`).
fn user_indices(indices: &[Option<Tensor>]) -> Vec<Value> {
    indices.iter().flatten().map(|t| t.v).collect()
}

/// The single boolean mask among the indices, if any: (position, tensor).
fn bool_mask(indices: &[Option<Tensor>]) -> Option<(usize, Tensor)> {
    indices
        .iter()
        .enumerate()
        .find_map(|(i, t)| t.filter(|t| matches!(t.dtype, DType::Bool | DType::U8)).map(|t| (i, t)))
}

fn index(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let indices = index_list(args)?;
    let user = user_indices(&indices);
    let xd = cx.dims(x.v);
    // In a bucketed program (padded inputs): self's real sizes. A mask sizes the result by its
    // count, which padding would change.
    let real = cx.real_sizes(x.v);
    if real.is_some() && bool_mask(&indices).is_some() {
        cx.decline_padded();
        return one(x.v);
    }
    let indices = match bool_mask(&indices) {
        None => indices,
        Some((p, m)) => expand_mask(cx, args, &xd, &indices, p, &m)?,
    };
    let Some(a) = advanced(cx, &xd, &indices, real.as_deref())? else {
        return one(x.v);
    };
    let out_dims = a.result_dims();
    if numel(&out_dims) == 0 {
        return one(cx.full(0.0, x.dtype, &out_dims));
    }
    check!(!a.indexed_sizes.contains(&0), Index, "index is out of bounds for dimension with size 0");
    if args.op != "_unsafe_index" {
        check_advanced(cx, &xd, &indices, &user, real.as_deref());
    }
    let xt = cx.transpose(x.v, &a.perm);
    let nb = a.bshape.len() as i64;
    let nr = a.rest.len() as i64;
    let mut slice = vec![1; a.k];
    slice.extend(&a.rest);
    let dn = GatherDims {
        offset_dims: (nb..nb + nr).collect(),
        collapsed_slice_dims: (0..a.k as i64).collect(),
        start_index_map: (0..a.k as i64).collect(),
        index_vector_dim: nb,
        ..Default::default()
    };
    let g = cx.gather(xt, a.coords, &dn, &slice, false);
    one(cx.transpose(g, &a.result_perm()))
}

/// Replaces the boolean mask at `p` by the coordinates of its true elements (one index tensor
/// per mask dim). How many there are comes from the shape of the `out` tensor that PyTorch
/// sized (with nonzero) before calling index.out.
fn expand_mask(cx: &mut Cx, args: &Args, xd: &[i64], indices: &[Option<Tensor>], p: usize, m: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let masks = indices.iter().filter(|t| matches!(t, Some(t) if matches!(t.dtype, DType::Bool | DType::U8))).count();
    check!(masks == 1, NotImplemented, "torchtpu: indexing with more than one boolean mask is not supported yet");
    let out = args
        .opt_tensor("out")?
        .ok_or_else(|| crate::TorchError::new(crate::ErrorKind::NotImplemented, "torchtpu: index with a boolean mask needs its out= tensor"))?;
    let md = cx.dims(m.v);
    let k = md.len();
    check!(k > 0, NotImplemented, "torchtpu: indexing with a 0-d boolean mask is not supported yet");
    check!(p + k <= xd.len(), Index, "too many indices for tensor of dimension {} (got {})", xd.len(), p + k);
    for (j, &s) in md.iter().enumerate() {
        check!(
            s == xd[p + j],
            Index,
            "The shape of the mask {} at index {} does not match the shape of the indexed tensor {} at index {}",
            shape_str(&md),
            j,
            shape_str(xd),
            p + j
        );
    }
    // Where the index block sits in out: the indexed dims after expansion, the rest around them.
    let mut pos: Vec<usize> = Vec::new();
    let mut other_rank = 0;
    for (i, t) in indices.iter().enumerate() {
        let at = if i < p { i } else if i == p { p } else { i + k - 1 };
        match t {
            Some(_) if i == p => pos.extend(p..p + k),
            Some(t) => {
                pos.push(at);
                other_rank = other_rank.max(cx.rank(t.v));
            }
            None => {}
        }
    }
    let nb = other_rank.max(1);
    let contiguous = pos.last().unwrap() - pos[0] + 1 == pos.len();
    let front = if contiguous { pos[0] } else { 0 };
    let od = cx.dims(out.v);
    let rest = xd.len() - pos.len();
    check!(
        od.len() == rest + nb,
        NotImplemented,
        "torchtpu: index with a boolean mask got an out= tensor of an unexpected shape {}",
        shape_str(&od)
    );
    let nnz = od[front + nb - 1];
    let mask = cx.cast(m.v, DType::Bool);
    let coords = nonzero_coords(cx, mask, nnz, 0);
    let mut out_idx = Vec::new();
    for (i, t) in indices.iter().enumerate() {
        if i != p {
            out_idx.push(*t);
            continue;
        }
        for j in 0..k as i64 {
            let c = cx.slice(coords, &[0, j], &[nnz, j + 1], &[1, 1]);
            let c = cx.reshape(c, &[nnz]);
            out_idx.push(Some(Tensor { v: c, dtype: I64, rank: crate::Rank::Dim }));
        }
    }
    Ok(out_idx)
}

fn index_put(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let indices = index_list(args)?;
    let values = args.tensor("values")?;
    let accumulate = args.bool_or("accumulate", false)?;
    check!(
        values.dtype == x.dtype,
        Runtime,
        "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source.",
        x.dtype.torch_name(),
        values.dtype.torch_name()
    );
    let xd = cx.dims(x.v);
    if let Some((p, m)) = bool_mask(&indices) {
        let others = indices.iter().enumerate().any(|(i, t)| i != p && t.is_some());
        check!(
            !others,
            NotImplemented,
            "torchtpu: index_put with a boolean mask and other index tensors is not supported yet"
        );
        return one(mask_put(cx, &x, p, &m, &values, accumulate)?);
    }
    let Some(a) = advanced(cx, &xd, &indices, None)? else {
        // x[...] = v: every element.
        let vd = cx.dims(values.v);
        check_value_shape(&vd, &xd)?;
        let v = cx.broadcast_to(values.v, &xd);
        return one(if accumulate { add_values(cx, x.v, v) } else { v });
    };
    let out_dims = a.result_dims();
    let vd = cx.dims(values.v);
    check_value_shape(&vd, &out_dims)?;
    if numel(&out_dims) == 0 {
        return one(x.v);
    }
    check!(!a.indexed_sizes.contains(&0), Index, "index is out of bounds for dimension with size 0");
    if args.op != "_unsafe_index_put" {
        let user = user_indices(&indices);
        check_advanced(cx, &xd, &indices, &user, None);
    }
    let v = cx.broadcast_to(values.v, &out_dims);
    let v = cx.transpose(v, &inverse_perm(&a.result_perm()));
    let xt = cx.transpose(x.v, &a.perm);
    let nb = a.bshape.len() as i64;
    let nr = a.rest.len() as i64;
    let dn = ScatterDims {
        update_window_dims: (nb..nb + nr).collect(),
        inserted_window_dims: (0..a.k as i64).collect(),
        scatter_dims_to_operand_dims: (0..a.k as i64).collect(),
        index_vector_dim: nb,
        ..Default::default()
    };
    let c = if accumulate { Combine::Add } else { Combine::Replace };
    let s = cx.scatter(xt, a.coords, v, &dn, move |b, cur, upd| combine(b, c, cur, upd));
    one(cx.transpose(s, &inverse_perm(&a.perm)))
}

/// flex_lib::zeros_and_scatter(shape, indices, vals): zeros of `shape` with each of `vals` added
/// at its indices, the indices broadcast to the values' shape first (vmap's batching rule for
/// it: one position per element of a block of scores); no indices: the sum of the values.
fn zeros_and_scatter(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let shape = args.ints("shape")?;
    let values = args.tensor("vals")?;
    let indices: Vec<Tensor> = match args.get("indices") {
        Some(Arg::List(items)) => items.iter().filter_map(|x| if let Arg::Tensor(t) = x { Some(*t) } else { None }).collect(),
        _ => Vec::new(),
    };
    if indices.is_empty() {
        check!(shape.is_empty(), Runtime, "zeros_and_scatter with no indices only supports scalar outputs");
        let all: Vec<i64> = (0..cx.dims(values.v).len() as i64).collect();
        return one(crate::blocks::reduce::reduce(cx, values.v, &all, crate::blocks::reduce::Red::Sum));
    }
    let mut shapes: Vec<Vec<i64>> = indices.iter().map(|t| cx.dims(t.v)).collect();
    shapes.push(cx.dims(values.v));
    let common = broadcast_shapes(&shapes)?;
    let rank = |dims: &[i64]| if dims.is_empty() { Rank::ZeroDim } else { Rank::Dim };
    let expanded: Vec<Arg> =
        indices.iter().map(|t| Arg::Tensor(Tensor { v: cx.broadcast_to(t.v, &common), dtype: t.dtype, rank: rank(&common) })).collect();
    let zeros = cx.full(0.0, values.dtype, &shape);
    let names: Vec<String> = ["self", "indices", "values", "accumulate"].iter().map(|n| n.to_string()).collect();
    let vals = [Arg::Tensor(Tensor { v: zeros, dtype: values.dtype, rank: rank(&shape) }), Arg::List(expanded), Arg::Tensor(values), Arg::Bool(true)];
    index_put(cx, &Args { op: "index_put", names: &names, values: &vals, strides: &[] })
}

fn check_value_shape(vd: &[i64], out: &[i64]) -> Result<()> {
    let ok = broadcast_shapes(&[vd.to_vec(), out.to_vec()]).map(|b| b == out).unwrap_or(false);
    check!(
        ok,
        Runtime,
        "shape mismatch: value tensor of shape {} cannot be broadcast to indexing result of shape {}",
        shape_str(vd),
        shape_str(out)
    );
    Ok(())
}

fn add_values(cx: &mut Cx, a: Value, b: Value) -> Value {
    if cx.dtype(a) == DType::Bool {
        cx.or(a, b)
    } else {
        cx.add(a, b)
    }
}

/// x[..., mask, ...] = values (or +=) for a boolean mask over dims p..p+mask.dim(), without
/// knowing how many elements the mask selects: values are either broadcast along the selection
/// or consumed in order (found by a prefix count of the mask).
fn mask_put(cx: &mut Cx, x: &Tensor, p: usize, m: &Tensor, values: &Tensor, accumulate: bool) -> Result<Value> {
    let xd = cx.dims(x.v);
    let md = cx.dims(m.v);
    let k = md.len();
    check!(p + k <= xd.len(), Index, "too many indices for tensor of dimension {} (got {})", xd.len(), p + k);
    for (j, &s) in md.iter().enumerate() {
        check!(
            s == xd[p + j],
            Index,
            "The shape of the mask {} at index {} does not match the shape of the indexed tensor {} at index {}",
            shape_str(&md),
            j,
            shape_str(&xd),
            p + j
        );
    }
    let pre = &xd[..p];
    let post = &xd[p + k..];
    let mask = cx.cast(m.v, DType::Bool);
    // The indexing result is pre + [nnz] + post; values broadcast to it.
    let vd = cx.dims(values.v);
    let rank = pre.len() + 1 + post.len();
    check!(
        vd.len() <= rank,
        Runtime,
        "shape mismatch: value tensor of shape {} cannot be broadcast to indexing result of shape {}",
        shape_str(&vd),
        shape_str(&[pre, &[-1], post].concat())
    );
    let mut v_full = vec![1; rank - vd.len()];
    v_full.extend(&vd);
    let n = v_full[pre.len()];
    for (i, (&a, &b)) in v_full.iter().zip(pre.iter().chain([&n]).chain(post)).enumerate() {
        check!(
            a == 1 || a == b,
            Runtime,
            "shape mismatch: value tensor of shape {} cannot be broadcast to indexing result of shape {} at dim {}",
            shape_str(&vd),
            shape_str(&[pre, &[n], post].concat()),
            i
        );
    }
    let vv = cx.reshape(values.v, &v_full);
    let target: Vec<i64> = [pre, &md[..], post].concat();
    let spread = if n == 1 {
        // The same values for every selected position.
        let mut d = v_full[..pre.len()].to_vec();
        d.extend(vec![1; k]);
        d.extend(&v_full[pre.len() + 1..]);
        let r = cx.reshape(vv, &d);
        bcast_dims(cx, r, &target)
    } else {
        // Values consumed in row-major order of the mask.
        let nm = numel(&md);
        if nm == 0 {
            return Ok(x.v);
        }
        let flat = cx.reshape(mask, &[nm]);
        let pos = compact_positions(cx, flat, 0);
        let pos = cx.reshape(pos, &md);
        let full: Vec<i64> = [pre, &[n], post].concat();
        let vb = bcast_dims(cx, vv, &full);
        take_along(cx, vb, pre.len(), pos)
    };
    let mb = {
        let bd: Vec<i64> = (p..p + k).map(|d| d as i64).collect();
        cx.broadcast_in_dim(mask, &xd, &bd)
    };
    let new = if accumulate { add_values(cx, x.v, spread) } else { spread };
    Ok(cx.select(mb, new, x.v))
}

/// Broadcast `v` (same rank as `dims`, ones where it broadcasts) to `dims`.
fn bcast_dims(cx: &mut Cx, v: Value, dims: &[i64]) -> Value {
    let r = dims.len() as i64;
    cx.broadcast_in_dim(v, dims, &(0..r).collect::<Vec<_>>())
}

// ---- index_add, index_copy, index_fill, index_reduce ----------------------------------------------

/// Common checks of index_add/index_copy/index_reduce: returns (dim, index as 1-D).
fn index_source_check(cx: &mut Cx, op: &str, x: &Tensor, dim: i64, index: &Tensor, source: &Tensor) -> Result<(usize, Value)> {
    let xd = cx.dims(x.v);
    let sd = cx.dims(source.v);
    let id = cx.dims(index.v);
    let dim = wrap_dim(dim, xd.len())?;
    let n = numel(&id);
    let ss = nonempty(&sd);
    let xs = nonempty(&xd);
    let sdim = if sd.is_empty() { 1 } else { ss[dim.min(ss.len() - 1)] };
    if op == "index_copy_" {
        check!(id.len() <= 1, Index, "index_copy_(): Index should have dimension 1 or 0 (got {})", id.len());
        check!(index.dtype == DType::I64, Runtime, "index_copy_(): Expected a long tensor for index, but got {}", index.dtype.torch_name());
        check!(
            source.dtype == x.dtype,
            Runtime,
            "index_copy_(): self and source expected to have the same dtype, but got (self) {} and (source) {}",
            x.dtype.torch_name(),
            source.dtype.torch_name()
        );
        if !xd.is_empty() && !sd.is_empty() {
            check!(
                sd.len() == xd.len(),
                Index,
                "index_copy_(): When source and destination are not scalars, their dimensionality must match. Source dimensionality ({}), destination dimensionality ({})",
                sd.len(),
                xd.len()
            );
        }
        check!(n == sdim, Index, "index_copy_(): Number of indices ({}) should be equal to source.size(dim) ({})", n, sdim);
        for d in 0..xs.len().min(ss.len()) {
            check!(
                d == dim || xs[d] == ss[d],
                Runtime,
                "index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: {} at dimension {} and source slice shape: {} at dimension {}.",
                xs[d],
                d,
                ss[d],
                d
            );
        }
    } else {
        check!(
            id.len() <= 1,
            Index,
            "{}(): Index is supposed to be a vector, but got dim: {} with type: {} and size: {}",
            op,
            id.len(),
            index.dtype.torch_name(),
            shape_str(&id)
        );
        check!(is_index_dtype(index.dtype), Runtime, "{}(): Expected dtype int32/int64 for index but got: {}", op, index.dtype.torch_name());
        check!(
            source.dtype == x.dtype,
            Runtime,
            "{}(): self ({}) and source ({}) must have the same scalar type",
            op,
            x.dtype.torch_name(),
            source.dtype.torch_name()
        );
        check!(
            n == sdim,
            Runtime,
            "{}(): Number of indices ({}) should be equal to source.size(dim): ({}), for dim: {}",
            op,
            n,
            sdim,
            dim
        );
        let same = ss.len() == xs.len() && (0..xs.len()).all(|d| d == dim || xs[d] == ss[d]);
        check!(
            same,
            Runtime,
            "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = {} source.shape = {}",
            shape_str(&xd),
            shape_str(&sd)
        );
    }
    let idx = cx.reshape(index.v, &[n]);
    Ok((dim, idx))
}

fn index_add(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let source = args.tensor("source")?;
    let (dim, idx) = index_source_check(cx, "index_add_", &x, args.int("dim")?, &index, &source)?;
    let xd = cx.dims(x.v);
    let n = numel(&cx.dims(idx));
    if xd.len() > 1 {
        if n > 0 && numel(&xd) > 0 {
            // PyTorch's CPU kernel runs scatter_add (and its message) for the first or last dim
            // when alpha is 1, the index int64 and the source shaped like self apart from dim.
            let alpha_one = match args.opt_scalar("alpha")? {
                None | Some(Scalar::Int(1)) | Some(Scalar::Bool(true)) => true,
                Some(Scalar::Float(f)) => f.value == 1.0,
                Some(_) => false,
            };
            let sd = cx.dims(source.v);
            let same = sd.len() == xd.len() && (0..xd.len()).all(|d| d == dim || sd[d] == xd[d]);
            if (dim == 0 || dim == xd.len() - 1) && alpha_one && index.dtype == DType::I64 && same {
                check_along(cx, index.v, dim, xd[dim], None);
            } else {
                cx.check_index(index.v, 0, xd[dim], ErrorKind::Index, "index out of range in self");
            }
        }
    } else {
        cx.check_index(index.v, 0, numel(&xd), ErrorKind::Index, "index out of range in self");
    }
    if n == 0 || numel(&xd) == 0 {
        return one(x.v);
    }
    let xs = nonempty(&xd);
    let sd = nonempty(&cx.dims(source.v));
    let mut src = cx.reshape(source.v, &sd);
    match args.opt_scalar("alpha")? {
        None | Some(Scalar::Int(1)) | Some(Scalar::Bool(true)) => {}
        Some(a) => {
            let av = cx.scalar(a, x.dtype);
            let srcd = cx.dims(src);
            let av = cx.broadcast_in_dim(av, &srcd, &[]);
            src = if x.dtype == DType::Bool { cx.and(src, av) } else { cx.mul(src, av) };
        }
    }
    let xv = cx.reshape(x.v, &xs);
    let out = scatter_along(cx, xv, dim, idx, src, Combine::Add);
    one(cx.reshape(out, &xd))
}

fn index_copy(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let source = args.tensor("source")?;
    let (dim, idx) = index_source_check(cx, "index_copy_", &x, args.int("dim")?, &index, &source)?;
    let xd = cx.dims(x.v);
    if sweeps(&xd, dim, &cx.dims(idx)) {
        let size = nonempty(&xd)[dim];
        let msg = format!("index_copy_(): index {{value}} is out of bounds for dimension {dim} with size {size}");
        cx.check_index(index.v, 0, size, ErrorKind::Index, msg);
    }
    if numel(&cx.dims(idx)) == 0 || numel(&xd) == 0 {
        return one(x.v);
    }
    let xs = nonempty(&xd);
    let mut sd = nonempty(&cx.dims(source.v));
    if sd.len() != xs.len() {
        sd = xs.clone();
        sd[dim] = 1;
    }
    let src = cx.reshape(source.v, &sd);
    let xv = cx.reshape(x.v, &xs);
    let out = scatter_along(cx, xv, dim, idx, src, Combine::Replace);
    one(cx.reshape(out, &xd))
}

fn index_reduce(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let source = args.tensor("source")?;
    let red = parse_reduction(args.str("reduce")?.unwrap_or(""), "index_reduce")?;
    let include_self = args.bool_or("include_self", true)?;
    let (dim, idx) = index_source_check(cx, "index_reduce_", &x, args.int("dim")?, &index, &source)?;
    let xd = cx.dims(x.v);
    let n = numel(&cx.dims(idx));
    if !include_self {
        // PyTorch first fills the indexed slices with the reduction's identity (index_fill_).
        index_fill_bounds(cx, &xd, dim, index.v);
    }
    if xd.len() > 1 {
        if n > 0 {
            cx.check_index(index.v, 0, xd[dim], ErrorKind::Index, "index out of range in self");
        }
    } else {
        cx.check_index(index.v, 0, numel(&xd), ErrorKind::Index, "index out of range in self");
    }
    if n == 0 || numel(&xd) == 0 {
        return one(x.v);
    }
    let xs = nonempty(&xd);
    let sd = nonempty(&cx.dims(source.v));
    let src = cx.reshape(source.v, &sd);
    let xv = cx.reshape(x.v, &xs);
    let f = move |cx: &mut Cx, base: Value, u: Value, c: Combine| scatter_along(cx, base, dim, idx, u, c);
    let out = reduce_into(cx, xv, red, include_self, &f, src)?;
    one(cx.reshape(out, &xd))
}

fn index_fill(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    check!(index.dtype == DType::I64, Index, "index_fill_(): Expected dtype int64 for index.");
    let id = cx.dims(index.v);
    check!(id.len() <= 1, Runtime, "Index has to be a vector/scalar");
    let xd = cx.dims(x.v);
    let dim = wrap_dim(args.int("dim")?, xd.len())?;
    let value = value_arg(cx, args, "value", x.dtype, "index_fill_")?;
    let n = numel(&id);
    index_fill_bounds(cx, &xd, dim, index.v);
    if n == 0 || numel(&xd) == 0 {
        return one(x.v);
    }
    let xs = nonempty(&xd);
    let size = xs[dim];
    let idx = cx.reshape(index.v, &[n]);
    let idx = wrap_negative(cx, idx, size);
    let none = cx.full(0.0, DType::Bool, &[size]);
    let yes = cx.full(1.0, DType::Bool, &[n]);
    let hit = scatter_along(cx, none, 0, idx, yes, Combine::Replace);
    let hit = cx.broadcast_in_dim(hit, &xs, &[dim as i64]);
    let hit = cx.reshape(hit, &xd);
    let v = cx.broadcast_in_dim(value, &xd, &[]);
    one(cx.select(hit, v, x.v))
}

/// Whether PyTorch's index_copy_/index_fill_ kernels visit any element: they sweep self (0-d as
/// [1]) with dim `dim` replaced by the index's length.
fn sweeps(xd: &[i64], dim: usize, id: &[i64]) -> bool {
    let mut swept = nonempty(xd);
    swept[dim] = numel(id);
    numel(&swept) > 0
}

/// index_fill_'s bounds check: indices in -size..size of dim `dim` (0-d self: size 1).
fn index_fill_bounds(cx: &mut Cx, xd: &[i64], dim: usize, index: Value) {
    if sweeps(xd, dim, &cx.dims(index)) {
        let size = nonempty(xd)[dim];
        let msg = format!("index {{value}} is out of bounds for dimension {dim} with size {size}");
        cx.check_index(index, -size, size, ErrorKind::Index, msg);
    }
}

// ---- masked_scatter, take, put ----------------------------------------------------------------------

fn masked_scatter(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let mask = args.tensor("mask")?;
    let source = args.tensor("source")?;
    check!(
        mask.dtype == DType::Bool,
        Runtime,
        "masked_scatter_ only supports boolean masks, but got mask with dtype {}",
        mask.dtype.torch_name()
    );
    check!(
        source.dtype == x.dtype,
        Runtime,
        "masked_scatter: expected self and source to have same dtypes but got{} and {}",
        x.dtype.torch_name(),
        source.dtype.torch_name()
    );
    let xd = cx.dims(x.v);
    let md = cx.dims(mask.v);
    let b = broadcast_shapes(&[xd.clone(), md.clone()])?;
    check!(b == xd, Runtime, "masked_scatter_: the mask of shape {} cannot be broadcast to self of shape {}", shape_str(&md), shape_str(&xd));
    let ns = numel(&cx.dims(source.v));
    let n = numel(&xd);
    if n == 0 || ns == 0 {
        return one(x.v);
    }
    let m = cx.broadcast_to(mask.v, &xd);
    let flat = cx.reshape(m, &[n]);
    let pos = compact_positions(cx, flat, 0);
    let src = cx.reshape(source.v, &[ns]);
    let picked = take_along(cx, src, 0, pos);
    let picked = cx.reshape(picked, &xd);
    one(cx.select(m, picked, x.v))
}

/// take's and put_'s bounds check: flat indices in -n..n.
fn take_put_bounds(cx: &mut Cx, index: Value, n: i64) {
    let msg = format!("out of range: tried to access index {{value}} on a tensor of {n} elements.");
    cx.check_index(index, -n, n, ErrorKind::Index, msg);
}

fn take(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    check!(index.dtype == DType::I64, Runtime, "take(): Expected a long tensor for index, but got {}", index.dtype.torch_name());
    let id = cx.dims(index.v);
    let n = numel(&cx.dims(x.v));
    if numel(&id) == 0 {
        return one(cx.full(0.0, x.dtype, &id));
    }
    check!(n > 0, Index, "take(): tried to take from an empty tensor");
    take_put_bounds(cx, index.v, n);
    let flat = cx.reshape(x.v, &[n]);
    let idx = wrap_negative(cx, index.v, n);
    one(take_along(cx, flat, 0, idx))
}

fn put(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let index = args.tensor("index")?;
    let source = args.tensor("source")?;
    let accumulate = args.bool_or("accumulate", false)?;
    check!(index.dtype == DType::I64, Runtime, "put_(): Expected a long tensor for index, but got {}", index.dtype.torch_name());
    check!(
        source.dtype == x.dtype,
        Runtime,
        "put_(): self and source expected to have the same dtype, but got self.dtype = {} and source.dtype = {}",
        x.dtype.torch_name(),
        source.dtype.torch_name()
    );
    let ni = numel(&cx.dims(index.v));
    let ns = numel(&cx.dims(source.v));
    check!(
        ni == ns,
        Index,
        "put_(): Expected source and index to have the same number of elements, but got source.numel() = {}, index.numel() = {}",
        ns,
        ni
    );
    let xd = cx.dims(x.v);
    let n = numel(&xd);
    if ni == 0 {
        return one(x.v);
    }
    check!(n > 0, Index, "put_(): Tried to put elements into an empty tensor");
    take_put_bounds(cx, index.v, n);
    let flat = cx.reshape(x.v, &[n]);
    let idx = cx.reshape(index.v, &[ni]);
    let idx = wrap_negative(cx, idx, n);
    let src = cx.reshape(source.v, &[ns]);
    let c = if accumulate { Combine::Add } else { Combine::Replace };
    let out = scatter_along(cx, flat, 0, idx, src, c);
    one(cx.reshape(out, &xd))
}
