//! LU and the solvers built on it: linalg_lu_factor_ex, linalg_lu, lu_unpack, linalg_lu_solve,
//! _linalg_solve_ex, linalg_inv_ex, _linalg_det and _linalg_slogdet.
//!
//! LU with partial pivoting (LAPACK getrf: the first row of largest magnitude is the pivot) is a
//! while loop over the columns, each step a row swap and a rank-1 update of the whole batch.
use crate::args::{Args, Tensor};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{adjoint, batch_col, batch_entry, bcast, bcast0, block, bmm, broadcast_batch, check_float_or_complex, check_lapack_dtype, check_matrix, check_square, diag, expand_batch, eye3, first_argmax, iota, lt_const, mats, numel, pivot_magnitude, prod, splat, sum, to_elem, tri, trsm, unflatten, I32, I64, Mats};
use stablehlo::{Builder, CmpDir, ElemType, Value};

pub(crate) const OPS: &[Op] = &[
    op("linalg_lu_factor_ex", linalg_lu_factor_ex),
    op("linalg_lu", linalg_lu),
    op("lu_unpack", lu_unpack),
    op("linalg_lu_solve", linalg_lu_solve),
    op("_linalg_solve_ex", linalg_solve_ex),
    op("linalg_inv_ex", linalg_inv_ex),
    op("_linalg_det", linalg_det),
    op("_linalg_slogdet", linalg_slogdet),
];

// ---- LU ---------------------------------------------------------------------------------------

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
