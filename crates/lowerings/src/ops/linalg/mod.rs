//! Matrix decompositions and the solvers built on them, written as StableHLO programs that any
//! PJRT plugin runs (no LAPACK custom calls):
//!
//! - Cholesky and triangular solves are StableHLO ops (stablehlo.cholesky,
//!   stablehlo.triangular_solve).
//! - LU with partial pivoting (LAPACK getrf: the first row of largest magnitude is the pivot) is a
//!   while loop over the columns, each step a row swap and a rank-1 update of the whole batch.
//!   solve, inv, det, slogdet and lu_solve build on it.
//! - QR is Householder QR with LAPACK's reflector conventions (geqrf: R's diagonal is
//!   -sign(Re a) * norm, H = I - tau v v^H with v[0] = 1), a while loop over the columns.
//! - eigh is cyclic Jacobi with the round-robin ordering: each step rotates N/2 disjoint index
//!   pairs at once (A <- J^H A J, the rotated pairs' diagonal and zeros set exactly), until the
//!   off-diagonal part is below eps ||A||; the eigenvalues are then the Rayleigh quotients of
//!   the (re-orthonormalized) eigenvectors.
//! - svd is one-sided Jacobi (Hestenes): the same rotations orthogonalize the columns of A
//!   (A <- A J, V <- V J) to LAPACK's gesvj criterion; the singular values are the column norms
//!   of A V, U is A V / sigma re-orthonormalized (and completed, for full_matrices or a rank
//!   deficient A) by a Householder QR. Accuracy is on par with LAPACK's for well-conditioned
//!   inputs; eigenvectors and singular vectors may differ from LAPACK's by a sign (phase).
//! - lstsq goes through the SVD (the minimum-norm solution, like gelsd), matrix_exp follows
//!   PyTorch's mexp (Taylor degrees 1-18 by norm, scaling and squaring for degree 18).
//!
//! Every algorithm works on a batch [B, m, n] (the leading dims flattened); loops run until the
//! whole batch is done. Empty matrices and empty batches are answered without a loop.
pub(crate) mod products;

use crate::args::{Args, Tensor};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, Registry};
use stablehlo::{Builder, CmpDir, ElemType, GatherDims, Precision, ScatterDims, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("eye", eye);
    r.add("linalg_cross", linalg_cross);
    r.add("linalg_cholesky_ex", linalg_cholesky_ex);
    r.add_sized("cholesky", cholesky_failure, cholesky);
    r.add("cholesky_inverse", cholesky_inverse);
    r.add("_cholesky_solve_helper", cholesky_solve_helper);
    r.add("linalg_solve_triangular", linalg_solve_triangular);
    r.add("triangular_solve", triangular_solve);
    r.add("linalg_lu_factor_ex", linalg_lu_factor_ex);
    r.add("linalg_lu", linalg_lu);
    r.add("lu_unpack", lu_unpack);
    r.add("linalg_lu_solve", linalg_lu_solve);
    r.add("_linalg_solve_ex", linalg_solve_ex);
    r.add("linalg_inv_ex", linalg_inv_ex);
    r.add("_linalg_det", linalg_det);
    r.add("_linalg_slogdet", linalg_slogdet);
    r.add("linalg_qr", linalg_qr);
    r.add("geqrf", geqrf);
    r.add("linalg_householder_product", linalg_householder_product);
    r.add("ormqr", ormqr);
    r.add("_linalg_eigh", linalg_eigh);
    r.add("_linalg_svd", linalg_svd);
    r.add("linalg_lstsq", linalg_lstsq);
    r.add("linalg_matrix_exp", linalg_matrix_exp);
}

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

// ---- eye, cross -------------------------------------------------------------------------------

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

/// linalg_cross(self, other, dim): the cross product of 3-vectors along `dim`, broadcast.
fn linalg_cross(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("other")?;
    let (da, db) = (cx.dims(a.v), cx.dims(b.v));
    check!(da.len() == db.len(), Runtime, "linalg.cross: inputs must have the same number of dimensions.");
    check!(
        a.dtype == b.dtype,
        Runtime,
        "expected scalar type {} but found {}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    let shape = crate::broadcast_shapes(&[da.clone(), db.clone()])?;
    let dim = wrap_dim(args.int_or("dim", -1)?, shape.len())?;
    check!(
        da[dim] == 3 && db[dim] == 3,
        Runtime,
        "linalg.cross: inputs dimension {} must have length 3. Got {} and {}",
        dim,
        da[dim],
        db[dim]
    );
    let x = cx.broadcast_to(a.v, &shape);
    let y = cx.broadcast_to(b.v, &shape);
    if numel(&shape) == 0 {
        return one(x);
    }
    let r = shape.len();
    let comp = |cx: &mut Cx, v: Value, i: i64| {
        let mut s = vec![0; r];
        let mut l = shape.clone();
        s[dim] = i;
        l[dim] = i + 1;
        cx.slice(v, &s, &l, &vec![1; r])
    };
    let xs: Vec<Value> = (0..3).map(|i| comp(cx, x, i)).collect();
    let ys: Vec<Value> = (0..3).map(|i| comp(cx, y, i)).collect();
    let mut parts = Vec::new();
    for (i, j) in [(1, 2), (2, 0), (0, 1)] {
        let p = cx.mul(xs[i], ys[j]);
        let q = cx.mul(xs[j], ys[i]);
        parts.push(cx.sub(p, q));
    }
    one(cx.concatenate(&parts, dim as i64))
}

// ---- Cholesky ---------------------------------------------------------------------------------

/// The Hermitian matrix a LAPACK routine sees when it reads only one triangle of `a`
/// (the diagonal's imaginary part is ignored).
fn hermitian_from(b: &mut Builder, a: Value, lower: bool) -> Value {
    let t = tri(b, a, lower, 0);
    let strict = tri(b, a, lower, if lower { -1 } else { 1 });
    let mirrored = adjoint(b, strict);
    let mut h = b.add(t, mirrored);
    if b.elem(a).is_complex() {
        // Keep only the real part of the diagonal.
        let dims = b.dims(h).to_vec();
        let r = iota(b, &dims, 1);
        let c = iota(b, &dims, 2);
        let on = b.compare(CmpDir::Eq, r, c);
        let re = b.real(h);
        let re = to_elem(b, re, b.elem(a));
        h = b.select(on, re, h);
    }
    h
}

/// Lower Cholesky factor L (A = L L^H) of a batch [B, n, n] read from one triangle, and LAPACK's
/// info [B] (int32): the order of the first leading minor that is not positive definite, 0 when
/// none. stablehlo.cholesky gives no info (and may fill a failed matrix with NaN), so a failure
/// is detected from the factor and its order found by `cholesky_info`.
fn cholesky_lower(b: &mut Builder, a: Value, from_lower: bool) -> (Value, Value) {
    let h = hermitian_from(b, a, from_lower);
    let ty = b.ty(h).clone();
    let l = b.custom_op("stablehlo.cholesky", &[h], "lower = true", &[ty])[0];
    let l = tri(b, l, true, 0);
    let dims = b.dims(l).to_vec();
    let bs = dims[0];
    // Failed: a diagonal entry that is not a positive number, or anything non-finite.
    let d = diag(b, l);
    let d = b.real(d);
    let zero = splat(b, 0.0, b.elem(d), &[bs, dims[1]]);
    let pos = b.compare(CmpDir::Gt, d, zero);
    let not_pos = b.not(pos);
    let bad_diag = any_over(b, not_pos, &[1]);
    let re = b.real(l);
    let fin = b.is_finite(re);
    let fin = if b.elem(l).is_complex() {
        let im = b.imag(l);
        let fi = b.is_finite(im);
        b.and(fin, fi)
    } else {
        fin
    };
    let nonfin = b.not(fin);
    let bad_any = any_over(b, nonfin, &[1, 2]);
    let failed = b.or(bad_diag, bad_any);
    let info = cholesky_info(b, h, failed);
    (l, info)
}

/// potrf's info for the batch elements marked `failed` [B] (0 for the others): a right-looking
/// Cholesky of h [B, n, n] that records the first pivot that is not positive. Its loop runs
/// only when some element failed.
fn cholesky_info(b: &mut Builder, h: Value, failed: Value) -> Value {
    let d = b.dims(h).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(h);
    let info0 = splat(b, 0.0, I64, &[bs]);
    let any_failed = any(b, failed);
    let j0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[j0, h, info0],
        |b, v| {
            let nn = b.constant_i64(n, I64);
            let more = b.compare(CmpDir::Lt, v[0], nn);
            b.and(more, any_failed)
        },
        |b, v| {
            let (j, a, info) = (v[0], v[1], v[2]);
            let d2 = [bs, n];
            let d3 = [bs, n, n];
            let col = batch_col(b, a, j);
            let piv = batch_entry(b, col, j);
            let piv = b.real(piv);
            let zr = splat(b, 0.0, b.elem(piv), &[bs]);
            let ok = b.compare(CmpDir::Gt, piv, zr);
            let zi = splat(b, 0.0, I64, &[bs]);
            let none_yet = b.compare(CmpDir::Eq, info, zi);
            let bad = b.not(ok);
            let first = b.and(none_yet, bad);
            let one = b.constant_i64(1, I64);
            let j1 = b.add(j, one);
            let j1b = bcast0(b, j1, &[bs]);
            let info = b.select(first, j1b, info);
            let onesr = splat(b, 1.0, b.elem(piv), &[bs]);
            let safe = b.select(ok, piv, onesr);
            let root = b.sqrt(safe);
            let root = to_elem(b, root, e);
            let root2 = bcast(b, root, &d2, &[0]);
            let rows = iota(b, &d2, 1);
            let jm = bcast0(b, j, &d2);
            let below = b.compare(CmpDir::Gt, rows, jm);
            let lcol = b.div(col, root2);
            let zeros = splat(b, 0.0, e, &d2);
            let l = b.select(below, lcol, zeros);
            let l3 = bcast(b, l, &d3, &[0, 1]);
            let lc = conj(b, l);
            let lc3 = bcast(b, lc, &d3, &[0, 2]);
            let outer = b.mul(l3, lc3);
            let a = b.sub(a, outer);
            vec![j1, a, info]
        },
    );
    let zero = splat(b, 0.0, I64, &[bs]);
    let info = b.select(failed, out[2], zero);
    b.convert(info, I32)
}

/// Cholesky of `t` ([..., n, n]): the factor (lower, or upper = L^H) and info.
fn cholesky_common(cx: &mut Cx, t: &Tensor, upper: bool, api: &str) -> Result<(Value, Value)> {
    check_square(cx, t, api)?;
    check_float_or_complex(t, api)?;
    check_lapack_dtype(t.dtype, "cholesky_cpu")?;
    let mm = mats(cx, t.v);
    if mm.bs == 0 || mm.n == 0 {
        let info = cx.full(0.0, DType::I32, &mm.batch);
        return Ok((t.v, info));
    }
    // LAPACK's upper factorization reads the upper triangle: A = U^H U with U = L^H of the
    // matrix mirrored from that triangle.
    let (l, info) = cholesky_lower(cx, mm.v, !upper);
    let f = if upper { adjoint(cx, l) } else { l };
    let f = unflatten(cx, f, &mm.batch);
    let info = cx.reshape(info, &mm.batch);
    Ok((f, info))
}

/// linalg_cholesky_ex(self, upper, check_errors) -> (L, info).
fn linalg_cholesky_ex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let t = args.tensor("self")?;
    let upper = args.bool_or("upper", false)?;
    check!(
        !args.bool_or("check_errors", false)?,
        NotImplemented,
        "linalg.cholesky_ex: check_errors=True is not supported on tpu (read `info` instead)"
    );
    let (l, info) = cholesky_common(cx, &t, upper, "linalg.cholesky")?;
    Ok(vec![Out::Tensor(l), Out::Tensor(info)])
}

/// Triangular solve with broadcasting batch dims: op(a) x = rhs (left) or x op(a) = rhs.
fn solve_tri_batched(cx: &mut Cx, a: Value, rhs: Value, left: bool, lower: bool, unit: bool, transpose: &str) -> Result<Value> {
    let batch = broadcast_batch(cx, a, rhs)?;
    let a = expand_batch(cx, a, &batch);
    let r = expand_batch(cx, rhs, &batch);
    let am = mats(cx, a);
    let rm = mats(cx, r);
    if numel(&cx.dims(rhs)) == 0 || rm.bs == 0 || am.n == 0 {
        let d = cx.dims(r);
        return Ok(cx.full(0.0, cx.dtype(rhs), &d));
    }
    let a3 = tri(cx, am.v, lower, 0);
    let x = trsm(cx, a3, rm.v, left, lower, unit, transpose);
    Ok(unflatten(cx, x, &batch))
}

