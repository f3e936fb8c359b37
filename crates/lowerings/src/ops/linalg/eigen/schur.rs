//! geev's Schur step: Francis double-shift QR on the Hessenberg matrix (dlahqr), with dlanv2's
//! standardized 2x2 blocks.
use crate::ops::linalg::I64E;
use super::balance::ev_larfg;
use super::{
    band, cols_at, fsign, hessenberg_part, lapy2, last_where, next_along, pick, plane_rot, pos, prev_along, put_cols,
    put_rows, reflect3, rows_at, select_all, stack, unstack, Ev,
};
use stablehlo::{Ex, Value, E};

/// LAPACK's dlanv2: the Schur factorization of a real 2x2 block in standard form (a 2x2
/// complex block gets equal diagonals and off-diagonals of opposite signs). Returns
/// ([a, b, c, d], [rt1r, rt1i, rt2r, rt2i], cs, sn).
fn ev_lanv2<'e>(ev: &Ev, a: E<'e>, bb: E<'e>, c: E<'e>, d: E<'e>) -> ([E<'e>; 4], [E<'e>; 4], E<'e>, E<'e>) {
    let (zero, one) = (a.k(0.0), a.k(1.0));
    let amd = a - d;
    // a == d and b, c of opposite signs: already standard.
    let case3 = amd.eq(0.0) & (bb.lt(0.0) ^ c.lt(0.0));
    // General case.
    let temp = amd;
    let p = 0.5 * temp;
    let (ab, ac) = (bb.abs(), c.abs());
    let bcmax = ab.max(ac);
    let bcmis = ab.min(ac) * fsign(one, bb) * fsign(one, c);
    let scale = p.abs().max(bcmax);
    let z = p / scale * p + bcmax / scale * bcmis;
    let real = z.ge(4.0 * ev.ulp());
    // Real eigenvalues.
    let (ra, rd, rb, rcs, rsn) = {
        let zz = p + fsign(scale.sqrt() * z.sqrt(), p);
        let tau = lapy2(c, zz);
        (d + zz, d - bcmax / zz * bcmis, bb - c, zz / tau, c / tau)
    };
    // Complex (or nearly equal real) eigenvalues: equal diagonals.
    let (ca, cb, cc, cd, ccs, csn) = {
        let sigma = bb + c;
        let tau = lapy2(sigma, temp);
        let cs = (0.5 * (1.0 + sigma.abs() / tau)).sqrt();
        let sn = -(p / (tau * cs) * fsign(one, sigma));
        // [aa bb; cc dd] = [a b; c d] [cs -sn; sn cs]
        let (aa, bbb) = plane_rot(a, bb, cs, sn);
        let (cc, dd) = plane_rot(c, d, cs, sn);
        // [a b; c d] = [cs sn; -sn cs] [aa bb; cc dd]
        let (na, nc) = plane_rot(aa, cc, cs, sn);
        let (nb, nd) = plane_rot(bbb, dd, cs, sn);
        let tm = 0.5 * (na + nd);
        // c != 0 and b != 0 with equal signs: real after all, triangularize.
        let (nc_nz, nb_zero) = (!nc.eq(0.0), nb.eq(0.0));
        let tri = nc_nz & !nb_zero & !(nb.lt(0.0) ^ nc.lt(0.0));
        let (sab, sac) = (nb.abs().sqrt(), nc.abs().sqrt());
        let pp = fsign(sab * sac, nc);
        let tau2 = 1.0 / (nb + nc).abs().sqrt();
        let (cs1, sn1) = (sab * tau2, sac * tau2);
        let (tcs, tsn) = (cs * cs1 - sn * sn1, cs * sn1 + sn * cs1);
        // b == 0 (c != 0): swap to upper triangular.
        let swp = nc_nz & nb_zero;
        (
            tri.select(tm + pp, tm),
            swp.select(-nc, tri.select(nb - nc, nb)),
            swp.select(0.0, tri.select(0.0, nc)),
            tri.select(tm - pp, tm),
            swp.select(-sn, tri.select(tcs, cs)),
            swp.select(cs, tri.select(tsn, sn)),
        )
    };
    // (a, b, c, d, cs, sn) of the general case, then the special cases over it (c == 0 first).
    let g = select_all(real, [ra, rb, zero, rd, rcs, rsn], [ca, cb, cc, cd, ccs, csn]);
    let f = select_all(case3, [a, bb, c, d, one, zero], g);
    let f = select_all(bb.eq(0.0), [d, -c, zero, a, zero, one], f);
    let [fa, fb, fc, fd, fcs, fsn] = select_all(c.eq(0.0), [a, bb, c, d, one, zero], f);
    let im = fc.eq(0.0).select(0.0, fb.abs().sqrt() * fc.abs().sqrt());
    ([fa, fb, fc, fd], [fa, im, fd, -im], fcs, fsn)
}

