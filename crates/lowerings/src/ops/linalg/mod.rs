//! Linear algebra as StableHLO programs that any PJRT plugin runs (no LAPACK custom calls), one
//! family per file: products.rs, cholesky.rs, lu.rs, qr.rs, ldl.rs, eigen/ (eig, eigh, svd),
//! lstsq.rs and matrix_exp.rs. This file holds eye and the builders and checks they share.
//!
//! Every algorithm works on a batch [B, m, n] (the leading dims flattened); loops run until the
//! whole batch is done. Empty matrices and empty batches are answered without a loop.
pub(crate) mod cholesky;
pub(crate) mod eigen;
pub(crate) mod ldl;
pub(crate) mod lstsq;
pub(crate) mod lu;
pub(crate) mod matrix_exp;
pub(crate) mod products;
pub(crate) mod qr;

use crate::args::{Args, Tensor};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
// The short names the LAPACK-step ports (ldl.rs, eigen/) give the builders here.
use self::{bcast as bc, conj as conj_of, iota as idx, splat as spl, sum as sum_over, to_elem as as_elem};
use stablehlo::{Builder, CmpDir, ElemType, Precision, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("eye", eye),
];

// ---- small builders on batches of matrices ----------------------------------------------------

const I64: ElemType = ElemType::I64;
const I32: ElemType = ElemType::I32;

pub(crate) fn splat(b: &mut Builder, x: f64, elem: ElemType, dims: &[i64]) -> Value {
    b.splat_f64(x, &TensorType::new(elem, dims))
}

pub(crate) fn iota(b: &mut Builder, dims: &[i64], d: usize) -> Value {
    b.iota(&TensorType::new(I64, dims), d as i64)
}

/// Column j (0-d) of each matrix of a batch [B, r, c], as [B, r].
fn batch_col(b: &mut Builder, m: Value, j: Value) -> Value {
    let d = b.dims(m).to_vec();
    let zero = b.constant_i64(0, I64);
    let col = b.dynamic_slice(m, &[zero, zero, j], &[d[0], d[1], 1]);
    b.reshape(col, &d[..2])
}

/// Entry j (0-d) of each row of v [B, n], as [B].
fn batch_entry(b: &mut Builder, v: Value, j: Value) -> Value {
    let bs = b.dims(v)[0];
    let zero = b.constant_i64(0, I64);
    let x = b.dynamic_slice(v, &[zero, j], &[bs, 1]);
    b.reshape(x, &[bs])
}

/// j < k for a 0-d loop counter j: the condition of the loops over columns.
fn lt_const(b: &mut Builder, j: Value, k: i64) -> Value {
    let kk = b.constant_i64(k, I64);
    b.compare(CmpDir::Lt, j, kk)
}

/// A 0-d value broadcast to `dims`.
fn bcast0(b: &mut Builder, v: Value, dims: &[i64]) -> Value {
    b.broadcast_in_dim(v, dims, &[])
}

/// `v` of dims [B] or [B, x] broadcast to `dims`, its dims landing on `at`.
pub(crate) fn bcast(b: &mut Builder, v: Value, dims: &[i64], at: &[i64]) -> Value {
    b.broadcast_in_dim(v, dims, at)
}

pub(crate) fn sum(b: &mut Builder, v: Value, dims: &[i64]) -> Value {
    let e = b.elem(v);
    let zero = b.constant_f64(0.0, e);
    b.reduce(&[v], &[zero], dims, |b, a| vec![b.add(a[0], a[1])])[0]
}

fn prod(b: &mut Builder, v: Value, dims: &[i64]) -> Value {
    let e = b.elem(v);
    let one = b.constant_f64(1.0, e);
    b.reduce(&[v], &[one], dims, |b, a| vec![b.mul(a[0], a[1])])[0]
}

pub(crate) fn max(b: &mut Builder, v: Value, dims: &[i64]) -> Value {
    let e = b.elem(v);
    let lo = b.constant_f64(f64::NEG_INFINITY, e);
    b.reduce(&[v], &[lo], dims, |b, a| vec![b.max(a[0], a[1])])[0]
}

