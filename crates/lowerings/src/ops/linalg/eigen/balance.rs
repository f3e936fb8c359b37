//! geev's first steps: balancing (dgebal) and the reduction to Hessenberg form (dgehrd, with
//! dlarfg's reflectors).
use crate::ops::linalg::{splat as spl, I64E};
use super::{
    amax, any, col_at, fsign, hessenberg_part, lapy2, last_where, pos, put_col, put_row, reflect_left, reflect_right, row_at,
    sum, swapped, Ev,
};
use stablehlo::{Ex, E};

/// LAPACK's dgebal(job = 'B'): permutations isolating eigenvalues (rows pushed down, then
/// columns pushed left), then power-of-two scaling of rows and columns ilo..ihi until the row
/// and column 2-norms are balanced. Returns (A, ilo, ihi, scale) with 0-based ilo/ihi.
pub(crate) fn ev_gebal<'e>(ev: &Ev, a: E<'e>) -> (E<'e>, E<'e>, E<'e>, E<'e>) {
    let n = ev.n;
    let d2 = [n, n];
    // Rows with no off-diagonal entry in columns 0..l: swap to l, shrink l.
    let p1 = a.with(|b| {
        let scale0 = spl(b, 1.0, ev.e, &[n]);
        let l0 = b.constant_i64(n - 1, I64E);
        let (t, f) = (b.constant_bool(true), b.constant_bool(false));
        b.while_loop(
            &[a.v, scale0, l0, t, f],
            |_, v| v[3],
            |b, v| {
                let e = Ex::new(b);
                let [a, scale, l, iso] = e.all([v[0], v[1], v[2], v[4]]);
                let (r, c) = (pos(a, &d2, 0), pos(a, &d2, 1));
                let lb = l.splat(&d2);
                let row_bad = any(a.ne(0.0) & c.le(lb) & c.ne(r), &[1]);
                let rv = pos(a, &[n], 0);
                let j = last_where(!row_bad & rv.le(l.splat(&[n])), rv);
                let found = j.ge(0i64);
                let scale_n = ev.vset(scale, l, j.cast(ev.e));
                let a1 = r.le(lb).select(swapped(a, j, l, 1), a);
                let a2 = swapped(a1, j, l, 0);
                let at0 = l.eq(0i64);
                let l_dec = found & !at0;
                let iso = iso | (found & at0);
                let (a, scale, l) = (found.select(a2, a), found.select(scale_n, scale), l_dec.select(l - 1i64, l));
                vec![a.v, scale.v, l.v, (found & l_dec).v, iso.v]
            },
        )
    });
    let (a, scale, l, iso) = (a.of(p1[0]), a.of(p1[1]), a.of(p1[2]), a.of(p1[4]));
    // Columns with no off-diagonal entry in rows k..l: swap to k, grow k.
    let go0 = !iso;
    let p2 = a.with(|b| {
        let k0 = b.constant_i64(0, I64E);
        b.while_loop(
            &[a.v, scale.v, k0, go0.v],
            |_, v| v[3],
            |b, v| {
                let e = Ex::new(b);
                let [a, scale, k, l] = e.all([v[0], v[1], v[2], l.v]);
                let (r, c) = (pos(a, &d2, 0), pos(a, &d2, 1));
                let (kb, lb) = (k.splat(&d2), l.splat(&d2));
                let col_bad = any(a.ne(0.0) & r.ge(kb) & r.le(lb) & c.ne(r), &[0]);
                let cv = pos(a, &[n], 0);
                let cand = !col_bad & cv.ge(k.splat(&[n])) & cv.le(l.splat(&[n]));
                // The first such column (n when none).
                let ci = cand.select(cv, n);
                let j = ci.make(|b| {
                    let mx = b.constant_i64(n, I64E);
                    b.reduce(&[ci.v], &[mx], &[0], |b, x| vec![b.min(x[0], x[1])])[0]
                });
                let found = j.lt(n);
                let jc = j.min(l);
                let scale_n = ev.vset(scale, k, jc.cast(ev.e));
                let a1 = r.le(lb).select(swapped(a, jc, k, 1), a);
                let a2 = c.ge(kb).select(swapped(a1, jc, k, 0), a1);
                let (a, scale, k) = (found.select(a2, a), found.select(scale_n, scale), found.select(k + 1i64, k));
                vec![a.v, scale.v, k.v, found.v]
            },
        )
    });
    let (a, scale, k) = (a.of(p2[0]), a.of(p2[1]), a.of(p2[2]));
    // Scaling (skipped when everything was isolated).
    let sfmin1 = ev.safmin() / ev.ulp();
    let sfmax1 = 1.0 / sfmin1;
    let sfmin2 = sfmin1 * 2.0;
    let sfmax2 = 1.0 / sfmin2;
    let not_iso = !iso;
    let p3 = a.with(|b| {
        let fl = b.constant_bool(false);
        b.while_loop(
            &[a.v, scale.v, k.v, fl, not_iso.v],
            |_, v| v[4],
            |b, v| {
                let e = Ex::new(b);
                let [a, scale, i, noconv, k, l] = e.all([v[0], v[1], v[2], v[3], k.v, l.v]);
                // Past the last column: another sweep if anything changed, else done.
                let past = i.gt(l);
                let ic = i.min(l);
                let (col, row) = (col_at(a, ic), row_at(a, ic));
                let p = pos(a, &[n], 0);
                let (ge_k, le_l) = (p.ge(k.splat(&[n])), p.le(l.splat(&[n])));
                let in_kl = ge_k & le_l;
                // The 2-norm of x over rows/columns k..l, and its largest magnitude where `amax_on`.
                let [(cn, ca), (rn, ra)] = [(col, le_l), (row, ge_k)].map(|(x, amax_on)| {
                    let nrm = sum(in_kl.select(x * x, 0.0), &[0]);
                    (nrm.sqrt(), amax(amax_on.select(x.abs(), 0.0), &[0]))
                });
                // Grow f while c < g (and nothing over/underflows; a NaN norm stops it).
                let (one, g0) = (cn.k(1.0), rn / 2.0);
                let up = e.with(|b| {
                    b.while_loop(
                        &[one.v, cn.v, ca.v, rn.v, g0.v, ra.v],
                        |b, v| {
                            let e = Ex::new(b);
                            let [f, c, ca, r, g, ra] = e.all([v[0], v[1], v[2], v[3], v[4], v[5]]);
                            let stop = c.ge(g) | f.max(c).max(ca).ge(sfmax2) | r.min(g).min(ra).le(sfmin2) | c.ne(c);
                            (!stop).v
                        },
                        |b, v| {
                            let e = Ex::new(b);
                            let [f, c, ca, r, g, ra] = e.all([v[0], v[1], v[2], v[3], v[4], v[5]]);
                            [f * 2.0, c * 2.0, ca * 2.0, r / 2.0, g / 2.0, ra / 2.0].map(|x| x.v).to_vec()
                        },
                    )
                });
                // Then shrink f while g >= r (g from the grown c).
                let g1 = e.of(up[1]) / 2.0;
                let down = e.with(|b| {
                    b.while_loop(
                        &[up[0], up[1], up[2], up[3], g1.v, up[5]],
                        |b, v| {
                            let e = Ex::new(b);
                            let [f, c, ca, r, g, ra] = e.all([v[0], v[1], v[2], v[3], v[4], v[5]]);
                            let stop = g.lt(r) | r.max(ra).ge(sfmax2) | f.min(c).min(g).min(ca).le(sfmin2) | r.ne(r);
                            (!stop).v
                        },
                        |b, v| {
                            let e = Ex::new(b);
                            let [f, c, ca, r, g, ra] = e.all([v[0], v[1], v[2], v[3], v[4], v[5]]);
                            [f / 2.0, c / 2.0, ca / 2.0, r * 2.0, g / 2.0, ra * 2.0].map(|x| x.v).to_vec()
                        },
                    )
                });
                let [fv, c2, r2] = e.all([down[0], down[1], down[3]]);
                let balanced = (c2 + r2).ge(0.95 * (cn + rn));
                let sc_i = ev.vat(scale, ic);
                let skip1 = fv.lt(1.0) & sc_i.lt(1.0) & (fv * sc_i).le(sfmin1);
                let skip2 = fv.gt(1.0) & sc_i.gt(1.0) & sc_i.ge(sfmax1 / fv);
                let apply = !(cn.eq(0.0) | rn.eq(0.0) | balanced | skip1 | skip2 | past);
                let g = 1.0 / fv;
                let scale = apply.select(ev.vset(scale, ic, sc_i * fv), scale);
                // Row i (columns >= k) times g, then column i (rows <= l) times f.
                let a1 = put_row(a, ic, ge_k.select(row * g.splat(&[n]), row));
                let col1 = col_at(a1, ic);
                let a2 = put_col(a1, ic, le_l.select(col1 * fv.splat(&[n]), col1));
                let a = apply.select(a2, a);
                let noconv = noconv | apply;
                // Next column, or a new sweep.
                let i = past.select(k, i + 1i64);
                let go = !past | noconv;
                let noconv = past.select(false, noconv);
                vec![a.v, scale.v, i.v, noconv.v, go.v]
            },
        )
    });
    let (ilo, ihi) = (iso.select(0i64, k), iso.select(0i64, l));
    (a.of(p3[0]), ilo, ihi, a.of(p3[1]))
}

