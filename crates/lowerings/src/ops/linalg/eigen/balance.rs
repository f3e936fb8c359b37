//! geev's first steps: balancing (dgebal) and the reduction to Hessenberg form (dgehrd, with
//! dlarfg's reflectors).
use crate::ops::linalg::{any_over, iota as idx, ispl, max as max_over, splat as spl, sum as sum_over, swap_lines, I64E};
use super::{col_at, fsign, hessenberg_part, lapy2, last_where, put_col, put_row, reflect_left, reflect_right, row_at, Ev};
use stablehlo::{Builder, CmpDir, Value};

/// LAPACK's dgebal(job = 'B'): permutations isolating eigenvalues (rows pushed down, then
/// columns pushed left), then power-of-two scaling of rows and columns ilo..ihi until the row
/// and column 2-norms are balanced. Returns (A, ilo, ihi, scale) with 0-based ilo/ihi.
pub(crate) fn ev_gebal(b: &mut Builder, ev: &Ev, a: Value) -> (Value, Value, Value, Value) {
    let n = ev.n;
    let e = ev.e;
    let d2 = [n, n];
    let scale0 = spl(b, 1.0, e, &[n]);
    let l0 = ev.i(b, n - 1);
    let t = b.constant_bool(true);
    let f = b.constant_bool(false);
    // Rows with no off-diagonal entry in columns 0..l: swap to l, shrink l.
    let p1 = b.while_loop(
        &[a, scale0, l0, t, f],
        |_, v| v[3],
        |b, v| {
            let (a, scale, l, _, iso) = (v[0], v[1], v[2], v[3], v[4]);
            let r = idx(b, &d2, 0);
            let c = idx(b, &d2, 1);
            let lb = b.broadcast_in_dim(l, &d2, &[]);
            let z = spl(b, 0.0, e, &d2);
            let nz = b.compare(CmpDir::Ne, a, z);
            let in_l = b.compare(CmpDir::Le, c, lb);
            let off = b.compare(CmpDir::Ne, c, r);
            let bad = b.and(nz, in_l);
            let bad = b.and(bad, off);
            let row_bad = any_over(b, bad, &[1]);
            let rv = idx(b, &[n], 0);
            let lv = b.broadcast_in_dim(l, &[n], &[]);
            let le = b.compare(CmpDir::Le, rv, lv);
            let ok = b.not(row_bad);
            let cand = b.and(ok, le);
            let j = last_where(b, cand, rv);
            let zero_i = ev.i(b, 0);
            let found = b.compare(CmpDir::Ge, j, zero_i);
            let jf = b.convert(j, e);
            let scale_n = ev.vset(b, scale, l, jf);
            let rows_le = b.compare(CmpDir::Le, r, lb);
            let sw = swap_lines(b, a, j, l, 1);
            let a1 = b.select(rows_le, sw, a);
            let a2 = swap_lines(b, a1, j, l, 0);
            let at0 = b.compare(CmpDir::Eq, l, zero_i);
            let one_i = ev.i(b, 1);
            let l_n = b.sub(l, one_i);
            let a = b.select(found, a2, a);
            let scale = b.select(found, scale_n, scale);
            let iso_n = b.and(found, at0);
            let iso = b.or(iso, iso_n);
            let l_dec = b.not(at0);
            let l_dec = b.and(found, l_dec);
            let l = b.select(l_dec, l_n, l);
            let go = b.and(found, l_dec);
            vec![a, scale, l, go, iso]
        },
    );
    let (a, scale, l, iso) = (p1[0], p1[1], p1[2], p1[4]);
    // Columns with no off-diagonal entry in rows k..l: swap to k, grow k.
    let k0 = ev.i(b, 0);
    let go0 = b.not(iso);
    let p2 = b.while_loop(
        &[a, scale, k0, go0],
        |_, v| v[3],
        |b, v| {
            let (a, scale, k) = (v[0], v[1], v[2]);
            let r = idx(b, &d2, 0);
            let c = idx(b, &d2, 1);
            let kb = b.broadcast_in_dim(k, &d2, &[]);
            let lb = b.broadcast_in_dim(l, &d2, &[]);
            let z = spl(b, 0.0, e, &d2);
            let nz = b.compare(CmpDir::Ne, a, z);
            let r_ge = b.compare(CmpDir::Ge, r, kb);
            let r_le = b.compare(CmpDir::Le, r, lb);
            let off = b.compare(CmpDir::Ne, c, r);
            let bad = b.and(nz, r_ge);
            let bad = b.and(bad, r_le);
            let bad = b.and(bad, off);
            let col_bad = any_over(b, bad, &[0]);
            let cv = idx(b, &[n], 0);
            let kv = b.broadcast_in_dim(k, &[n], &[]);
            let lv = b.broadcast_in_dim(l, &[n], &[]);
            let ge = b.compare(CmpDir::Ge, cv, kv);
            let le = b.compare(CmpDir::Le, cv, lv);
            let ok = b.not(col_bad);
            let cand = b.and(ok, ge);
            let cand = b.and(cand, le);
            let big = ispl(b, n, &[n]);
            let ci = b.select(cand, cv, big);
            let mx = b.constant_i64(n, I64E);
            let j = b.reduce(&[ci], &[mx], &[0], |b, x| vec![b.min(x[0], x[1])])[0];
            let nn = ev.i(b, n);
            let found = b.compare(CmpDir::Lt, j, nn);
            let jc = b.min(j, l);
            let jf = b.convert(jc, e);
            let scale_n = ev.vset(b, scale, k, jf);
            let rows_le = b.compare(CmpDir::Le, r, lb);
            let sw = swap_lines(b, a, jc, k, 1);
            let a1 = b.select(rows_le, sw, a);
            let cols_ge = b.compare(CmpDir::Ge, c, kb);
            let sw = swap_lines(b, a1, jc, k, 0);
            let a2 = b.select(cols_ge, sw, a1);
            let one_i = ev.i(b, 1);
            let k_n = b.add(k, one_i);
            let a = b.select(found, a2, a);
            let scale = b.select(found, scale_n, scale);
            let k = b.select(found, k_n, k);
            vec![a, scale, k, found]
        },
    );
    let (a, scale, k) = (p2[0], p2[1], p2[2]);
    // Scaling (skipped when everything was isolated).
    let sfmin1 = ev.safmin() / ev.ulp();
    let sfmax1 = 1.0 / sfmin1;
    let sfmin2 = sfmin1 * 2.0;
    let sfmax2 = 1.0 / sfmin2;
    let kx = k;
    let fl = b.constant_bool(false);
    let not_iso = b.not(iso);
    let p3 = b.while_loop(
        &[a, scale, kx, fl, not_iso],
        |_, v| v[4],
        |b, v| {
            let (a, scale, i, noconv) = (v[0], v[1], v[2], v[3]);
            // Past the last column: another sweep if anything changed, else done.
            let past = b.compare(CmpDir::Gt, i, l);
            let ic = b.min(i, l);
            let col = col_at(b, a, ic);
            let row = row_at(b, a, ic);
            let pos = idx(b, &[n], 0);
            let kv = b.broadcast_in_dim(k, &[n], &[]);
            let lv = b.broadcast_in_dim(l, &[n], &[]);
            let ge_k = b.compare(CmpDir::Ge, pos, kv);
            let le_l = b.compare(CmpDir::Le, pos, lv);
            let in_kl = b.and(ge_k, le_l);
            // The 2-norm of x over rows/columns k..l, and its largest magnitude where `amax_on`.
            let norm_and_amax = |b: &mut Builder, x: Value, amax_on: Value| -> (Value, Value) {
                let zv = spl(b, 0.0, e, &[n]);
                let sq = b.mul(x, x);
                let sq = b.select(in_kl, sq, zv);
                let nrm = sum_over(b, sq, &[0]);
                let ax = b.abs(x);
                let ax = b.select(amax_on, ax, zv);
                (b.sqrt(nrm), max_over(b, ax, &[0]))
            };
            let (cn, ca) = norm_and_amax(b, col, le_l);
            let (rn, ra) = norm_and_amax(b, row, ge_k);
            let zero = ev.c(b, 0.0);
            let two = ev.c(b, 2.0);
            let one = ev.c(b, 1.0);
            let g0 = b.div(rn, two);
            let smax2 = ev.c(b, sfmax2);
            let smin2 = ev.c(b, sfmin2);
            // Grow f while c < g (and nothing over/underflows).
            let up = b.while_loop(
                &[one, cn, ca, rn, g0, ra],
                |b, v| {
                    let (f, c, ca, r, g, ra) = (v[0], v[1], v[2], v[3], v[4], v[5]);
                    let s1 = b.compare(CmpDir::Ge, c, g);
                    let m1 = b.max(f, c);
                    let m1 = b.max(m1, ca);
                    let s2 = b.compare(CmpDir::Ge, m1, smax2);
                    let m2 = b.min(r, g);
                    let m2 = b.min(m2, ra);
                    let s3 = b.compare(CmpDir::Le, m2, smin2);
                    let stop = b.or(s1, s2);
                    let stop = b.or(stop, s3);
                    let nan = b.compare(CmpDir::Ne, c, c);
                    let stop = b.or(stop, nan);
                    b.not(stop)
                },
                |b, v| {
                    let two = b.constant_f64(2.0, e);
                    vec![b.mul(v[0], two), b.mul(v[1], two), b.mul(v[2], two), b.div(v[3], two), b.div(v[4], two), b.div(v[5], two)]
                },
            );
            let g1 = b.div(up[1], two);
            let down = b.while_loop(
                &[up[0], up[1], up[2], up[3], g1, up[5]],
                |b, v| {
                    let (f, c, ca, r, g, ra) = (v[0], v[1], v[2], v[3], v[4], v[5]);
                    let s1 = b.compare(CmpDir::Lt, g, r);
                    let m1 = b.max(r, ra);
                    let s2 = b.compare(CmpDir::Ge, m1, smax2);
                    let m2 = b.min(f, c);
                    let m2 = b.min(m2, g);
                    let m2 = b.min(m2, ca);
                    let s3 = b.compare(CmpDir::Le, m2, smin2);
                    let stop = b.or(s1, s2);
                    let stop = b.or(stop, s3);
                    let nan = b.compare(CmpDir::Ne, r, r);
                    let stop = b.or(stop, nan);
                    b.not(stop)
                },
                |b, v| {
                    let two = b.constant_f64(2.0, e);
                    vec![b.div(v[0], two), b.div(v[1], two), b.div(v[2], two), b.mul(v[3], two), b.div(v[4], two), b.mul(v[5], two)]
                },
            );
            let (fv, c2, r2) = (down[0], down[1], down[3]);
            let s = b.add(cn, rn);
            let cr = b.add(c2, r2);
            let fac = ev.c(b, 0.95);
            let fs = b.mul(fac, s);
            let balanced = b.compare(CmpDir::Ge, cr, fs);
            let sc_i = ev.vat(b, scale, ic);
            let f_lt1 = b.compare(CmpDir::Lt, fv, one);
            let s_lt1 = b.compare(CmpDir::Lt, sc_i, one);
            let fsi = b.mul(fv, sc_i);
            let smin1 = ev.c(b, sfmin1);
            let tiny = b.compare(CmpDir::Le, fsi, smin1);
            let skip1 = b.and(f_lt1, s_lt1);
            let skip1 = b.and(skip1, tiny);
            let f_gt1 = b.compare(CmpDir::Gt, fv, one);
            let s_gt1 = b.compare(CmpDir::Gt, sc_i, one);
            let smax1 = ev.c(b, sfmax1);
            let lim = b.div(smax1, fv);
            let huge = b.compare(CmpDir::Ge, sc_i, lim);
            let skip2 = b.and(f_gt1, s_gt1);
            let skip2 = b.and(skip2, huge);
            let cz = b.compare(CmpDir::Eq, cn, zero);
            let rz = b.compare(CmpDir::Eq, rn, zero);
            let skip = b.or(cz, rz);
            let skip = b.or(skip, balanced);
            let skip = b.or(skip, skip1);
            let skip = b.or(skip, skip2);
            let skip = b.or(skip, past);
            let apply = b.not(skip);
            let g = b.div(one, fv);
            let nsc = b.mul(sc_i, fv);
            let scale_n = ev.vset(b, scale, ic, nsc);
            let scale = b.select(apply, scale_n, scale);
            // Row i (columns >= k) times g, then column i (rows <= l) times f.
            let gv = b.broadcast_in_dim(g, &[n], &[]);
            let row_s = b.mul(row, gv);
            let row_n = b.select(ge_k, row_s, row);
            let a1 = put_row(b, a, ic, row_n);
            let col1 = col_at(b, a1, ic);
            let fvv = b.broadcast_in_dim(fv, &[n], &[]);
            let col_s = b.mul(col1, fvv);
            let col_n = b.select(le_l, col_s, col1);
            let a2 = put_col(b, a1, ic, col_n);
            let a = b.select(apply, a2, a);
            let noconv = b.or(noconv, apply);
            // Next column, or a new sweep.
            let one_i = ev.i(b, 1);
            let i_next = b.add(i, one_i);
            let f = b.constant_bool(false);
            let i = b.select(past, k, i_next);
            let go_on = b.not(past);
            let go = b.or(go_on, noconv);
            let noconv = b.select(past, f, noconv);
            vec![a, scale, i, noconv, go]
        },
    );
    let (ilo, ihi) = {
        let z = ev.i(b, 0);
        (b.select(iso, z, k), b.select(iso, z, l))
    };
    (p3[0], ilo, ihi, p3[1])
}

