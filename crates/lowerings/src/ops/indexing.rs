//! Indexing and data-dependent ops: index_select, gather, scatter (and its reductions),
//! advanced indexing (index, index_put), index_add/copy/fill/reduce, masked_scatter, take,
//! put, embedding_dense_backward, and the ops whose output size depends on the data
//! (nonzero, masked_select, unique).
//!
//! Index bounds: PyTorch raises for out-of-range indices. Gathers clamp such indices into
//! range (XLA's gather semantics) and scatters drop them, so every op here that reads
//! user-given indices attaches PyTorch's check (`Cx::check_index`), with PyTorch's CPU
//! exception class and message: at the call for CPU index tensors, at the next
//! synchronization for device ones (see engine/src/checks.rs). `_unsafe_index` and
//! `_unsafe_index_put` do not check, as in PyTorch.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::gather::{combine, compact_positions, count_all, cumsum_1d, index_select_check, nonzero_coords, numel, scatter_along, take_along, Combine};
use crate::blocks::type_names::tensor_type_name;
use crate::cx::{broadcast_shapes, wrap_dim, Bound, Cx};
use crate::dtype::{DType, Rank};
use crate::error::{ErrorKind, Result};
use crate::{bail, check, one, Out, Registry};
use stablehlo::{CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("_assert_async", assert_async);
    r.add("_functional_assert_async", assert_async);
    r.add("index_select", index_select);
    r.add("gather", gather);
    r.add("scatter", scatter);
    r.add("scatter_add", scatter_add);
    r.add("scatter_reduce", scatter_reduce);
    r.add("index", index);
    r.add("_unsafe_index", index);
    r.add("index_put", index_put);
    r.add("_index_put_impl", index_put);
    r.add("_unsafe_index_put", index_put);
    // Specialized: PyTorch's message for a bad index depends on whether alpha is 1.
    r.add_specialized("index_add", index_add);
    r.add("index_copy", index_copy);
    r.add("index_fill", index_fill);
    r.add("index_reduce", index_reduce);
    r.add("masked_scatter", masked_scatter);
    r.add("take", take);
    r.add("put", put);
    r.add("embedding_dense_backward", embedding_dense_backward);
    r.add_specialized("embedding_renorm", embedding_renorm);
    r.add("_embedding_bag", embedding_bag);
    r.add("_embedding_bag_forward_only", embedding_bag);
    r.add("_embedding_bag_backward", embedding_bag_backward);
    r.add("_embedding_bag_dense_backward", embedding_bag_backward);
    r.add("_embedding_bag_per_sample_weights_backward", embedding_bag_psw_backward);
    r.add("nonzero_static", nonzero_static);
    r.add("count_nonzero", count_nonzero);
    r.add_sized("nonzero", nonzero_size, nonzero);
    r.add_sized("masked_select", masked_select_size, masked_select);
    r.add_sized("_unique2", unique_size, unique2);
    r.add_sized("_unique", unique_size, unique1);
    r.add_sized("unique_consecutive", unique_consecutive_size, unique_consecutive);
    r.add_sized("unique_dim", unique_dim_size, unique_dim);
    r.add_sized("unique_dim_consecutive", unique_consecutive_size, unique_consecutive);
    r.add_sized("bincount", bincount_size, bincount);
    r.add("searchsorted", searchsorted);
    r.add("bucketize", bucketize);
    r.add("isin", isin);
    r.add_specialized("histc", histc);
}

// ---- shared helpers ---------------------------------------------------------------------------

const I64: DType = DType::I64;

fn is_index_dtype(d: DType) -> bool {
    matches!(d, DType::I64 | DType::I32)
}

/// `i < 0 ? i + n : i` as int64 (Python-style negative indices).
pub(crate) fn wrap_negative(cx: &mut Cx, idx: Value, n: i64) -> Value {
    let i = cx.convert(idx, ElemType::I64);
    let dims = cx.dims(i);
    let zero = cx.full(0.0, I64, &dims);
    let neg = cx.compare(CmpDir::Lt, i, zero);
    let nn = cx.full(n as f64, I64, &dims);
    let w = cx.add(i, nn);
    cx.select(neg, w, i)
}

/// Scatter with full per-element coordinates: `coords` is [S..., r] int64, `updates` is [S...].
fn scatter_points(cx: &mut Cx, x: Value, coords: Value, updates: Value, c: Combine) -> Value {
    let r = cx.rank(x) as i64;
    let dn = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: (0..r).collect(),
        scatter_dims_to_operand_dims: (0..r).collect(),
        index_vector_dim: cx.rank(coords) as i64 - 1,
        ..Default::default()
    };
    cx.scatter(x, coords, updates, &dn, move |b, cur, upd| combine(b, c, cur, upd))
}

/// Gather single elements at full coordinates ([S..., r] int64) -> [S...].
fn gather_points(cx: &mut Cx, x: Value, coords: Value) -> Value {
    let r = cx.rank(x) as i64;
    let dn = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: (0..r).collect(),
        start_index_map: (0..r).collect(),
        index_vector_dim: cx.rank(coords) as i64 - 1,
        ..Default::default()
    };
    cx.gather(x, coords, &dn, &vec![1; r as usize], false)
}