/// A Householder reflector H = I - tau v v^T (v[0] = 1) with H [alpha; x] = [beta; 0], as
/// LAPACK's dlarfg: returns (beta, tau, x scaled into v's tail). `x` may hold zeros to ignore.
pub(crate) fn ev_larfg<'e>(alpha: E<'e>, x: E<'e>) -> (E<'e>, E<'e>, E<'e>) {
    let d = x.dims();
    let xnorm = sum(x * x, &[0]).sqrt();
    let none = xnorm.eq(0.0);
    let beta = -fsign(lapy2(alpha, xnorm), alpha);
    let tau = (beta - alpha) / beta;
    let v = x * (1.0 / (alpha - beta)).splat(&d);
    (none.select(alpha, beta), none.select(0.0, tau), none.splat(&d).select(0.0, v))
}

/// LAPACK's dgehd2 + dorghr: A = Q H Q^T with H upper Hessenberg (reflectors for columns
/// ilo .. ihi - 2 acting on rows i + 1 .. ihi). Returns (H with zeros below the subdiagonal, Q).
pub(crate) fn ev_hessenberg<'e>(ev: &Ev, a: E<'e>, ilo: E<'e>, ihi: E<'e>) -> (E<'e>, E<'e>) {
    let n = ev.n;
    let d2 = [n, n];
    let (vs0, taus0) = (a.k(0.0), a.make(|b| spl(b, 0.0, ev.e, &[n])));
    let out = a.with(|b| {
        b.while_loop(
            &[ilo.v, a.v, vs0.v, taus0.v],
            |b, v| {
                let e = Ex::new(b);
                e.of(v[0]).lt(e.of(ihi.v) - 1i64).v
            },
            |b, v| {
                let e = Ex::new(b);
                let [i, a, vs, taus, ihi] = e.all([v[0], v[1], v[2], v[3], ihi.v]);
                let p = pos(a, &[n], 0);
                let col = col_at(a, i);
                let i1 = i + 1i64;
                let i1v = i1.splat(&[n]);
                let tail = p.gt(i1v) & p.le(ihi.splat(&[n]));
                let (beta, tau, xs) = ev_larfg(ev.vat(col, i1), tail.select(col, 0.0));
                // v: 1 at i + 1, the scaled tail below, zeros elsewhere.
                let at1 = p.eq(i1v);
                let vv = at1.select(1.0, xs);
                let (r, c) = (pos(a, &d2, 0), pos(a, &d2, 1));
                // Right: A[0..ihi, :] -= tau (A v) v^T.
                let a = r.le(ihi.splat(&d2)).select(reflect_right(a, vv, tau), a);
                // Left: A[:, i+1..] -= tau v (v^T A).
                let a = c.ge(i1.splat(&d2)).select(reflect_left(a, vv, tau), a);
                // Column i: beta at i + 1, zeros below (the reflector is kept apart).
                let colf = col_at(a, i);
                let colf = tail.select(0.0, at1.select(beta.splat(&[n]), colf));
                vec![i1.v, put_col(a, i, colf).v, put_col(vs, i, vv).v, ev.vset(taus, i, tau).v]
            },
        )
    });
    let (h, vs, taus) = (a.of(out[1]), a.of(out[2]), a.of(out[3]));
    // Q = H(ilo) ... H(ihi - 2), applied to the identity from the last reflector back.
    let q0 = {
        let (r, c) = (pos(a, &d2, 0), pos(a, &d2, 1));
        r.eq(c).select(a.k(1.0), 0.0)
    };
    let start = ihi - 2i64;
    let q = a.with(|b| {
        b.while_loop(
            &[start.v, q0.v],
            |b, v| {
                let e = Ex::new(b);
                e.of(v[0]).ge(e.of(ilo.v)).v
            },
            |b, v| {
                let e = Ex::new(b);
                let [i, q, vs, taus] = e.all([v[0], v[1], vs.v, taus.v]);
                let q = reflect_left(q, col_at(vs, i), ev.vat(taus, i));
                vec![(i - 1i64).v, q.v]
            },
        )
    });
    (hessenberg_part(h), a.of(q[1]))
}