/// Lines i and i + 1 of m along `axis` (rows 0, columns 1) rotated by (cs, sn) as the
/// pairs (x, y) of `plane_rot`, changed only where `keep` holds along them.
fn rotate_pair<'e>(m: E<'e>, i: E<'e>, cs: E<'e>, sn: E<'e>, axis: usize, keep: Option<E<'e>>) -> E<'e> {
    let len = m.dims()[1 - axis];
    let blk = if axis == 0 { rows_at(m, i, 2) } else { cols_at(m, i, 2) };
    let xy = unstack(blk, axis);
    let (nx, ny) = plane_rot(xy[0], xy[1], cs.splat(&[len]), sn.splat(&[len]));
    let nw = match keep {
        Some(k) => select_all(k, [nx, ny], xy),
        None => [nx, ny],
    };
    let blk = stack(&nw, axis);
    if axis == 0 { put_rows(m, i, blk) } else { put_cols(m, i, blk) }
}

/// The 3-row reflector of a sweep step (`reflect3`) applied from the right to columns k..k+2
/// of m, in rows 0..=limit (all rows without one).
fn reflect_cols<'e>(m: E<'e>, k: E<'e>, v: [E<'e>; 2], t: [E<'e>; 3], three: E<'e>, limit: Option<E<'e>>) -> E<'e> {
    let rows_n = m.dims()[0];
    let c = unstack(cols_at(m, k, 3), 1);
    let nw = reflect3(c, v, t, three);
    let nw = match limit {
        Some(lim) => select_all(pos(m, &[rows_n], 0).le(lim.splat(&[rows_n])), nw, c),
        None => nw,
    };
    put_cols(m, k, stack(&nw, 1))
}

/// LAPACK's dlahqr with wantt and wantz: the Schur form T = Z^T H Z of an upper Hessenberg H by
/// Francis double-shift QR sweeps on the active block (deflating from the bottom, with the
/// Ahues-Kressner test and exceptional shifts), each 2x2 block standardized by dlanv2. H and Z
/// are kept padded by one row and column (zeros) so that 3-row reflectors never leave them.
/// Returns (T, Z, wr, wi).
pub(crate) fn ev_lahqr<'e>(ev: &Ev, h: E<'e>, z: E<'e>, ilo: E<'e>, ihi: E<'e>) -> (E<'e>, E<'e>, E<'e>, E<'e>) {
    let n = ev.n;
    let e = ev.e;
    let np = (n + 1).max(3);
    let pad = |m: Value, rows: i64, cols: i64| {
        h.make(|b| {
            let zero = b.constant_f64(0.0, e);
            b.pad(m, zero, &[0, 0], &[rows, cols], &[0, 0])
        })
    };
    let (h, z) = (pad(h.v, np - n, np - n), pad(z.v, 0, np - n));
    // Eigenvalues isolated by the balancing are the diagonal.
    let diag0 = {
        let dg = band(h, 0);
        dg.make(|b| b.slice(dg.v, &[0], &[n], &[1]))
    };
    let wi0 = diag0.k(0.0);
    // The active block's size ihi - ilo + 1.
    let nh = ihi - ilo + 1i64;
    let ulp = ev.ulp();
    let smlnum = ev.safmin() * (nh.cast(e) / ulp);
    let itmax = nh.max(10i64) * 30i64;
    // Clear below the subdiagonal (the "trash").
    let h = hessenberg_part(h);
    let (zero_i, fl) = (ilo.k(0.0), ilo.make(|b| b.constant_bool(false)));
    // State: H, Z, wr, wi, i, l, its, kdefl, failed.
    let out = h.with(|b| {
        b.while_loop(
            &[h.v, z.v, diag0.v, wi0.v, ihi.v, ilo.v, zero_i.v, zero_i.v, fl.v],
            |b, v| {
                let e = Ex::new(b);
                let [i, failed, ilo] = e.all([v[4], v[8], ilo.v]);
                (i.ge(ilo) & !failed).v
            },
            |b, v| {
                let e = Ex::new(b);
                let [h, z, wr, wi, i, l, its, kdefl] = e.all([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]);
                let [ilo, ihi, smlnum, itmax] = e.all([ilo.v, ihi.v, smlnum.v, itmax.v]);
                // Diagonals of H: d[k] = H[k, k], sub[k] = H[k, k-1], sup[k] = H[k, k+1].
                let (dg, sub, sup) = (band(h, 0), band(h, 1), band(h, -1));
                let kpos = pos(h, &[np], 0);
                // Shifted copies: prev[k] = x[k-1], next[k] = x[k+1] (zeros past the ends).
                let prev = |x| prev_along(x, 0);
                let next = |x| next_along(x, 0);
                // Deflation: the largest k in (l, i] whose subdiagonal is negligible.
                let l_new = {
                    let (hk, dprev, ad) = (sub.abs(), prev(dg), dg.abs());
                    let tst = dprev.abs() + ad;
                    // tst == 0: the neighbouring subdiagonals inside the active block instead.
                    let add1 = (kpos - 2i64).ge(ilo.splat(&[np])).select(prev(sub).abs(), 0.0);
                    let add2 = (kpos + 1i64).le(ihi.splat(&[np])).select(next(sub).abs(), 0.0);
                    let tst = tst.eq(0.0).select(tst + add1 + add2, tst);
                    let smv = smlnum.splat(&[np]);
                    // Ahues-Kressner: a small subdiagonal next to the 2x2 block it closes.
                    let asupp = prev(sup).abs();
                    let (ab, ba) = (hk.max(asupp), hk.min(asupp));
                    let add = (dprev - dg).abs();
                    let (aa, bbv) = (ad.max(add), ad.min(add));
                    let s = aa + ab;
                    let ak = hk.le(ulp * tst) & (ba * (ab / s)).le(smv.max(ulp * (bbv * (aa / s))));
                    let neg = hk.le(smv) | ak;
                    let cand = neg & kpos.gt(l.splat(&[np])) & kpos.le(i.splat(&[np]));
                    last_where(cand, kpos).max(l)
                };
                // H[l, l-1] = 0 when l > ilo.
                let h = {
                    let lm1 = (l_new - 1i64).max(0i64);
                    ev.set(h, l_new, lm1, l_new.gt(ilo).select(0.0, ev.at(h, l_new, lm1)))
                };
                let im1 = i - 1i64;
                let deflated = l_new.ge(im1);
                // ---- a QR sweep (when not deflated) ----
                let kdefl1 = kdefl + 1i64;
                let [rt1r, rt1i, rt2r, rt2i] = {
                    let (im1c, im2c) = (im1.max(0i64), (i - 2i64).max(0i64));
                    let (h11, h21, h12, h22) = (ev.at(h, im1c, im1c), ev.at(h, i, im1c), ev.at(h, im1c, i), ev.at(h, i, i));
                    // Exceptional shifts every 10 (from the top) and 20 (from the bottom) iterations.
                    let s_bot = h21.abs() + ev.at(h, im1c, im2c).abs();
                    let (l1c, l2c) = ((l_new + 1i64).min(np - 1), (l_new + 2i64).min(np - 1));
                    let s_top = ev.at(h, l1c, l_new).abs() + ev.at(h, l2c, l1c).abs();
                    let ex_bot = (kdefl1 % 20i64).eq(0i64);
                    let ex_top = (kdefl1 % 10i64).eq(0i64) & !ex_bot;
                    let eb11 = 0.75 * s_bot + h22;
                    let et11 = 0.75 * s_top + ev.at(h, l_new, l_new);
                    let hs = select_all(ex_bot, [eb11, -0.4375 * s_bot, s_bot, eb11], [h11, h12, h21, h22]);
                    let [h11, h12, h21, h22] = select_all(ex_top, [et11, -0.4375 * s_top, s_top, et11], hs);
                    let s = h11.abs() + h12.abs() + h21.abs() + h22.abs();
                    let (h11, h21, h12, h22) = (h11 / s, h21 / s, h12 / s, h22 / s);
                    let tr = (h11 + h22) / 2.0;
                    let det = (h11 - tr) * (h22 - tr) - h12 * h21;
                    let rtdisc = det.abs().sqrt();
                    let cplx = det.ge(0.0);
                    // Real shifts: both the root closer to h22.
                    let (r1, r2) = (tr + rtdisc, tr - rtdisc);
                    let rr = (r1 - h22).abs().le((r2 - h22).abs()).select(r1 * s, r2 * s);
                    let rt1r = cplx.select(tr * s, rr);
                    let c1i = rtdisc * s;
                    let rt = [rt1r, cplx.select(c1i, 0.0), rt1r, cplx.select(-c1i, 0.0)];
                    select_all(s.eq(0.0), [s.k(0.0); 4], rt)
                };
                // Where to start the sweep: the lowest m in [l, i-2] (searching up from i-2) whose
                // bulge would make H[m, m-1] negligible; its first reflector vector.
                let (m, v0) = {
                    let hmm = dg;
                    let hm1m = next(sub); // H[m+1, m]
                    let hmm1 = sup; // H[m, m+1]
                    let hm1m1 = next(dg); // H[m+1, m+1]
                    let hm2m1 = next(hm1m); // H[m+2, m+1]
                    let hmmm1 = sub; // H[m, m-1]
                    let hm1m1p = prev(dg); // H[m-1, m-1]
                    let [r1r, r1i, r2r, r2i] = [rt1r, rt1i, rt2r, rt2i].map(|x| x.splat(&[np]));
                    let s = (hmm - r2r).abs() + r2i.abs() + hm1m.abs();
                    let h21s = hm1m / s;
                    let v1 = h21s * hmm1 + (hmm - r1r) * ((hmm - r2r) / s) - r1i * (r2i / s);
                    let v2 = h21s * (hmm + hm1m1 - r1r - r2r);
                    let v3 = h21s * hm2m1;
                    let s = v1.abs() + v2.abs() + v3.abs();
                    let (v1, v2, v3) = (v1 / s, v2 / s, v3 / s);
                    let h00 = hmmm1.abs() * (v2.abs() + v3.abs());
                    let h01 = ulp * v1.abs() * (hm1m1p.abs() + hmm.abs() + hm1m1.abs());
                    let lv = l_new.splat(&[np]);
                    let stop = h00.le(h01) | kpos.eq(lv);
                    let cand = stop & kpos.ge(lv) & kpos.le((i - 2i64).splat(&[np]));
                    let m = last_where(cand, kpos).max(l_new);
                    (m, [pick(v1, m), pick(v2, m), pick(v3, m)])
                };
                // The sweep: k = m .. i-1 (none when deflated).
                let k_end = deflated.select(m, i);
                let sw = e.with(|b| {
                    b.while_loop(
                        &[m.v, h.v, z.v, v0[0].v, v0[1].v, v0[2].v],
                        |b, v| {
                            let e = Ex::new(b);
                            e.of(v[0]).lt(e.of(k_end.v)).v
                        },
                        |b, v| {
                            let e = Ex::new(b);
                            let [k, h, z, va, vb, vc] = e.all([v[0], v[1], v[2], v[3], v[4], v[5]]);
                            let [i, m, l_new, kpos] = e.all([i.v, m.v, l_new.v, kpos.v]);
                            let three = e.int(3, I64E);
                            let nr3 = three.min(i - k + 1i64).eq(three);
                            let after = k.gt(m);
                            // Vector: from column k-1 below the diagonal after the first step.
                            let km1c = (k - 1i64).max(0i64);
                            let colv = h.make(|b| {
                                let c = b.dynamic_slice(h.v, &[k.v, km1c.v], &[3, 1]);
                                b.reshape(c, &[3])
                            });
                            let cv: [E; 3] = unstack(colv, 0);
                            let va = after.select(cv[0], va);
                            let vb = after.select(cv[1], vb);
                            let vc = nr3.select(after.select(cv[2], vc), 0.0);
                            let (beta, t1, xv) = ev_larfg(va, stack(&[vb, vc], 0));
                            let [v2, v3] = unstack(xv, 0);
                            let v3 = nr3.select(v3, 0.0);
                            // Column k-1 after the first step: beta, then zeros.
                            let h = {
                                let cur = ev.at(h, k, km1c);
                                let first = m.gt(l_new).select(cur * (1.0 - t1), cur);
                                let h = ev.set(h, k, km1c, after.select(beta, first));
                                let k1 = k + 1i64;
                                let h = ev.set(h, k1, km1c, after.select(0.0, ev.at(h, k1, km1c)));
                                let k2 = k + 2i64;
                                let z2 = after & k.lt(i - 1i64);
                                ev.set(h, k2, km1c, z2.select(0.0, ev.at(h, k2, km1c)))
                            };
                            let t = [t1, t1 * v2, t1 * v3];
                            // From the left: rows k..k+2, columns k..n-1.
                            let r = unstack(rows_at(h, k, 3), 0);
                            let nw = reflect3(r, [v2, v3], t, nr3);
                            let cols_ok = kpos.ge(k.splat(&[np])) & kpos.lt(n);
                            let h = put_rows(h, k, stack(&select_all(cols_ok, nw, r), 0));
                            // From the right: columns k..k+2, rows 0..min(k+3, i).
                            let h = reflect_cols(h, k, [v2, v3], t, nr3, Some((k + three).min(i)));
                            let z = reflect_cols(z, k, [v2, v3], t, nr3, None);
                            [k + 1i64, h, z, va, v2, v3].map(|x| x.v).to_vec()
                        },
                    )
                });
                let (h_sw, z_sw) = (e.of(sw[1]), e.of(sw[2]));
                // ---- deflation: one eigenvalue, or a standardized 2x2 block ----
                let (h_df, z_df, wr_df, wi_df) = {
                    let one_blk = l_new.eq(i);
                    let im1c = im1.max(0i64);
                    let (a, bb, c, d) = (ev.at(h, im1c, im1c), ev.at(h, im1c, i), ev.at(h, i, im1c), ev.at(h, i, i));
                    let ([na, nb, nc, nd], [r1r, r1i, r2r, r2i], cs, sn) = ev_lanv2(ev, a, bb, c, d);
                    let h2 = ev.set(h, im1c, im1c, na);
                    let h2 = ev.set(h2, im1c, i, nb);
                    let h2 = ev.set(h2, i, im1c, nc);
                    let h2 = ev.set(h2, i, i, nd);
                    // Rotate rows i-1, i (columns > i) and columns i-1, i (rows < i-1), and Z.
                    let h2 = rotate_pair(h2, im1c, cs, sn, 0, Some(kpos.gt(i.splat(&[np]))));
                    let h2 = rotate_pair(h2, im1c, cs, sn, 1, Some(kpos.lt(im1c.splat(&[np]))));
                    let z2 = rotate_pair(z, im1c, cs, sn, 1, None);
                    let wr2 = ev.vset(ev.vset(wr, im1c, r1r), i, r2r);
                    let wi2 = ev.vset(ev.vset(wi, im1c, r1i), i, r2i);
                    let wr1 = ev.vset(wr, i, d);
                    let wi1 = ev.vset(wi, i, d.k(0.0));
                    (one_blk.select(h, h2), one_blk.select(z, z2), one_blk.select(wr1, wr2), one_blk.select(wi1, wi2))
                };
                let h = deflated.select(h_df, h_sw);
                let z = deflated.select(z_df, z_sw);
                let wr = deflated.select(wr_df, wr);
                let wi = deflated.select(wi_df, wi);
                let i_n = deflated.select(l_new - 1i64, i);
                let l_n = deflated.select(ilo, l_new);
                let its_n = deflated.select(0i64, its + 1i64);
                let kd_n = deflated.select(0i64, kdefl1);
                [h, z, wr, wi, i_n, l_n, its_n, kd_n, its_n.gt(itmax)].map(|x| x.v).to_vec()
            },
        )
    });
    let [t, zf] = [out[0], out[1]].map(|m| h.make(|b| b.slice(m, &[0, 0], &[n, n], &[1, 1])));
    // A failed iteration leaves NaN eigenvalues (LAPACK reports info > 0).
    let failed = h.of(out[8]).splat(&[n]);
    (t, zf, failed.select(f64::NAN, out[2]), failed.select(f64::NAN, out[3]))
}