/// The coordinates of every element of `index` (dims S, rank r) with dim `dim` replaced by the
/// index values: an [S..., r] int64 tensor (torch.gather / torch.scatter addressing).
fn along_coords(cx: &mut Cx, index: Value, dim: usize) -> Value {
    let idx = cx.convert(index, ElemType::I64);
    let dims = cx.dims(idx);
    let r = dims.len();
    let ty = TensorType::new(ElemType::I64, &dims);
    let mut shp = dims.clone();
    shp.push(1);
    let parts: Vec<Value> = (0..r)
        .map(|d| {
            let c = if d == dim { idx } else { cx.iota(&ty, d as i64) };
            cx.reshape(c, &shp)
        })
        .collect();
    cx.concatenate(&parts, r as i64)
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

fn shape_str(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// Sizes as PyTorch's ensure_nonempty_size sees them (0-d counts as [1]).
fn nonempty(d: &[i64]) -> Vec<i64> {
    if d.is_empty() {
        vec![1]
    } else {
        d.to_vec()
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
    check_along(cx, index.v, dim, xs[dim]);
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
fn check_along(cx: &mut Cx, index: Value, dim: usize, size: i64) {
    let msg = format!("index {{value}} is out of bounds for dimension {dim} with size {size}");
    cx.check_index(index, 0, size, ErrorKind::Runtime, msg);
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
    check_along(cx, index.v, dim, xs[dim]);
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
    let iv = cx.reshape(index.v, &nonempty(&id));
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
            let s = args.scalar("value")?;
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

type Fill = Box<dyn Fn(&mut Cx, &[i64]) -> Value>;

/// The lowest and highest values of a dtype, as fills.
fn extremes(dtype: DType) -> (Fill, Fill) {
    use DType::*;
    if dtype.is_float() {
        return (
            Box::new(move |cx, d| cx.full(f64::NEG_INFINITY, dtype, d)),
            Box::new(move |cx, d| cx.full(f64::INFINITY, dtype, d)),
        );
    }
    let (lo, hi): (i64, i64) = match dtype {
        Bool => (0, 1),
        U8 => (0, u8::MAX as i64),
        I8 => (i8::MIN as i64, i8::MAX as i64),
        I16 => (i16::MIN as i64, i16::MAX as i64),
        I32 => (i32::MIN as i64, i32::MAX as i64),
        U16 => (0, u16::MAX as i64),
        U32 => (0, u32::MAX as i64),
        U64 => (0, -1),
        _ => (i64::MIN, i64::MAX),
    };
    let e = dtype.elem();
    (
        Box::new(move |cx, d| cx.splat_i64(lo, &TensorType::new(e, d))),
        Box::new(move |cx, d| cx.splat_i64(hi, &TensorType::new(e, d))),
    )
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

fn inverse_perm(p: &[i64]) -> Vec<i64> {
    let mut inv = vec![0; p.len()];
    for (i, &q) in p.iter().enumerate() {
        inv[q as usize] = i as i64;
    }
    inv
}

fn index_list(args: &Args) -> Result<Vec<Option<Tensor>>> {
    args.opt_tensors("indices")
}

/// Validates the index tensors (ints only: boolean masks are handled by the callers).
fn advanced(cx: &mut Cx, xd: &[i64], indices: &[Option<Tensor>]) -> Result<Option<Advanced>> {
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
        let w = wrap_negative(cx, b, xd[p]);
        parts.push(cx.reshape(w, &cshape));
    }
    let coords = cx.concatenate(&parts, bshape.len() as i64);
    Ok(Some(Advanced { perm, coords, bshape, k, rest, front: if contiguous { pos[0] } else { 0 }, indexed_sizes }))
}

/// PyTorch's bounds check of advanced indices: the index tensors the user gave (`user`; not the
/// coordinates a boolean mask expanded to) in -size..size of their dims. PyTorch names a dim
/// by its place among the index tensors (after mask expansion).
fn check_advanced(cx: &mut Cx, xd: &[i64], indices: &[Option<Tensor>], user: &[Value]) {
    let mut bounds = Vec::new();
    for (j, (d, t)) in indices.iter().enumerate().filter_map(|(d, t)| t.map(|t| (d, t))).enumerate() {
        if user.contains(&t.v) {
            let size = xd[d];
            let message = format!("index {{value}} is out of bounds for dimension {j} with size {size}");
            bounds.push(Bound { index: t.v, lo: -size, hi: size, message });
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
    let indices = match bool_mask(&indices) {
        None => indices,
        Some((p, m)) => expand_mask(cx, args, &xd, &indices, p, &m)?,
    };
    let Some(a) = advanced(cx, &xd, &indices)? else {
        return one(x.v);
    };
    let out_dims = a.result_dims();
    if numel(&out_dims) == 0 {
        return one(cx.full(0.0, x.dtype, &out_dims));
    }
    check!(!a.indexed_sizes.contains(&0), Index, "index is out of bounds for dimension with size 0");
    if args.op != "_unsafe_index" {
        check_advanced(cx, &xd, &indices, &user);
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
    let Some(a) = advanced(cx, &xd, &indices)? else {
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
        check_advanced(cx, &xd, &indices, &user);
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
                check_along(cx, index.v, dim, xd[dim]);
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

// ---- embedding ------------------------------------------------------------------------------------

fn embedding_dense_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let grad = args.tensor("grad_output")?;
    let indices = args.tensor("indices")?;
    check!(
        is_index_dtype(indices.dtype),
        Runtime,
        "Expected tensor for argument #2 'indices' to have one of the following scalar types: Long, Int; but got {} instead (while checking arguments for embedding_backward)",
        tensor_type_name(indices.dtype)
    );
    let num_weights = args.int("num_weights")?;
    let padding_idx = args.int("padding_idx")?;
    let scale = args.bool("scale_grad_by_freq")?;
    let gd = cx.dims(grad.v);
    let n = numel(&cx.dims(indices.v));
    let width = if gd.is_empty() { 1 } else { *gd.last().unwrap() };
    let out_dims = [num_weights, width];
    if n == 0 || numel(&out_dims) == 0 {
        return one(cx.full(0.0, grad.dtype, &out_dims));
    }
    let idx = cx.reshape(indices.v, &[n]);
    let idx = cx.convert(idx, ElemType::I64);
    let mut rows = cx.reshape(grad.v, &[n, width]);
    if scale {
        let ones = cx.full(1.0, I64, &[n]);
        let zeros = cx.full(0.0, I64, &[num_weights]);
        let counts = scatter_along(cx, zeros, 0, idx, ones, Combine::Add);
        let c = take_along(cx, counts, 0, idx);
        let c = cx.convert(c, grad.dtype.elem());
        let c = cx.broadcast_in_dim(c, &[n, width], &[0]);
        rows = cx.div(rows, c);
    }
    if padding_idx >= 0 {
        let p = cx.full(padding_idx as f64, I64, &[n]);
        let is_pad = cx.compare(CmpDir::Eq, idx, p);
        let is_pad = cx.broadcast_in_dim(is_pad, &[n, width], &[0]);
        let z = cx.full(0.0, grad.dtype, &[n, width]);
        rows = cx.select(is_pad, z, rows);
    }
    let zeros = cx.full(0.0, grad.dtype, &out_dims);
    one(scatter_along(cx, zeros, 0, idx, rows, Combine::Add))
}

/// embedding_renorm_(self, indices, max_norm, norm_type): the rows of `self` that `indices` use
/// and whose p-norm exceeds max_norm are scaled to max_norm / (norm + 1e-7).
fn embedding_renorm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let w = args.tensor("self")?;
    let indices = args.tensor("indices")?;
    let wd = cx.dims(w.v);
    check!(wd.len() == 2, Runtime, "embedding_renorm_(): Expected 2-D tensor for argument #1 'self' (got {}-D)", wd.len());
    check!(
        is_index_dtype(indices.dtype),
        Runtime,
        "Expected tensor for argument #2 'indices' to have one of the following scalar types: Long, Int; but got {} instead (while checking arguments for embedding_renorm_)",
        tensor_type_name(indices.dtype)
    );
    let float = |name: &str| -> Result<f64> {
        match args.get(name) {
            Some(Arg::Float(f)) => Ok(f.value),
            _ => Ok(args.int(name)? as f64),
        }
    };
    let max_norm = float("max_norm")?;
    let p = float("norm_type")?;
    let n = numel(&cx.dims(indices.v));
    if n == 0 || numel(&wd) == 0 {
        return one(w.v);
    }
    let (rows, width) = (wd[0], wd[1]);
    let dt = w.dtype;
    // Accumulate 16-bit floats in float32, like PyTorch's norm.
    let acc = if dt.is_float() && dt.size() < 4 { DType::F32 } else { dt };
    let x = cx.cast(w.v, acc);
    let ax = cx.abs(x);
    let e = acc.elem();
    let sum = |cx: &mut Cx, v: Value| {
        let z = cx.constant_f64(0.0, e);
        cx.reduce(&[v], &[z], &[1], |b, a| vec![b.add(a[0], a[1])])[0]
    };
    let norm = if p.is_infinite() {
        let init = cx.constant_f64(if p > 0.0 { 0.0 } else { f64::INFINITY }, e);
        let is_max = p > 0.0;
        cx.reduce(&[ax], &[init], &[1], move |b, a| vec![if is_max { b.max(a[0], a[1]) } else { b.min(a[0], a[1]) }])[0]
    } else if p == 0.0 {
        let b = cx.cast(x, DType::Bool);
        let c = cx.convert(b, e);
        sum(cx, c)
    } else if p == 1.0 {
        sum(cx, ax)
    } else if p == 2.0 {
        let sq = cx.mul(x, x);
        let s = sum(cx, sq);
        cx.sqrt(s)
    } else {
        let pv = cx.full(p, acc, &wd);
        let pw = cx.pow(ax, pv);
        let s = sum(cx, pw);
        let inv = cx.full(1.0 / p, acc, &[rows]);
        cx.pow(s, inv)
    };
    let norm = cx.convert(norm, ElemType::F64);
    let norm = cx.convert(norm, dt.elem());
    let norm = cx.convert(norm, ElemType::F64);
    let mx = cx.full(max_norm, DType::F64, &[rows]);
    let over = cx.compare(CmpDir::Gt, norm, mx);
    let eps = cx.full(1e-7, DType::F64, &[rows]);
    let denom = cx.add(norm, eps);
    let scale = cx.div(mx, denom);
    // Only the rows that the indices name.
    let idx = cx.reshape(indices.v, &[n]);
    let none = cx.full(0.0, DType::Bool, &[rows]);
    let yes = cx.full(1.0, DType::Bool, &[n]);
    let used = scatter_along(cx, none, 0, idx, yes, Combine::Replace);
    let hit = cx.and(used, over);
    // row *= scale: the double scale is rounded to the row's dtype first.
    let scale = cx.convert(scale, dt.elem());
    let hit = cx.broadcast_in_dim(hit, &[rows, width], &[0]);
    let scale = cx.broadcast_in_dim(scale, &[rows, width], &[0]);
    let scaled = cx.mul(w.v, scale);
    one(cx.select(hit, scaled, w.v))
}

// ---- data-dependent sizes -------------------------------------------------------------------------

fn size(args: &Args) -> Result<i64> {
    args.int("__size")
}

fn nonzero_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let b = cx.cast(x.v, DType::Bool);
    one(count_all(cx, b))
}

fn nonzero(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let rows = size(args)?;
    let b = cx.cast(x.v, DType::Bool);
    one(nonzero_coords(cx, b, rows, 0))
}

fn nonzero_static(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let rows = args.int("size")?;
    check!(rows >= 0, Runtime, "nonzero_static: 'size' must be an non-negative integer, but got size: {}", rows);
    let fill = args.int_or("fill_value", -1)?;
    let b = cx.cast(x.v, DType::Bool);
    one(nonzero_coords(cx, b, rows, fill))
}

fn count_nonzero(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    let mut dims: Vec<i64> = Vec::new();
    for d in args.opt_ints("dim")?.unwrap_or_default() {
        let w = wrap_dim(d, xd.len())? as i64;
        check!(!dims.contains(&w), Runtime, "dim {} appears multiple times in the list of dims", w);
        dims.push(w);
    }
    if dims.is_empty() {
        dims = (0..xd.len() as i64).collect();
    }
    if xd.is_empty() {
        dims.clear();
    }
    let b = cx.cast(x.v, DType::Bool);
    let v = cx.convert(b, ElemType::I64);
    let z = cx.constant_i64(0, ElemType::I64);
    one(cx.reduce(&[v], &[z], &dims, |b, a| vec![b.add(a[0], a[1])])[0])
}

fn masked_select_args(cx: &mut Cx, args: &Args) -> Result<(Value, Value)> {
    let x = args.tensor("self")?;
    let mask = args.tensor("mask")?;
    check!(mask.dtype == DType::Bool, Runtime, "masked_select: expected BoolTensor for mask");
    let vs = cx.broadcast_all(&[x.v, mask.v])?;
    Ok((vs[0], vs[1]))
}

fn masked_select_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (_, m) = masked_select_args(cx, args)?;
    one(count_all(cx, m))
}

/// The elements of `x` where `mask` is true, in row-major order; `rows` of them.
fn compact(cx: &mut Cx, x: Value, mask: Value, rows: i64) -> Value {
    let dt = cx.dtype(x);
    let n = numel(&cx.dims(x));
    if n == 0 || rows == 0 {
        return cx.full(0.0, dt, &[rows]);
    }
    let flat = cx.reshape(x, &[n]);
    let fm = cx.reshape(mask, &[n]);
    let pos = compact_positions(cx, fm, rows);
    let out = cx.full(0.0, dt, &[rows + 1]);
    let out = scatter_along(cx, out, 0, pos, flat, Combine::Replace);
    cx.slice(out, &[0], &[rows], &[1])
}

fn masked_select(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let rows = size(args)?;
    let (x, m) = masked_select_args(cx, args)?;
    one(compact(cx, x, m, rows))
}

// ---- unique -----------------------------------------------------------------------------------------

/// Sorts a 1-D value ascending (NaN last), carrying the original positions along.
fn sort_with_positions(cx: &mut Cx, v: Value) -> (Value, Value) {
    let n = cx.dims(v)[0];
    let dt = cx.dtype(v);
    let key = if dt == DType::Bool { cx.convert(v, ElemType::U8) } else { v };
    let pos = cx.iota(&TensorType::new(ElemType::I64, &[n]), 0);
    let is_float = dt.is_float();
    let r = cx.sort(&[key, pos], 0, true, move |b, a| {
        let lt = b.compare(CmpDir::Lt, a[0], a[1]);
        if !is_float {
            return lt;
        }
        // NaN sorts after everything else.
        let an = b.compare(CmpDir::Ne, a[0], a[0]);
        let bn = b.compare(CmpDir::Ne, a[1], a[1]);
        let not_an = b.not(an);
        let nan_after = b.and(not_an, bn);
        b.or(lt, nan_after)
    });
    let sorted = if dt == DType::Bool { cx.cast(r[0], DType::Bool) } else { r[0] };
    (sorted, r[1])
}

/// For a 1-D value: true where an element differs from the one before it (and at 0).
fn run_starts(cx: &mut Cx, v: Value) -> Value {
    let n = cx.dims(v)[0];
    let first = cx.full(1.0, DType::Bool, &[1]);
    if n == 1 {
        return first;
    }
    let a = cx.slice(v, &[1], &[n], &[1]);
    let b = cx.slice(v, &[0], &[n - 1], &[1]);
    let ne = cx.compare(CmpDir::Ne, a, b);
    cx.concatenate(&[first, ne], 0)
}

fn unique_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let n = numel(&cx.dims(x.v));
    if n == 0 {
        return one(cx.constant_i64(0, ElemType::I64));
    }
    let flat = cx.reshape(x.v, &[n]);
    let (s, _) = sort_with_positions(cx, flat);
    let starts = run_starts(cx, s);
    one(count_all(cx, starts))
}

/// unique over runs of a 1-D sequence `s` whose elements came from positions `perm` of the input
/// (dims `in_dims`): (values, inverse, counts) with empty inverse/counts unless asked for.
fn unique_runs(cx: &mut Cx, s: Value, perm: Option<Value>, in_dims: &[i64], rows: i64, inverse: bool, counts: bool) -> Vec<Out> {
    let dt = cx.dtype(s);
    let n = cx.dims(s)[0];
    let starts = run_starts(cx, s);
    let pos = compact_positions(cx, starts, rows);
    let values = {
        let out = cx.full(0.0, dt, &[rows + 1]);
        let out = scatter_along(cx, out, 0, pos, s, Combine::Replace);
        cx.slice(out, &[0], &[rows], &[1])
    };
    let group = {
        let s64 = cx.convert(starts, ElemType::I64);
        let c = cumsum_1d(cx, s64);
        let one_ = cx.full(1.0, I64, &[n]);
        cx.sub(c, one_)
    };
    let inv = if inverse {
        let g = match perm {
            Some(p) => {
                let z = cx.full(0.0, I64, &[n]);
                scatter_along(cx, z, 0, p, group, Combine::Replace)
            }
            None => group,
        };
        cx.reshape(g, in_dims)
    } else {
        cx.full(0.0, I64, &[0])
    };
    let cnt = if counts {
        let z = cx.full(0.0, I64, &[rows]);
        let ones = cx.full(1.0, I64, &[n]);
        scatter_along(cx, z, 0, group, ones, Combine::Add)
    } else {
        cx.full(0.0, I64, &[0])
    };
    vec![Out::Tensor(values), Out::Tensor(inv), Out::Tensor(cnt)]
}

fn unique_common(cx: &mut Cx, args: &Args, inverse: bool, counts: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let rows = size(args)?;
    let xd = cx.dims(x.v);
    let n = numel(&xd);
    if n == 0 {
        let inv = if inverse { cx.full(0.0, I64, &xd) } else { cx.full(0.0, I64, &[0]) };
        return Ok(vec![Out::Tensor(cx.full(0.0, x.dtype, &[0])), Out::Tensor(inv), Out::Tensor(cx.full(0.0, I64, &[0]))]);
    }
    let flat = cx.reshape(x.v, &[n]);
    let (s, perm) = sort_with_positions(cx, flat);
    Ok(unique_runs(cx, s, Some(perm), &xd, rows, inverse, counts))
}

fn unique2(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let inverse = args.bool_or("return_inverse", false)?;
    let counts = args.bool_or("return_counts", false)?;
    unique_common(cx, args, inverse, counts)
}

fn unique1(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let inverse = args.bool_or("return_inverse", false)?;
    let mut outs = unique_common(cx, args, inverse, false)?;
    outs.truncate(2);
    Ok(outs)
}

/// unique_consecutive / unique_dim_consecutive: the dim to work along (None: flattened).
fn consecutive_dim(cx: &Cx, args: &Args) -> Result<Option<usize>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    match args.opt_int("dim")? {
        None => Ok(None),
        Some(d) => Ok(Some(wrap_dim(d, xd.len())?)),
    }
}

/// The slices of `x` along `dim` as rows of a 2-D value [size(dim), rest].
fn rows_along(cx: &mut Cx, x: Value, dim: usize) -> Value {
    let xd = cx.dims(x);
    let r = xd.len();
    let mut perm = vec![dim as i64];
    perm.extend((0..r).filter(|&d| d != dim).map(|d| d as i64));
    let t = cx.transpose(x, &perm);
    let rest: i64 = xd.iter().enumerate().filter(|&(d, _)| d != dim).map(|(_, &s)| s).product();
    cx.reshape(t, &[xd[dim], rest])
}

/// true where row i differs from row i-1 (and at 0).
fn row_starts(cx: &mut Cx, rows: Value) -> Value {
    let d = cx.dims(rows);
    let (n, m) = (d[0], d[1]);
    let first = cx.full(1.0, DType::Bool, &[1]);
    if n == 1 {
        return first;
    }
    if m == 0 {
        let f = cx.full(0.0, DType::Bool, &[n - 1]);
        return cx.concatenate(&[first, f], 0);
    }
    let a = cx.slice(rows, &[1, 0], &[n, m], &[1, 1]);
    let b = cx.slice(rows, &[0, 0], &[n - 1, m], &[1, 1]);
    let ne = cx.compare(CmpDir::Ne, a, b);
    let f = cx.constant_bool(false);
    let any = cx.reduce(&[ne], &[f], &[1], |b, a| vec![b.or(a[0], a[1])])[0];
    cx.concatenate(&[first, any], 0)
}

fn unique_consecutive_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    let dim = consecutive_dim(cx, args)?;
    let starts = match dim {
        None => {
            let n = numel(&xd);
            if n == 0 {
                return one(cx.constant_i64(0, ElemType::I64));
            }
            let flat = cx.reshape(x.v, &[n]);
            run_starts(cx, flat)
        }
        Some(d) => {
            if xd.is_empty() || xd[d] == 0 {
                return one(cx.constant_i64(0, ElemType::I64));
            }
            let rows = rows_along(cx, x.v, d);
            row_starts(cx, rows)
        }
    };
    one(count_all(cx, starts))
}

/// Unique rows of `rows` [n, m] (already ordered so equal rows are adjacent): the kept rows in
/// the layout of `x` along `dim`, the group of each row, and the group sizes.
#[allow(clippy::too_many_arguments)]
fn unique_rows(cx: &mut Cx, x: &Tensor, dim: usize, rows2: Value, perm: Option<Value>, k: i64, inverse: bool, counts: bool) -> Vec<Out> {
    let xd = cx.dims(x.v);
    let d = cx.dims(rows2);
    let (n, m) = (d[0], d[1]);
    let starts = row_starts(cx, rows2);
    let pos = compact_positions(cx, starts, k);
    let out = cx.full(0.0, x.dtype, &[k + 1, m]);
    let out = scatter_along(cx, out, 0, pos, rows2, Combine::Replace);
    let out = cx.slice(out, &[0, 0], &[k, m], &[1, 1]);
    // Back to x's layout with dim of size k.
    let mut tdims = vec![k];
    tdims.extend(xd.iter().enumerate().filter(|&(i, _)| i != dim).map(|(_, &s)| s));
    let out = cx.reshape(out, &tdims);
    let mut perm_t = vec![dim as i64];
    perm_t.extend((0..xd.len()).filter(|&i| i != dim).map(|i| i as i64));
    let values = cx.transpose(out, &inverse_perm(&perm_t));
    let s64 = cx.convert(starts, ElemType::I64);
    let c = cumsum_1d(cx, s64);
    let one_ = cx.full(1.0, I64, &[n]);
    let group = cx.sub(c, one_);
    let inv = if inverse {
        match perm {
            Some(p) => {
                let z = cx.full(0.0, I64, &[n]);
                scatter_along(cx, z, 0, p, group, Combine::Replace)
            }
            None => group,
        }
    } else {
        cx.full(0.0, I64, &[0])
    };
    let cnt = if counts {
        let z = cx.full(0.0, I64, &[k]);
        let ones = cx.full(1.0, I64, &[n]);
        scatter_along(cx, z, 0, group, ones, Combine::Add)
    } else {
        cx.full(0.0, I64, &[0])
    };
    vec![Out::Tensor(values), Out::Tensor(inv), Out::Tensor(cnt)]
}

fn unique_consecutive(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let rows = size(args)?;
    let inverse = args.bool_or("return_inverse", false)?;
    let counts = args.bool_or("return_counts", false)?;
    let xd = cx.dims(x.v);
    let empty_i = |cx: &mut Cx, d: &[i64]| cx.full(0.0, I64, d);
    match consecutive_dim(cx, args)? {
        None => {
            let n = numel(&xd);
            if n == 0 {
                let inv = if inverse { empty_i(cx, &xd) } else { empty_i(cx, &[0]) };
                return Ok(vec![Out::Tensor(cx.full(0.0, x.dtype, &[0])), Out::Tensor(inv), Out::Tensor(empty_i(cx, &[0]))]);
            }
            let flat = cx.reshape(x.v, &[n]);
            Ok(unique_runs(cx, flat, None, &xd, rows, inverse, counts))
        }
        Some(d) => {
            check!(!xd.is_empty(), Index, "Dimension out of range (expected to be in range of [-1, 0], but got {})", d);
            if xd[d] == 0 {
                let inv = empty_i(cx, &[0]);
                return Ok(vec![Out::Tensor(x.v), Out::Tensor(inv), Out::Tensor(empty_i(cx, &[0]))]);
            }
            let r2 = rows_along(cx, x.v, d);
            Ok(unique_rows(cx, &x, d, r2, None, rows, inverse, counts))
        }
    }
}

/// Sorts the rows of [n, m] lexicographically (stable sorts from the last column to the first),
/// returning the sorted rows and where each came from.
fn sort_rows(cx: &mut Cx, rows2: Value) -> (Value, Value) {
    let d = cx.dims(rows2);
    let (n, m) = (d[0], d[1]);
    let mut perm = cx.iota(&TensorType::new(ElemType::I64, &[n]), 0);
    for c in (0..m).rev() {
        let col = cx.slice(rows2, &[0, c], &[n, c + 1], &[1, 1]);
        let col = cx.reshape(col, &[n]);
        let col = take_along(cx, col, 0, perm);
        let (_, p) = sort_with_positions(cx, col);
        perm = take_along(cx, perm, 0, p);
    }
    (take_along(cx, rows2, 0, perm), perm)
}

fn unique_dim_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, xd.len())?;
    if xd.is_empty() || xd[d] == 0 {
        return one(cx.constant_i64(0, ElemType::I64));
    }
    let r2 = rows_along(cx, x.v, d);
    let (s, _) = sort_rows(cx, r2);
    let starts = row_starts(cx, s);
    one(count_all(cx, starts))
}

fn unique_dim(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let rows = size(args)?;
    let inverse = args.bool_or("return_inverse", false)?;
    let counts = args.bool_or("return_counts", false)?;
    let xd = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, xd.len())?;
    check!(!xd.is_empty(), Index, "Dimension out of range (expected to be in range of [-1, 0], but got {})", d);
    if xd[d] == 0 {
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(cx.full(0.0, I64, &[0])), Out::Tensor(cx.full(0.0, I64, &[0]))]);
    }
    let r2 = rows_along(cx, x.v, d);
    let (s, perm) = sort_rows(cx, r2);
    Ok(unique_rows(cx, &x, d, s, Some(perm), rows, inverse, counts))
}