/// A Householder reflector H = I - tau v v^T (v[0] = 1) with H [alpha; x] = [beta; 0], as
/// LAPACK's dlarfg: returns (beta, tau, x scaled into v's tail). `x` may hold zeros to ignore.
pub(crate) fn ev_larfg(b: &mut Builder, ev: &Ev, alpha: Value, x: Value) -> (Value, Value, Value) {
    let d = b.dims(x).to_vec();
    let sq = b.mul(x, x);
    let xn = sum_over(b, sq, &[0]);
    let xnorm = b.sqrt(xn);
    let zero = ev.c(b, 0.0);
    let none = b.compare(CmpDir::Eq, xnorm, zero);
    let h = lapy2(b, alpha, xnorm);
    let beta = fsign(b, h, alpha);
    let beta = b.neg(beta);
    let bma = b.sub(beta, alpha);
    let tau = b.div(bma, beta);
    let amb = b.sub(alpha, beta);
    let one = ev.c(b, 1.0);
    let scal = b.div(one, amb);
    let sv = b.broadcast_in_dim(scal, &d, &[]);
    let v = b.mul(x, sv);
    let beta = b.select(none, alpha, beta);
    let tau = b.select(none, zero, tau);
    let zv = spl(b, 0.0, ev.e, &d);
    let nb = b.broadcast_in_dim(none, &d, &[]);
    let v = b.select(nb, zv, v);
    (beta, tau, v)
}

