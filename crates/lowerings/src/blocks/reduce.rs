//! Reductions along dims (`reduce` with a `Red`, NaN-propagating max/min; `reduce_back`,
//! `along`), the reduced shapes (`reduce_dims`, `reduced_shape`, `keep`, `unreduce`), the
//! accumulation dtype (`acc_type`), inclusive scans (`scan`) and stable NaN-last sorts.
use crate::args::{Arg, Args};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};
use std::sync::atomic::{AtomicBool, Ordering};

/// The combining function of a reduction.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum Red {
    Sum,
    Prod,
    Max,
    Min,
    And,
    Or,
    /// The maximum that only shifts values before an exponential (softmax, log-sum-exp): XLA's
    /// plain maximum, whose reductions the CPU plugin vectorizes (3x faster than `Max`'s
    /// NaN-keeping reducer). It may drop a NaN, which reaches the result through the sum of
    /// exponentials anyway.
    ShiftMax,
}

static SUMS_AS_DOTS: AtomicBool = AtomicBool::new(false);

/// Whether float32 sums over a tensor's last dims are products with a vector of ones (set once
/// by the engine: on the CPU plugin). XLA:CPU's reduction loops add one element at a time
/// (its tree rewrite splits rows of more than 32 into windows, summed the same way); its
/// matrix-vector product is vectorized: a compiled row sum of x*x over [8192, 128] took 648 us
/// as a reduction and 290 us as a product (torch CPU 214 us).
pub fn set_sums_as_dots(on: bool) {
    SUMS_AS_DOTS.store(on, Ordering::Relaxed);
}

/// Rows of ROW_SUM_DOT_MIN to ROW_SUM_DOT_MAX elements are summed by one product; longer ones
/// in pieces of a length that divides them (the pieces' sums summed again), which keeps the
/// error of a long sum of the order of torch CPU's (products of up to 16384 erred up to 12x
/// more on a 65536-element sum); a length with no such divisor keeps XLA's reduction.
const ROW_SUM_DOT_MIN: i64 = 64;
const ROW_SUM_DOT_MAX: i64 = 1024;

/// The sum of float32 `v` over its last dims `dims` as [rows, n] x ones[n], where enabled.
fn row_sum_as_dot(cx: &mut Cx, v: Value, dims: &[i64]) -> Option<Value> {
    if !SUMS_AS_DOTS.load(Ordering::Relaxed) || cx.elem(v) != ElemType::F32 {
        return None;
    }
    let shape = cx.dims(v);
    let rank = shape.len() as i64;
    if dims.iter().enumerate().any(|(i, &d)| d != rank - dims.len() as i64 + i as i64) {
        return None; // not the trailing dims
    }
    let kept = shape[..shape.len() - dims.len()].to_vec();
    let n: i64 = shape[kept.len()..].iter().product();
    let piece = if n > ROW_SUM_DOT_MAX {
        (ROW_SUM_DOT_MIN..=ROW_SUM_DOT_MAX).rev().find(|p| n % p == 0)?
    } else if n >= ROW_SUM_DOT_MIN {
        n
    } else {
        return None;
    };
    let rows: i64 = kept.iter().product::<i64>() * (n / piece);
    let m = cx.reshape(v, &[rows, piece]);
    let ones = cx.splat_f64(1.0, &TensorType::new(ElemType::F32, &[piece]));
    cx.set_precision(Some(stablehlo::Precision::Highest));
    let s = cx.dot_general(m, ones, &[], &[], &[1], &[0], ElemType::F32);
    if piece == n {
        return Some(cx.reshape(s, &kept));
    }
    let partial = cx.reshape(s, &[kept.as_slice(), &[n / piece]].concat());
    Some(reduce(cx, partial, &[kept.len() as i64], Red::Sum))
}

/// The identity of `red` for `elem`.
pub(crate) fn identity(b: &mut Builder, red: Red, elem: ElemType) -> Value {
    use ElemType::*;
    match (red, elem) {
        (Red::Sum, _) | (Red::Or, _) => b.constant_i64(0, elem),
        (Red::Prod, _) | (Red::And, _) => b.constant_i64(1, elem),
        (Red::Max | Red::ShiftMax, Pred) => b.constant_bool(false),
        (Red::Min, Pred) => b.constant_bool(true),
        (Red::Max | Red::ShiftMax, e) if e.is_float() => b.constant_f64(f64::NEG_INFINITY, e),
        (Red::Min, e) if e.is_float() => b.constant_f64(f64::INFINITY, e),
        (Red::Max | Red::ShiftMax, e) => b.constant_i64(int_limit(e, false), e),
        (Red::Min, e) => b.constant_i64(int_limit(e, true), e),
    }
}