// ---- bincount, searchsorted, bucketize, isin, histc ---------------------------------------------

fn bincount_args(cx: &Cx, args: &Args) -> Result<(Tensor, Option<Tensor>, i64)> {
    let x = args.tensor("self")?;
    let w = args.opt_tensor("weights")?;
    let minlength = args.int_or("minlength", 0)?;
    check!(minlength >= 0, Runtime, "minlength should be >= 0");
    check!(
        cx.rank(x.v) == 1 && x.dtype.is_integral() && x.dtype != DType::Bool,
        Runtime,
        "bincount only supports 1-d non-negative integral inputs."
    );
    if let Some(w) = &w {
        check!(
            cx.rank(w.v) == 1 && cx.dims(w.v) == cx.dims(x.v),
            Runtime,
            "weights should be 1-d and have the same length as input"
        );
    }
    Ok((x, w, minlength))
}

fn bincount_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, _, minlength) = bincount_args(cx, args)?;
    let n = numel(&cx.dims(x.v));
    let ml = cx.constant_i64(minlength, ElemType::I64);
    if n == 0 {
        return one(ml);
    }
    let v = cx.convert(x.v, ElemType::I64);
    let lo = cx.constant_i64(-1, ElemType::I64);
    let m = cx.reduce(&[v], &[lo], &[0], |b, a| vec![b.max(a[0], a[1])])[0];
    let one_ = cx.constant_i64(1, ElemType::I64);
    let m1 = cx.add(m, one_);
    one(cx.max(m1, ml))
}