/// (index, value) of the largest entry of `v` along `axis`, ties going to the first index
/// (LAPACK's i?amax pivot rule). The reduction starts from (`lo`, i64::MAX), so an entry equal
/// to `lo` still wins over none; callers mark entries to ignore with values at or below `lo`.
pub(crate) fn first_argmax(b: &mut Builder, v: Value, axis: usize, lo: f64) -> (Value, Value) {
    let d = b.dims(v).to_vec();
    let pos = iota(b, &d, axis);
    let lo = b.constant_f64(lo, b.elem(v));
    let far = b.constant_i64(i64::MAX, I64);
    let r = b.reduce(&[v, pos], &[lo, far], &[axis as i64], |b, x| {
        // (value, index) pairs: larger value wins, ties go to the smaller index.
        let gt = b.compare(CmpDir::Gt, x[2], x[0]);
        let eq = b.compare(CmpDir::Eq, x[2], x[0]);
        let lt = b.compare(CmpDir::Lt, x[3], x[1]);
        let tie = b.and(eq, lt);
        let take = b.or(gt, tie);
        vec![b.select(take, x[2], x[0]), b.select(take, x[3], x[1])]
    });
    (r[1], r[0])
}

pub(crate) fn conj(b: &mut Builder, x: Value) -> Value {
    if !b.elem(x).is_complex() {
        return x;
    }
    let re = b.real(x);
    let im = b.imag(x);
    let im = b.neg(im);
    b.complex(re, im)
}

/// |x|^2 as a real value.
fn abs2(b: &mut Builder, x: Value) -> Value {
    if b.elem(x).is_complex() {
        let re = b.real(x);
        let im = b.imag(x);
        let r2 = b.mul(re, re);
        let i2 = b.mul(im, im);
        b.add(r2, i2)
    } else {
        b.mul(x, x)
    }
}

/// A real value as `elem` (complex with zero imaginary part when `elem` is complex).
pub(crate) fn to_elem(b: &mut Builder, x: Value, elem: ElemType) -> Value {
    if elem.is_complex() && !b.elem(x).is_complex() {
        let (e, dims) = (b.elem(x), b.dims(x).to_vec());
        let zero = splat(b, 0.0, e, &dims);
        return b.complex(x, zero);
    }
    b.convert(x, elem)
}

/// Batched matrix product [B, m, k] x [B, k, n] at full precision.
fn bmm(b: &mut Builder, x: Value, y: Value) -> Value {
    b.set_precision(Some(Precision::Highest));
    let e = b.elem(x);
    b.dot_general(x, y, &[0], &[0], &[2], &[1], e)
}

/// Conjugate transpose of a batch [B, m, n].
fn adjoint(b: &mut Builder, x: Value) -> Value {
    let t = b.transpose(x, &[0, 2, 1]);
    conj(b, t)
}

/// Identity matrices [B, m, n] of `elem`.
fn eye3(b: &mut Builder, elem: ElemType, bs: i64, m: i64, n: i64) -> Value {
    let dims = [bs, m, n];
    let r = iota(b, &dims, 1);
    let c = iota(b, &dims, 2);
    let on = b.compare(CmpDir::Eq, r, c);
    let one = splat(b, 1.0, elem, &dims);
    let zero = splat(b, 0.0, elem, &dims);
    b.select(on, one, zero)
}

/// Mask of the triangle of a batch: `lower` keeps col - row <= k, upper keeps col - row >= k.
fn tri_mask(b: &mut Builder, dims: &[i64], lower: bool, k: i64) -> Value {
    let r = iota(b, dims, dims.len() - 2);
    let c = iota(b, dims, dims.len() - 1);
    let kk = splat(b, k as f64, I64, dims);
    let rk = b.add(r, kk);
    b.compare(if lower { CmpDir::Le } else { CmpDir::Ge }, c, rk)
}