/// linalg_solve_triangular(self=A, B, upper, left, unitriangular).
fn linalg_solve_triangular(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let bt = args.tensor("B")?;
    let upper = args.bool("upper")?;
    let left = args.bool_or("left", true)?;
    let unit = args.bool_or("unitriangular", false)?;
    let api = "linalg.solve_triangular";
    check_square(cx, &a, api)?;
    check!(
        cx.dims(bt.v).len() >= 2,
        Runtime,
        "{}: The input tensor B must have at least 2 dimensions.",
        api
    );
    let (da, db) = (cx.dims(a.v), cx.dims(bt.v));
    let n = da[da.len() - 1];
    let (br, bc) = (db[db.len() - 2], db[db.len() - 1]);
    if left {
        check!(
            br == n,
            Runtime,
            "{}: Incompatible shapes of A and B for the equation AX = B ({}x{} and {}x{})",
            api,
            n,
            n,
            br,
            bc
        );
    } else {
        check!(
            bc == n,
            Runtime,
            "{}: Incompatible shapes of A and B for the equation XA = B ({}x{} and {}x{})",
            api,
            n,
            n,
            br,
            bc
        );
    }
    // Like PyTorch's: solved in the promoted dtype, returned in A's.
    let dt = crate::dtype::promote(a.dtype, bt.dtype);
    check_lapack_dtype(dt, "triangular_solve_cpu")?;
    let av = cx.cast(a.v, dt);
    let bv = cx.cast(bt.v, dt);
    let x = solve_tri_batched(cx, av, bv, left, !upper, unit, "NO_TRANSPOSE")?;
    let x = if dt.is_complex() && !a.dtype.is_complex() { cx.real(x) } else { x };
    one(cx.cast(x, a.dtype))
}

/// triangular_solve(self=b, A, upper, transpose, unitriangular) -> (solution, cloned A).
fn triangular_solve(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let bt = args.tensor("self")?;
    let a = args.tensor("A")?;
    let upper = args.bool_or("upper", true)?;
    let transpose = args.bool_or("transpose", false)?;
    let unit = args.bool_or("unitriangular", false)?;
    let nb = cx.dims(bt.v).len();
    check!(nb >= 2, Runtime, "torch.triangular_solve: Expected b to have at least 2 dimensions, but it has {} dimensions instead", nb);
    let na = cx.dims(a.v).len();
    check!(na >= 2, Runtime, "torch.triangular_solve: Expected A to have at least 2 dimensions, but it has {} dimensions instead", na);
    check!(
        a.dtype == bt.dtype,
        Runtime,
        "Expected b and A to have the same dtype, but found b of type {} and A of type {} instead.",
        bt.dtype.torch_name(),
        a.dtype.torch_name()
    );
    let (da, db) = (cx.dims(a.v), cx.dims(bt.v));
    let (m, n) = (da[na - 2], da[na - 1]);
    check!(m == n, Runtime, "A must be batches of square matrices, but they are {} by {} matrices", m, n);
    check!(
        db[nb - 2] == n,
        Runtime,
        "Incompatible matrix sizes for triangular_solve: each A matrix is {} by {} but each b matrix is {} by {}",
        n,
        n,
        db[nb - 2],
        db[nb - 1]
    );
    check_lapack_dtype(a.dtype, "triangular_solve_cpu")?;
    let batch = broadcast_batch(cx, bt.v, a.v)?;
    let x = solve_tri_batched(cx, a.v, bt.v, true, !upper, unit, if transpose { "TRANSPOSE" } else { "NO_TRANSPOSE" })?;
    let ac = expand_batch(cx, a.v, &batch);
    Ok(vec![Out::Tensor(x), Out::Tensor(ac)])
}

/// cholesky_inverse(self=L, upper): (L L^H)^-1, or (U^H U)^-1.
fn cholesky_inverse(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let t = args.tensor("self")?;
    let upper = args.bool_or("upper", false)?;
    check_square(cx, &t, "cholesky_inverse")?;
    check_float_or_complex(&t, "cholesky_inverse")?;
    check_lapack_dtype(t.dtype, "cholesky_inverse_out_cpu")?;
    let mm = mats(cx, t.v);
    if mm.bs == 0 || mm.n == 0 {
        return one(t.v);
    }
    let e = t.dtype.elem();
    let id = eye3(cx, e, mm.bs, mm.n, mm.n);
    let f = tri(cx, mm.v, !upper, 0);
    // Lower: A^-1 = L^-H L^-1. Upper: A^-1 = U^-1 U^-H.
    let inv = trsm(cx, f, id, true, !upper, false, "NO_TRANSPOSE");
    let inv_h = adjoint(cx, inv);
    let r = if upper { bmm(cx, inv, inv_h) } else { bmm(cx, inv_h, inv) };
    one(unflatten(cx, r, &mm.batch))
}

/// _cholesky_solve_helper(self=B, A=factor, upper): A^-1 B with A = L L^H (or U^H U); the
/// composite cholesky_solve has already broadcast the batch dims.
fn cholesky_solve_helper(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let bt = args.tensor("self")?;
    let a = args.tensor("A")?;
    let upper = args.bool("upper")?;
    check_lapack_dtype(a.dtype, "cholesky_solve_cpu")?;
    let (ua, ub) = if upper { ("ADJOINT", "NO_TRANSPOSE") } else { ("NO_TRANSPOSE", "ADJOINT") };
    let y = solve_tri_batched(cx, a.v, bt.v, true, !upper, false, ua)?;
    one(solve_tri_batched(cx, a.v, y, true, !upper, false, ub)?)
}

// ---- LU ---------------------------------------------------------------------------------------

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

/// LU factorization with partial pivoting of a batch [B, m, n] (getrf). Returns the packed
/// factors [B, m, n] (unit L below the diagonal, U on and above), LAPACK's 1-based pivots
/// [B, k] (int32) and info [B] (int32: the first zero pivot, 1-based, or 0).
fn lu_factor(b: &mut Builder, a: Value) -> (Value, Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, m, n) = (d[0], d[1], d[2]);
    let k = m.min(n);
    let e = b.elem(a);
    let piv0 = {
        let i = iota(b, &[bs, k], 1);
        let one = splat(b, 1.0, I64, &[bs, k]);
        let p = b.add(i, one);
        b.convert(p, I32)
    };
    let info0 = splat(b, 0.0, I32, &[bs]);
    if k == 0 || bs == 0 {
        return (a, piv0, info0);
    }
    let j0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[j0, a, piv0, info0],
        |b, v| lt_const(b, v[0], k),
        |b, v| {
            let (j, a, piv, info) = (v[0], v[1], v[2], v[3]);
            let zero = b.constant_i64(0, I64);
            let d2 = [bs, m];
            let d3 = [bs, m, n];
            let rows = iota(b, &d2, 1);
            let jm = bcast0(b, j, &d2);
            // The pivot: the first row at or below j with the largest magnitude in column j.
            let col = batch_col(b, a, j);
            let mag = pivot_magnitude(b, col);
            let re = b.elem(mag);
            let at_or_below = b.compare(CmpDir::Ge, rows, jm);
            let minus = splat(b, -1.0, re, &d2);
            let mag = b.select(at_or_below, mag, minus);
            let (p, _) = first_argmax(b, mag, 1, -2.0);
            let one = splat(b, 1.0, I64, &[bs]);
            let p1 = b.add(p, one);
            let p1 = b.convert(p1, I32);
            let p1 = b.reshape(p1, &[bs, 1]);
            let piv = b.dynamic_update_slice(piv, p1, &[zero, j]);
            // Swap rows j and p.
            let rows3 = iota(b, &d3, 1);
            let cols3 = iota(b, &d3, 2);
            let j3 = bcast0(b, j, &d3);
            let p3 = bcast(b, p, &d3, &[0]);
            let is_p = b.compare(CmpDir::Eq, rows3, p3);
            let is_j = b.compare(CmpDir::Eq, rows3, j3);
            let zeros3 = splat(b, 0.0, e, &d3);
            let only_p = b.select(is_p, a, zeros3);
            let row_p = sum(b, only_p, &[1]);
            let row_j = b.dynamic_slice(a, &[zero, j, zero], &[bs, 1, n]);
            let row_j = b.reshape(row_j, &[bs, n]);
            let row_p3 = bcast(b, row_p, &d3, &[0, 2]);
            let row_j3 = bcast(b, row_j, &d3, &[0, 2]);
            let swapped = b.select(is_p, row_j3, a);
            let a = b.select(is_j, row_p3, swapped);
            // info: the first zero pivot.
            let u = batch_entry(b, row_p, j);
            let zero_e = splat(b, 0.0, e, &[bs]);
            let nonzero = b.compare(CmpDir::Ne, u, zero_e);
            let zero_i = splat(b, 0.0, I32, &[bs]);
            let no_info = b.compare(CmpDir::Eq, info, zero_i);
            let singular = b.not(nonzero);
            let first = b.and(no_info, singular);
            let one_i = b.constant_i64(1, I64);
            let j1 = b.add(j, one_i);
            let j1i = b.convert(j1, I32);
            let j1b = bcast0(b, j1i, &[bs]);
            let info = b.select(first, j1b, info);
            // Multipliers below the pivot (skipped for a zero pivot, like getf2), then the
            // rank-1 update of the trailing columns.
            let colj = batch_col(b, a, j);
            let u2 = bcast(b, u, &d2, &[0]);
            let ratio = b.div(colj, u2);
            let below = b.compare(CmpDir::Gt, rows, jm);
            let nz2 = bcast(b, nonzero, &d2, &[0]);
            let use_l = b.and(below, nz2);
            let zeros2 = splat(b, 0.0, e, &d2);
            let l = b.select(use_l, ratio, zeros2);
            let l3 = bcast(b, l, &d3, &[0, 1]);
            let upd = b.mul(l3, row_p3);
            let reduced = b.sub(a, upd);
            let right = b.compare(CmpDir::Gt, cols3, j3);
            let a = b.select(right, reduced, a);
            let at_j = b.compare(CmpDir::Eq, cols3, j3);
            let use3 = bcast(b, use_l, &d3, &[0, 1]);
            let store = b.and(at_j, use3);
            let a = b.select(store, l3, a);
            vec![j1, a, piv, info]
        },
    );
    (out[1], out[2], out[3])
}

/// The row order of the getrf pivots: perm[i] is the row of A that is row i of P^T A
/// ([B, m] int64), from applying the swaps in order.
fn pivots_to_perm(b: &mut Builder, piv: Value, m: i64) -> Value {
    let d = b.dims(piv).to_vec();
    let (bs, k) = (d[0], d[1]);
    let perm0 = iota(b, &[bs, m], 1);
    if k == 0 || bs == 0 || m == 0 {
        return perm0;
    }
    let piv = b.convert(piv, I64);
    let j0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[j0, perm0],
        |b, v| lt_const(b, v[0], k),
        |b, v| {
            let (j, perm) = (v[0], v[1]);
            let d2 = [bs, m];
            let pj = batch_entry(b, piv, j);
            let one = splat(b, 1.0, I64, &[bs]);
            let pj = b.sub(pj, one);
            let idx = iota(b, &d2, 1);
            let p2 = bcast(b, pj, &d2, &[0]);
            let j2 = bcast0(b, j, &d2);
            let is_p = b.compare(CmpDir::Eq, idx, p2);
            let is_j = b.compare(CmpDir::Eq, idx, j2);
            let zeros = splat(b, 0.0, I64, &d2);
            let only_p = b.select(is_p, perm, zeros);
            let at_p = sum(b, only_p, &[1]);
            let at_j = batch_entry(b, perm, j);
            let at_p2 = bcast(b, at_p, &d2, &[0]);
            let at_j2 = bcast(b, at_j, &d2, &[0]);
            let perm = b.select(is_p, at_j2, perm);
            let perm = b.select(is_j, at_p2, perm);
            let one0 = b.constant_i64(1, I64);
            vec![b.add(j, one0), perm]
        },
    );
    out[1]
}