/// bincount(self, weights=None, minlength=0): counts (or summed weights) of each value.
fn bincount(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, w, _) = bincount_args(cx, args)?;
    let bins = size(args)?;
    let n = numel(&cx.dims(x.v));
    let dt = match &w {
        None => I64,
        Some(w) if w.dtype == DType::F32 => DType::F32,
        Some(_) => DType::F64,
    };
    let zeros = cx.full(0.0, dt, &[bins]);
    if n == 0 || bins == 0 {
        return one(zeros);
    }
    let upd = match &w {
        None => cx.full(1.0, dt, &[n]),
        Some(w) => cx.cast(w.v, dt),
    };
    one(scatter_along(cx, zeros, 0, x.v, upd, Combine::Add))
}

/// For each value, the insertion point in the rows of `seq` ([P, M] sorted along M; `vals` is
/// [P, K]; or `seq` [M] and `vals` [K]): the first i with !(seq[i] < v) (left) or
/// !(seq[i] <= v) (right), written like PyTorch's CPU kernel so NaNs land where they do there.
fn lower_bound(cx: &mut Cx, seq: Value, vals: Value, right: bool) -> Value {
    let sd = cx.dims(seq);
    let vd = cx.dims(vals);
    let m = *sd.last().unwrap();
    let mut lo = cx.full(0.0, I64, &vd);
    let mut hi = cx.full(m as f64, I64, &vd);
    let two = cx.full(2.0, I64, &vd);
    let one_ = cx.full(1.0, I64, &vd);
    let last = cx.full((m - 1).max(0) as f64, I64, &vd);
    let mut steps = 0;
    while (1i64 << steps) <= m {
        steps += 1;
    }
    for _ in 0..steps {
        let sum = cx.add(lo, hi);
        let mid = cx.div(sum, two);
        let at = cx.min(mid, last);
        let b = if sd.len() == 1 {
            take_along(cx, seq, 0, at)
        } else {
            let coords = along_coords(cx, at, 1);
            gather_points(cx, seq, coords)
        };
        // left: go right when !(b >= v); right: when !(b > v)
        let stop = cx.compare(if right { CmpDir::Gt } else { CmpDir::Ge }, b, vals);
        let go = cx.not(stop);
        let active = cx.compare(CmpDir::Lt, lo, hi);
        let go_right = cx.and(go, active);
        let stop_here = cx.and(stop, active);
        let m1 = cx.add(mid, one_);
        lo = cx.select(go_right, m1, lo);
        hi = cx.select(stop_here, mid, hi);
    }
    lo
}

