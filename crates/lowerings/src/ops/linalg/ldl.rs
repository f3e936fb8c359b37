//! LDL^T with Bunch-Kaufman pivoting: linalg_ldl_factor_ex and linalg_ldl_solve, reproducing
//! LAPACK's sytrf/hetrf and sytrs/hetrs step for step (PyTorch returns their results as
//! they are).
use crate::args::Args;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
// cabs1 is LAPACK's name for the pivot magnitude (pivot_magnitude), |re| + |im|.
use super::{any_over, bcast as bc, check_float_or_complex, check_lapack_dtype, check_square, conj as conj_of, first_argmax, flat_batch, from_lower, iota as idx, ispl, max as max_over, pick, pick_col, pick_row, pivot_magnitude as cabs1, splat as spl, sum as sum_over, swap_lines, to_elem as as_elem, with_batch, I64E};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    // With check_errors, the size program finds the first failed factorization.
    op("linalg_ldl_factor_ex", linalg_ldl_factor_ex).sized(ldl_factor_failure),
    op("linalg_ldl_solve", linalg_ldl_solve),
];

/// Bunch-Kaufman's alpha = (1 + sqrt(17)) / 8 in the working precision.
fn bk_alpha(e: ElemType) -> f64 {
    if e.real_type() == ElemType::F64 {
        (1.0 + 17f64.sqrt()) / 8.0
    } else {
        ((1.0f32 + 17f32.sqrt()) / 8.0f32) as f64
    }
}

/// Where both the row and the column of [B, n, n] compare `dir` to k3 (k per batch element,
/// broadcast to `d3`): the trailing matrix a step of sytf2 swaps or updates.
fn trailing_mask(b: &mut Builder, d3: &[i64], k3: Value, dir: CmpDir) -> Value {
    let r3 = idx(b, d3, 1);
    let c3 = idx(b, d3, 2);
    let rk = b.compare(dir, r3, k3);
    let ck = b.compare(dir, c3, k3);
    b.and(rk, ck)
}

/// 1 / d for the 1x1 pivots d [B]; a Hermitian D has a real diagonal, so only the real part is
/// inverted (sytf2/hetf2 scale by it, sytrs/hetrs divide by it).
fn recip_pivot(b: &mut Builder, d: Value, hermitian: bool) -> Value {
    let e = b.elem(d);
    let dims = b.dims(d).to_vec();
    if hermitian {
        let r = b.real(d);
        let one = spl(b, 1.0, e.real_type(), &dims);
        let q = b.div(one, r);
        as_elem(b, q, e)
    } else {
        let one = spl(b, 1.0, e, &dims);
        b.div(one, d)
    }
}