/// P^T as a matrix [B, m, m] of `elem`: row i has its one at column perm[i].
fn perm_matrix_t(b: &mut Builder, perm: Value, elem: ElemType) -> Value {
    let d = b.dims(perm).to_vec();
    let d3 = [d[0], d[1], d[1]];
    let cols = iota(b, &d3, 2);
    let p3 = bcast(b, perm, &d3, &[0, 1]);
    let on = b.compare(CmpDir::Eq, cols, p3);
    let one = splat(b, 1.0, elem, &d3);
    let zero = splat(b, 0.0, elem, &d3);
    b.select(on, one, zero)
}

/// The unit lower factor L [B, m, k] and the upper factor U [B, k, n] of packed LU factors.
fn unpack_lu(b: &mut Builder, lu: Value) -> (Value, Value) {
    let d = b.dims(lu).to_vec();
    let (bs, m, n) = (d[0], d[1], d[2]);
    let k = m.min(n);
    let e = b.elem(lu);
    let lpart = block(b, lu, (0, m), (0, k));
    let l = tri(b, lpart, true, -1);
    let id = eye3(b, e, bs, m, k);
    let l = b.add(l, id);
    let upart = block(b, lu, (0, k), (0, n));
    let u = tri(b, upart, false, 0);
    (l, u)
}

/// Solves A X = B (or A^H X = B when `adjoint`) for square A = P L U given as packed factors
/// and pivots. All operands are batches with the same B.
fn lu_solve_core(b: &mut Builder, lu: Value, piv: Value, rhs: Value, adjoint_a: bool) -> Value {
    let n = b.dims(lu)[1];
    let e = b.elem(lu);
    let perm = pivots_to_perm(b, piv, n);
    let pt = perm_matrix_t(b, perm, e);
    let (l, u) = unpack_lu(b, lu);
    if !adjoint_a {
        // X = U^-1 L^-1 P^T B
        let y = bmm(b, pt, rhs);
        let y = trsm(b, l, y, true, true, true, "NO_TRANSPOSE");
        trsm(b, u, y, true, false, false, "NO_TRANSPOSE")
    } else {
        // A^H = U^H L^H P^T: X = P L^-H U^-H B
        let z = trsm(b, u, rhs, true, false, false, "ADJOINT");
        let w = trsm(b, l, z, true, true, true, "ADJOINT");
        let p = b.transpose(pt, &[0, 2, 1]);
        bmm(b, p, w)
    }
}

fn check_lu_input(cx: &Cx, t: &Tensor, api: &str) -> Result<()> {
    let nd = cx.dims(t.v).len();
    check!(nd >= 2, Runtime, "torch.lu_factor: Expected tensor with 2 or more dimensions. Got size: {:?} instead", cx.dims(t.v));
    let _ = api;
    Ok(())
}

/// linalg_lu_factor_ex(A, pivot, check_errors) -> (LU, pivots, info).
fn linalg_lu_factor_ex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    check_lu_input(cx, &a, "linalg.lu_factor")?;
    check_lapack_dtype(a.dtype, "lu_cpu")?;
    check!(args.bool_or("pivot", true)?, Runtime, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
    check!(
        !args.bool_or("check_errors", false)?,
        NotImplemented,
        "linalg.lu_factor_ex: check_errors=True is not supported on tpu (read `info` instead)"
    );
    let mm = mats(cx, a.v);
    let (lu, piv, info) = lu_factor(cx, mm.v);
    let lu = unflatten(cx, lu, &mm.batch);
    let piv = unflatten(cx, piv, &mm.batch);
    let info = cx.reshape(info, &mm.batch);
    Ok(vec![Out::Tensor(lu), Out::Tensor(piv), Out::Tensor(info)])
}

/// linalg_lu(A, pivot) -> (P, L, U) with A = P L U.
fn linalg_lu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    check_matrix(cx, &a, "linalg.lu")?;
    check_lapack_dtype(a.dtype, "lu_cpu")?;
    check!(args.bool_or("pivot", true)?, Runtime, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
    let mm = mats(cx, a.v);
    let (lu, piv, _) = lu_factor(cx, mm.v);
    let perm = pivots_to_perm(cx, piv, mm.m);
    let pt = perm_matrix_t(cx, perm, a.dtype.elem());
    let p = cx.transpose(pt, &[0, 2, 1]);
    let (l, u) = unpack_lu(cx, lu);
    let p = unflatten(cx, p, &mm.batch);
    let l = unflatten(cx, l, &mm.batch);
    let u = unflatten(cx, u, &mm.batch);
    Ok(vec![Out::Tensor(p), Out::Tensor(l), Out::Tensor(u)])
}

/// lu_unpack(LU_data, LU_pivots, unpack_data, unpack_pivots) -> (P, L, U); the parts not asked
/// for are empty.
fn lu_unpack(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let lu = args.tensor("LU_data")?;
    let piv = args.tensor("LU_pivots")?;
    let unpack_data = args.bool_or("unpack_data", true)?;
    let unpack_pivots = args.bool_or("unpack_pivots", true)?;
    let nd = cx.dims(lu.v).len();
    check!(nd >= 2, Runtime, "torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: {:?} instead", cx.dims(lu.v));
    check!(
        piv.dtype == DType::I32,
        Runtime,
        "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype. Note: this function is intended to be used with the output produced by torch.linalg.lu_factor"
    );
    let mm = mats(cx, lu.v);
    let k = mm.m.min(mm.n);
    let pd = cx.dims(piv.v);
    check!(
        pd.len() == nd - 1 && pd[nd - 2] == k,
        Runtime,
        "torch.lu_unpack: Expected LU_pivots of shape {:?} but got {:?}",
        {
            let mut s = mm.batch.clone();
            s.push(k);
            s
        },
        pd
    );
    let empty = cx.full(0.0, lu.dtype, &[0]);
    let (l, u) = if unpack_data {
        let (l, u) = unpack_lu(cx, mm.v);
        (unflatten(cx, l, &mm.batch), unflatten(cx, u, &mm.batch))
    } else {
        (empty, empty)
    };
    let p = if unpack_pivots {
        let pv = cx.reshape(piv.v, &[mm.bs, k]);
        let perm = pivots_to_perm(cx, pv, mm.m);
        let pt = perm_matrix_t(cx, perm, lu.dtype.elem());
        let p = cx.transpose(pt, &[0, 2, 1]);
        unflatten(cx, p, &mm.batch)
    } else {
        empty
    };
    Ok(vec![Out::Tensor(p), Out::Tensor(l), Out::Tensor(u)])
}

/// Solve with packed LU factors, broadcasting batch dims; `left` = false solves X A = B via
/// A^H X^H = B^H.
fn lu_solve_any(cx: &mut Cx, lu: Value, piv: Value, rhs: Value, left: bool, adjoint_a: bool) -> Result<Value> {
    let batch = broadcast_batch(cx, lu, rhs)?;
    let lu_b = expand_batch(cx, lu, &batch);
    let mut pb = batch.clone();
    pb.push(*cx.dims(piv).last().unwrap());
    let piv_b = cx.broadcast_to(piv, &pb);
    let rhs_b = expand_batch(cx, rhs, &batch);
    let lm = mats(cx, lu_b);
    let rd = cx.dims(rhs_b);
    if numel(&rd) == 0 || lm.n == 0 {
        return Ok(cx.full(0.0, cx.dtype(rhs), &rd));
    }
    let pv = cx.reshape(piv_b, &[lm.bs, lm.n]);
    let rm = mats(cx, rhs_b);
    let x = if left {
        lu_solve_core(cx, lm.v, pv, rm.v, adjoint_a)
    } else {
        let rh = adjoint(cx, rm.v);
        let xh = lu_solve_core(cx, lm.v, pv, rh, !adjoint_a);
        adjoint(cx, xh)
    };
    Ok(unflatten(cx, x, &batch))
}

/// linalg_lu_solve(LU, pivots, B, left, adjoint).
fn linalg_lu_solve(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let lu = args.tensor("LU")?;
    let piv = args.tensor("pivots")?;
    let bt = args.tensor("B")?;
    let left = args.bool_or("left", true)?;
    let adj = args.bool_or("adjoint", false)?;
    let api = "linalg.lu_solve";
    check_square(cx, &lu, api)?;
    check!(cx.dims(bt.v).len() >= 2, Runtime, "{}: The input tensor B must have at least 2 dimensions.", api);
    check!(
        lu.dtype == bt.dtype,
        Runtime,
        "{}: Expected LU and B to have the same dtype, but found LU of type {} and B of type {} instead",
        api,
        lu.dtype.torch_name(),
        bt.dtype.torch_name()
    );
    check!(piv.dtype == DType::I32, Runtime, "{}: Expected pivots to be integers. Got {}", api, piv.dtype.torch_name());
    let (dl, db) = (cx.dims(lu.v), cx.dims(bt.v));
    let n = dl[dl.len() - 1];
    let (br, bc) = (db[db.len() - 2], db[db.len() - 1]);
    if left {
        check!(br == n, Runtime, "{}: Incompatible shapes of A and B for the equation AX = B ({}x{} and {}x{})", api, n, n, br, bc);
    } else {
        check!(bc == n, Runtime, "{}: Incompatible shapes of A and B for the equation XA = B ({}x{} and {}x{})", api, n, n, br, bc);
    }
    let pd = cx.dims(piv.v);
    check!(
        pd.len() == dl.len() - 1 && pd[pd.len() - 1] == n,
        Runtime,
        "{}: Expected LU.shape[:-1] == pivots.shape. Got LU.shape = {:?} and pivots.shape = {:?}",
        api,
        dl,
        pd
    );
    check_lapack_dtype(lu.dtype, "lu_solve_cpu")?;
    one(lu_solve_any(cx, lu.v, piv.v, bt.v, left, adj)?)
}

/// NumPy's rule in linalg.solve: B is a (batch of) vector(s) when it is 1-d, or has one dim
/// less than A and matches A's shape without its last dim.
fn is_vector_rhs(a: &[i64], b: &[i64]) -> bool {
    b.len() == 1 || (b.len() + 1 == a.len() && b == &a[..a.len() - 1])
}

/// _linalg_solve_ex(A, B, left, check_errors) -> (result, LU, pivots, info); LU is the
/// factorization of A itself.
fn linalg_solve_ex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let bt = args.tensor("B")?;
    let left = args.bool_or("left", true)?;
    let api = "linalg.solve";
    check_float_or_complex(&a, api)?;
    check!(
        a.dtype == bt.dtype,
        Runtime,
        "{}: Expected A and B to have the same dtype, but found A of type {} and B of type {} instead",
        api,
        a.dtype.torch_name(),
        bt.dtype.torch_name()
    );
    check!(
        !args.bool_or("check_errors", false)?,
        NotImplemented,
        "linalg.solve_ex: check_errors=True is not supported on tpu (read `info` instead)"
    );
    check_square(cx, &a, api)?;
    let (da, db) = (cx.dims(a.v), cx.dims(bt.v));
    let vector = is_vector_rhs(&da, &db);
    let b2 = if vector {
        let mut s = db.clone();
        s.push(1);
        cx.reshape(bt.v, &s)
    } else {
        bt.v
    };
    let d2 = cx.dims(b2);
    check!(d2.len() >= 2, Runtime, "{}: The input tensor B must have at least 2 dimensions.", api);
    let n = da[da.len() - 1];
    let (br, bc) = (d2[d2.len() - 2], d2[d2.len() - 1]);
    if left {
        check!(br == n, Runtime, "{}: Incompatible shapes of A and B for the equation AX = B ({}x{} and {}x{})", api, n, n, br, bc);
    } else {
        check!(bc == n, Runtime, "{}: Incompatible shapes of A and B for the equation XA = B ({}x{} and {}x{})", api, n, n, br, bc);
    }
    check!(
        left || !vector,
        Runtime,
        "linalg.solve: Vector broadcasting of the left hand side is not supported for left=False. In this case linalg.solve is equivalent to B / A.squeeze(-1)"
    );
    check_lapack_dtype(a.dtype, "linalg_solve")?;
    let mm = mats(cx, a.v);
    let (lu, piv, info) = lu_factor(cx, mm.v);
    let lu = unflatten(cx, lu, &mm.batch);
    let piv = unflatten(cx, piv, &mm.batch);
    let info = cx.reshape(info, &mm.batch);
    let x = lu_solve_any(cx, lu, piv, b2, left, false)?;
    let x = if vector {
        let mut s = cx.dims(x);
        s.pop();
        cx.reshape(x, &s)
    } else {
        x
    };
    Ok(vec![Out::Tensor(x), Out::Tensor(lu), Out::Tensor(piv), Out::Tensor(info)])
}