#[allow(clippy::too_many_arguments)]
fn search(cx: &mut Cx, seq: Tensor, vals: Value, vrank: Rank, vdtype: DType, right: bool, out_int32: bool, sorter: Option<Tensor>) -> Result<Value> {
    let sd = cx.dims(seq.v);
    let vd = cx.dims(vals);
    let out_dt = if out_int32 { DType::I32 } else { I64 };
    let dt = crate::dtype::result_type(&[(seq.dtype, seq.rank), (vdtype, vrank)]).unwrap();
    let m = *sd.last().unwrap_or(&1);
    if numel(&vd) == 0 || m == 0 || numel(&sd) == 0 {
        return Ok(cx.full(0.0, out_dt, &vd));
    }
    let mut s = cx.cast(seq.v, dt);
    if let Some(so) = sorter {
        let r = sd.len() - 1;
        let coords = along_coords(cx, so.v, r);
        s = gather_points(cx, s, coords);
    }
    let v = cx.cast(vals, dt);
    let pos = if sd.len() == 1 {
        let n = numel(&vd);
        let flat = cx.reshape(v, &[n]);
        let p = lower_bound(cx, s, flat, right);
        cx.reshape(p, &vd)
    } else {
        let p: i64 = sd[..sd.len() - 1].iter().product();
        let k = *vd.last().unwrap();
        let s2 = cx.reshape(s, &[p, m]);
        let v2 = cx.reshape(v, &[p, k]);
        let r = lower_bound(cx, s2, v2, right);
        cx.reshape(r, &vd)
    };
    Ok(cx.convert(pos, out_dt.elem()))
}

fn searchsorted(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let seq = args.tensor("sorted_sequence")?;
    let out_int32 = args.bool_or("out_int32", false)?;
    let mut right = args.bool_or("right", false)?;
    if let Some(side) = args.str("side")? {
        check!(
            side == "left" || side == "right",
            Runtime,
            "torch.searchsorted(): side can only be 'left' or 'right' but got {}",
            side
        );
        check!(
            !(side == "left" && right),
            Runtime,
            "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"
        );
        right = side == "right";
    }
    let sorter = args.opt_tensor("sorter")?;
    let sd = cx.dims(seq.v);
    let (vals, vrank, vdtype) = match args.get("self") {
        Some(Arg::Tensor(t)) => (t.v, t.rank, t.dtype),
        _ => {
            let sc = args.scalar("self")?;
            let d = crate::dtype::result_type(&[(seq.dtype, seq.rank), (sc.dtype(), Rank::Wrapped)]).unwrap();
            (cx.scalar(sc, d), Rank::Wrapped, sc.dtype())
        }
    };
    let vd = cx.dims(vals);
    check!(!sd.is_empty(), Runtime, "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 dimension");
    let ok = sd.len() == 1 || (sd.len() == vd.len() && sd[..sd.len() - 1] == vd[..vd.len() - 1]);
    check!(
        ok,
        Runtime,
        "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries tensor and input value tensor must match, but we got boundaries tensor {} and input value tensor {}",
        shape_str(&sd),
        shape_str(&vd)
    );
    if let Some(so) = &sorter {
        check!(so.dtype == I64, Runtime, "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype {}", so.dtype.torch_name());
        check!(
            cx.dims(so.v) == sd,
            Runtime,
            "torch.searchsorted(): boundary and sorter must have the same size, but got boundary tensor {} and got sorter tensor {}",
            shape_str(&sd),
            shape_str(&cx.dims(so.v))
        );
    }
    one(search(cx, seq, vals, vrank, vdtype, right, out_int32, sorter)?)
}

fn bucketize(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let b = args.tensor("boundaries")?;
    let bd = cx.dims(b.v);
    check!(bd.len() == 1, Runtime, "boundaries tensor must be 1 dimension, but got dim({})", bd.len());
    let out_int32 = args.bool_or("out_int32", false)?;
    let right = args.bool_or("right", false)?;
    let (vals, vrank, vdtype) = match args.get("self") {
        Some(Arg::Tensor(t)) => (t.v, t.rank, t.dtype),
        _ => {
            let sc = args.scalar("self")?;
            let d = crate::dtype::result_type(&[(b.dtype, b.rank), (sc.dtype(), Rank::Wrapped)]).unwrap();
            (cx.scalar(sc, d), Rank::Wrapped, sc.dtype())
        }
    };
    one(search(cx, b, vals, vrank, vdtype, right, out_int32, None)?)
}

/// isin(elements, test_elements, assume_unique=False, invert=False) for tensors and scalars.
fn isin(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let operand = |cx: &mut Cx, names: &[&str]| -> Result<(Value, DType, Rank)> {
        for n in names {
            match args.get(n) {
                Some(Arg::Tensor(t)) => return Ok((t.v, t.dtype, t.rank)),
                Some(Arg::None) | None => continue,
                Some(_) => {
                    let s = args.scalar(n)?;
                    let d = match s {
                        Scalar::Float(_) => DType::F64,
                        _ => s.dtype(),
                    };
                    return Ok((cx.scalar(s, d), d, Rank::Wrapped));
                }
            }
        }
        Err(crate::TorchError::new(crate::ErrorKind::Type, "isin(): missing argument"))
    };
    let (e, ed, er) = operand(cx, &["elements", "element"])?;
    let (t, td, tr) = operand(cx, &["test_elements", "test_element"])?;
    let invert = args.bool_or("invert", false)?;
    for d in [ed, td] {
        check!(d != DType::Bool, Runtime, "Unsupported input type encountered for isin(): {}", d.torch_name());
    }
    let dt = crate::dtype::result_type(&[(ed, er), (td, tr)]).unwrap();
    let edims = cx.dims(e);
    let nt = numel(&cx.dims(t));
    let found = if nt == 0 || numel(&edims) == 0 {
        cx.full(0.0, DType::Bool, &edims)
    } else {
        let tv = cx.cast(t, dt);
        let tv = cx.reshape(tv, &[nt]);
        let ev = cx.cast(e, dt);
        let (sorted, _) = sort_with_positions(cx, tv);
        let n = numel(&edims);
        let flat = cx.reshape(ev, &[n]);
        let pos = lower_bound(cx, sorted, flat, false);
        let last = cx.full((nt - 1) as f64, I64, &[n]);
        let at = cx.min(pos, last);
        let b = take_along(cx, sorted, 0, at);
        let eq = cx.compare(CmpDir::Eq, b, flat);
        cx.reshape(eq, &edims)
    };
    one(if invert { cx.not(found) } else { found })
}

