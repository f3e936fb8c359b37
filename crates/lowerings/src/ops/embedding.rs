//! Embeddings: embedding, embedding_dense_backward, embedding_renorm, and the bags
//! (_embedding_bag, _embedding_bag_forward_only and their backward ops).
use crate::args::{Arg, Args, Tensor};
use crate::blocks::consts::{extremes, I64};
use crate::blocks::gather::{cumsum_1d, is_index_dtype, numel, scatter_along, scatter_points, take_along, Combine};
use crate::blocks::type_names::tensor_type_name;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::{ErrorKind, Result};
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("embedding", embedding),
    op("embedding_dense_backward", embedding_dense_backward),
    op("embedding_renorm", embedding_renorm).specialized(),
    op("_embedding_bag", embedding_bag),
    op("_embedding_bag_forward_only", embedding_bag),
    op("_embedding_bag_backward", embedding_bag_backward),
    op("_embedding_bag_dense_backward", embedding_bag_backward),
    op("_embedding_bag_per_sample_weights_backward", embedding_bag_psw_backward),
];

// ---- embedding ------------------------------------------------------------------------------------

/// embedding(weight, indices, ...): rows of `weight`, shaped indices.shape + [dim].
fn embedding(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let w = args.tensor("weight")?;
    let idx = args.tensor("indices")?;
    check!(
        matches!(idx.dtype, DType::I64 | DType::I32),
        Runtime,
        "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got {} instead",
        idx.dtype.torch_name()
    );
    let wd = cx.dims(w.v);
    check!(wd.len() == 2, Runtime, "'weight' must be 2-D");
    let id = cx.dims(idx.v);
    let n: i64 = id.iter().product();
    let mut out = id.clone();
    out.push(wd[1]);
    // PyTorch's embedding is weight.index_select(0, indices.reshape(-1)): its bounds check.
    if !crate::blocks::gather::index_select_check(cx, &wd, 0, idx.v)? {
        return one(cx.full(0.0, w.dtype, &out));
    }
    let flat = cx.reshape(idx.v, &[n, 1]);
    let dn = stablehlo::GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![0],
        index_vector_dim: 1,
    };
    let rows = cx.gather(w.v, flat, &dn, &[1, wd[1]], false);
    one(cx.reshape(rows, &out))
}

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