/// linalg_inv_ex(A, check_errors) -> (inverse, info).
fn linalg_inv_ex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let api = "linalg.inv";
    check_square(cx, &a, api)?;
    check_float_or_complex(&a, api)?;
    check!(
        !args.bool_or("check_errors", false)?,
        NotImplemented,
        "linalg.inv_ex: check_errors=True is not supported on tpu (read `info` instead)"
    );
    check_lapack_dtype(a.dtype, "linalg_inv")?;
    let mm = mats(cx, a.v);
    if mm.bs == 0 || mm.n == 0 {
        let info = cx.full(0.0, DType::I32, &mm.batch);
        return Ok(vec![Out::Tensor(a.v), Out::Tensor(info)]);
    }
    let (lu, piv, info) = lu_factor(cx, mm.v);
    let id = eye3(cx, a.dtype.elem(), mm.bs, mm.n, mm.n);
    let x = lu_solve_core(cx, lu, piv, id, false);
    let x = unflatten(cx, x, &mm.batch);
    let info = cx.reshape(info, &mm.batch);
    Ok(vec![Out::Tensor(x), Out::Tensor(info)])
}

/// The factorization det and slogdet use: like PyTorch's CPU kernels, LU of A^T (= A^H) for real
/// matrices (they factor the transpose of a contiguous A), of A for complex ones.
fn det_lu(cx: &mut Cx, a: &Tensor, api: &str) -> Result<(Mats, Value, Value)> {
    check_square(cx, a, api)?;
    check_float_or_complex(a, api)?;
    check_lapack_dtype(a.dtype, "lu_cpu")?;
    let mm = mats(cx, a.v);
    let src = if a.dtype.is_complex() { mm.v } else { cx.transpose(mm.v, &[0, 2, 1]) };
    let (lu, piv, _) = lu_factor(cx, src);
    Ok((mm, lu, piv))
}

/// (-1)^(number of row swaps) of getrf pivots [B, k], as `elem` [B].
fn perm_sign(b: &mut Builder, piv: Value, elem: ElemType) -> Value {
    let d = b.dims(piv).to_vec();
    let i = iota(b, &d, 1);
    let one = splat(b, 1.0, I64, &d);
    let i1 = b.add(i, one);
    let p = b.convert(piv, I64);
    let swapped = b.compare(CmpDir::Ne, p, i1);
    let m1 = splat(b, -1.0, elem, &d);
    let p1 = splat(b, 1.0, elem, &d);
    let f = b.select(swapped, m1, p1);
    prod(b, f, &[1])
}

/// _linalg_det(A) -> (det, LU, pivots).
fn linalg_det(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let (mm, lu, piv) = det_lu(cx, &a, "linalg.det")?;
    let e = a.dtype.elem();
    let d = if mm.bs == 0 || mm.n == 0 {
        cx.full(1.0, a.dtype, &[mm.bs])
    } else {
        let dg = diag(cx, lu);
        let p = prod(cx, dg, &[1]);
        let s = perm_sign(cx, piv, e);
        cx.mul(p, s)
    };
    let d = cx.reshape(d, &mm.batch);
    let lu = unflatten(cx, lu, &mm.batch);
    let piv = unflatten(cx, piv, &mm.batch);
    Ok(vec![Out::Tensor(d), Out::Tensor(lu), Out::Tensor(piv)])
}

/// _linalg_slogdet(A) -> (sign, logabsdet, LU, pivots): sign is x/|x| of the determinant (0 for
/// a singular matrix, whose logabsdet is -inf).
fn linalg_slogdet(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let (mm, lu, piv) = det_lu(cx, &a, "linalg.slogdet")?;
    let e = a.dtype.elem();
    let re = e.real_type();
    let (sign, logabs) = if mm.bs == 0 || mm.n == 0 {
        (cx.full(1.0, a.dtype, &[mm.bs]), cx.full(0.0, a.dtype.to_real(), &[mm.bs]))
    } else {
        let dg = diag(cx, lu);
        let abs = cx.abs(dg);
        let dims = cx.dims(abs);
        let zero = splat(cx, 0.0, re, &dims);
        let is0 = cx.compare(CmpDir::Eq, abs, zero);
        // sgn(x) = x / |x|, 0 at 0.
        let abs_e = to_elem(cx, abs, e);
        let unit = cx.div(dg, abs_e);
        let zero_e = splat(cx, 0.0, e, &dims);
        let sg = cx.select(is0, zero_e, unit);
        let sg = prod(cx, sg, &[1]);
        let ps = perm_sign(cx, piv, e);
        let sign = cx.mul(sg, ps);
        let logs = cx.log(abs);
        (sign, sum(cx, logs, &[1]))
    };
    let sign = cx.reshape(sign, &mm.batch);
    let logabs = cx.reshape(logabs, &mm.batch);
    let lu = unflatten(cx, lu, &mm.batch);
    let piv = unflatten(cx, piv, &mm.batch);
    Ok(vec![Out::Tensor(sign), Out::Tensor(logabs), Out::Tensor(lu), Out::Tensor(piv)])
}

// ---- QR ---------------------------------------------------------------------------------------

/// Householder QR of a batch [B, m, n] with LAPACK's conventions (geqrf + orgqr/ungqr):
/// reflector j is H_j = I - tau_j v_j v_j^H with v_j[j] = 1 and zeros above, chosen so that
/// H_j^H maps column j to (.., beta, 0, ..) with beta = -sign(Re alpha) ||x|| (real); a column
/// with nothing to eliminate gets tau = 0. Returns (R [B, m, n], the reflectors V [B, m, k]
/// (unit at j, zeros above) and tau [B, k]); Q = H_1 ... H_k comes from `apply_reflectors`.
fn householder_qr(b: &mut Builder, a: Value) -> (Value, Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, m, n) = (d[0], d[1], d[2]);
    let k = m.min(n);
    let e = b.elem(a);
    let re = e.real_type();
    let v0 = splat(b, 0.0, e, &[bs, m, k]);
    let t0 = splat(b, 0.0, e, &[bs, k]);
    if k == 0 || bs == 0 {
        return (a, v0, t0);
    }
    let j0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[j0, a, v0, t0],
        |b, v| lt_const(b, v[0], k),
        |b, v| {
            let (j, r, vs, taus) = (v[0], v[1], v[2], v[3]);
            let zero = b.constant_i64(0, I64);
            let d2 = [bs, m];
            let d3 = [bs, m, n];
            let rows = iota(b, &d2, 1);
            let jm = bcast0(b, j, &d2);
            let col = batch_col(b, r, j);
            let alpha = batch_entry(b, col, j);
            let below = b.compare(CmpDir::Gt, rows, jm);
            let at_j = b.compare(CmpDir::Eq, rows, jm);
            let zeros2 = splat(b, 0.0, e, &d2);
            let x = b.select(below, col, zeros2);
            let x2 = abs2(b, x);
            let xnorm2 = sum(b, x2, &[1]);
            let (ar, ai) = if e.is_complex() { (b.real(alpha), b.imag(alpha)) } else { (alpha, splat(b, 0.0, re, &[bs])) };
            let a2 = abs2(b, alpha);
            let tot = b.add(a2, xnorm2);
            let norm = b.sqrt(tot);
            let zr = splat(b, 0.0, re, &[bs]);
            let nonneg = b.compare(CmpDir::Ge, ar, zr);
            let neg_norm = b.neg(norm);
            let beta = b.select(nonneg, neg_norm, norm);
            let x_zero = b.compare(CmpDir::Eq, xnorm2, zr);
            let ai_zero = b.compare(CmpDir::Eq, ai, zr);
            let trivial = b.and(x_zero, ai_zero);
            let beta_e = to_elem(b, beta, e);
            let diff = b.sub(beta_e, alpha);
            let tau = b.div(diff, beta_e);
            let ze = splat(b, 0.0, e, &[bs]);
            let tau = b.select(trivial, ze, tau);
            // v = (.., 1 at j, x / (alpha - beta)); e_j when trivial (tau = 0 makes it moot).
            let denom = b.sub(alpha, beta_e);
            let denom2 = bcast(b, denom, &d2, &[0]);
            let scaled = b.div(col, denom2);
            let ones2 = splat(b, 1.0, e, &d2);
            let unit = b.select(at_j, ones2, zeros2);
            let vv = b.select(below, scaled, unit);
            let triv2 = bcast(b, trivial, &d2, &[0]);
            let vv = b.select(triv2, unit, vv);
            // R <- H^H R on the columns right of j: R - conj(tau) v (v^H R).
            let vc = conj(b, vv);
            b.set_precision(Some(Precision::Highest));
            let w = b.dot_general(vc, r, &[0], &[0], &[1], &[1], e);
            let tc = conj(b, tau);
            let v3 = bcast(b, vv, &d3, &[0, 1]);
            let w3 = bcast(b, w, &d3, &[0, 2]);
            let t3 = bcast(b, tc, &d3, &[0]);
            let vw = b.mul(v3, w3);
            let upd = b.mul(t3, vw);
            let reduced = b.sub(r, upd);
            let cols3 = iota(b, &d3, 2);
            let j3 = bcast0(b, j, &d3);
            let right = b.compare(CmpDir::Gt, cols3, j3);
            let r = b.select(right, reduced, r);
            // Column j becomes (.., beta, 0, ..) (alpha itself when trivial).
            let diag_val = b.select(trivial, alpha, beta_e);
            let dv2 = bcast(b, diag_val, &d2, &[0]);
            let newcol = b.select(at_j, dv2, col);
            let newcol = b.select(below, zeros2, newcol);
            let newcol3 = bcast(b, newcol, &d3, &[0, 1]);
            let on_j = b.compare(CmpDir::Eq, cols3, j3);
            let r = b.select(on_j, newcol3, r);
            let vcol = b.reshape(vv, &[bs, m, 1]);
            let vs = b.dynamic_update_slice(vs, vcol, &[zero, zero, j]);
            let tcol = b.reshape(tau, &[bs, 1]);
            let taus = b.dynamic_update_slice(taus, tcol, &[zero, j]);
            let one = b.constant_i64(1, I64);
            vec![b.add(j, one), r, vs, taus]
        },
    );
    (out[1], out[2], out[3])
}

/// Q C (or Q^H C when `adjoint`) for Q = H_1 ... H_k given by reflectors V [B, m, k] (unit at
/// j, zeros above) and tau [B, k], applied to C [B, m, p] one reflector at a time (LAPACK's
/// orm2r): Q C applies H_k first, Q^H C applies H_1^H first; H_j^(H) C = C - tau_j^(*) v (v^H C).
fn apply_reflectors(b: &mut Builder, vs: Value, tau: Value, c: Value, adjoint_q: bool) -> Value {
    let d = b.dims(c).to_vec();
    let (bs, m, p) = (d[0], d[1], d[2]);
    let k = b.dims(tau)[1];
    let e = b.elem(c);
    if k == 0 || bs == 0 || m == 0 || p == 0 {
        return c;
    }
    let j0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[j0, c],
        |b, v| lt_const(b, v[0], k),
        |b, v| {
            let (i, c) = (v[0], v[1]);
            // Reflector j = k - 1 - i for Q C, j = i for Q^H C.
            let j = if adjoint_q {
                i
            } else {
                let last = b.constant_i64(k - 1, I64);
                b.sub(last, i)
            };
            let vv = batch_col(b, vs, j);
            let t = batch_entry(b, tau, j);
            let t = if adjoint_q { conj(b, t) } else { t };
            let vc = conj(b, vv);
            b.set_precision(Some(Precision::Highest));
            let w = b.dot_general(vc, c, &[0], &[0], &[1], &[1], e);
            let d3 = [bs, m, p];
            let v3 = bcast(b, vv, &d3, &[0, 1]);
            let w3 = bcast(b, w, &d3, &[0, 2]);
            let t3 = bcast(b, t, &d3, &[0]);
            let outer = b.mul(v3, w3);
            let upd = b.mul(t3, outer);
            let c = b.sub(c, upd);
            let one = b.constant_i64(1, I64);
            vec![b.add(i, one), c]
        },
    );
    out[1]
}

/// The first `cols` columns of Q = H_1 ... H_k [B, m, cols] (LAPACK's org2r).
fn q_columns(b: &mut Builder, vs: Value, tau: Value, cols: i64) -> Value {
    let d = b.dims(vs).to_vec();
    let id = eye3(b, b.elem(vs), d[0], d[1], cols);
    apply_reflectors(b, vs, tau, id, false)
}