/// histc(self, bins=100, min=0, max=0): equal-width histogram; min == max uses the data's range.
fn histc(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    // Integer inputs as on CUDA (PyTorch's CPU kernel has floats only; models use ints on
    // accelerators).
    check!(
        x.dtype.is_float() || x.dtype.is_int(),
        NotImplemented,
        "\"histogram_tpu\" not implemented for '{}'",
        x.dtype.torch_name()
    );
    let bins = args.int_or("bins", 100)?;
    check!(bins > 0, Runtime, "torch.histc(): bins must be > 0, but got {} for dimension 0", bins);
    let float = |name: &str| -> Result<f64> {
        match args.get(name) {
            Some(Arg::Float(f)) => Ok(f.value),
            None | Some(Arg::None) => Ok(0.0),
            _ => Ok(args.int(name)? as f64),
        }
    };
    let (mn, mx) = (float("min")?, float("max")?);
    let ordered = mn <= mx;
    check!(ordered, Runtime, "torch.histc(): max must be larger than min");
    check!(mn.is_finite() && mx.is_finite(), Runtime, "torch.histc(): range of [{}, {}] is not finite", mn, mx);
    let dt = x.dtype;
    let n = numel(&cx.dims(x.v));
    if n == 0 {
        return one(cx.full(0.0, dt, &[bins]));
    }
    let flat = cx.reshape(x.v, &[n]);
    if dt.is_int() {
        return one(histc_int(cx, flat, bins, mn, mx));
    }
    let e = dt.elem();
    let (lo, hi) = if mn == mx {
        // The data's own range (NaNs ignored), widened by 1 when it is a single point.
        let nan = cx.compare(CmpDir::Ne, flat, flat);
        let inf = cx.full(f64::INFINITY, dt, &[n]);
        let ninf = cx.full(f64::NEG_INFINITY, dt, &[n]);
        let a = cx.select(nan, inf, flat);
        let b = cx.select(nan, ninf, flat);
        let i0 = cx.constant_f64(f64::INFINITY, e);
        let i1 = cx.constant_f64(f64::NEG_INFINITY, e);
        let lo = cx.reduce(&[a], &[i0], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
        let hi = cx.reduce(&[b], &[i1], &[0], |b, v| vec![b.max(v[0], v[1])])[0];
        let same = cx.compare(CmpDir::Eq, lo, hi);
        let one_ = cx.constant_f64(1.0, e);
        let lo1 = cx.sub(lo, one_);
        let hi1 = cx.add(hi, one_);
        let fixed_lo = cx.constant_f64(mn - 1.0, e);
        let fixed_hi = cx.constant_f64(mx + 1.0, e);
        // all-NaN (or empty) data: PyTorch falls back to the given (equal) bounds
        let empty = cx.compare(CmpDir::Gt, lo, hi);
        let lo = cx.select(same, lo1, lo);
        let hi = cx.select(same, hi1, hi);
        let lo = cx.select(empty, fixed_lo, lo);
        let hi = cx.select(empty, fixed_hi, hi);
        (lo, hi)
    } else {
        (cx.constant_f64(mn, e), cx.constant_f64(mx, e))
    };
    let lob = cx.broadcast_in_dim(lo, &[n], &[]);
    let hib = cx.broadcast_in_dim(hi, &[n], &[]);
    // pos = (x - lo) * bins / (hi - lo), then one step of local search against the bin edges
    let d = cx.sub(flat, lob);
    let w = cx.sub(hib, lob);
    let nb = cx.full(bins as f64, dt, &[n]);
    let scaled = cx.mul(d, nb);
    let q = cx.div(scaled, w);
    let pos = cx.convert(q, ElemType::I64);
    let lastb = cx.full((bins - 1) as f64, I64, &[n]);
    let zero = cx.full(0.0, I64, &[n]);
    let pos = cx.min(pos, lastb);
    let pos = cx.max(pos, zero);
    // edge(i) = lo + i * (hi - lo) / bins, as linspace computes it
    let edge = |cx: &mut Cx, i: Value| {
        let f = cx.convert(i, e);
        let step = cx.div(w, nb);
        let t = cx.mul(f, step);
        cx.add(lob, t)
    };
    let e0 = edge(cx, pos);
    let one_i = cx.full(1.0, I64, &[n]);
    let next = cx.add(pos, one_i);
    let e1 = edge(cx, next);
    let below = cx.compare(CmpDir::Lt, flat, e0);
    let above = cx.compare(CmpDir::Ge, flat, e1);
    let not_last = cx.compare(CmpDir::Lt, pos, lastb);
    let above = cx.and(above, not_last);
    let down = cx.sub(pos, one_i);
    let pos = cx.select(below, down, pos);
    let pos = cx.select(above, next, pos);
    // only elements inside [lo, hi] count
    let ge = cx.compare(CmpDir::Ge, flat, lob);
    let le = cx.compare(CmpDir::Le, flat, hib);
    let inside = cx.and(ge, le);
    let trash = cx.full(bins as f64, I64, &[n]);
    let pos = cx.select(inside, pos, trash);
    let zeros = cx.full(0.0, dt, &[bins + 1]);
    let ones = cx.full(1.0, dt, &[n]);
    let h = scatter_along(cx, zeros, 0, pos, ones, Combine::Add);
    one(cx.slice(h, &[0], &[bins], &[1]))
}

/// histc on integers (CUDA's rule): bin = (x - lo) * bins / (hi - lo) in integer arithmetic,
/// x == hi in the last bin, values outside [lo, hi] dropped; counts in the input dtype.
fn histc_int(cx: &mut Cx, flat: Value, bins: i64, mn: f64, mx: f64) -> Value {
    let dt = cx.dtype(flat);
    let n = cx.dims(flat)[0];
    let x = cx.convert(flat, ElemType::I64);
    let (mut lo, mut hi) = (cx.constant_i64(mn as i64, ElemType::I64), cx.constant_i64(mx as i64, ElemType::I64));
    if mn as i64 == mx as i64 {
        let i0 = cx.constant_i64(i64::MAX, ElemType::I64);
        let i1 = cx.constant_i64(i64::MIN, ElemType::I64);
        lo = cx.reduce(&[x], &[i0], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
        hi = cx.reduce(&[x], &[i1], &[0], |b, v| vec![b.max(v[0], v[1])])[0];
    }
    let same = cx.compare(CmpDir::Eq, lo, hi);
    let one_ = cx.constant_i64(1, ElemType::I64);
    let lo1 = cx.sub(lo, one_);
    let hi1 = cx.add(hi, one_);
    let lo = cx.select(same, lo1, lo);
    let hi = cx.select(same, hi1, hi);
    let lob = cx.broadcast_in_dim(lo, &[n], &[]);
    let hib = cx.broadcast_in_dim(hi, &[n], &[]);
    let d = cx.sub(x, lob);
    let nb = cx.full(bins as f64, I64, &[n]);
    let scaled = cx.mul(d, nb);
    let w = cx.sub(hib, lob);
    let pos = cx.div(scaled, w);
    let lastb = cx.full((bins - 1) as f64, I64, &[n]);
    let pos = cx.min(pos, lastb);
    let ge = cx.compare(CmpDir::Ge, x, lob);
    let le = cx.compare(CmpDir::Le, x, hib);
    let inside = cx.and(ge, le);
    let trash = cx.full(bins as f64, I64, &[n]);
    let pos = cx.select(inside, pos, trash);
    let zeros = cx.full(0.0, dt, &[bins + 1]);
    let ones = cx.full(1.0, dt, &[n]);
    let h = scatter_along(cx, zeros, 0, pos, ones, Combine::Add);
    cx.slice(h, &[0], &[bins], &[1])
}

// ---- embedding_bag ------------------------------------------------------------------------------

const BAG_SUM: i64 = 0;
const BAG_MEAN: i64 = 1;
const BAG_MAX: i64 = 2;

/// The bag of each of the n indices from the bag start offsets (positions after the last bag
/// get the number of bags, which scatters drop).
fn offset_to_bag(cx: &mut Cx, offsets: Value, n: i64) -> Value {
    let no = numel(&cx.dims(offsets));
    let marks = cx.full(0.0, I64, &[n + 1]);
    if no <= 1 || n == 0 {
        return cx.full(0.0, I64, &[n]);
    }
    let o = cx.reshape(offsets, &[no]);
    let o = cx.convert(o, ElemType::I64);
    let starts = cx.slice(o, &[1], &[no], &[1]);
    let hi = cx.full(n as f64, I64, &[no - 1]);
    let lo = cx.full(0.0, I64, &[no - 1]);
    let starts = cx.clamp(lo, starts, hi);
    let ones = cx.full(1.0, I64, &[no - 1]);
    let marks = scatter_along(cx, marks, 0, starts, ones, Combine::Add);
    let marks = cx.slice(marks, &[0], &[n], &[1]);
    cumsum_1d(cx, marks)
}

struct Bags {
    n: i64,
    bags: i64,
    idx: Value,
    bag: Value,
    valid: Value,
    count: Value,
}

fn bags(cx: &mut Cx, indices: &Tensor, offsets: &Tensor, include_last: bool, padding_idx: i64, bags_hint: Option<i64>) -> Result<Bags> {
    let id = cx.dims(indices.v);
    check!(id.len() == 1, Runtime, "input has to be 1D or 2D Tensor, but got Tensor of dimension {}", id.len());
    check!(is_index_dtype(indices.dtype), Runtime, "embedding_bag: expected indices to be Long or Int, but got {}", indices.dtype.torch_name());
    check!(cx.rank(offsets.v) == 1, Runtime, "offsets has to be a 1D Tensor, but got Tensor of dimension {}", cx.rank(offsets.v));
    let n = id[0];
    let no = cx.dims(offsets.v)[0];
    let bags = bags_hint.unwrap_or(no - include_last as i64).max(0);
    let idx = cx.convert(indices.v, ElemType::I64);
    let bag = offset_to_bag(cx, offsets.v, n);
    let valid = if padding_idx >= 0 {
        let p = cx.full(padding_idx as f64, I64, &[n]);
        cx.compare(CmpDir::Ne, idx, p)
    } else {
        cx.full(1.0, DType::Bool, &[n])
    };
    let zeros = cx.full(0.0, I64, &[bags]);
    let count = if n == 0 || bags == 0 {
        zeros
    } else {
        let v = cx.convert(valid, ElemType::I64);
        scatter_along(cx, zeros, 0, bag, v, Combine::Add)
    };
    Ok(Bags { n, bags, idx, bag, valid, count })
}

fn bag_mode(args: &Args) -> Result<i64> {
    let mode = args.int_or("mode", 0)?;
    check!((0..=2).contains(&mode), Runtime, "embedding_bag: mode has to be one of sum, mean or max, got {}", mode);
    Ok(mode)
}

/// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
/// per_sample_weights, include_last_offset, padding_idx) -> (output, offset2bag, bag_size,
/// max_indices), with the auxiliary outputs shaped as PyTorch's CPU kernel leaves them.
fn embedding_bag(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let w = args.tensor("weight")?;
    let indices = args.tensor("indices")?;
    let offsets = args.tensor("offsets")?;
    let mode = bag_mode(args)?;
    let psw = args.opt_tensor("per_sample_weights")?;
    let include_last = args.bool_or("include_last_offset", false)?;
    let padding_idx = args.int_or("padding_idx", -1)?;
    let wd = cx.dims(w.v);
    check!(wd.len() == 2, Runtime, "weight has to be a 2D Tensor, but got Tensor of dimension {}", wd.len());
    if let Some(p) = &psw {
        check!(
            mode == BAG_SUM,
            NotImplemented,
            "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for mode='sum' (got mode='{}'). Please open a feature request on GitHub.",
            if mode == BAG_MEAN { "mean" } else { "max" }
        );
        check!(p.dtype == w.dtype, Runtime, "embedding_bag: expected per_sample_weights to have the dtype of weight ({}), but got {}", w.dtype.torch_name(), p.dtype.torch_name());
    }
    let b = bags(cx, &indices, &offsets, include_last, padding_idx, None)?;
    // PyTorch's CPU kernels word the bounds check by path: the fast sum/mean path of 32- and
    // 16-bit float weights (without padding_idx) names the position too.
    let fast = mode != BAG_MAX && padding_idx < 0 && matches!(w.dtype, DType::F32 | DType::F16 | DType::BF16);
    let msg = if fast {
        format!("Index {{position}} of input takes value {{value}} which is not in the valid range [0, {})", wd[0])
    } else {
        "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {value}".to_string()
    };
    cx.check_index(indices.v, 0, wd[0], ErrorKind::Runtime, msg);
    let d = wd[1];
    let aux = indices.dtype.elem();
    let dims = [b.bags, d];
    // 16-bit floats are summed in float32 and rounded once, as PyTorch's CPU kernel does.
    let acc = if w.dtype.is_float() && w.dtype.size() < 4 && mode != BAG_MAX { DType::F32 } else { w.dtype };
    let out = if b.n == 0 || b.bags == 0 || d == 0 {
        cx.full(0.0, w.dtype, &dims)
    } else {
        let rows = take_along(cx, w.v, 0, b.idx);
        let mut rows = cx.cast(rows, acc);
        if let Some(p) = &psw {
            let pv = cx.reshape(p.v, &[b.n]);
            let pv = cx.cast(pv, acc);
            let pv = cx.broadcast_in_dim(pv, &[b.n, d], &[0]);
            rows = cx.mul(rows, pv);
        }
        let valid2 = cx.broadcast_in_dim(b.valid, &[b.n, d], &[0]);
        if mode == BAG_MAX {
            let (lo, _) = extremes(w.dtype);
            let low = lo(cx, &[b.n, d]);
            let r = cx.select(valid2, rows, low);
            let init = lo(cx, &dims);
            let m = scatter_along(cx, init, 0, b.bag, r, Combine::Max);
            let zero = cx.full(0.0, I64, &[b.bags]);
            let empty = cx.compare(CmpDir::Eq, b.count, zero);
            let empty = cx.broadcast_in_dim(empty, &dims, &[0]);
            let z = cx.full(0.0, w.dtype, &dims);
            cx.select(empty, z, m)
        } else {
            let z = cx.full(0.0, acc, &[b.n, d]);
            let r = cx.select(valid2, rows, z);
            let zeros = cx.full(0.0, acc, &dims);
            let s = scatter_along(cx, zeros, 0, b.bag, r, Combine::Add);
            let s = if mode == BAG_MEAN {
                let one_ = cx.full(1.0, I64, &[b.bags]);
                let c = cx.max(b.count, one_);
                let c = cx.convert(c, acc.elem());
                let c = cx.broadcast_in_dim(c, &dims, &[0]);
                cx.div(s, c)
            } else {
                s
            };
            cx.cast(s, w.dtype)
        }
    };
    // Auxiliary outputs (what the backward needs), as the CPU kernel shapes them.
    let fast_sum = mode == BAG_SUM && padding_idx < 0 && matches!(w.dtype, DType::F32 | DType::F16 | DType::BF16);
    let offset2bag = if fast_sum { cx.full(0.0, indices.dtype, &[0]) } else { cx.convert(b.bag, aux) };
    let bag_size = if mode == BAG_SUM { cx.full(0.0, indices.dtype, &[b.bags]) } else { cx.convert(b.count, aux) };
    let max_indices = if mode == BAG_MAX {
        if b.n == 0 || b.bags == 0 || d == 0 {
            cx.full(0.0, indices.dtype, &dims)
        } else {
            max_positions(cx, &w, &b, out, d)?
        }
    } else {
        bag_size
    };
    let max_indices = cx.convert(max_indices, aux);
    Ok(vec![Out::Tensor(out), Out::Tensor(offset2bag), Out::Tensor(bag_size), Out::Tensor(max_indices)])
}

/// For max bags: the index (into weight) of the first position holding each bag's maximum.
fn max_positions(cx: &mut Cx, w: &Tensor, b: &Bags, out: Value, d: i64) -> Result<Value> {
    let dims = [b.bags, d];
    let rows = take_along(cx, w.v, 0, b.idx);
    // The bag maximum seen from each position (positions past the last bag compare with 0).
    let last = cx.full((b.bags - 1) as f64, I64, &[b.n]);
    let bag_c = cx.min(b.bag, last);
    let per_pos = take_along(cx, out, 0, bag_c);
    let hit = cx.compare(CmpDir::Eq, rows, per_pos);
    let valid2 = cx.broadcast_in_dim(b.valid, &[b.n, d], &[0]);
    let hit = cx.and(hit, valid2);
    let pos = cx.iota(&TensorType::new(ElemType::I64, &[b.n, d]), 0);
    let none = cx.full(b.n as f64, I64, &[b.n, d]);
    let cand = cx.select(hit, pos, none);
    let init = cx.full(b.n as f64, I64, &dims);
    let first = scatter_along(cx, init, 0, b.bag, cand, Combine::Min);
    let lastp = cx.full((b.n - 1) as f64, I64, &dims);
    let at = cx.min(first, lastp);
    let picked = take_along(cx, b.idx, 0, at);
    let nn = cx.full(b.n as f64, I64, &dims);
    let found = cx.compare(CmpDir::Lt, first, nn);
    let z = cx.full(0.0, I64, &dims);
    Ok(cx.select(found, picked, z))
}

/// _embedding_bag_backward / _embedding_bag_dense_backward: the dense weight gradient.
fn embedding_bag_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let grad = args.tensor("grad")?;
    let indices = args.tensor("indices")?;
    let num_weights = args.int("num_weights")?;
    let scale = args.bool_or("scale_grad_by_freq", false)?;
    let mode = bag_mode(args)?;
    let psw = args.opt_tensor("per_sample_weights")?;
    let padding_idx = args.int_or("padding_idx", -1)?;
    check!(!args.bool_or("sparse", false)?, NotImplemented, "torchtpu: sparse embedding_bag gradients are not supported");
    let gd = cx.dims(grad.v);
    let (nb, d) = (gd[0], gd[1]);
    let n = numel(&cx.dims(indices.v));
    let out_dims = [num_weights, d];
    if n == 0 || nb == 0 || d == 0 {
        return one(cx.full(0.0, grad.dtype, &out_dims));
    }
    let idx = cx.reshape(indices.v, &[n]);
    let idx = cx.convert(idx, ElemType::I64);
    // The bag of each index: offset2bag when given in full, else from the offsets.
    let bag = match args.opt_tensor("offset2bag")? {
        Some(o) if numel(&cx.dims(o.v)) == n => cx.convert(o.v, ElemType::I64),
        _ => {
            let offsets = args.tensor("offsets")?;
            offset_to_bag(cx, offsets.v, n)
        }
    };
    let valid = if padding_idx >= 0 {
        let p = cx.full(padding_idx as f64, I64, &[n]);
        cx.compare(CmpDir::Ne, idx, p)
    } else {
        cx.full(1.0, DType::Bool, &[n])
    };
    let zeros = cx.full(0.0, grad.dtype, &out_dims);
    if mode == BAG_MAX {
        let mi = args.tensor("maximum_indices")?;
        let bag_size = args.tensor("bag_size")?;
        let mi = cx.convert(mi.v, ElemType::I64);
        let bs = cx.convert(bag_size.v, ElemType::I64);
        let z = cx.full(0.0, I64, &[nb]);
        let nonempty = cx.compare(CmpDir::Gt, bs, z);
        let nonempty = cx.broadcast_in_dim(nonempty, &[nb, d], &[0]);
        let zg = cx.full(0.0, grad.dtype, &[nb, d]);
        let g = cx.select(nonempty, grad.v, zg);
        // grad_weight[max_indices[b, j], j] += grad[b, j]
        let col = cx.iota(&TensorType::new(ElemType::I64, &[nb, d]), 1);
        let a = cx.reshape(mi, &[nb, d, 1]);
        let c = cx.reshape(col, &[nb, d, 1]);
        let coords = cx.concatenate(&[a, c], 2);
        return one(scatter_points(cx, zeros, coords, g, Combine::Add));
    }
    let last = cx.full((nb - 1) as f64, I64, &[n]);
    let in_range = cx.compare(CmpDir::Le, bag, last);
    let valid = cx.and(valid, in_range);
    let bag_c = cx.min(bag, last);
    let mut rows = take_along(cx, grad.v, 0, bag_c);
    if mode == BAG_MEAN {
        let bag_size = args.tensor("bag_size")?;
        let bs = cx.convert(bag_size.v, ElemType::I64);
        let c = take_along(cx, bs, 0, bag_c);
        let one_ = cx.full(1.0, I64, &[n]);
        let c = cx.max(c, one_);
        let c = cx.convert(c, grad.dtype.elem());
        let c = cx.broadcast_in_dim(c, &[n, d], &[0]);
        rows = cx.div(rows, c);
    }
    if let Some(p) = &psw {
        let pv = cx.reshape(p.v, &[n]);
        let pv = cx.cast(pv, grad.dtype);
        let pv = cx.broadcast_in_dim(pv, &[n, d], &[0]);
        rows = cx.mul(rows, pv);
    }
    if scale {
        let ones = cx.full(1.0, I64, &[n]);
        let counts = cx.full(0.0, I64, &[num_weights]);
        let counts = scatter_along(cx, counts, 0, idx, ones, Combine::Add);
        let c = take_along(cx, counts, 0, idx);
        let c = cx.convert(c, grad.dtype.elem());
        let c = cx.broadcast_in_dim(c, &[n, d], &[0]);
        rows = cx.div(rows, c);
    }
    let valid2 = cx.broadcast_in_dim(valid, &[n, d], &[0]);
    let z = cx.full(0.0, grad.dtype, &[n, d]);
    let rows = cx.select(valid2, rows, z);
    one(scatter_along(cx, zeros, 0, idx, rows, Combine::Add))
}

/// _embedding_bag_per_sample_weights_backward: d(out)/d(psw[i]) = <grad[bag(i)], weight[idx(i)]>.
fn embedding_bag_psw_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let grad = args.tensor("grad")?;
    let w = args.tensor("weight")?;
    let indices = args.tensor("indices")?;
    let mode = bag_mode(args)?;
    check!(mode == BAG_SUM, Runtime, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
    let padding_idx = args.int_or("padding_idx", -1)?;
    let n = numel(&cx.dims(indices.v));
    let gd = cx.dims(grad.v);
    let nb = gd[0];
    if n == 0 || nb == 0 {
        return one(cx.full(0.0, grad.dtype, &[n]));
    }
    let idx = cx.reshape(indices.v, &[n]);
    let idx = cx.convert(idx, ElemType::I64);
    let bag = match args.opt_tensor("offset2bag")? {
        Some(o) if numel(&cx.dims(o.v)) == n => cx.convert(o.v, ElemType::I64),
        _ => {
            let offsets = args.tensor("offsets")?;
            offset_to_bag(cx, offsets.v, n)
        }
    };
    let last = cx.full((nb - 1) as f64, I64, &[n]);
    let bag_c = cx.min(bag, last);
    let g = take_along(cx, grad.v, 0, bag_c);
    let rows = take_along(cx, w.v, 0, idx);
    let rows = cx.cast(rows, grad.dtype);
    let prod = cx.mul(g, rows);
    let z = cx.constant_f64(0.0, grad.dtype.elem());
    let dot = cx.reduce(&[prod], &[z], &[1], |b, a| vec![b.add(a[0], a[1])])[0];
    let mut keep = cx.compare(CmpDir::Le, bag, last);
    if padding_idx >= 0 {
        let p = cx.full(padding_idx as f64, I64, &[n]);
        let np = cx.compare(CmpDir::Ne, idx, p);
        keep = cx.and(keep, np);
    }
    let zn = cx.full(0.0, grad.dtype, &[n]);
    one(cx.select(keep, dot, zn))
}

// ---- assertions on data ------------------------------------------------------------------------

/// _assert_async(self[, assert_msg]) and _functional_assert_async.msg(self, assert_msg,
/// dep_token): a one-element tensor that must be nonzero. Like CUDA, the value is checked on
/// the device without waiting: a failure raises RuntimeError with the message at the next
/// synchronization (see the engine's checks). The functional form returns its dep_token.
fn assert_async(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let n = cx.numel(x.v);
    check!(n != 0, Runtime, "Boolean value of Tensor with no values is ambiguous");
    check!(n < 2, Runtime, "Boolean value of Tensor with more than one value is ambiguous");
    let msg = match args.str("assert_msg")? {
        Some(m) => m.to_string(),
        None => "Expected Tensor with single nonzero value, but got zero".to_string(),
    };
    let v = cx.reshape(x.v, &[]);
    let zero = cx.full(0.0, x.dtype, &[]);
    let is_zero = cx.compare(CmpDir::Eq, v, zero);
    let bad = cx.cast(is_zero, DType::I64);
    let bad = cx.reshape(bad, &[1]);
    let rest = cx.full(0.0, DType::I64, &[2]);
    let row = cx.concatenate(&[bad, rest], 0);
    cx.add_check(row, ErrorKind::Runtime, vec![msg]);
    match args.opt_tensor("dep_token")? {
        Some(t) => one(t.v),
        None => Ok(vec![]),
    }
}
