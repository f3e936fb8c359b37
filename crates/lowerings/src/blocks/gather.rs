//! Gathers and scatters: along one dim (`take_along`, `scatter_along` with a `Combine`), at
//! full coordinates (`gather_points`, `scatter_points`, `along_coords`), `take_1d`;
//! index_select's bounds check and index dtypes; and the steps of data-sized results
//! (`size`, `count_all`, `cumsum_1d`, `compact_positions`, `nonzero_coords`).
use crate::args::Args;
use crate::blocks::consts::I64;
use crate::check;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::{ErrorKind, Result};
use stablehlo::{Builder, CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub(crate) fn numel(dims: &[i64]) -> i64 {
    dims.iter().product()
}

/// Sum of all elements as a 0-d int64 (bools count their trues).
pub(crate) fn count_all(cx: &mut Cx, v: Value) -> Value {
    let v = cx.convert(v, ElemType::I64);
    let r = cx.rank(v) as i64;
    let z = cx.constant_i64(0, ElemType::I64);
    let dims: Vec<i64> = (0..r).collect();
    cx.reduce(&[v], &[z], &dims, |b, a| vec![b.add(a[0], a[1])])[0]
}

/// Inclusive prefix sum of a 1-D value, in log2(n) shifted adds.
pub(crate) fn cumsum_1d(cx: &mut Cx, v: Value) -> Value {
    let n = cx.dims(v)[0];
    let e = cx.elem(v);
    let zero = cx.constant_i64(0, e);
    let mut acc = v;
    let mut s = 1;
    while s < n {
        let head = cx.slice(acc, &[0], &[n - s], &[1]);
        let shifted = cx.pad(head, zero, &[s], &[0], &[0]);
        acc = cx.add(acc, shifted);
        s *= 2;
    }
    acc
}

/// For each element of a 1-D bool `mask`: its rank among the true elements (0-based) where
/// true, and `trash` where false. The targets of a compaction.
pub(crate) fn compact_positions(cx: &mut Cx, mask: Value, trash: i64) -> Value {
    let m = cx.convert(mask, ElemType::I64);
    let c = cumsum_1d(cx, m);
    let dims = cx.dims(c);
    let one_ = cx.full(1.0, I64, &dims);
    let pos = cx.sub(c, one_);
    let t = cx.full(trash as f64, I64, &dims);
    cx.select(mask, pos, t)
}

/// How a scatter combines the current value with an update.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Combine {
    Replace,
    Add,
    Mul,
    Max,
    Min,
}

pub(crate) fn combine(b: &mut Builder, c: Combine, cur: Value, upd: Value) -> Value {
    let e = b.elem(cur);
    let pred = e == ElemType::Pred;
    match c {
        Combine::Replace => upd,
        Combine::Add if pred => b.or(cur, upd),
        Combine::Add => b.add(cur, upd),
        Combine::Mul if pred => b.and(cur, upd),
        Combine::Mul => b.mul(cur, upd),
        Combine::Max | Combine::Min => {
            let is_max = c == Combine::Max;
            let m = match (pred, is_max) {
                (true, true) => b.or(cur, upd),
                (true, false) => b.and(cur, upd),
                (false, true) => b.max(cur, upd),
                (false, false) => b.min(cur, upd),
            };
            if !e.is_float() {
                return m;
            }
            // NaN wins, like PyTorch's CPU kernels.
            let un = b.compare(CmpDir::Ne, upd, upd);
            let m = b.select(un, upd, m);
            let cn = b.compare(CmpDir::Ne, cur, cur);
            b.select(cn, cur, m)
        }
    }
}

/// `x` with dim `dim` indexed by the int tensor `idx` (any dims I): dims D[..dim] + I + D[dim+1..].
pub(crate) fn take_along(cx: &mut Cx, x: Value, dim: usize, idx: Value) -> Value {
    let d = cx.dims(x);
    let r = d.len();
    let k = cx.rank(idx) as i64;
    let mut slice = d.clone();
    slice[dim] = 1;
    let offset_dims: Vec<i64> = (0..r).filter(|&i| i != dim).map(|i| if i < dim { i as i64 } else { i as i64 - 1 + k }).collect();
    let dn = GatherDims {
        offset_dims,
        collapsed_slice_dims: vec![dim as i64],
        start_index_map: vec![dim as i64],
        index_vector_dim: k,
        ..Default::default()
    };
    let idx = cx.convert(idx, ElemType::I64);
    cx.gather(x, idx, &dn, &slice, false)
}