/// linalg_qr(A, mode) -> (Q, R): mode "reduced" (Q m x k, R k x n), "complete" (Q m x m,
/// R m x n) or "r" (Q empty, R k x n).
fn linalg_qr(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let mode = args.str("mode")?.unwrap_or("reduced");
    check_matrix(cx, &a, "linalg.qr")?;
    check_float_or_complex(&a, "linalg.qr")?;
    check!(
        matches!(mode, "reduced" | "complete" | "r"),
        Runtime,
        "qr received unrecognized mode '{}' but expected one of 'reduced' (default), 'r', or 'complete'",
        mode
    );
    check_lapack_dtype(a.dtype, "linalg_qr_cpu")?;
    let mm = mats(cx, a.v);
    let k = mm.m.min(mm.n);
    let (r, vs, tau) = householder_qr(cx, mm.v);
    let (q, r) = match mode {
        "complete" => (Some(q_columns(cx, vs, tau, mm.m)), r),
        "reduced" => (Some(q_columns(cx, vs, tau, k)), block(cx, r, (0, k), (0, mm.n))),
        _ => (None, block(cx, r, (0, k), (0, mm.n))),
    };
    let q = match q {
        Some(q) => unflatten(cx, q, &mm.batch),
        None => cx.full(0.0, a.dtype, &[0]),
    };
    let r = unflatten(cx, r, &mm.batch);
    Ok(vec![Out::Tensor(q), Out::Tensor(r)])
}

/// geqrf(self) -> (a, tau): R on and above the diagonal, the reflectors below it.
fn geqrf(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let nd = cx.dims(a.v).len();
    check!(nd >= 2, Runtime, "torch.geqrf: input must have at least 2 dimensions.");
    check_lapack_dtype(a.dtype, "geqrf_cpu")?;
    let mm = mats(cx, a.v);
    let k = mm.m.min(mm.n);
    let (r, v, tau) = householder_qr(cx, mm.v);
    // Reflectors (without their unit entry) below the diagonal of the first k columns.
    let pad = cx.b.constant_f64(0.0, a.dtype.elem());
    let v = cx.pad(v, pad, &[0, 0, 0], &[0, 0, mm.n - k], &[0, 0, 0]);
    let v = tri(cx, v, true, -1);
    let r = tri(cx, r, false, 0);
    let packed = cx.add(r, v);
    let packed = unflatten(cx, packed, &mm.batch);
    let tau = unflatten(cx, tau, &mm.batch);
    Ok(vec![Out::Tensor(packed), Out::Tensor(tau)])
}

/// linalg_householder_product(input, tau): the first n columns of H_1 ... H_k, where H_j =
/// I - tau_j v_j v_j^H and v_j is column j of input below the diagonal with a unit on it.
fn linalg_householder_product(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("input")?;
    let tau = args.tensor("tau")?;
    let api = "torch.linalg.householder_product";
    let nd = cx.dims(a.v).len();
    check!(nd >= 2, Runtime, "{}: input must have at least 2 dimensions.", api);
    let (da, dt) = (cx.dims(a.v), cx.dims(tau.v));
    let (m, n) = (da[nd - 2], da[nd - 1]);
    check!(m >= n, Runtime, "{}: input.shape[-2] must be greater than or equal to input.shape[-1]", api);
    check!(dt.len() + 1 == nd, Runtime, "{}: input must have one more dimension than tau.", api);
    let k = dt[dt.len() - 1];
    check!(n >= k, Runtime, "{}: input.shape[-1] must be greater than or equal to tau.shape[-1]", api);
    check!(
        a.dtype == tau.dtype,
        Runtime,
        "{}: tau dtype {} does not match input dtype {}",
        api,
        tau.dtype.torch_name(),
        a.dtype.torch_name()
    );
    check_lapack_dtype(a.dtype, "orgqr_cpu")?;
    let mm = mats(cx, a.v);
    let tv = cx.reshape(tau.v, &[mm.bs, k]);
    let vs = packed_reflectors(cx, mm.v, k);
    let q = q_columns(cx, vs, tv, n);
    one(unflatten(cx, q, &mm.batch))
}

/// The unit lower reflectors V [B, m, k] held below the diagonal of LAPACK-packed [B, m, >= k].
fn packed_reflectors(b: &mut Builder, packed: Value, k: i64) -> Value {
    let d = b.dims(packed).to_vec();
    let (bs, m) = (d[0], d[1]);
    let vpart = block(b, packed, (0, m), (0, k));
    let vlow = tri(b, vpart, true, -1);
    let id = eye3(b, b.elem(packed), bs, m, k);
    b.add(vlow, id)
}

/// ormqr(self=reflectors, input2=tau, input3=other, left, transpose): op(Q) C (left) or
/// C op(Q), with Q = H_1 ... H_k from geqrf's packed reflectors and op(Q) = Q^H when transpose.
fn ormqr(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let tau = args.tensor("input2")?;
    let c = args.tensor("input3")?;
    let left = args.bool_or("left", true)?;
    let transpose = args.bool_or("transpose", false)?;
    let api = "torch.ormqr";
    let (da, dt, dc) = (cx.dims(a.v), cx.dims(tau.v), cx.dims(c.v));
    check!(da.len() >= 2, Runtime, "{}: input must have at least 2 dimensions.", api);
    check!(dc.len() >= 2, Runtime, "{}: other must have at least 2 dimensions.", api);
    let side: i64 = if left { -2 } else { -1 };
    let csize = dc[(dc.len() as i64 + side) as usize];
    let (mq, nin) = (da[da.len() - 2], da[da.len() - 1]);
    check!(csize == mq, Runtime, "{}: other.shape[{}] must be equal to input.shape[-2]", api, side);
    check!(dt.len() + 1 == da.len(), Runtime, "{}: Expected tau to have one dimension less than input, but got tau.ndim equal to {} and input.ndim is equal to {}", api, dt.len(), da.len());
    let k = dt[dt.len() - 1];
    check!(
        k == csize.min(nin),
        Runtime,
        "{}: tau.shape[-1] must be equal to min(other.shape[{}], input.shape[-1])",
        api,
        side
    );
    check!(da.len() == dc.len(), Runtime, "{}: Expected other to have the same number of dimensions as input, but got other.ndim equal to {} and input.ndim is equal to {}", api, dc.len(), da.len());
    check_lapack_dtype(a.dtype, "ormqr_cpu")?;
    check!(
        a.dtype == tau.dtype && a.dtype == c.dtype,
        Runtime,
        "{}: Expected input, tau and other to have the same dtype, but got {}, {} and {}",
        api,
        a.dtype.torch_name(),
        tau.dtype.torch_name(),
        c.dtype.torch_name()
    );
    let batch = broadcast_batch(cx, a.v, c.v)?;
    let av = expand_batch(cx, a.v, &batch);
    let cv = expand_batch(cx, c.v, &batch);
    let mut tb = batch.clone();
    tb.push(k);
    let tv = cx.broadcast_to(tau.v, &tb);
    let am = mats(cx, av);
    let cm = mats(cx, cv);
    if cm.bs == 0 || cm.m == 0 || cm.n == 0 {
        return one(cv);
    }
    let tv = cx.reshape(tv, &[am.bs, k]);
    let vs = packed_reflectors(cx, am.v, k);
    let r = if left {
        apply_reflectors(cx, vs, tv, cm.v, transpose)
    } else {
        // C op(Q) = (op(Q)^H C^H)^H
        let ch = adjoint(cx, cm.v);
        let x = apply_reflectors(cx, vs, tv, ch, !transpose);
        adjoint(cx, x)
    };
    one(unflatten(cx, r, &batch))
}

// ---- Jacobi rotations (eigh, svd) -------------------------------------------------------------

/// The round-robin (circle) schedule of N (even) indices: N - 1 rounds of N / 2 disjoint pairs
/// (p < q) that together cover every pair once. Returned as two [R, N/2] tables.
fn round_robin(n: i64) -> (Vec<i64>, Vec<i64>) {
    let mut ring: Vec<i64> = (0..n).collect();
    let (mut ps, mut qs) = (Vec::new(), Vec::new());
    for _ in 0..n - 1 {
        for i in 0..(n / 2) as usize {
            let (x, y) = (ring[i], ring[n as usize - 1 - i]);
            ps.push(x.min(y));
            qs.push(x.max(y));
        }
        // Keep position 0, rotate the rest by one.
        let last = ring.pop().unwrap();
        ring.insert(1, last);
    }
    (ps, qs)
}

/// Elements x[b, i_h, j_h] for index pairs idx [H, 2] -> [B, H].
fn gather_pairs(b: &mut Builder, x: Value, idx: Value) -> Value {
    let bs = b.dims(x)[0];
    let dn = GatherDims {
        offset_dims: vec![0],
        collapsed_slice_dims: vec![1, 2],
        start_index_map: vec![1, 2],
        index_vector_dim: 1,
        ..Default::default()
    };
    b.gather(x, idx, &dn, &[bs, 1, 1], false)
}

fn pair_index(b: &mut Builder, i: Value, j: Value) -> Value {
    let h = b.dims(i)[0];
    let i2 = b.reshape(i, &[h, 1]);
    let j2 = b.reshape(j, &[h, 1]);
    b.concatenate(&[i2, j2], 1)
}

/// The unitary J [B, N, N] of one Jacobi round: for each pair (p, q) of the round (index
/// vectors p, q [H]), the rotation with J^H A J zeroing A[p, q], where app, aqq (real) and apq
/// are the entries of the Hermitian A [B, H]. apq is first made real and non-negative by a
/// phase on index q: J = D R with D_q = conj(apq) / |apq| and R the real rotation
/// [[c, s], [-s, c]], t = s / c = sign(theta) / (|theta| + sqrt(theta^2 + 1)),
/// theta = (aqq - app) / (2 |apq|).
fn jacobi_rotation(b: &mut Builder, app: Value, aqq: Value, apq: Value, p: Value, q: Value, n: i64) -> (Value, Value) {
    let e = b.elem(apq);
    let re = e.real_type();
    let d = b.dims(app).to_vec();
    let (bs, h) = (d[0], d[1]);
    let abs = b.abs(apq);
    let zero = splat(b, 0.0, re, &d);
    let none = b.compare(CmpDir::Eq, abs, zero);
    let diff = b.sub(aqq, app);
    let two = splat(b, 2.0, re, &d);
    let den = b.mul(two, abs);
    let theta = b.div(diff, den);
    let one = splat(b, 1.0, re, &d);
    let minus = splat(b, -1.0, re, &d);
    let nonneg = b.compare(CmpDir::Ge, theta, zero);
    let sg = b.select(nonneg, one, minus);
    let th2 = b.mul(theta, theta);
    let th2p1 = b.add(th2, one);
    let root = b.sqrt(th2p1);
    let ath = b.abs(theta);
    let den2 = b.add(ath, root);
    let t = b.div(sg, den2);
    let t = b.select(none, zero, t);
    let t2 = b.mul(t, t);
    let t2p1 = b.add(t2, one);
    let c = b.rsqrt(t2p1);
    let s = b.mul(t, c);
    let (c_e, s_e) = (to_elem(b, c, e), to_elem(b, s, e));
    // The phase conj(apq) / |apq| (the sign of apq for reals), 1 when apq = 0.
    let phase = {
        let abs_e = to_elem(b, abs, e);
        let ca = conj(b, apq);
        let ph = b.div(ca, abs_e);
        let one_e = splat(b, 1.0, e, &d);
        b.select(none, one_e, ph)
    };
    let cq = b.mul(c_e, phase);
    let sq = b.mul(s_e, phase);
    let sq = b.neg(sq);
    let idx = {
        let pp = pair_index(b, p, p);
        let qq = pair_index(b, q, q);
        let pq = pair_index(b, p, q);
        let qp = pair_index(b, q, p);
        b.concatenate(&[pp, qq, pq, qp], 0)
    };
    let vals = b.concatenate(&[c_e, cq, s_e, sq], 1);
    let zeros = splat(b, 0.0, e, &[bs, n, n]);
    let _ = h;
    let j = scatter_pairs(b, zeros, idx, vals);
    // The exact change of the diagonal: a_pp - t |a_pq| and a_qq + t |a_pq|.
    let shift = b.mul(t, abs);
    (j, shift)
}

/// x [B, N, N] with the entries at the index pairs idx [K, 2] replaced by vals [B, K].
fn scatter_pairs(b: &mut Builder, x: Value, idx: Value, vals: Value) -> Value {
    let dn = ScatterDims {
        update_window_dims: vec![0],
        inserted_window_dims: vec![1, 2],
        scatter_dims_to_operand_dims: vec![1, 2],
        index_vector_dim: 1,
        indices_are_sorted: false,
        unique_indices: true,
        ..Default::default()
    };
    b.scatter(x, idx, vals, &dn, |_, _, upd| upd)
}

