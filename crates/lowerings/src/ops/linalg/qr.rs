//! Householder QR: linalg_qr, geqrf, linalg_householder_product and ormqr, with LAPACK's
//! reflector conventions (geqrf: R's diagonal is -sign(Re a) * norm, H = I - tau v v^H with
//! v[0] = 1), a while loop over the columns.
use crate::args::Args;
use crate::cx::Cx;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{abs2, adjoint, batch_col, batch_entry, bcast, bcast0, block, broadcast_batch, check_float_or_complex, check_lapack_dtype, check_matrix, conj, expand_batch, eye3, iota, lt_const, mats, splat, sum, to_elem, tri, unflatten, I64};
use stablehlo::{Builder, CmpDir, Precision, Value};

pub(crate) const OPS: &[Op] = &[
    op("linalg_qr", linalg_qr),
    op("geqrf", geqrf),
    op("linalg_householder_product", linalg_householder_product),
    op("ormqr", ormqr),
];

// ---- QR ---------------------------------------------------------------------------------------

/// Householder QR of a batch [B, m, n] with LAPACK's conventions (geqrf + orgqr/ungqr):
/// reflector j is H_j = I - tau_j v_j v_j^H with v_j[j] = 1 and zeros above, chosen so that
/// H_j^H maps column j to (.., beta, 0, ..) with beta = -sign(Re alpha) ||x|| (real); a column
/// with nothing to eliminate gets tau = 0. Returns (R [B, m, n], the reflectors V [B, m, k]
/// (unit at j, zeros above) and tau [B, k]); Q = H_1 ... H_k comes from `apply_reflectors`.
pub(crate) fn householder_qr(b: &mut Builder, a: Value) -> (Value, Value, Value) {
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
pub(crate) fn q_columns(b: &mut Builder, vs: Value, tau: Value, cols: i64) -> Value {
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
