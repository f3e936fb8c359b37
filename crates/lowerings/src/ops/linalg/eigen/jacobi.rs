//! Jacobi methods: _linalg_eigh (cyclic Jacobi) and _linalg_svd (one-sided Jacobi).
//!
//! eigh is cyclic Jacobi with the round-robin ordering: each step rotates N/2 disjoint index
//! pairs at once (A <- J^H A J, the rotated pairs' diagonal and zeros set exactly), until the
//! off-diagonal part is below eps ||A||; the eigenvalues are then the Rayleigh quotients of
//! the (re-orthonormalized) eigenvectors.
//!
//! svd is one-sided Jacobi (Hestenes): the same rotations orthogonalize the columns of A
//! (A <- A J, V <- V J) to LAPACK's gesvj criterion; the singular values are the column norms
//! of A V, U is A V / sigma re-orthonormalized (and completed, for full_matrices or a rank
//! deficient A) by a Householder QR. Accuracy is on par with LAPACK's for well-conditioned
//! inputs; eigenvectors and singular vectors may differ from LAPACK's by a sign (phase).
use crate::args::Args;
use crate::cx::Cx;
use crate::error::Result;
use crate::ops::linalg::cholesky::hermitian_from;
use crate::ops::linalg::qr::{householder_qr, q_columns};
use crate::ops::linalg::{abs2, adjoint, any, bcast, block, bmm, check_float_or_complex, check_lapack_dtype, check_matrix, check_square, conj, diag, eps, eye3, iota, mats, max, splat, sum, to_elem, unflatten, I64};
use crate::{check, Out, op, Op};
use stablehlo::{Builder, CmpDir, ElemType, Ex, GatherDims, ScatterDims, TensorType, Value, E};

pub(crate) const OPS: &[Op] = &[
    op("_linalg_eigh", linalg_eigh),
    op("_linalg_svd", linalg_svd),
];

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
    let bs = b.dims(app)[0];
    let [c_e, s_e, cq, sq, shift] = {
        let ex = Ex::new(b);
        let [app, aqq, apq] = ex.all([app, aqq, apq]);
        let abs = apq.abs();
        let none = abs.eq(0.0);
        let theta = (aqq - app) / (2.0 * abs);
        let sg = theta.ge(0.0).select(theta.k(1.0), -1.0);
        let t = none.select(0.0, sg / (theta.abs() + (theta * theta + 1.0).sqrt()));
        let c = (t * t + 1.0).rsqrt();
        let s = t * c;
        let (c_e, s_e) = (as_elem(c, e), as_elem(s, e));
        // The phase conj(apq) / |apq| (the sign of apq for reals), 1 when apq = 0.
        let phase = none.select(1.0, apq.make(|b| conj(b, apq.v)) / as_elem(abs, e));
        // The exact change of the diagonal: a_pp - t |a_pq| and a_qq + t |a_pq|.
        [c_e, s_e, c_e * phase, -(s_e * phase), t * abs].map(|x| x.v)
    };
    let idx = {
        let pp = pair_index(b, p, p);
        let qq = pair_index(b, q, q);
        let pq = pair_index(b, p, q);
        let qp = pair_index(b, q, p);
        b.concatenate(&[pp, qq, pq, qp], 0)
    };
    let vals = b.concatenate(&[c_e, cq, s_e, sq], 1);
    let zeros = splat(b, 0.0, e, &[bs, n, n]);
    (scatter_pairs(b, zeros, idx, vals), shift)
}

/// x as element type `e` (a real x as complex with a zero imaginary part).
fn as_elem<'e>(x: E<'e>, e: ElemType) -> E<'e> {
    x.make(|b| to_elem(b, x.v, e))
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
    let eye = eye3(b, e, d[0], d[2], d[2]);
    let m = {
        let ex = Ex::new(b);
        let [eye, g] = ex.all([eye, g]);
        ((eye * 3.0 - g) * 0.5).v
    };
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
    let a2 = abs2(b, x);
    let a2 = {
        let ex = Ex::new(b);
        let [r, c, a2] = ex.all([r, c, a2]);
        r.ne(c).select(a2, 0.0).v
    };
    sum(b, a2, &[1, 2])
}

/// Eigen-decomposition of Hermitian batches [B, n, n] by parallel cyclic Jacobi. Returns the
/// eigenvalues [B, n] (real, unsorted) and eigenvectors [B, n, n] (columns).
fn jacobi_eigh(b: &mut Builder, a: Value) -> (Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
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
    let limit = {
        let ex = Ex::new(b);
        (tol * tol * ex.of(fro)).v
    };
    let v0 = eye3(b, e, bs, nn, nn);
    let t0 = b.constant_i64(0, I64);
    let out = b.while_loop(
        &[t0, a, v0],
        |b, v| {
            let off = off_diag_norm2(b, v[1]);
            let ex = Ex::new(b);
            let [t, off, limit] = ex.all([v[0], off, limit]);
            let big = off.gt(limit);
            (t.lt(MAX_SWEEPS * rounds) & big.make(|b| any(b, big.v))).v
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
            let [dp, dq] = {
                let ex = Ex::new(b);
                let [app, aqq, shift] = ex.all([app, aqq, shift]);
                [as_elem(app.real() - shift, e).v, as_elem(aqq.real() + shift, e).v]
            };
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
            let pm = {
                let ex = Ex::new(b);
                let one = ex.full(1.0, &TensorType::new(e, &d3));
                ex.of(rows).eq(ex.of(p3)).select(one, 0.0).v
            };
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
            let g = v[3];
            let d3 = [bs, nn, nn];
            let dg = diag(b, g);
            let g2 = abs2(b, g);
            let rows = iota(b, &d3, 1);
            let cols = iota(b, &d3, 2);
            let ex = Ex::new(b);
            let [t, dg, g2, rows, cols] = ex.all([v[0], dg, g2, rows, cols]);
            let dg = dg.real();
            let lim = dg.broadcast(&d3, &[0, 1]) * dg.broadcast(&d3, &[0, 2]) * (tol * tol);
            let bad = rows.ne(cols) & g2.gt(lim);
            (t.lt(MAX_SWEEPS * rounds) & bad.make(|b| any(b, bad.v))).v
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
    let ex = Ex::new(b);
    let sigma = ex.of(s2).sqrt();
    // Columns with a negligible norm carry no direction: left as zeros (completed later).
    let smax = sigma.make(|b| max(b, sigma.v, &[1])).broadcast(&[bs, n], &[0]);
    let keep = sigma.gt(smax * ((m.max(n) as f64) * eps(e)));
    let d3 = [bs, m, n];
    let u = ex.of(w) / as_elem(sigma.broadcast(&d3, &[0, 2]), e);
    let u = keep.broadcast(&d3, &[0, 2]).select(u, 0.0);
    (u.v, sigma.v, vecs)
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
    let ph = {
        let ex = Ex::new(b);
        let rd = ex.of(rd);
        let mag = rd.abs();
        mag.gt(0.5).select(rd / as_elem(mag, e), 1.0).v
    };
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
pub(crate) fn svd_batch(b: &mut Builder, a: Value, full: bool, compute_uv: bool) -> (Value, Value, Value) {
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