/// One Newton-Schulz step toward orthonormal columns, Q (3I - Q^H Q) / 2: it squares the
/// deviation from orthonormality that many accumulated rotations leave (zero columns stay zero).
fn reorthonormalize(b: &mut Builder, q: Value) -> Value {
    let d = b.dims(q).to_vec();
    let e = b.elem(q);
    let qh = adjoint(b, q);
    let g = bmm(b, qh, q);
    let three = eye3(b, e, d[0], d[2], d[2]);
    let c3 = splat(b, 3.0, e, &[d[0], d[2], d[2]]);
    let three = b.mul(three, c3);
    let m = b.sub(three, g);
    let half = splat(b, 0.5, e, &[d[0], d[2], d[2]]);
    let m = b.mul(m, half);
    bmm(b, q, m)
}

/// `round_robin(n)`'s pairs as constant tables [n - 1, n / 2] (p and q of each round).
fn round_robin_tables(b: &mut Builder, n: i64) -> (Value, Value) {
    let (ps, qs) = round_robin(n);
    let ptab = b.constant_array_i64(&ps, &[n - 1, n / 2], I64);
    let qtab = b.constant_array_i64(&qs, &[n - 1, n / 2], I64);
    (ptab, qtab)
}

/// The pair tables of round `r` (0-d i64) as two [H] index vectors.
fn round_pairs(b: &mut Builder, ptab: Value, qtab: Value, r: Value) -> (Value, Value) {
    let h = b.dims(ptab)[1];
    let zero = b.constant_i64(0, I64);
    let p = b.dynamic_slice(ptab, &[r, zero], &[1, h]);
    let q = b.dynamic_slice(qtab, &[r, zero], &[1, h]);
    (b.reshape(p, &[h]), b.reshape(q, &[h]))
}

/// Round t (0-d, counted over all sweeps) of the round-robin Jacobi sweep on Hermitian m
/// [B, N, N]: its pairs (p, q), their gather indices, the diagonal entries m_pp, m_qq (as m's
/// element type) and the rotation J with its diagonal shift (see `jacobi_rotation`).
struct JacobiRound {
    p: Value,
    q: Value,
    ipp: Value,
    iqq: Value,
    ipq: Value,
    app: Value,
    aqq: Value,
    j: Value,
    shift: Value,
}

fn jacobi_round(b: &mut Builder, m: Value, t: Value, tables: (Value, Value), rounds: i64, nn: i64) -> JacobiRound {
    let e = b.elem(m);
    let rr = b.constant_i64(rounds, I64);
    let r = b.rem(t, rr);
    let (p, q) = round_pairs(b, tables.0, tables.1, r);
    let ipp = pair_index(b, p, p);
    let iqq = pair_index(b, q, q);
    let ipq = pair_index(b, p, q);
    let app = gather_pairs(b, m, ipp);
    let app = b.real(app);
    let aqq = gather_pairs(b, m, iqq);
    let aqq = b.real(aqq);
    let apq = gather_pairs(b, m, ipq);
    let (app, aqq) = if e.is_complex() { (app, aqq) } else { (b.convert(app, e), b.convert(aqq, e)) };
    let (j, shift) = jacobi_rotation(b, app, aqq, apq, p, q, nn);
    JacobiRound { p, q, ipp, iqq, ipq, app, aqq, j, shift }
}

/// Jacobi loop budget: sweeps over all pairs before giving up on convergence.
const MAX_SWEEPS: i64 = 40;

/// Sum of |x_ij|^2 off the diagonal of [B, N, N], per batch.
fn off_diag_norm2(b: &mut Builder, x: Value) -> Value {
    let dims = b.dims(x).to_vec();
    let r = iota(b, &dims, 1);
    let c = iota(b, &dims, 2);
    let off = b.compare(CmpDir::Ne, r, c);
    let a2 = abs2(b, x);
    let zero = splat(b, 0.0, b.elem(a2), &dims);
    let a2 = b.select(off, a2, zero);
    sum(b, a2, &[1, 2])
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

/// Eigen-decomposition of Hermitian batches [B, n, n] by parallel cyclic Jacobi. Returns the
/// eigenvalues [B, n] (real, unsorted) and eigenvectors [B, n, n] (columns).
fn jacobi_eigh(b: &mut Builder, a: Value) -> (Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
    let re = e.real_type();
    // An odd size gets a decoupled zero row and column (its rotations are identities).
    let nn = n + n % 2;
    let a = if nn != n {
        let z = b.constant_f64(0.0, e);
        b.pad(a, z, &[0, 0, 0], &[0, 1, 1], &[0, 0, 0])
    } else {
        a
    };
    let (ptab, qtab) = round_robin_tables(b, nn);
    let rounds = nn - 1;
    let fro = {
        let a2 = abs2(b, a);
        sum(b, a2, &[1, 2])
    };
    // Converged when the off-diagonal part is below eps ||A||_F (the rotated pairs are zeroed
    // exactly, so rounding does not hold it above that).
    let tol = eps(e);
    let tol2 = splat(b, tol * tol, re, &[bs]);
    let limit = b.mul(tol2, fro);
    let v0 = eye3(b, e, bs, nn, nn);
    let t0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[t0, a, v0],
        |b, v| {
            let cap = b.constant_i64(MAX_SWEEPS * rounds, I64);
            let more = b.compare(CmpDir::Lt, v[0], cap);
            let off = off_diag_norm2(b, v[1]);
            let big = b.compare(CmpDir::Gt, off, limit);
            let any_big = any(b, big);
            b.and(more, any_big)
        },
        |b, v| {
            let (t, a, vecs) = (v[0], v[1], v[2]);
            let JacobiRound { p, q, ipp, iqq, ipq, app, aqq, j, shift } = jacobi_round(b, a, t, (ptab, qtab), rounds, nn);
            let jh = adjoint(b, j);
            let ja = bmm(b, jh, a);
            let a = bmm(b, ja, j);
            // The rotated pairs' diagonal entries and zeros, exactly (the product above rounds
            // them relative to the whole entries; accumulated over the rounds that is
            // much less accurate).
            let app_r = b.real(app);
            let aqq_r = b.real(aqq);
            let dp = b.sub(app_r, shift);
            let dq = b.add(aqq_r, shift);
            let dp = to_elem(b, dp, e);
            let dq = to_elem(b, dq, e);
            let dd = b.dims(dp).to_vec();
            let z = splat(b, 0.0, e, &dd);
            let iqp = pair_index(b, q, p);
            let idx = b.concatenate(&[ipp, iqq, ipq, iqp], 0);
            let vals = b.concatenate(&[dp, dq, z, z], 1);
            let a = scatter_pairs(b, a, idx, vals);
            let vecs = bmm(b, vecs, j);
            let one = b.constant_i64(1, I64);
            vec![b.add(t, one), a, vecs]
        },
    );
    // Eigenvalues as the Rayleigh quotients v^H A v of the (re-orthonormalized) eigenvectors
    // with the original A: their error is second order in the eigenvectors' error, where the
    // rotated diagonal carries the rounding of every rotation.
    let v = reorthonormalize(b, out[2]);
    let av = bmm(b, a, v);
    let vh = adjoint(b, v);
    let vav = bmm(b, vh, av);
    let dg = diag(b, vav);
    let w = b.real(dg);
    let w = b.slice(w, &[0, 0], &[bs, n], &[1, 1]);
    let v = block(b, v, (0, n), (0, n));
    (w, v)
}

/// Sorts values [B, k] (ascending, or descending) and permutes the columns of each matrix in
/// `mats` ([B, r, k]) alike.
fn sort_with_columns(b: &mut Builder, w: Value, mats: &[Value], descending: bool) -> (Value, Vec<Value>) {
    let d = b.dims(w).to_vec();
    let (bs, k) = (d[0], d[1]);
    let idx = iota(b, &d, 1);
    let sorted = b.sort(&[w, idx], 1, true, |b, a| b.compare(if descending { CmpDir::Gt } else { CmpDir::Lt }, a[0], a[1]));
    let (ws, perm) = (sorted[0], sorted[1]);
    let out = mats
        .iter()
        .map(|&m| {
            let e = b.elem(m);
            let d3 = [bs, k, k];
            let rows = iota(b, &d3, 1);
            let p3 = bcast(b, perm, &d3, &[0, 2]);
            let on = b.compare(CmpDir::Eq, rows, p3);
            let one = splat(b, 1.0, e, &d3);
            let zero = splat(b, 0.0, e, &d3);
            let pm = b.select(on, one, zero);
            bmm(b, m, pm)
        })
        .collect();
    (ws, out)
}

/// _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues ascending, eigenvectors as columns).
fn linalg_eigh(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let uplo = args.str("UPLO")?.unwrap_or("L");
    let compute_v = args.bool_or("compute_v", true)?;
    check!(uplo == "L" || uplo == "U", Runtime, "Expected UPLO argument to be 'L' or 'U', but got {}", uplo);
    let api = "linalg.eigh";
    check_square(cx, &a, api)?;
    check_lapack_dtype(a.dtype, "linalg_eigh_cpu")?;
    let mm = mats(cx, a.v);
    let rdt = a.dtype.to_real();
    let (w, v) = if mm.bs == 0 || mm.n == 0 {
        (cx.full(0.0, rdt, &[mm.bs, mm.n]), mm.v)
    } else {
        let h = hermitian_from(cx, mm.v, uplo == "L");
        let (w, v) = jacobi_eigh(cx, h);
        let (w, vs) = sort_with_columns(cx, w, &[v], false);
        (w, vs[0])
    };
    let w = unflatten(cx, w, &mm.batch);
    let v = if compute_v { unflatten(cx, v, &mm.batch) } else { cx.full(0.0, a.dtype, &[0]) };
    Ok(vec![Out::Tensor(w), Out::Tensor(v)])
}

/// Thin SVD of a batch [B, m, n] with m >= n by one-sided Jacobi: rotations J (the ones that
/// diagonalize W^H W) orthogonalize the columns of W <- W J, accumulated in V <- V J. Returns
/// (U [B, m, n] with orthonormal columns where sigma > 0 and zero columns elsewhere, sigma [B, n],
/// V [B, n, n]), unsorted.
fn jacobi_svd(b: &mut Builder, a: Value) -> (Value, Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, m, n) = (d[0], d[1], d[2]);
    let e = b.elem(a);
    let re = e.real_type();
    let nn = n + n % 2;
    let w0 = if nn != n {
        let z = b.constant_f64(0.0, e);
        b.pad(a, z, &[0, 0, 0], &[0, 0, 1], &[0, 0, 0])
    } else {
        a
    };
    let (ptab, qtab) = round_robin_tables(b, nn);
    let rounds = nn - 1;
    // LAPACK's gesvj criterion: columns p, q count as orthogonal once
    // |w_p^H w_q| <= sqrt(m) eps ||w_p|| ||w_q||.
    let tol = (m as f64).sqrt().max(1.0) * eps(e);
    let gram = |b: &mut Builder, w: Value| {
        let wh = adjoint(b, w);
        bmm(b, wh, w)
    };
    let g0 = gram(b, w0);
    let v0 = eye3(b, e, bs, nn, nn);
    let t0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[t0, w0, v0, g0],
        |b, v| {
            // Converged when every pair of columns is orthogonal to working precision:
            // |g_pq|^2 <= tol^2 g_pp g_qq.
            let cap = b.constant_i64(MAX_SWEEPS * rounds, I64);
            let more = b.compare(CmpDir::Lt, v[0], cap);
            let g = v[3];
            let d3 = [bs, nn, nn];
            let dg = diag(b, g);
            let dg = b.real(dg);
            let gi = bcast(b, dg, &d3, &[0, 1]);
            let gj = bcast(b, dg, &d3, &[0, 2]);
            let gg = b.mul(gi, gj);
            let t2 = splat(b, tol * tol, re, &d3);
            let lim = b.mul(gg, t2);
            let g2 = abs2(b, g);
            let rows = iota(b, &d3, 1);
            let cols = iota(b, &d3, 2);
            let off = b.compare(CmpDir::Ne, rows, cols);
            let big = b.compare(CmpDir::Gt, g2, lim);
            let bad = b.and(off, big);
            let any_bad = any(b, bad);
            b.and(more, any_bad)
        },
        |b, v| {
            let (t, w, vecs, g) = (v[0], v[1], v[2], v[3]);
            let j = jacobi_round(b, g, t, (ptab, qtab), rounds, nn).j;
            let w = bmm(b, w, j);
            let vecs = bmm(b, vecs, j);
            let g = gram(b, w);
            let one = b.constant_i64(1, I64);
            vec![b.add(t, one), w, vecs, g]
        },
    );
    // The rotated columns carry the rounding of every rotation: recompute them as A V from the
    // (re-orthonormalized) V.
    let vecs = reorthonormalize(b, out[2]);
    let w = bmm(b, w0, vecs);
    let w = block(b, w, (0, m), (0, n));
    let vecs = block(b, vecs, (0, n), (0, n));
    let w2 = abs2(b, w);
    let s2 = sum(b, w2, &[1]);
    let sigma = b.sqrt(s2);
    // Columns with a negligible norm carry no direction: left as zeros (completed later).
    let smax = max(b, sigma, &[1]);
    let d2 = [bs, n];
    let smax2 = bcast(b, smax, &d2, &[0]);
    let thr = splat(b, (m.max(n) as f64) * eps(e), re, &d2);
    let cut = b.mul(smax2, thr);
    let keep = b.compare(CmpDir::Gt, sigma, cut);
    let d3 = [bs, m, n];
    let s3 = bcast(b, sigma, &d3, &[0, 2]);
    let s3 = to_elem(b, s3, e);
    let u = b.div(w, s3);
    let keep3 = bcast(b, keep, &d3, &[0, 2]);
    let zeros = splat(b, 0.0, e, &d3);
    let u = b.select(keep3, u, zeros);
    (u, sigma, vecs)
}