/// LAPACK's ?sytf2 / ?hetf2 with uplo = 'L' on a batch [B, n, n] (read from the lower triangle):
/// each step picks a 1x1 or 2x2 pivot by Bunch-Kaufman's test, swaps it into place within the
/// trailing matrix and updates that matrix. Returns (LD with L's multipliers and D below and on
/// the diagonal, zeros above; LAPACK's pivots [B, n] (int32, 1-based, negative for 2x2 blocks);
/// info [B] (int32: the first zero pivot column)). Each batch element advances its own column.
fn ldl_factor(b: &mut Builder, a: Value, hermitian: bool) -> (Value, Value, Value) {
    let d3 = b.dims(a).to_vec();
    let (bs, n) = (d3[0], d3[1]);
    let e = b.elem(a);
    let re = e.real_type();
    let hermitian = hermitian && e.is_complex();
    let s0 = from_lower(b, a, hermitian);
    let piv0 = b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs, n]));
    let info0 = b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs]));
    let k0 = ispl(b, 0, &[bs]);
    let alpha = bk_alpha(e);
    // The magnitude Bunch-Kaufman compares a diagonal entry by (a Hermitian diagonal is real).
    let diag_mag = |b: &mut Builder, x: Value| -> Value {
        if hermitian {
            let r = b.real(x);
            b.abs(r)
        } else {
            cabs1(b, x)
        }
    };
    let out = b.while_loop(
        &[k0, s0, piv0, info0],
        |b, v| {
            let nn = ispl(b, n, &[bs]);
            let lt = b.compare(CmpDir::Lt, v[0], nn);
            any_over(b, lt, &[0])
        },
        |b, v| {
            let (k, s, piv, info) = (v[0], v[1], v[2], v[3]);
            let d2 = [bs, n];
            let one = ispl(b, 1, &[bs]);
            let nm1 = ispl(b, n - 1, &[bs]);
            let nn = ispl(b, n, &[bs]);
            let active = b.compare(CmpDir::Lt, k, nn);
            let kc = b.min(k, nm1);
            let rows2 = idx(b, &d2, 1);
            let k2 = bc(b, kc, &d2, &[0]);
            let neg = spl(b, -1.0, re, &d2);
            // Column k, its diagonal and the largest entry below it.
            let colk = pick_col(b, s, kc);
            let akk = pick(b, colk, kc);
            let absakk = diag_mag(b, akk);
            let below_k = b.compare(CmpDir::Gt, rows2, k2);
            let mags = cabs1(b, colk);
            let mags = b.select(below_k, mags, neg);
            let (imax, colmax) = first_argmax(b, mags, 1, -1.0);
            let zr = spl(b, 0.0, re, &[bs]);
            let colmax = b.max(colmax, zr);
            let imax = b.min(imax, nm1);
            // The largest off-diagonal entry of row/column imax in the trailing matrix.
            let rowi = pick_row(b, s, imax);
            let i2 = bc(b, imax, &d2, &[0]);
            let ge_k = b.compare(CmpDir::Ge, rows2, k2);
            let ne_i = b.compare(CmpDir::Ne, rows2, i2);
            let off = b.and(ge_k, ne_i);
            let rmag = cabs1(b, rowi);
            let rmag = b.select(off, rmag, neg);
            let rowmax = max_over(b, rmag, &[1]);
            let aii = pick(b, rowi, imax);
            let absaii = diag_mag(b, aii);
            // Bunch-Kaufman's choice.
            let mx = b.max(absakk, colmax);
            let is_zero = b.compare(CmpDir::Eq, mx, zr);
            let nan = b.compare(CmpDir::Ne, absakk, absakk);
            let zero_col = b.or(is_zero, nan);
            let al = spl(b, alpha, re, &[bs]);
            let acol = b.mul(al, colmax);
            let case_a = b.compare(CmpDir::Ge, absakk, acol);
            let ratio = b.div(colmax, rowmax);
            let t = b.mul(acol, ratio);
            let case_b = b.compare(CmpDir::Ge, absakk, t);
            let arow = b.mul(al, rowmax);
            let case_c = b.compare(CmpDir::Ge, absaii, arow);
            let keep_k = b.or(case_a, case_b);
            let keep_k = b.or(keep_k, zero_col);
            let one_by_one = b.or(keep_k, case_c);
            let kp = b.select(keep_k, kc, imax);
            let two = ispl(b, 2, &[bs]);
            let kstep = b.select(one_by_one, one, two);
            let kk = b.add(kc, kstep);
            let kk = b.sub(kk, one);
            // Symmetric interchange of kk and kp within the trailing matrix (rows, cols >= k).
            let swap = b.compare(CmpDir::Ne, kp, kk);
            let swap = b.and(swap, active);
            let s = {
                let d3 = [bs, n, n];
                let p = swap_lines(b, s, kk, kp, 1);
                let p = swap_lines(b, p, kk, kp, 2);
                let k3 = bc(b, kc, &d3, &[0]);
                let trailing = trailing_mask(b, &d3, k3, CmpDir::Ge);
                let sw3 = bc(b, swap, &d3, &[0]);
                let use_p = b.and(trailing, sw3);
                b.select(use_p, p, s)
            };
            // The update of the trailing matrix.
            let d3 = [bs, n, n];
            let r3 = idx(b, &d3, 1);
            let c3 = idx(b, &d3, 2);
            let k3 = bc(b, kc, &d3, &[0]);
            let colk = pick_col(b, s, kc);
            let colk1 = {
                let kc1 = b.add(kc, one);
                let kc1 = b.min(kc1, nm1);
                pick_col(b, s, kc1)
            };
            let dkk = pick(b, colk, kc);
            let upd1 = {
                // 1x1: A(i, j) += x_i * (-1/d * x_j) for i, j > k; column k scaled by 1/d.
                let dinv = recip_pivot(b, dkk, hermitian);
                let z2 = spl(b, 0.0, e, &d2);
                let x = b.select(below_k, colk, z2);
                let xj = if hermitian { conj_of(b, x) } else { x };
                let ndinv = b.neg(dinv);
                let nd2 = bc(b, ndinv, &d2, &[0]);
                let temp = b.mul(nd2, xj);
                let xi3 = bc(b, x, &d3, &[0, 1]);
                let t3 = bc(b, temp, &d3, &[0, 2]);
                let prod = b.mul(xi3, t3);
                let upd = b.add(s, prod);
                let trailing = trailing_mask(b, &d3, k3, CmpDir::Gt);
                let upd = b.select(trailing, upd, s);
                let d2b = bc(b, dinv, &d2, &[0]);
                let scaled = b.mul(x, d2b);
                let scaled3 = bc(b, scaled, &d3, &[0, 1]);
                let at_k = b.compare(CmpDir::Eq, c3, k3);
                let below3 = b.compare(CmpDir::Gt, r3, k3);
                let store = b.and(at_k, below3);
                b.select(store, scaled3, upd)
            };
            let upd2 = {
                // 2x2: with d21 = A(k+1, k), W = (x y) D^-1 for the columns x, y below k + 1.
                let kc1 = b.add(kc, one);
                let kc1 = b.min(kc1, nm1);
                let d21 = pick(b, colk, kc1);
                let dk1k1 = pick(b, colk1, kc1);
                let k1 = b.add(kc, one);
                let k12 = bc(b, k1, &d2, &[0]);
                let below_k1 = b.compare(CmpDir::Gt, rows2, k12);
                let z2 = spl(b, 0.0, e, &d2);
                let x = b.select(below_k1, colk, z2);
                let y = b.select(below_k1, colk1, z2);
                let (wk, wkp1) = if hermitian {
                    let dd = b.abs(d21);
                    let r11 = b.real(dk1k1);
                    let r22 = b.real(dkk);
                    let d11 = b.div(r11, dd);
                    let d22 = b.div(r22, dd);
                    let onev = spl(b, 1.0, re, &[bs]);
                    let pr = b.mul(d11, d22);
                    let pr = b.sub(pr, onev);
                    let tt = b.div(onev, pr);
                    let dd2 = as_elem(b, dd, e);
                    let d21n = b.div(d21, dd2);
                    let dscale = b.div(tt, dd);
                    let dscale = as_elem(b, dscale, e);
                    let d11e = as_elem(b, d11, e);
                    let d22e = as_elem(b, d22, e);
                    let d11v = bc(b, d11e, &d2, &[0]);
                    let d22v = bc(b, d22e, &d2, &[0]);
                    let d21v = bc(b, d21n, &d2, &[0]);
                    let d21c = conj_of(b, d21n);
                    let d21cv = bc(b, d21c, &d2, &[0]);
                    let ds = bc(b, dscale, &d2, &[0]);
                    let a1 = b.mul(d11v, x);
                    let a2 = b.mul(d21v, y);
                    let w = b.sub(a1, a2);
                    let wk = b.mul(ds, w);
                    let b1 = b.mul(d22v, y);
                    let b2 = b.mul(d21cv, x);
                    let w1 = b.sub(b1, b2);
                    let wkp1 = b.mul(ds, w1);
                    (wk, wkp1)
                } else {
                    let d11 = b.div(dk1k1, d21);
                    let d22 = b.div(dkk, d21);
                    let onev = spl(b, 1.0, e, &[bs]);
                    let pr = b.mul(d11, d22);
                    let pr = b.sub(pr, onev);
                    let t = b.div(onev, pr);
                    let dsc = b.div(t, d21);
                    let d11v = bc(b, d11, &d2, &[0]);
                    let d22v = bc(b, d22, &d2, &[0]);
                    let ds = bc(b, dsc, &d2, &[0]);
                    let a1 = b.mul(d11v, x);
                    let w = b.sub(a1, y);
                    let wk = b.mul(ds, w);
                    let b1 = b.mul(d22v, y);
                    let w1 = b.sub(b1, x);
                    let wkp1 = b.mul(ds, w1);
                    (wk, wkp1)
                };
                let (wkj, wkp1j) = if hermitian { (conj_of(b, wk), conj_of(b, wkp1)) } else { (wk, wkp1) };
                let xi3 = bc(b, x, &d3, &[0, 1]);
                let yi3 = bc(b, y, &d3, &[0, 1]);
                let wk3 = bc(b, wkj, &d3, &[0, 2]);
                let wkp13 = bc(b, wkp1j, &d3, &[0, 2]);
                let p1 = b.mul(xi3, wk3);
                let p2 = b.mul(yi3, wkp13);
                let u = b.sub(s, p1);
                let u = b.sub(u, p2);
                let k13 = bc(b, k1, &d3, &[0]);
                let trailing = trailing_mask(b, &d3, k13, CmpDir::Gt);
                let u = b.select(trailing, u, s);
                let below3 = b.compare(CmpDir::Gt, r3, k13);
                let at_k = b.compare(CmpDir::Eq, c3, k3);
                let at_k1 = b.compare(CmpDir::Eq, c3, k13);
                let st0 = b.and(at_k, below3);
                let st1 = b.and(at_k1, below3);
                let wk3c = bc(b, wk, &d3, &[0, 1]);
                let wkp13c = bc(b, wkp1, &d3, &[0, 1]);
                let u = b.select(st0, wk3c, u);
                b.select(st1, wkp13c, u)
            };
            let ob3 = bc(b, one_by_one, &d3, &[0]);
            let upd = b.select(ob3, upd1, upd2);
            let skip = b.not(active);
            let skip = b.or(skip, zero_col);
            let skip3 = bc(b, skip, &d3, &[0]);
            let s_new = b.select(skip3, s, upd);
            // Re-symmetrize from the lower triangle (the products above are not symmetric
            // bit for bit).
            let s_new = from_lower(b, s_new, hermitian);
            // Pivots and info.
            let kp1 = b.add(kp, one);
            let kp1 = b.convert(kp1, ElemType::I32);
            let nkp1 = b.neg(kp1);
            let pv = b.select(one_by_one, kp1, nkp1);
            let pv2 = bc(b, pv, &d2, &[0]);
            let at_k = b.compare(CmpDir::Eq, rows2, k2);
            let k1 = b.add(kc, one);
            let k12 = bc(b, k1, &d2, &[0]);
            let at_k1 = b.compare(CmpDir::Eq, rows2, k12);
            let ob2 = bc(b, one_by_one, &d2, &[0]);
            let tb2 = b.not(ob2);
            let at_k1 = b.and(at_k1, tb2);
            let set = b.or(at_k, at_k1);
            let act2 = bc(b, active, &d2, &[0]);
            let set = b.and(set, act2);
            let piv = b.select(set, pv2, piv);
            let zi = b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs]));
            let first = b.compare(CmpDir::Eq, info, zi);
            let first = b.and(first, zero_col);
            let first = b.and(first, active);
            let kinfo = b.add(kc, one);
            let kinfo = b.convert(kinfo, ElemType::I32);
            let info = b.select(first, kinfo, info);
            let k_next = b.add(k, kstep);
            let k_next = b.select(active, k_next, k);
            vec![k_next, s_new, piv, info]
        },
    );
    let ld = {
        let s = out[1];
        let d = b.dims(s).to_vec();
        let r = idx(b, &d, 1);
        let c = idx(b, &d, 2);
        let low = b.compare(CmpDir::Ge, r, c);
        let z = spl(b, 0.0, e, &d);
        b.select(low, s, z)
    };
    (ld, out[2], out[3])
}