/// tril(x, k) or triu(x, k).
fn tri(b: &mut Builder, x: Value, lower: bool, k: i64) -> Value {
    let dims = b.dims(x).to_vec();
    let m = tri_mask(b, &dims, lower, k);
    let zero = splat(b, 0.0, b.elem(x), &dims);
    b.select(m, x, zero)
}

/// The main diagonal of a batch [B, n, n] as [B, n].
fn diag(b: &mut Builder, x: Value) -> Value {
    let dims = b.dims(x).to_vec();
    let r = iota(b, &dims, 1);
    let c = iota(b, &dims, 2);
    let on = b.compare(CmpDir::Eq, r, c);
    let zero = splat(b, 0.0, b.elem(x), &dims);
    let d = b.select(on, x, zero);
    sum(b, d, &[2])
}

/// Sub-block [.., r0..r1, c0..c1] of a batch.
fn block(b: &mut Builder, x: Value, rows: (i64, i64), cols: (i64, i64)) -> Value {
    let d = b.dims(x).to_vec();
    let n = d.len();
    let mut start = vec![0; n];
    let mut limit = d.clone();
    start[n - 2] = rows.0;
    limit[n - 2] = rows.1;
    start[n - 1] = cols.0;
    limit[n - 1] = cols.1;
    b.slice(x, &start, &limit, &vec![1; n])
}

/// stablehlo.triangular_solve: op(a) x = rhs (left) or x op(a) = rhs; reads one triangle of a.
fn trsm(b: &mut Builder, a: Value, rhs: Value, left: bool, lower: bool, unit: bool, transpose: &str) -> Value {
    let ty = b.ty(rhs).clone();
    let attrs = format!(
        "left_side = {left}, lower = {lower}, unit_diagonal = {unit}, transpose_a = #stablehlo<transpose {transpose}>"
    );
    b.custom_op("stablehlo.triangular_solve", &[a, rhs], &attrs, &[ty])[0]
}

/// Machine epsilon of a real or complex element type.
fn eps(elem: ElemType) -> f64 {
    match elem.real_type() {
        ElemType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    }
}

// ---- argument handling ------------------------------------------------------------------------

/// A [..., m, n] tensor flattened to a batch [B, m, n].
struct Mats {
    v: Value,
    batch: Vec<i64>,
    bs: i64,
    m: i64,
    n: i64,
}

fn mats(cx: &mut Cx, v: Value) -> Mats {
    let d = cx.dims(v);
    let r = d.len();
    let (m, n) = (d[r - 2], d[r - 1]);
    let batch = d[..r - 2].to_vec();
    let bs: i64 = batch.iter().product();
    let v = cx.reshape(v, &[bs, m, n]);
    Mats { v, batch, bs, m, n }
}

/// `v` [B, rest...] back to [batch..., rest...].
fn unflatten(cx: &mut Cx, v: Value, batch: &[i64]) -> Value {
    let d = cx.dims(v);
    let mut out = batch.to_vec();
    out.extend_from_slice(&d[1..]);
    cx.reshape(v, &out)
}

fn check_matrix(cx: &Cx, t: &Tensor, api: &str) -> Result<()> {
    check!(cx.dims(t.v).len() >= 2, Runtime, "{}: The input tensor A must have at least 2 dimensions.", api);
    Ok(())
}

pub(crate) fn check_square(cx: &Cx, t: &Tensor, api: &str) -> Result<()> {
    check_matrix(cx, t, api)?;
    let d = cx.dims(t.v);
    let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
    check!(m == n, Runtime, "{}: A must be batches of square matrices, but they are {} by {} matrices", api, m, n);
    Ok(())
}

pub(crate) fn check_float_or_complex(t: &Tensor, api: &str) -> Result<()> {
    check!(
        t.dtype.is_float() || t.dtype.is_complex(),
        Runtime,
        "{}: Expected a floating point or complex tensor as input. Got {}",
        api,
        t.dtype.torch_name()
    );
    Ok(())
}