/// An orthonormal basis [B, m, cols] whose leading columns follow those of `u` [B, m, k]
/// (nearly orthonormal, by decreasing singular value, zero columns last): the Householder QR
/// of u re-orthonormalizes them in order (a column moves only by its deviation from the ones
/// before it, so the large singular directions stay put) and completes the basis where u has
/// zero columns or none. Column j of Q is u_j / R_jj: the phase of R_jj is put back.
fn orthonormal_basis(b: &mut Builder, u: Value, cols: i64) -> Value {
    let d = b.dims(u).to_vec();
    let (bs, m, k) = (d[0], d[1], d[2]);
    let e = b.elem(u);
    let (r, vs, tau) = householder_qr(b, u);
    let q = q_columns(b, vs, tau, cols);
    let kk = k.min(cols);
    let rk = block(b, r, (0, kk), (0, kk));
    let rd = diag(b, rk);
    let mag = b.abs(rd);
    let half = splat(b, 0.5, e.real_type(), &[bs, kk]);
    let present = b.compare(CmpDir::Gt, mag, half);
    let mag_e = to_elem(b, mag, e);
    let ph = b.div(rd, mag_e);
    let ones = splat(b, 1.0, e, &[bs, kk]);
    let ph = b.select(present, ph, ones);
    let ph = if cols > kk {
        let rest = splat(b, 1.0, e, &[bs, cols - kk]);
        b.concatenate(&[ph, rest], 1)
    } else {
        ph
    };
    let ph3 = bcast(b, ph, &[bs, m, cols], &[0, 2]);
    b.mul(q, ph3)
}

/// SVD of a batch [B, m, n]: (U [B, m, m or k], S [B, k] descending, Vh [B, n or k, n]).
fn svd_batch(b: &mut Builder, a: Value, full: bool, compute_uv: bool) -> (Value, Value, Value) {
    let d = b.dims(a).to_vec();
    let (m, n) = (d[1], d[2]);
    let wide = m < n;
    let src = if wide { adjoint(b, a) } else { a };
    // src is tall: src = U1 S V1^H with U1 [B, M, k], V1 [B, k, k].
    let (u1, s, v1) = jacobi_svd(b, src);
    let (s, sorted) = sort_with_columns(b, s, &[u1, v1], true);
    if !compute_uv {
        return (u1, s, v1);
    }
    let big = if wide { n } else { m };
    let k = m.min(n);
    let u1 = orthonormal_basis(b, sorted[0], if full { big } else { k });
    let v1 = sorted[1];
    if wide {
        // A = V1 S U1^H.
        let vh = adjoint(b, u1);
        (v1, s, vh)
    } else {
        let vh = adjoint(b, v1);
        (u1, s, vh)
    }
}

/// _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh).
fn linalg_svd(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("A")?;
    let full = args.bool_or("full_matrices", false)?;
    let compute_uv = args.bool_or("compute_uv", true)?;
    let api = "linalg.svd";
    check_matrix(cx, &a, api)?;
    check_float_or_complex(&a, api)?;
    check!(
        args.str("driver")?.is_none(),
        Runtime,
        "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend."
    );
    check_lapack_dtype(a.dtype, "linalg_svd_cpu")?;
    let mm = mats(cx, a.v);
    let k = mm.m.min(mm.n);
    let rdt = a.dtype.to_real();
    let e = a.dtype.elem();
    let (u, s, vh) = if mm.bs == 0 || k == 0 {
        let (uc, vr) = if full { (mm.m, mm.n) } else { (k, k) };
        (eye3(cx, e, mm.bs, mm.m, uc), cx.full(0.0, rdt, &[mm.bs, k]), eye3(cx, e, mm.bs, vr, mm.n))
    } else {
        svd_batch(cx, mm.v, full, compute_uv)
    };
    let s = unflatten(cx, s, &mm.batch);
    if !compute_uv {
        let empty = cx.full(0.0, a.dtype, &[0]);
        return Ok(vec![Out::Tensor(empty), Out::Tensor(s), Out::Tensor(empty)]);
    }
    let u = unflatten(cx, u, &mm.batch);
    let vh = unflatten(cx, vh, &mm.batch);
    Ok(vec![Out::Tensor(u), Out::Tensor(s), Out::Tensor(vh)])
}

// ---- least squares, matrix exponential ----------------------------------------------------------

/// linalg_lstsq(self=A, b, rcond, driver) -> (solution, residuals, rank, singular_values).
/// The solution is the minimum-norm least-squares one from the SVD, with singular values at or
/// below rcond * s_max dropped (rcond defaults to eps * max(m, n)); for full-rank problems every
/// LAPACK driver gives the same. Like PyTorch's CPU drivers: gelsy (default) returns the rank,
/// gelsd/gelss the rank, residuals and singular values, gels the residuals; residuals are
/// returned for m > n (computed for a full-rank A).
fn linalg_lstsq(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let bt = args.tensor("b")?;
    let api = "torch.linalg.lstsq";
    let driver = args.str("driver")?.unwrap_or("gelsy");
    check!(
        matches!(driver, "gels" | "gelsy" | "gelsd" | "gelss"),
        Runtime,
        "{}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)",
        api
    );
    let (da, db) = (cx.dims(a.v), cx.dims(bt.v));
    check!(da.len() >= 2, Runtime, "{}: input must have at least 2 dimensions.", api);
    check!(!db.is_empty(), Runtime, "{}: other must have at least 1 dimension.", api);
    check!(
        a.dtype == bt.dtype,
        Runtime,
        "{}: Expected input and other to have the same dtype, but got input's dtype {} and other's dtype {}",
        api,
        a.dtype.torch_name(),
        bt.dtype.torch_name()
    );
    check!(
        da.len() >= db.len() && da.len() - db.len() <= 1,
        Runtime,
        "{}: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1",
        api
    );
    let vector = db.len() + 1 == da.len();
    let m = da[da.len() - 2];
    let n = da[da.len() - 1];
    if vector {
        check!(db[db.len() - 1] == m, Runtime, "{}: input.size(-2) should match other.size(-1)", api);
    } else {
        check!(db[db.len() - 2] == m, Runtime, "{}: input.size(-2) should match other.size(-2)", api);
    }
    check!(
        a.dtype.is_float() || a.dtype.is_complex(),
        Runtime,
        "linalg.lstsq: Expected a floating point or complex tensor as input. Got {}",
        a.dtype.torch_name()
    );
    check_lapack_dtype(a.dtype, "linalg_lstsq_cpu")?;
    let b2 = if vector {
        let mut s = db.clone();
        s.push(1);
        cx.reshape(bt.v, &s)
    } else {
        bt.v
    };
    let batch = broadcast_batch(cx, a.v, b2)?;
    let bv = expand_batch(cx, b2, &batch);
    let bm = mats(cx, bv);
    // The SVD (and so rank and singular values) per matrix of A, broadcast for the solve.
    let own = mats(cx, a.v);
    let k = bm.n;
    let e = a.dtype.elem();
    let rdt = a.dtype.to_real();
    let re = rdt.elem();
    let mn = m.min(n);
    let rcond = match args.get("rcond") {
        Some(crate::Arg::Float(f)) => f.value,
        _ => eps(e) * (m.max(n) as f64),
    };
    let widen = |cx: &mut Cx, v: Value| {
        let v = unflatten(cx, v, &own.batch);
        let rest = cx.dims(v)[own.batch.len()..].to_vec();
        let mut target = batch.clone();
        target.extend_from_slice(&rest);
        let v = cx.broadcast_to(v, &target);
        let d = cx.dims(v);
        let mut f = vec![bm.bs];
        f.extend_from_slice(&d[batch.len()..]);
        cx.reshape(v, &f)
    };
    let (x, s, rank) = if own.bs == 0 || bm.bs == 0 || mn == 0 {
        let s = cx.full(0.0, rdt, &[own.bs, mn]);
        (cx.full(0.0, a.dtype, &[bm.bs, n, k]), s, cx.full(0.0, DType::I64, &[own.bs]))
    } else {
        let (u, s, vh) = svd_batch(cx, own.v, false, true);
        let smax = max(cx, s, &[1]);
        let d2 = [own.bs, mn];
        let smax2 = bcast(cx, smax, &d2, &[0]);
        let rc = splat(cx, rcond, re, &d2);
        let cut = cx.mul(smax2, rc);
        let keep = cx.compare(CmpDir::Gt, s, cut);
        let one = splat(cx, 1.0, re, &d2);
        let inv = cx.div(one, s);
        let zero = splat(cx, 0.0, re, &d2);
        let inv = cx.select(keep, inv, zero);
        let ones = splat(cx, 1.0, I64, &d2);
        let zeros = splat(cx, 0.0, I64, &d2);
        let counted = cx.select(keep, ones, zeros);
        let rank = sum(cx, counted, &[1]);
        // x = V diag(1/s) U^H b
        let (u, inv, vh) = (widen(cx, u), widen(cx, inv), widen(cx, vh));
        let uh = adjoint(cx, u);
        let ub = bmm(cx, uh, bm.v);
        let d3 = [bm.bs, mn, k];
        let inv3 = bcast(cx, inv, &d3, &[0, 1]);
        let inv3 = to_elem(cx, inv3, e);
        let scaled = cx.mul(ub, inv3);
        let v = adjoint(cx, vh);
        let x = bmm(cx, v, scaled);
        (x, s, rank)
    };
    let residuals = if driver != "gelsy" && m > n && bm.bs > 0 && own.bs > 0 {
        let aw = widen(cx, own.v);
        let ax = bmm(cx, aw, x);
        let r = cx.sub(ax, bm.v);
        let r2 = abs2(cx, r);
        let res = sum(cx, r2, &[1]);
        unflatten(cx, res, &batch)
    } else {
        cx.full(0.0, rdt, &[0])
    };
    let x = unflatten(cx, x, &batch);
    let x = if vector {
        let mut d = cx.dims(x);
        d.pop();
        cx.reshape(x, &d)
    } else {
        x
    };
    let rank = if driver == "gels" { cx.full(0.0, DType::I64, &[0]) } else { cx.reshape(rank, &own.batch) };
    let sv = if matches!(driver, "gelsd" | "gelss") { unflatten(cx, s, &own.batch) } else { cx.full(0.0, rdt, &[0]) };
    Ok(vec![Out::Tensor(x), Out::Tensor(residuals), Out::Tensor(rank), Out::Tensor(sv)])
}

/// sum_j c_j M_j over matrices of one shape, accumulated in order (PyTorch's
/// _compute_linear_combination); the coefficients are rounded to the real type first.
fn lin_comb(b: &mut Builder, ms: &[Value], cs: &[f64]) -> Value {
    let e = b.elem(ms[0]);
    let dims = b.dims(ms[0]).to_vec();
    let round = |c: f64| if e.real_type() == ElemType::F64 { c } else { c as f32 as f64 };
    let mut acc = splat(b, 0.0, e, &dims);
    for (&m, &c) in ms.iter().zip(cs) {
        let cv = splat(b, round(c), e, &dims);
        let t = b.mul(m, cv);
        acc = b.add(acc, t);
    }
    acc
}