/// linalg_ldl_factor_ex(self, hermitian, check_errors) -> (LD, pivots, info): LAPACK's sytrf
/// (hetrf for complex Hermitian) with uplo = 'L', as PyTorch returns it (LD has zeros above the
/// diagonal; info > 0 marks a singular D).
fn linalg_ldl_factor_ex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let api = "torch.linalg.ldl_factor_ex";
    check_square(cx, &a, api)?;
    check_float_or_complex(&a, api)?;
    check_lapack_dtype(a.dtype, "ldl_factor_cpu")?;
    let hermitian = args.bool_or("hermitian", false)?;
    let d = cx.dims(a.v);
    let n = d[d.len() - 1];
    let (m, batch) = flat_batch(cx, a.v);
    let bs: i64 = batch.iter().product();
    if bs == 0 || n == 0 {
        let piv = cx.b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs, n]));
        let info = cx.b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs]));
        let piv = cx.reshape(piv, &d[..d.len() - 1]);
        let info = cx.reshape(info, &batch);
        return Ok(vec![Out::Tensor(a.v), Out::Tensor(piv), Out::Tensor(info)]);
    }
    let (ld, piv, info) = ldl_factor(cx, m, hermitian);
    let ld = with_batch(cx, ld, &batch);
    let piv = cx.reshape(piv, &d[..d.len() - 1]);
    let info = cx.reshape(info, &batch);
    let code = args.int_or("__size", 0)?;
    if code != 0 {
        // PyTorch's _linalg_check_errors has no message for sytrf's info (an internal assert).
        let (bi, order) = (code / (n + 1), code % (n + 1));
        let batch_str = if d.len() > 2 { format!(": (Batch element {bi})") } else { String::new() };
        bail!(Runtime, "{}{}: Unknown error code: {}.", api, batch_str, order);
    }
    Ok(vec![Out::Tensor(ld), Out::Tensor(piv), Out::Tensor(info)])
}