/// The CPU kernels (LAPACK) exist for float, double and their complex types only.
pub(crate) fn check_lapack_dtype(t: DType, kernel: &str) -> Result<()> {
    check!(
        matches!(t, DType::F32 | DType::F64 | DType::C64 | DType::C128),
        NotImplemented,
        "\"{}\" not implemented for '{}'",
        kernel,
        t.torch_name()
    );
    Ok(())
}

/// Two operands' batch dims broadcast (PyTorch's _linalg_broadcast_batch_dims).
fn broadcast_batch(cx: &Cx, a: Value, b: Value) -> Result<Vec<i64>> {
    let (da, db) = (cx.dims(a), cx.dims(b));
    crate::broadcast_shapes(&[da[..da.len() - 2].to_vec(), db[..db.len() - 2].to_vec()])
}

fn expand_batch(cx: &mut Cx, v: Value, batch: &[i64]) -> Value {
    let d = cx.dims(v);
    let mut target = batch.to_vec();
    target.extend_from_slice(&d[d.len() - 2..]);
    cx.broadcast_to(v, &target)
}

fn numel(d: &[i64]) -> i64 {
    d.iter().product()
}

// ---- batches of matrices: small builders of the LAPACK-step ports (ldl.rs, eigen/) ----------

const I64E: ElemType = ElemType::I64;

/// An int64 splat (loop counters and indices, one per batch element).
fn ispl(b: &mut Builder, x: i64, dims: &[i64]) -> Value {
    b.splat_i64(x, &TensorType::new(I64E, dims))
}

/// A complex splat x + x i of the real type `re` (complex zeros, or NaN + NaN i).
fn cspl(b: &mut Builder, x: f64, re: ElemType, dims: &[i64]) -> Value {
    let v = spl(b, x, re, dims);
    b.complex(v, v)
}

/// The real part as the same element type (the diagonal of a Hermitian matrix).
fn real_as_is(b: &mut Builder, x: Value) -> Value {
    let e = b.elem(x);
    if !e.is_complex() {
        return x;
    }
    let re = b.real(x);
    as_elem(b, re, e)
}

/// The entries of `v` at index `at` along `axis`, that axis dropped, read by a masked sum (0
/// when out of range). `at` is 0-d, or holds one index per batch element (v's dim 0).
/// pick/pick_col/pick_row/pick1 and swap_lines all read lines this way.
fn take_at(b: &mut Builder, v: Value, at: Value, axis: usize) -> Value {
    let d = b.dims(v).to_vec();
    let at_dims: &[i64] = if b.dims(at).is_empty() { &[] } else { &[0] };
    let pos = idx(b, &d, axis);
    let a = bc(b, at, &d, at_dims);
    let on = b.compare(CmpDir::Eq, pos, a);
    let z = spl(b, 0.0, b.elem(v), &d);
    let m = b.select(on, v, z);
    sum_over(b, m, &[axis as i64])
}

/// v[b, idx_b] of v [B, n] (idx [B], int64; 0 when out of range).
fn pick(b: &mut Builder, v: Value, at: Value) -> Value {
    take_at(b, v, at, 1)
}

/// Column idx_b of each matrix of m [B, n, n] as [B, n].
fn pick_col(b: &mut Builder, m: Value, at: Value) -> Value {
    take_at(b, m, at, 2)
}

/// Row idx_b of each matrix of m [B, n, k] as [B, k].
fn pick_row(b: &mut Builder, m: Value, at: Value) -> Value {
    take_at(b, m, at, 1)
}

/// v[idx] of a 1-d v (idx a 0-d int64).
fn pick1(b: &mut Builder, v: Value, at: Value) -> Value {
    take_at(b, v, at, 0)
}