/// The Taylor approximations of exp(A) PyTorch's mexp uses (Bader, Blanes, Casas 2019): degree
/// 1, 2, 4, 8, 12 or 18, each evaluated with PyTorch's sequence of products and combinations.
#[allow(clippy::excessive_precision)]
fn mexp_taylor(b: &mut Builder, a: Value, degree: u32) -> Value {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
    let id = eye3(b, e, bs, n, n);
    match degree {
        1 => b.add(id, a),
        2 => {
            let a2 = bmm(b, a, a);
            let two = splat(b, 2.0, e, &d);
            let h = b.div(a2, two);
            let s = b.add(id, a);
            b.add(s, h)
        }
        4 => {
            let a2 = bmm(b, a, a);
            let c = lin_comb(b, &[id, a, a2], &[1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0]);
            let t = bmm(b, a2, c);
            lin_comb(b, &[id, a, a2, t], &[1.0, 1.0, 0.0, 1.0])
        }
        8 => {
            // The constants as PyTorch's constexpr scalar_t computes them.
            let f = |x: f64| if e.real_type() == ElemType::F64 { x } else { x as f32 as f64 };
            let sqrt_177 = f(0.1330413469565007072504e+2);
            let x3 = f(2.0 / 3.0);
            let x1 = f(x3 * ((1.0 + sqrt_177) / 88.0));
            let x2 = f(x3 * ((1.0 + sqrt_177) / 352.0));
            let x4 = f((-271.0 + 29.0 * sqrt_177) / (315.0 * x3));
            let x5 = f((-11.0 + 11.0 * sqrt_177) / (1260.0 * x3));
            let x6 = f((-99.0 + 11.0 * sqrt_177) / (5040.0 * x3));
            let x7 = f((89.0 - sqrt_177) / (5040.0 * x3));
            let y2 = f((857.0 - 58.0 * sqrt_177) / 630.0);
            let a2 = bmm(b, a, a);
            let c = lin_comb(b, &[a, a2], &[x1, x2]);
            let a4 = bmm(b, a2, c);
            let l = lin_comb(b, &[a2, a4], &[x3, 1.0]);
            let r = lin_comb(b, &[id, a, a2, a4], &[x4, x5, x6, x7]);
            let a8 = bmm(b, l, r);
            lin_comb(b, &[id, a, a2, a4, a8], &[1.0, 1.0, y2, 0.0, 1.0])
        }
        12 => {
            const B: [[f64; 4]; 4] = [
                [9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740],
                [5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989],
                [0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230],
                [-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359],
            ];
            let a2 = bmm(b, a, a);
            let a3 = bmm(b, a, a2);
            let ps = [id, a, a2, a3];
            let bsv: Vec<Value> = B.iter().map(|row| lin_comb(b, &ps, row)).collect();
            let a6 = bmm(b, bsv[3], bsv[3]);
            let b2 = b.add(bsv[2], a6);
            let l = b.add(bsv[1], b2);
            let p = bmm(b, l, b2);
            b.add(bsv[0], p)
        }
        _ => {
            const B: [[f64; 5]; 5] = [
                [0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.],
                [
                    0.,
                    3.97849749499645077844e-01,
                    1.36783778460411720168e+00,
                    4.98289622525382669416e-01,
                    -6.37898194594723280150e-04,
                ],
                [
                    -1.09676396052962061844e+01,
                    1.68015813878906206114e+00,
                    5.71779846478865511061e-02,
                    -6.98210122488052056106e-03,
                    3.34975017086070470649e-05,
                ],
                [
                    -9.04316832390810593223e-02,
                    -6.76404519071381882256e-02,
                    6.75961301770459654925e-02,
                    2.95552570429315521194e-02,
                    -1.39180257516060693404e-05,
                ],
                [0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05],
            ];
            let a2 = bmm(b, a, a);
            let a3 = bmm(b, a, a2);
            let a6 = bmm(b, a3, a3);
            let ps = [id, a, a2, a3, a6];
            let bsv: Vec<Value> = B.iter().map(|row| lin_comb(b, &ps, row)).collect();
            let a9 = bmm(b, bsv[0], bsv[4]);
            let b3 = b.add(bsv[3], a9);
            let l = b.add(bsv[2], b3);
            let p = bmm(b, l, b3);
            b.add(bsv[1], p)
        }
    }
}

/// linalg_matrix_exp(self), as PyTorch's mexp: a single matrix uses the Taylor degree its 1-norm
/// calls for (1, 2, 4, 8, 12 up to the thresholds, else 18); batches always use degree 18. Degree
/// 18 runs on A / 2^s with s = max(0, ceil(log2(||A||_1 / theta_18))), then squares s times.
/// 16-bit floats are computed in float32 (PyTorch's kernels misread their coefficients there).
#[allow(clippy::excessive_precision)]
fn linalg_matrix_exp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let api = "linalg.matrix_exp";
    check_square(cx, &a, api)?;
    check_float_or_complex(&a, api)?;
    check!(
        matches!(a.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::C64 | DType::C128),
        NotImplemented,
        "\"linalg_matrix_exp\" not implemented for '{}'",
        a.dtype.torch_name()
    );
    let wide = match a.dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    };
    let mm = mats(cx, a.v);
    if mm.bs == 0 || mm.n == 0 {
        return one(a.v);
    }
    if mm.n == 1 {
        let x = cx.convert(a.v, wide.elem());
        let r = cx.exp(x);
        return one(cx.convert(r, a.dtype.elem()));
    }
    let (bs, n) = (mm.bs, mm.n);
    let e = wide.elem();
    let re = e.real_type();
    let x = cx.convert(mm.v, e);
    let thetas: [f64; 6] = if re == ElemType::F64 {
        [2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04, 4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00]
    } else {
        [1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02, 5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00]
    };
    let th = |t: f64| if re == ElemType::F64 { t } else { t as f32 as f64 };
    // 1-norm: the largest column sum of |a_ij|.
    let ab = cx.abs(x);
    let colsum = sum(cx, ab, &[1]);
    let norm = max(cx, colsum, &[1]);
    // Degree 18 with scaling and squaring.
    let t18 = {
        let th18 = splat(cx, th(thetas[5]), re, &[bs]);
        let q = cx.div(norm, th18);
        // ceil(log2(q)), exact at powers of two: log(q) / ln 2, then corrected by one step
        // where 2^(s - 1) already reaches q or 2^s falls short of it.
        let lg = cx.log(q);
        let inv_ln2 = splat(cx, 1.0 / std::f64::consts::LN_2, re, &[bs]);
        let lg = cx.mul(lg, inv_ln2);
        let s = cx.ceil(lg);
        let two = splat(cx, 2.0, re, &[bs]);
        let one_r = splat(cx, 1.0, re, &[bs]);
        let sm1 = cx.sub(s, one_r);
        let p_lo = cx.pow(two, sm1);
        let too_big = cx.compare(CmpDir::Ge, p_lo, q);
        let s = cx.select(too_big, sm1, s);
        let p_hi = cx.pow(two, s);
        let too_small = cx.compare(CmpDir::Lt, p_hi, q);
        let sp1 = cx.add(s, one_r);
        let s = cx.select(too_small, sp1, s);
        let zero = splat(cx, 0.0, re, &[bs]);
        let s = cx.max(s, zero);
        let fin = cx.is_finite(s);
        let s = cx.select(fin, s, zero);
        let cap = splat(cx, 1100.0, re, &[bs]);
        let s = cx.min(s, cap);
        let two = splat(cx, 2.0, re, &[bs]);
        let ns = cx.neg(s);
        let scale = cx.pow(two, ns);
        let d3 = [bs, n, n];
        let scale3 = bcast(cx, scale, &d3, &[0]);
        let scale3 = to_elem(cx, scale3, e);
        let xs = cx.mul(x, scale3);
        let t = mexp_taylor(cx, xs, 18);
        let si = cx.convert(s, I64);
        let z0 = cx.b.constant_i64(0, I64);
        let smax = cx.reduce(&[si], &[z0], &[0], |b, v| vec![b.max(v[0], v[1])])[0];
        let k0 = cx.b.constant_i64(0, I64);
        let out = cx.while_loop(
            &[k0, t],
            |b, v| b.compare(CmpDir::Lt, v[0], smax),
            |b, v| {
                let (k, t) = (v[0], v[1]);
                let sq = bmm(b, t, t);
                let kb = bcast0(b, k, &[bs]);
                let more = b.compare(CmpDir::Lt, kb, si);
                let more3 = bcast(b, more, &d3, &[0]);
                let t = b.select(more3, sq, t);
                let one = b.constant_i64(1, I64);
                vec![b.add(k, one), t]
            },
        );
        out[1]
    };
    let r = if bs > 1 {
        t18
    } else {
        // One matrix: the degree its norm calls for; a NaN norm matches no interval (NaN result).
        let d3 = [bs, n, n];
        let mut r = splat(cx, f64::NAN, e, &d3);
        let mut lower = -1.0;
        for (i, deg) in [1u32, 2, 4, 8, 12].into_iter().enumerate() {
            let t = mexp_taylor(cx, x, deg);
            let lo = splat(cx, lower, re, &[bs]);
            let hi = splat(cx, th(thetas[i]), re, &[bs]);
            let above = cx.compare(CmpDir::Gt, norm, lo);
            let below = cx.compare(CmpDir::Le, norm, hi);
            let inside = cx.and(above, below);
            let inside = bcast(cx, inside, &d3, &[0]);
            r = cx.select(inside, t, r);
            lower = th(thetas[i]);
        }
        let lo = splat(cx, th(thetas[4]), re, &[bs]);
        let large = cx.compare(CmpDir::Ge, norm, lo);
        let large = bcast(cx, large, &d3, &[0]);
        cx.select(large, t18, r)
    };
    let r = cx.convert(r, a.dtype.elem());
    one(unflatten(cx, r, &mm.batch))
}

// ---- torch.cholesky's error check ---------------------------------------------------------------

/// The size program of `cholesky`: 0 when every matrix factors, else bi * (n + 1) + info of the
/// first batch element bi that fails (so the lowering can raise like the CPU kernel does).
fn cholesky_failure(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let t = args.tensor("self")?;
    let upper = args.bool_or("upper", false)?;
    let (_, info) = cholesky_common(cx, &t, upper, "cholesky")?;
    let d = cx.dims(t.v);
    let n = d[d.len() - 1];
    let info = cx.convert(info, I64);
    let bs = numel(&cx.dims(info));
    let info = cx.reshape(info, &[bs]);
    if bs == 0 {
        return one(cx.b.constant_i64(0, I64));
    }
    let idx = iota(cx, &[bs], 0);
    let np1 = splat(cx, (n + 1) as f64, I64, &[bs]);
    let code = cx.mul(idx, np1);
    let code = cx.add(code, info);
    let zero = splat(cx, 0.0, I64, &[bs]);
    let failed = cx.compare(CmpDir::Ne, info, zero);
    let big = splat(cx, i64::MAX as f64, I64, &[bs]);
    let code = cx.select(failed, code, big);
    let lo = cx.b.constant_i64(i64::MAX, I64);
    let first = cx.reduce(&[code], &[lo], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
    let none = cx.b.constant_i64(i64::MAX, I64);
    let is_none = cx.compare(CmpDir::Eq, first, none);
    let z = cx.b.constant_i64(0, I64);
    one(cx.select(is_none, z, first))
}

/// cholesky(self, upper) (the deprecated torch.cholesky): raises for a matrix that is not
/// positive definite, like the CPU kernel (a RuntimeError: the engine has no LinAlgError).
fn cholesky(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let t = args.tensor("self")?;
    let upper = args.bool_or("upper", false)?;
    let code = args.int("__size")?;
    if code != 0 {
        let d = cx.dims(t.v);
        let n = d[d.len() - 1];
        let (bi, order) = (code / (n + 1), code % (n + 1));
        let prefix = if d.len() > 2 { format!("(Batch element {bi}): ") } else { String::new() };
        bail!(
            Runtime,
            "cholesky: {}The factorization could not be completed because the input is not positive-definite (the leading minor of order {} is not positive-definite).",
            prefix,
            order
        );
    }
    let (l, _) = cholesky_common(cx, &t, upper, "cholesky")?;
    one(l)
}