/// Combines `updates` (dims of `x` with dim `dim` of size n) into `x` at the 1-D index `idx` [n].
pub(crate) fn scatter_along(cx: &mut Cx, x: Value, dim: usize, idx: Value, updates: Value, c: Combine) -> Value {
    let r = cx.rank(x);
    let dn = ScatterDims {
        update_window_dims: (0..r).filter(|&i| i != dim).map(|i| i as i64).collect(),
        inserted_window_dims: vec![dim as i64],
        scatter_dims_to_operand_dims: vec![dim as i64],
        index_vector_dim: 1,
        ..Default::default()
    };
    let idx = cx.convert(idx, ElemType::I64);
    cx.scatter(x, idx, updates, &dn, move |b, cur, upd| combine(b, c, cur, upd))
}

/// The coordinates of the true elements of `mask` (row-major), `rows` of them, padded with
/// `fill` when there are fewer.
pub(crate) fn nonzero_coords(cx: &mut Cx, mask: Value, rows: i64, fill: i64) -> Value {
    let dims = cx.dims(mask);
    let r = dims.len() as i64;
    let n = numel(&dims);
    if r == 0 || n == 0 || rows == 0 {
        return cx.splat_i64(fill, &TensorType::new(ElemType::I64, &[rows, r]));
    }
    let ty = TensorType::new(ElemType::I64, &dims);
    let parts: Vec<Value> = (0..r)
        .map(|d| {
            let c = cx.iota(&ty, d);
            cx.reshape(c, &[n, 1])
        })
        .collect();
    let coords = cx.concatenate(&parts, 1);
    let flat = cx.reshape(mask, &[n]);
    let pos = compact_positions(cx, flat, rows);
    let rows_plus = cx.splat_i64(fill, &TensorType::new(ElemType::I64, &[rows + 1, r]));
    let out = scatter_along(cx, rows_plus, 0, pos, coords, Combine::Replace);
    cx.slice(out, &[0, 0], &[rows, r], &[1, 1])
}

/// index_select's bounds check of `index` into dim `dim` of a tensor of dims `xd` (not 0-d),
/// with the messages of PyTorch's CPU kernel, which differ by path. Returns whether there is
/// anything to gather.
pub(crate) fn index_select_check(cx: &mut Cx, xd: &[i64], dim: usize, index: Value) -> Result<bool> {
    let n = numel(&cx.dims(index));
    let size = xd[dim];
    let indices_msg = format!("INDICES element is out of DATA bounds, id={{value}} axis_dim={size}");
    if xd.len() == 1 {
        check!(n == 0 || size > 0, Index, "index out of range in self");
        cx.check_index(index, 0, size, ErrorKind::Index, "index out of range in self");
    } else if n == 0 {
        return Ok(false);
    } else if numel(xd) == 0 {
        check!(size > 0, Runtime, "index_select(): self indexing axis dim should be positive");
        cx.check_index(index, 0, size, ErrorKind::Runtime, indices_msg);
        return Ok(false);
    } else if dim == 1 {
        cx.check_index(index, 0, size, ErrorKind::Runtime, indices_msg);
    } else {
        cx.check_index(index, 0, size, ErrorKind::Index, "index out of range in self");
    }
    Ok(n > 0 && numel(xd) > 0)
}

/// `v[idx]` for a 1-d `v` and integer indices of any shape (clamped into range).
pub fn take_1d(cx: &mut Cx, v: Value, idx: Value) -> Value {
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

pub(crate) fn is_index_dtype(d: DType) -> bool {
    matches!(d, DType::I64 | DType::I32)
}

/// Sizes as PyTorch's ensure_nonempty_size sees them (0-d counts as [1]).
pub(crate) fn nonempty(d: &[i64]) -> Vec<i64> {
    if d.is_empty() {
        vec![1]
    } else {
        d.to_vec()
    }
}

/// The coordinates of every element of `index` (dims S, rank r) with dim `dim` replaced by the
/// index values: an [S..., r] int64 tensor (torch.gather / torch.scatter addressing).
pub(crate) fn along_coords(cx: &mut Cx, index: Value, dim: usize) -> Value {
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

/// Gather single elements at full coordinates ([S..., r] int64) -> [S...].
pub(crate) fn gather_points(cx: &mut Cx, x: Value, coords: Value) -> Value {
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

/// Scatter with full per-element coordinates: `coords` is [S..., r] int64, `updates` is [S...].
pub(crate) fn scatter_points(cx: &mut Cx, x: Value, coords: Value, updates: Value, c: Combine) -> Value {
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

/// The data-dependent size the op's size program computed (`Lowering::size`).
pub(crate) fn size(args: &Args) -> Result<i64> {
    args.int("__size")
}

pub(crate) fn inverse_perm(p: &[i64]) -> Vec<i64> {
    let mut inv = vec![0; p.len()];
    for (i, &q) in p.iter().enumerate() {
        inv[q as usize] = i as i64;
    }
    inv
}
