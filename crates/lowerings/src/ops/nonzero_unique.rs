//! Mask compaction and uniqueness: nonzero, nonzero_static, count_nonzero, masked_select and the
//! unique ops (_unique, _unique2, unique_consecutive, unique_dim, unique_dim_consecutive). All but
//! count_nonzero and nonzero_static have data-dependent sizes: a size program counts first.
use crate::args::{Args, Tensor};
use crate::blocks::consts::I64;
use crate::blocks::gather::{compact_positions, count_all, cumsum_1d, inverse_perm, nonzero_coords, numel, scatter_along, size, take_along, Combine};
use crate::blocks::reduce::sort_with_positions;
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("nonzero_static", nonzero_static),
    op("count_nonzero", count_nonzero),
    op("nonzero", nonzero).sized(nonzero_size),
    op("masked_select", masked_select).sized(masked_select_size),
    op("_unique2", unique2).sized(unique_size),
    op("_unique", unique1).sized(unique_size),
    op("unique_consecutive", unique_consecutive).sized(unique_consecutive_size),
    op("unique_dim", unique_dim).sized(unique_dim_size),
    op("unique_dim_consecutive", unique_consecutive).sized(unique_consecutive_size),
];

// ---- data-dependent sizes -------------------------------------------------------------------------

/// nonzero's out= must be int64, whatever it could be cast to.
fn check_nonzero_out(args: &Args) -> Result<()> {
    if let Ok(out) = args.tensor("out") {
        check!(out.dtype == DType::I64, Runtime, "nonzero: Expected out tensor to have scalar type Long but got scalar type{}", out.dtype.torch_name());
    }
    Ok(())
}

fn nonzero_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    check_nonzero_out(args)?;
    let x = args.tensor("self")?;
    let b = cx.cast(x.v, DType::Bool);
    one(count_all(cx, b))
}

fn nonzero(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    check_nonzero_out(args)?;
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