/// LAPACK's dgehd2 + dorghr: A = Q H Q^T with H upper Hessenberg (reflectors for columns
/// ilo .. ihi - 2 acting on rows i + 1 .. ihi). Returns (H with zeros below the subdiagonal, Q).
pub(crate) fn ev_hessenberg(b: &mut Builder, ev: &Ev, a: Value, ilo: Value, ihi: Value) -> (Value, Value) {
    let n = ev.n;
    let e = ev.e;
    let d2 = [n, n];
    let vs0 = spl(b, 0.0, e, &d2);
    let taus0 = spl(b, 0.0, e, &[n]);
    let out = b.while_loop(
        &[ilo, a, vs0, taus0],
        |b, v| {
            let one = b.constant_i64(1, I64E);
            let last = b.sub(ihi, one);
            b.compare(CmpDir::Lt, v[0], last)
        },
        |b, v| {
            let (i, a, vs, taus) = (v[0], v[1], v[2], v[3]);
            let one_i = ev.i(b, 1);
            let pos = idx(b, &[n], 0);
            let col = col_at(b, a, i);
            let i1 = b.add(i, one_i);
            let i1v = b.broadcast_in_dim(i1, &[n], &[]);
            let hv = b.broadcast_in_dim(ihi, &[n], &[]);
            let below = b.compare(CmpDir::Gt, pos, i1v);
            let le_h = b.compare(CmpDir::Le, pos, hv);
            let tail = b.and(below, le_h);
            let zv = spl(b, 0.0, e, &[n]);
            let x = b.select(tail, col, zv);
            let alpha = ev.vat(b, col, i1);
            let (beta, tau, xs) = ev_larfg(b, ev, alpha, x);
            // v: 1 at i + 1, the scaled tail below, zeros elsewhere.
            let at1 = b.compare(CmpDir::Eq, pos, i1v);
            let onev = spl(b, 1.0, e, &[n]);
            let vv = b.select(at1, onev, xs);
            // Right: A[0..ihi, :] -= tau (A v) v^T.
            let a_r = reflect_right(b, a, vv, tau);
            let r = idx(b, &d2, 0);
            let c = idx(b, &d2, 1);
            let hb = b.broadcast_in_dim(ihi, &d2, &[]);
            let rows_ok = b.compare(CmpDir::Le, r, hb);
            let a = b.select(rows_ok, a_r, a);
            // Left: A[:, i+1..] -= tau v (v^T A).
            let a_l = reflect_left(b, a, vv, tau);
            let i1b = b.broadcast_in_dim(i1, &d2, &[]);
            let cols_ok = b.compare(CmpDir::Ge, c, i1b);
            let a = b.select(cols_ok, a_l, a);
            // Column i: beta at i + 1, zeros below (the reflector is kept apart).
            let colf = col_at(b, a, i);
            let betav = b.broadcast_in_dim(beta, &[n], &[]);
            let colf = b.select(at1, betav, colf);
            let colf = b.select(tail, zv, colf);
            let a = put_col(b, a, i, colf);
            let vs = put_col(b, vs, i, vv);
            let taus = ev.vset(b, taus, i, tau);
            vec![i1, a, vs, taus]
        },
    );
    let (h, vs, taus) = (out[1], out[2], out[3]);
    // Q = H(ilo) ... H(ihi - 2), applied to the identity from the last reflector back.
    let q0 = {
        let r = idx(b, &d2, 0);
        let c = idx(b, &d2, 1);
        let on = b.compare(CmpDir::Eq, r, c);
        let one = spl(b, 1.0, e, &d2);
        let z = spl(b, 0.0, e, &d2);
        b.select(on, one, z)
    };
    let two = ev.i(b, 2);
    let start = b.sub(ihi, two);
    let q = b.while_loop(
        &[start, q0],
        |b, v| b.compare(CmpDir::Ge, v[0], ilo),
        |b, v| {
            let (i, q) = (v[0], v[1]);
            let vv = col_at(b, vs, i);
            let tau = ev.vat(b, taus, i);
            let q = reflect_left(b, q, vv, tau);
            let one_i = ev.i(b, 1);
            vec![b.sub(i, one_i), q]
        },
    );
    (hessenberg_part(b, h), q[1])
}
