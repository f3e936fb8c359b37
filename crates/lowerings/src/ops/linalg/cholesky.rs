//! Cholesky and triangular solves: linalg_cholesky_ex, cholesky (with torch.cholesky's error
//! check), cholesky_inverse, _cholesky_solve_helper, linalg_solve_triangular and
//! triangular_solve. Both are StableHLO ops (stablehlo.cholesky, stablehlo.triangular_solve).
use crate::args::{Args, Tensor};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use super::{adjoint, any, any_over, batch_col, batch_entry, bcast, bcast0, bmm, broadcast_batch, check_float_or_complex, check_lapack_dtype, check_square, conj, diag, expand_batch, eye3, iota, mats, numel, splat, to_elem, tri, trsm, unflatten, I32, I64};
use stablehlo::{Builder, CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("linalg_cholesky_ex", linalg_cholesky_ex),
    op("cholesky", cholesky).sized(cholesky_failure),
    op("cholesky_inverse", cholesky_inverse),
    op("_cholesky_solve_helper", cholesky_solve_helper),
    op("linalg_solve_triangular", linalg_solve_triangular),
    op("triangular_solve", triangular_solve),
];

// ---- Cholesky ---------------------------------------------------------------------------------

/// The Hermitian matrix a LAPACK routine sees when it reads only one triangle of `a`
/// (the diagonal's imaginary part is ignored).
pub(crate) fn hermitian_from(b: &mut Builder, a: Value, lower: bool) -> Value {
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