/// The largest (or smallest) value of an integer element type, as its i64 bit pattern.
pub(crate) fn int_limit(e: ElemType, largest: bool) -> i64 {
    use ElemType::*;
    match (e, largest) {
        (I8, true) => i8::MAX as i64,
        (I8, false) => i8::MIN as i64,
        (I16, true) => i16::MAX as i64,
        (I16, false) => i16::MIN as i64,
        (I32, true) => i32::MAX as i64,
        (I32, false) => i32::MIN as i64,
        (I64, true) => i64::MAX,
        (I64, false) => i64::MIN,
        (U8, true) => u8::MAX as i64,
        (U16, true) => u16::MAX as i64,
        (U32, true) => u32::MAX as i64,
        (U64, true) => -1, // all ones
        (_, false) => 0,
        (other, _) => panic!("int_limit: {other} is not an integer type"),
    }
}

pub(crate) fn combine(b: &mut Builder, red: Red, x: Value, y: Value) -> Value {
    let pred = b.elem(x) == ElemType::Pred;
    match red {
        Red::Sum if pred => b.or(x, y),
        Red::Prod if pred => b.and(x, y),
        Red::Max | Red::ShiftMax if pred => b.or(x, y),
        Red::Min if pred => b.and(x, y),
        Red::ShiftMax => b.max(x, y),
        Red::Sum => b.add(x, y),
        Red::Prod => b.mul(x, y),
        Red::Max | Red::Min => {
            let m = if red == Red::Max { b.max(x, y) } else { b.min(x, y) };
            if !b.elem(x).is_float() {
                return m;
            }
            // XLA's CPU reductions may drop NaNs; PyTorch propagates them.
            let y_nan = b.compare(CmpDir::Ne, y, y);
            let m = b.select(y_nan, y, m);
            let x_nan = b.compare(CmpDir::Ne, x, x);
            b.select(x_nan, x, m)
        }
        Red::And => b.and(x, y),
        Red::Or => b.or(x, y),
    }
}

/// Reduces `dims` of `v` away with `red` (no dims: `v` itself).
pub(crate) fn reduce(cx: &mut Cx, v: Value, dims: &[i64], red: Red) -> Value {
    if dims.is_empty() {
        return v;
    }
    if red == Red::Sum {
        if let Some(s) = row_sum_as_dot(cx, v, dims) {
            return s;
        }
    }
    let elem = cx.elem(v);
    let init = identity(cx, red, elem);
    cx.reduce(&[v], &[init], dims, move |b, a| vec![combine(b, red, a[0], a[1])])[0]
}