/// The size program of linalg_ldl_factor_ex: 0 unless check_errors is set and some matrix has
/// info > 0; then bi * (n + 1) + info of the first such batch element bi.
fn ldl_factor_failure(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let z = cx.b.constant_i64(0, I64E);
    let a = args.tensor("self")?;
    let d = cx.dims(a.v);
    if !args.bool_or("check_errors", false)? || d.len() < 2 || d[d.len() - 1] != d[d.len() - 2] || !matches!(a.dtype, DType::F32 | DType::F64 | DType::C64 | DType::C128) {
        return one(z);
    }
    let n = d[d.len() - 1];
    let (m, batch) = flat_batch(cx, a.v);
    let bs: i64 = batch.iter().product();
    if bs == 0 || n == 0 {
        return one(z);
    }
    let (_, _, info) = ldl_factor(cx, m, args.bool_or("hermitian", false)?);
    let info = cx.convert(info, I64E);
    let i = cx.b.iota(&TensorType::new(I64E, &[bs]), 0);
    let np1 = ispl(cx, n + 1, &[bs]);
    let code = cx.mul(i, np1);
    let code = cx.add(code, info);
    let zero = ispl(cx, 0, &[bs]);
    let failed = cx.compare(CmpDir::Ne, info, zero);
    let big = ispl(cx, i64::MAX, &[bs]);
    let code = cx.select(failed, code, big);
    let mx = cx.b.constant_i64(i64::MAX, I64E);
    let first = cx.reduce(&[code], &[mx], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
    let none = cx.compare(CmpDir::Eq, first, mx);
    one(cx.select(none, z, first))
}

/// LAPACK's ?sytrs / ?hetrs with uplo = 'L': solves A X = B for A = L D L^T (L D L^H) given by
/// sytrf's LD and pivots, on batches LD [B, n, n], piv [B, n] (int64), rhs [B, n, k]. A forward
/// sweep applies each interchange, eliminates below the (1x1 or 2x2) block and divides by it;
/// a backward sweep applies L^T and the interchanges in reverse.
fn ldl_solve_core(b: &mut Builder, ld: Value, piv: Value, rhs: Value, hermitian: bool) -> Value {
    let d = b.dims(rhs).to_vec();
    let (bs, n, nr) = (d[0], d[1], d[2]);
    let e = b.elem(rhs);
    let hermitian = hermitian && e.is_complex();
    let d2 = [bs, n];
    let d3 = [bs, n, nr];
    let sc = |b: &mut Builder, x: i64| ispl(b, x, &[bs]);
    // Swap rows r1 and r2 (per batch) of x [B, n, nr] where `on`.
    let swap_rows = |b: &mut Builder, x: Value, r1: Value, r2: Value, on: Value| -> Value {
        let y = swap_lines(b, x, r1, r2, 1);
        let on3 = bc(b, on, &d3, &[0]);
        b.select(on3, y, x)
    };
    // Forward: L D X = B.
    let k0 = sc(b, 0);
    let fwd = b.while_loop(
        &[k0, rhs],
        |b, v| {
            let nn = sc(b, n);
            let lt = b.compare(CmpDir::Lt, v[0], nn);
            any_over(b, lt, &[0])
        },
        |b, v| {
            let (k, x) = (v[0], v[1]);
            let one = sc(b, 1);
            let nn = sc(b, n);
            let nm1 = sc(b, n - 1);
            let active = b.compare(CmpDir::Lt, k, nn);
            let kc = b.min(k, nm1);
            let k1 = b.add(kc, one);
            let k1c = b.min(k1, nm1);
            let p = pick(b, piv, kc);
            let zero = sc(b, 0);
            let one_by_one = b.compare(CmpDir::Gt, p, zero);
            let ap = b.abs(p);
            let kp = b.sub(ap, one);
            // Interchange rows k (or k + 1) and kp.
            let target = b.select(one_by_one, kc, k1c);
            let x = swap_rows(b, x, target, kp, active);
            let colk = pick_col(b, ld, kc);
            let colk1 = pick_col(b, ld, k1c);
            let rows2 = idx(b, &d2, 1);
            let k2 = bc(b, kc, &d2, &[0]);
            let k12 = bc(b, k1c, &d2, &[0]);
            let z2 = spl(b, 0.0, e, &d2);
            let rows3 = idx(b, &d3, 1);
            let bk = pick_row(b, x, kc);
            let bk1 = pick_row(b, x, k1c);
            // 1x1: B(i) -= L(i, k) B(k) for i > k, then B(k) /= D(k).
            let x1 = {
                let below = b.compare(CmpDir::Gt, rows2, k2);
                let l = b.select(below, colk, z2);
                let l3 = bc(b, l, &d3, &[0, 1]);
                let bk3 = bc(b, bk, &d3, &[0, 2]);
                let pr = b.mul(l3, bk3);
                let y = b.sub(x, pr);
                let dk = pick(b, colk, kc);
                let s1 = recip_pivot(b, dk, hermitian);
                let s2 = bc(b, s1, &[bs, nr], &[0]);
                let nb = b.mul(bk, s2);
                let nb3 = bc(b, nb, &d3, &[0, 2]);
                let k3 = bc(b, kc, &d3, &[0]);
                let at = b.compare(CmpDir::Eq, rows3, k3);
                b.select(at, nb3, y)
            };
            // 2x2: eliminate with both columns below k + 1, then solve the 2x2 block.
            let x2 = {
                let below = b.compare(CmpDir::Gt, rows2, k12);
                let l0 = b.select(below, colk, z2);
                let l1 = b.select(below, colk1, z2);
                let l03 = bc(b, l0, &d3, &[0, 1]);
                let l13 = bc(b, l1, &d3, &[0, 1]);
                let bk3 = bc(b, bk, &d3, &[0, 2]);
                let bk13 = bc(b, bk1, &d3, &[0, 2]);
                let p0 = b.mul(l03, bk3);
                let y = b.sub(x, p0);
                let p1 = b.mul(l13, bk13);
                let y = b.sub(y, p1);
                let akm1k = pick(b, colk, k1c);
                let akk = pick(b, colk, kc);
                let ak1 = pick(b, colk1, k1c);
                let (akm1, ak, dk_first) = if hermitian {
                    let c = conj_of(b, akm1k);
                    (b.div(akk, c), b.div(ak1, akm1k), c)
                } else {
                    (b.div(akk, akm1k), b.div(ak1, akm1k), akm1k)
                };
                let onev = spl(b, 1.0, e, &[bs]);
                let denom = b.mul(akm1, ak);
                let denom = b.sub(denom, onev);
                let dr = [bs, nr];
                let c1 = bc(b, dk_first, &dr, &[0]);
                let c2 = bc(b, akm1k, &dr, &[0]);
                let bkm1 = b.div(bk, c1);
                let bkk = b.div(bk1, c2);
                let akv = bc(b, ak, &dr, &[0]);
                let akm1v = bc(b, akm1, &dr, &[0]);
                let den = bc(b, denom, &dr, &[0]);
                let t0 = b.mul(akv, bkm1);
                let t0 = b.sub(t0, bkk);
                let n0 = b.div(t0, den);
                let t1 = b.mul(akm1v, bkk);
                let t1 = b.sub(t1, bkm1);
                let n1 = b.div(t1, den);
                let k3 = bc(b, kc, &d3, &[0]);
                let k13 = bc(b, k1c, &d3, &[0]);
                let at0 = b.compare(CmpDir::Eq, rows3, k3);
                let at1 = b.compare(CmpDir::Eq, rows3, k13);
                let n03 = bc(b, n0, &d3, &[0, 2]);
                let n13 = bc(b, n1, &d3, &[0, 2]);
                let y = b.select(at0, n03, y);
                b.select(at1, n13, y)
            };
            let ob3 = bc(b, one_by_one, &d3, &[0]);
            let y = b.select(ob3, x1, x2);
            let act3 = bc(b, active, &d3, &[0]);
            let y = b.select(act3, y, x);
            let two = sc(b, 2);
            let step = b.select(one_by_one, one, two);
            let kn = b.add(k, step);
            let kn = b.select(active, kn, k);
            vec![kn, y]
        },
    );
    // Backward: L^T X = B, from the last row up.
    let kl = sc(b, n - 1);
    let bwd = b.while_loop(
        &[kl, fwd[1]],
        |b, v| {
            let z = sc(b, 0);
            let ge = b.compare(CmpDir::Ge, v[0], z);
            any_over(b, ge, &[0])
        },
        |b, v| {
            let (k, x) = (v[0], v[1]);
            let one = sc(b, 1);
            let zero = sc(b, 0);
            let active = b.compare(CmpDir::Ge, k, zero);
            let kc = b.max(k, zero);
            let km1 = b.sub(kc, one);
            let km1c = b.max(km1, zero);
            let p = pick(b, piv, kc);
            let one_by_one = b.compare(CmpDir::Gt, p, zero);
            let ap = b.abs(p);
            let kp = b.sub(ap, one);
            let rows2 = idx(b, &d2, 1);
            let k2 = bc(b, kc, &d2, &[0]);
            let below = b.compare(CmpDir::Gt, rows2, k2);
            let z2 = spl(b, 0.0, e, &d2);
            let rows3 = idx(b, &d3, 1);
            let k3 = bc(b, kc, &d3, &[0]);
            let below3 = b.compare(CmpDir::Gt, rows3, k3);
            let zero3 = spl(b, 0.0, e, &d3);
            let xb = b.select(below3, x, zero3);
            // B(k) -= sum_{i > k} L(i, k) B(i) (conjugated L for Hermitian).
            let dot = |b: &mut Builder, col: Value| -> Value {
                let l = b.select(below, col, z2);
                let l = if hermitian { conj_of(b, l) } else { l };
                let l3 = bc(b, l, &d3, &[0, 1]);
                let pr = b.mul(l3, xb);
                sum_over(b, pr, &[1])
            };
            let colk = pick_col(b, ld, kc);
            let colkm1 = pick_col(b, ld, km1c);
            let s0 = dot(b, colk);
            let bk = pick_row(b, x, kc);
            let nbk = b.sub(bk, s0);
            let nbk3 = bc(b, nbk, &d3, &[0, 2]);
            let atk = b.compare(CmpDir::Eq, rows3, k3);
            let y = b.select(atk, nbk3, x);
            // 2x2 block (k - 1, k): also row k - 1 with column k - 1.
            let s1 = dot(b, colkm1);
            let bkm1 = pick_row(b, x, km1c);
            let nbkm1 = b.sub(bkm1, s1);
            let nbkm13 = bc(b, nbkm1, &d3, &[0, 2]);
            let km13 = bc(b, km1c, &d3, &[0]);
            let atkm1 = b.compare(CmpDir::Eq, rows3, km13);
            let ob3 = bc(b, one_by_one, &d3, &[0]);
            let two_by_two = b.not(ob3);
            let w = b.and(atkm1, two_by_two);
            let y = b.select(w, nbkm13, y);
            let y = swap_rows(b, y, kc, kp, active);
            let act3 = bc(b, active, &d3, &[0]);
            let y = b.select(act3, y, x);
            let two = sc(b, 2);
            let step = b.select(one_by_one, one, two);
            let kn = b.sub(k, step);
            let kn = b.select(active, kn, k);
            vec![kn, y]
        },
    );
    bwd[1]
}

/// linalg_ldl_solve(LD, pivots, B, hermitian): A X = B for the A that ldl_factor factored,
/// broadcasting the batch dims of LD (and pivots) and B.
fn linalg_ldl_solve(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ld = args.tensor("LD")?;
    let piv = args.tensor("pivots")?;
    let rhs = args.tensor("B")?;
    let api = "torch.linalg.ldl_solve";
    check_square(cx, &ld, api)?;
    check_float_or_complex(&ld, api)?;
    let ldd = cx.dims(ld.v);
    let bd = cx.dims(rhs.v);
    check!(
        rhs.dtype == ld.dtype,
        Runtime,
        "Expected b and A to have the same dtype, but found b of type {} and A of type {} instead.",
        rhs.dtype.torch_name(),
        ld.dtype.torch_name()
    );
    check!(
        bd.len() >= 2,
        Index,
        "Dimension out of range (expected to be in range of [{}, {}], but got -2)",
        -(bd.len().max(1) as i64),
        bd.len().max(1) as i64 - 1
    );
    check!(
        ldd[ldd.len() - 1] == bd[bd.len() - 2],
        Runtime,
        "Incompatible matrix sizes for {}: each A matrix is {} by {} but each b matrix is {} by {}",
        api,
        ldd[ldd.len() - 2],
        ldd[ldd.len() - 1],
        if bd.len() >= 2 { bd[bd.len() - 2] } else { 0 },
        bd.last().copied().unwrap_or(0)
    );
    let pd = cx.dims(piv.v);
    check!(
        pd[..] == ldd[..ldd.len() - 1],
        Runtime,
        "torch.linalg.ldl_solve: Expected LD.shape[:-1] and pivots.shape to be the same, but got pivots with shape [{}] instead",
        pd.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
    );
    check!(
        piv.dtype.is_int(),
        Runtime,
        "torch.linalg.ldl_solve: Expected pivots to be integers. Got {}",
        piv.dtype.torch_name()
    );
    check_lapack_dtype(ld.dtype, "ldl_solve_cpu")?;
    let batch = crate::broadcast_shapes(&[ldd[..ldd.len() - 2].to_vec(), bd[..bd.len() - 2].to_vec()])?;
    let n = ldd[ldd.len() - 1];
    let nr = bd[bd.len() - 1];
    let mut out_dims = batch.clone();
    out_dims.extend_from_slice(&[n, nr]);
    let bs: i64 = batch.iter().product();
    let bx = cx.broadcast_to(rhs.v, &out_dims);
    if bs == 0 || n == 0 || nr == 0 {
        return one(bx);
    }
    let mut ld_dims = batch.clone();
    ld_dims.extend_from_slice(&[n, n]);
    let l = cx.broadcast_to(ld.v, &ld_dims);
    let mut p_dims = batch.clone();
    p_dims.push(n);
    let p = cx.convert(piv.v, I64E);
    let p = cx.broadcast_to(p, &p_dims);
    let l = cx.reshape(l, &[bs, n, n]);
    let p = cx.reshape(p, &[bs, n]);
    let x = cx.reshape(bx, &[bs, n, nr]);
    let hermitian = args.bool_or("hermitian", false)?;
    let r = ldl_solve_core(cx, l, p, x, hermitian);
    one(cx.reshape(r, &out_dims))
}