/// `m` with its lines i1 and i2 along `axis` exchanged: rows (0) or columns (1) of one matrix
/// with 0-d indices, or rows (1) or columns (2) of each matrix of a batch [B, r, c] with
/// indices [B]. Callers mask the result where only part of the matrix may change.
fn swap_lines(b: &mut Builder, m: Value, i1: Value, i2: Value, axis: usize) -> Value {
    let d = b.dims(m).to_vec();
    let at_dims: &[i64] = if b.dims(i1).is_empty() { &[] } else { &[0] };
    let rest: Vec<i64> = (0..d.len() as i64).filter(|&k| k != axis as i64).collect();
    let pos = idx(b, &d, axis);
    let a1 = bc(b, i1, &d, at_dims);
    let a2 = bc(b, i2, &d, at_dims);
    let l1 = take_at(b, m, i1, axis);
    let l2 = take_at(b, m, i2, axis);
    let l1 = bc(b, l1, &d, &rest);
    let l2 = bc(b, l2, &d, &rest);
    let is1 = b.compare(CmpDir::Eq, pos, a1);
    let is2 = b.compare(CmpDir::Eq, pos, a2);
    let y = b.select(is1, l2, m);
    b.select(is2, l1, y)
}

/// The full symmetric (Hermitian: conjugated, real diagonal) matrix whose lower triangle is
/// that of m [B, n, n].
fn from_lower(b: &mut Builder, m: Value, hermitian: bool) -> Value {
    let d = b.dims(m).to_vec();
    let r = idx(b, &d, 1);
    let c = idx(b, &d, 2);
    let t = b.transpose(m, &[0, 2, 1]);
    let t = if hermitian { conj_of(b, t) } else { t };
    let below = b.compare(CmpDir::Ge, r, c);
    let full = b.select(below, m, t);
    if hermitian {
        let on = b.compare(CmpDir::Eq, r, c);
        let re = real_as_is(b, full);
        b.select(on, re, full)
    } else {
        full
    }
}

/// Leading batch dims flattened: ([B, r, c] value, batch dims).
fn flat_batch(cx: &mut Cx, v: Value) -> (Value, Vec<i64>) {
    let d = cx.dims(v);
    let r = d.len();
    let batch = d[..r - 2].to_vec();
    let bs: i64 = batch.iter().product();
    (cx.reshape(v, &[bs, d[r - 2], d[r - 1]]), batch)
}

fn with_batch(cx: &mut Cx, v: Value, batch: &[i64]) -> Value {
    let d = cx.dims(v);
    let mut out = batch.to_vec();
    out.extend_from_slice(&d[1..]);
    cx.reshape(v, &out)
}

/// LAPACK's pivot magnitude: |x| for reals, |re| + |im| for complex (i?amax).
pub(crate) fn pivot_magnitude(b: &mut Builder, x: Value) -> Value {
    if b.elem(x).is_complex() {
        let re = b.real(x);
        let im = b.imag(x);
        let re = b.abs(re);
        let im = b.abs(im);
        b.add(re, im)
    } else {
        b.abs(x)
    }
}

/// Logical or over `dims`.
pub(crate) fn any_over(b: &mut Builder, pred: Value, dims: &[i64]) -> Value {
    let f = b.constant_bool(false);
    b.reduce(&[pred], &[f], dims, |b, a| vec![b.or(a[0], a[1])])[0]
}

/// Logical or of every element.
fn any(b: &mut Builder, pred: Value) -> Value {
    let n = b.rank(pred) as i64;
    any_over(b, pred, &(0..n).collect::<Vec<_>>())
}

// ---- eye ------------------------------------------------------------------------------------

/// eye(n, m=n): ones on the main diagonal. The dtype is out's (eager) or dtype= (graphs).
fn eye(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let n = args.int("n")?;
    check!(n >= 0, Runtime, "n must be greater or equal to 0, got {}", n);
    let m = args.opt_int("m")?.unwrap_or(n);
    check!(m >= 0, Runtime, "m must be greater or equal to 0, got {}", m);
    let dt = match args.tensor("out") {
        Ok(o) => o.dtype,
        Err(_) => args.dtype("dtype")?.unwrap_or(DType::F32),
    };
    let e = eye3(cx, dt.elem(), 1, n, m);
    one(cx.reshape(e, &[n, m]))
}