/// The reduced dims named by an `int[1]? dim` argument: None (or, unless `empty_is_none`, an
/// empty list) means every dim. Dims are wrapped, and repeats are an error as in PyTorch.
pub(crate) fn reduce_dims(dim: Option<Vec<i64>>, ndim: usize, empty_is_none: bool) -> Result<Vec<i64>> {
    let dim = match dim {
        None => return Ok((0..ndim as i64).collect()),
        Some(d) if d.is_empty() && !empty_is_none => return Ok((0..ndim as i64).collect()),
        Some(d) => d,
    };
    let mut out: Vec<i64> = Vec::new();
    let mut seen = vec![false; ndim.max(1)];
    for d in dim {
        let w = wrap_dim(d, ndim)?;
        check!(!seen[w], Runtime, "dim {} appears multiple times in the list of dims", w);
        seen[w] = true;
        if w < ndim {
            out.push(w as i64);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// `in_dims` with the reduced dims removed, or kept as 1s.
pub(crate) fn reduced_shape(in_dims: &[i64], dims: &[i64], keepdim: bool) -> Vec<i64> {
    (0..in_dims.len())
        .filter_map(|i| {
            if dims.contains(&(i as i64)) {
                if keepdim {
                    Some(1)
                } else {
                    None
                }
            } else {
                Some(in_dims[i])
            }
        })
        .collect()
}

/// Reshape a reduced value to keep the reduced dims as 1s when `keepdim`.
pub(crate) fn keep(cx: &mut Cx, v: Value, in_dims: &[i64], dims: &[i64], keepdim: bool) -> Value {
    if keepdim {
        let shape = reduced_shape(in_dims, dims, true);
        cx.reshape(v, &shape)
    } else {
        v
    }
}

/// A value of shape `reduced_shape(in_dims, dims, false)` broadcast back to `in_dims`.
pub(crate) fn unreduce(cx: &mut Cx, v: Value, in_dims: &[i64], dims: &[i64]) -> Value {
    let kept: Vec<i64> = (0..in_dims.len() as i64).filter(|d| !dims.contains(d)).collect();
    cx.broadcast_in_dim(v, in_dims, &kept)
}

/// A `ScalarType?` argument. The shim currently encodes ScalarType values as plain ints (it
/// reads the schema's fake type), so accept both forms.
pub(crate) fn opt_dtype(args: &Args, name: &str) -> Result<Option<DType>> {
    match args.get(name) {
        Some(Arg::Int(code)) => match i8::try_from(*code).ok().and_then(DType::from_code) {
            Some(d) => Ok(Some(d)),
            None => bail!(Type, "{}(): unsupported dtype code {} for argument '{}'", args.op, code, name),
        },
        _ => args.dtype(name),
    }
}

/// Inclusive scan of `v` along `dim` with `red`, in log2(n) shifted combines.
pub(crate) fn scan(cx: &mut Cx, v: Value, dim: usize, red: Red) -> Value {
    let dims = cx.dims(v);
    let n = dims[dim];
    let elem = cx.elem(v);
    let mut v = v;
    let mut k = 1;
    while k < n {
        // shifted[i] = v[i - k], identity for i < k.
        let mut limit = dims.clone();
        limit[dim] = n - k;
        let head = cx.slice(v, &vec![0; dims.len()], &limit, &vec![1; dims.len()]);
        let id = identity(cx, red, elem);
        let mut low = vec![0; dims.len()];
        low[dim] = k;
        let shifted = cx.pad(head, id, &low, &vec![0; dims.len()], &vec![0; dims.len()]);
        v = combine(cx, red, v, shifted);
        k *= 2;
    }
    v
}

/// Stable sort of `v` along `dim` with its int64 source indices; NaN sorts above everything
/// (last ascending, first descending) as in PyTorch.
pub(crate) fn sort_with_indices(cx: &mut Cx, v: Value, dim: usize, descending: bool) -> (Value, Value) {
    let dims = cx.dims(v);
    if dims.is_empty() {
        let z = cx.constant_i64(0, ElemType::I64);
        return (v, z);
    }
    let idx = cx.iota(&TensorType::new(ElemType::I64, &dims), dim as i64);
    if cx.numel(v) == 0 {
        return (v, idx);
    }
    let float = cx.elem(v).is_float();
    let r = cx.sort(&[v, idx], dim as i64, true, move |b, a| {
        let (x, y) = (a[0], a[1]);
        let (first, second) = if descending { (y, x) } else { (x, y) };
        // first < second, with NaN the largest value.
        let lt = b.compare(CmpDir::Lt, first, second);
        if !float {
            return lt;
        }
        let first_nan = b.compare(CmpDir::Ne, first, first);
        let second_nan = b.compare(CmpDir::Ne, second, second);
        let not_first_nan = b.not(first_nan);
        let nan_above = b.and(not_first_nan, second_nan);
        b.or(lt, nan_above)
    });
    (r[0], r[1])
}

/// The single reduced dim of a softmax-like op along `dim` (none for a 0-d input).
pub(crate) fn along(dim: i64, ndim: usize) -> Result<Vec<i64>> {
    let d = wrap_dim(dim, ndim)?;
    Ok(if ndim == 0 { vec![] } else { vec![d as i64] })
}

/// `v` reduced with `red` over `dims` and broadcast back to `v`'s shape.
pub(crate) fn reduce_back(cx: &mut Cx, v: Value, dims: &[i64], red: Red) -> Value {
    let in_dims = cx.dims(v);
    let r = reduce(cx, v, dims, red);
    unreduce(cx, r, &in_dims, dims)
}

/// Sorts a 1-D value ascending (NaN last), carrying the original positions along.
pub(crate) fn sort_with_positions(cx: &mut Cx, v: Value) -> (Value, Value) {
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
