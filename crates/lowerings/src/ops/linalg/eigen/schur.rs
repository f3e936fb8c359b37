//! geev's Schur step: Francis double-shift QR on the Hessenberg matrix (dlahqr), with dlanv2's
//! standardized 2x2 blocks.
use crate::blocks::loops::select_all;
use crate::ops::linalg::{iota as idx, ispl, pick1, splat as spl, I64E};
use super::balance::ev_larfg;
use super::{band, fsign, hessenberg_part, lapy2, last_where, next_along, plane_rot, prev_along, reflect3, stack, unstack, Ev};
use stablehlo::{Builder, CmpDir, Value};

/// LAPACK's dlanv2: the Schur factorization of a real 2x2 block in standard form (a 2x2
/// complex block gets equal diagonals and off-diagonals of opposite signs). Returns
/// ([a, b, c, d], [rt1r, rt1i, rt2r, rt2i], cs, sn).
fn ev_lanv2(b: &mut Builder, ev: &Ev, a: Value, bb: Value, c: Value, d: Value) -> ([Value; 4], [Value; 4], Value, Value) {
    let zero = ev.c(b, 0.0);
    let one = ev.c(b, 1.0);
    let half = ev.c(b, 0.5);
    let eps = ev.c(b, 4.0 * ev.ulp());
    let c_zero = b.compare(CmpDir::Eq, c, zero);
    let b_zero = b.compare(CmpDir::Eq, bb, zero);
    let amd = b.sub(a, d);
    let amd0 = b.compare(CmpDir::Eq, amd, zero);
    let bneg = b.compare(CmpDir::Lt, bb, zero);
    let cneg = b.compare(CmpDir::Lt, c, zero);
    let diff_sign = b.xor(bneg, cneg);
    let case3 = b.and(amd0, diff_sign);
    // General case.
    let temp = amd;
    let p = b.mul(half, temp);
    let ab = b.abs(bb);
    let ac = b.abs(c);
    let bcmax = b.max(ab, ac);
    let bcmis0 = b.min(ab, ac);
    let sb = fsign(b, one, bb);
    let sc = fsign(b, one, c);
    let bcmis = b.mul(bcmis0, sb);
    let bcmis = b.mul(bcmis, sc);
    let pa = b.abs(p);
    let scale = b.max(pa, bcmax);
    let q1 = b.div(p, scale);
    let q1 = b.mul(q1, p);
    let q2 = b.div(bcmax, scale);
    let q2 = b.mul(q2, bcmis);
    let z = b.add(q1, q2);
    let real = b.compare(CmpDir::Ge, z, eps);
    // Real eigenvalues.
    let (ra, rd, rb, rcs, rsn) = {
        let s1 = b.sqrt(scale);
        let s2 = b.sqrt(z);
        let s12 = b.mul(s1, s2);
        let sg = fsign(b, s12, p);
        let zz = b.add(p, sg);
        let na = b.add(d, zz);
        let t = b.div(bcmax, zz);
        let t = b.mul(t, bcmis);
        let nd = b.sub(d, t);
        let tau = lapy2(b, c, zz);
        let cs = b.div(zz, tau);
        let sn = b.div(c, tau);
        let nb = b.sub(bb, c);
        (na, nd, nb, cs, sn)
    };
    // Complex (or nearly equal real) eigenvalues: equal diagonals.
    let (ca, cb, cc, cd, ccs, csn) = {
        let sigma = b.add(bb, c);
        let tau = lapy2(b, sigma, temp);
        let sa = b.abs(sigma);
        let q = b.div(sa, tau);
        let q = b.add(one, q);
        let q = b.mul(half, q);
        let cs = b.sqrt(q);
        let tc = b.mul(tau, cs);
        let pq = b.div(p, tc);
        let ss = fsign(b, one, sigma);
        let sn = b.mul(pq, ss);
        let sn = b.neg(sn);
        // [aa bb; cc dd] = [a b; c d] [cs -sn; sn cs]
        let (aa, bbb) = plane_rot(b, a, bb, cs, sn);
        let (cc, dd) = plane_rot(b, c, d, cs, sn);
        // [a b; c d] = [cs sn; -sn cs] [aa bb; cc dd]
        let (na, nc) = plane_rot(b, aa, cc, cs, sn);
        let (nb, nd) = plane_rot(b, bbb, dd, cs, sn);
        let s = b.add(na, nd);
        let tm = b.mul(half, s);
        // c != 0 and b != 0 with equal signs: real after all, triangularize.
        let nc_zero = b.compare(CmpDir::Eq, nc, zero);
        let nb_zero = b.compare(CmpDir::Eq, nb, zero);
        let nbneg = b.compare(CmpDir::Lt, nb, zero);
        let ncneg = b.compare(CmpDir::Lt, nc, zero);
        let same = b.xor(nbneg, ncneg);
        let same = b.not(same);
        let nc_nz = b.not(nc_zero);
        let nb_nz = b.not(nb_zero);
        let tri = b.and(nc_nz, nb_nz);
        let tri = b.and(tri, same);
        let sab = b.abs(nb);
        let sab = b.sqrt(sab);
        let sac = b.abs(nc);
        let sac = b.sqrt(sac);
        let sp = b.mul(sab, sac);
        let pp = fsign(b, sp, nc);
        let bc = b.add(nb, nc);
        let bc = b.abs(bc);
        let bc = b.sqrt(bc);
        let tau2 = b.div(one, bc);
        let ta = b.add(tm, pp);
        let td = b.sub(tm, pp);
        let tb = b.sub(nb, nc);
        let cs1 = b.mul(sab, tau2);
        let sn1 = b.mul(sac, tau2);
        let t1 = b.mul(cs, cs1);
        let t2 = b.mul(sn, sn1);
        let tcs = b.sub(t1, t2);
        let t1 = b.mul(cs, sn1);
        let t2 = b.mul(sn, cs1);
        let tsn = b.add(t1, t2);
        // b == 0 (c != 0): swap to upper triangular.
        let swp = b.and(nc_nz, nb_zero);
        let sb2 = b.neg(nc);
        let scs = b.neg(sn);
        let ra = b.select(tri, ta, tm);
        let rd = b.select(tri, td, tm);
        let rb = b.select(tri, tb, nb);
        let rb = b.select(swp, sb2, rb);
        let rc = b.select(tri, zero, nc);
        let rc = b.select(swp, zero, rc);
        let rcs = b.select(tri, tcs, cs);
        let rcs = b.select(swp, scs, rcs);
        let rsn = b.select(tri, tsn, sn);
        let rsn = b.select(swp, cs, rsn);
        (ra, rb, rc, rd, rcs, rsn)
    };
    // (a, b, c, d, cs, sn) of the general case, then the special cases over it (c == 0 first).
    let g = select_all(b, real, &[ra, rb, zero, rd, rcs, rsn], &[ca, cb, cc, cd, ccs, csn]);
    let nbc = b.neg(c);
    let f = select_all(b, case3, &[a, bb, c, d, one, zero], &g);
    let f = select_all(b, b_zero, &[d, nbc, zero, a, zero, one], &f);
    let f = select_all(b, c_zero, &[a, bb, c, d, one, zero], &f);
    let (fa, fb, fc, fd, fcs, fsn) = (f[0], f[1], f[2], f[3], f[4], f[5]);
    let fc0 = b.compare(CmpDir::Eq, fc, zero);
    let sbv = b.abs(fb);
    let sbv = b.sqrt(sbv);
    let scv = b.abs(fc);
    let scv = b.sqrt(scv);
    let im = b.mul(sbv, scv);
    let im = b.select(fc0, zero, im);
    let nim = b.neg(im);
    ([fa, fb, fc, fd], [fa, im, fd, nim], fcs, fsn)
}

/// LAPACK's dlahqr with wantt and wantz: the Schur form T = Z^T H Z of an upper Hessenberg H by
/// Francis double-shift QR sweeps on the active block (deflating from the bottom, with the
/// Ahues-Kressner test and exceptional shifts), each 2x2 block standardized by dlanv2. H and Z
/// are kept padded by one row and column (zeros) so that 3-row reflectors never leave them.
/// Returns (T, Z, wr, wi).
pub(crate) fn ev_lahqr(b: &mut Builder, ev: &Ev, h: Value, z: Value, ilo: Value, ihi: Value) -> (Value, Value, Value, Value) {
    let n = ev.n;
    let e = ev.e;
    let np = (n + 1).max(3);
    let zero_e = b.constant_f64(0.0, e);
    let h = b.pad(h, zero_e, &[0, 0], &[np - n, np - n], &[0, 0]);
    let z = b.pad(z, zero_e, &[0, 0], &[0, np - n], &[0, 0]);
    // Eigenvalues isolated by the balancing are the diagonal.
    let diag0 = {
        let dg = band(b, h, 0);
        b.slice(dg, &[0], &[n], &[1])
    };
    let wi0 = spl(b, 0.0, e, &[n]);
    // The active block's size ihi - ilo + 1.
    let nh = {
        let d = b.sub(ihi, ilo);
        let one = ev.i(b, 1);
        b.add(d, one)
    };
    let ulp = ev.ulp();
    let smlnum = {
        let u = ev.c(b, ulp);
        let nhf = b.convert(nh, e);
        let q = b.div(nhf, u);
        let s = ev.c(b, ev.safmin());
        b.mul(s, q)
    };
    let itmax = {
        let ten = ev.i(b, 10);
        let m = b.max(nh, ten);
        let t = ev.i(b, 30);
        b.mul(m, t)
    };
    // Clear below the subdiagonal (the "trash").
    let h = hessenberg_part(b, h);
    let zero_i = ev.i(b, 0);
    let fl = b.constant_bool(false);
    // State: H, Z, wr, wi, i, l, its, kdefl, failed.
    let out = b.while_loop(
        &[h, z, diag0, wi0, ihi, ilo, zero_i, zero_i, fl],
        |b, v| {
            let ge = b.compare(CmpDir::Ge, v[4], ilo);
            let ok = b.not(v[8]);
            b.and(ge, ok)
        },
        |b, v| {
            let (h, z, wr, wi, i, l, its, kdefl) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            let one_i = ev.i(b, 1);
            let two_i = ev.i(b, 2);
            let zero_i = ev.i(b, 0);
            let zero = ev.c(b, 0.0);
            // Diagonals of H: d[k] = H[k, k], sub[k] = H[k, k-1], sup[k] = H[k, k+1].
            let (dg, sub, sup) = (band(b, h, 0), band(b, h, 1), band(b, h, -1));
            let kpos = idx(b, &[np], 0);
            // Shifted copies: prev[k] = x[k-1], next[k] = x[k+1] (zeros past the ends).
            let prev = |b: &mut Builder, x: Value| prev_along(b, x, 0);
            let next = |b: &mut Builder, x: Value| next_along(b, x, 0);
            // Deflation: the largest k in (l, i] whose subdiagonal is negligible.
            let l_new = {
                let hk = b.abs(sub);
                let dprev = prev(b, dg);
                let adp = b.abs(dprev);
                let ad = b.abs(dg);
                let tst = b.add(adp, ad);
                let zvv = spl(b, 0.0, e, &[np]);
                let tz = b.compare(CmpDir::Eq, tst, zvv);
                let subp = prev(b, sub);
                let asubp = b.abs(subp);
                let subn = next(b, sub);
                let asubn = b.abs(subn);
                let km2 = {
                    let t = ispl(b, 2, &[np]);
                    b.sub(kpos, t)
                };
                let ilov = b.broadcast_in_dim(ilo, &[np], &[]);
                let ihiv = b.broadcast_in_dim(ihi, &[np], &[]);
                let c1 = b.compare(CmpDir::Ge, km2, ilov);
                let kp1 = {
                    let t = ispl(b, 1, &[np]);
                    b.add(kpos, t)
                };
                let c2 = b.compare(CmpDir::Le, kp1, ihiv);
                let zv = spl(b, 0.0, e, &[np]);
                let add1 = b.select(c1, asubp, zv);
                let add2 = b.select(c2, asubn, zv);
                let t2 = b.add(tst, add1);
                let t2 = b.add(t2, add2);
                let tst = b.select(tz, t2, tst);
                let smv = b.broadcast_in_dim(smlnum, &[np], &[]);
                let tiny = b.compare(CmpDir::Le, hk, smv);
                let uv = spl(b, ulp, e, &[np]);
                let ut = b.mul(uv, tst);
                let small = b.compare(CmpDir::Le, hk, ut);
                let asupp = {
                    let sp = prev(b, sup);
                    b.abs(sp)
                };
                let ab = b.max(hk, asupp);
                let ba = b.min(hk, asupp);
                let dd = b.sub(dprev, dg);
                let add_ = b.abs(dd);
                let aa = b.max(ad, add_);
                let bbv = b.min(ad, add_);
                let s = b.add(aa, ab);
                let q = b.div(ab, s);
                let lhs = b.mul(ba, q);
                let q2 = b.div(aa, s);
                let q2 = b.mul(bbv, q2);
                let rhs = b.mul(uv, q2);
                let rhs = b.max(smv, rhs);
                let ak = b.compare(CmpDir::Le, lhs, rhs);
                let ak = b.and(small, ak);
                let neg = b.or(tiny, ak);
                let lv = b.broadcast_in_dim(l, &[np], &[]);
                let iv = b.broadcast_in_dim(i, &[np], &[]);
                let gt_l = b.compare(CmpDir::Gt, kpos, lv);
                let le_i = b.compare(CmpDir::Le, kpos, iv);
                let cand = b.and(neg, gt_l);
                let cand = b.and(cand, le_i);
                let k = last_where(b, cand, kpos);
                b.max(k, l)
            };
            // H[l, l-1] = 0 when l > ilo.
            let h = {
                let gt = b.compare(CmpDir::Gt, l_new, ilo);
                let lm1 = b.sub(l_new, one_i);
                let lm1 = b.max(lm1, zero_i);
                let cur = ev.at(b, h, l_new, lm1);
                let nv = b.select(gt, zero, cur);
                ev.set(b, h, l_new, lm1, nv)
            };
            let im1 = b.sub(i, one_i);
            let deflated = b.compare(CmpDir::Ge, l_new, im1);
            // ---- a QR sweep (when not deflated) ----
            let kdefl1 = b.add(kdefl, one_i);
            let (rt1r, rt1i, rt2r, rt2i) = {
                let im1c = b.max(im1, zero_i);
                let im2 = b.sub(i, two_i);
                let im2c = b.max(im2, zero_i);
                let h11 = ev.at(b, h, im1c, im1c);
                let h21 = ev.at(b, h, i, im1c);
                let h12 = ev.at(b, h, im1c, i);
                let h22 = ev.at(b, h, i, i);
                let dat1 = ev.c(b, 0.75);
                let dat2 = ev.c(b, -0.4375);
                // Exceptional shifts every 10 (from the top) and 20 (from the bottom) iterations.
                let h_i_im1 = b.abs(h21);
                let h_im1_im2 = ev.at(b, h, im1c, im2c);
                let h_im1_im2 = b.abs(h_im1_im2);
                let s_bot = b.add(h_i_im1, h_im1_im2);
                let l1 = b.add(l_new, one_i);
                let l2 = b.add(l_new, two_i);
                let npm = ev.i(b, np - 1);
                let l1c = b.min(l1, npm);
                let l2c = b.min(l2, npm);
                let hl1l = ev.at(b, h, l1c, l_new);
                let hl1l = b.abs(hl1l);
                let hl2l1 = ev.at(b, h, l2c, l1c);
                let hl2l1 = b.abs(hl2l1);
                let s_top = b.add(hl1l, hl2l1);
                let twenty = ev.i(b, 20);
                let ten = ev.i(b, 10);
                let r20 = b.rem(kdefl1, twenty);
                let ex_bot = b.compare(CmpDir::Eq, r20, zero_i);
                let r10 = b.rem(kdefl1, ten);
                let ex_top = b.compare(CmpDir::Eq, r10, zero_i);
                let not_bot = b.not(ex_bot);
                let ex_top = b.and(ex_top, not_bot);
                let hll = ev.at(b, h, l_new, l_new);
                let t = b.mul(dat1, s_bot);
                let eb11 = b.add(t, h22);
                let eb12 = b.mul(dat2, s_bot);
                let t = b.mul(dat1, s_top);
                let et11 = b.add(t, hll);
                let et12 = b.mul(dat2, s_top);
                let hs = select_all(b, ex_bot, &[eb11, eb12, s_bot, eb11], &[h11, h12, h21, h22]);
                let hs = select_all(b, ex_top, &[et11, et12, s_top, et11], &hs);
                let (h11, h12, h21, h22) = (hs[0], hs[1], hs[2], hs[3]);
                let a11 = b.abs(h11);
                let a12 = b.abs(h12);
                let a21 = b.abs(h21);
                let a22 = b.abs(h22);
                let s = b.add(a11, a12);
                let s = b.add(s, a21);
                let s = b.add(s, a22);
                let s_zero = b.compare(CmpDir::Eq, s, zero);
                let h11 = b.div(h11, s);
                let h21 = b.div(h21, s);
                let h12 = b.div(h12, s);
                let h22 = b.div(h22, s);
                let two = ev.c(b, 2.0);
                let tr = b.add(h11, h22);
                let tr = b.div(tr, two);
                let x1 = b.sub(h11, tr);
                let x2 = b.sub(h22, tr);
                let det = b.mul(x1, x2);
                let hh = b.mul(h12, h21);
                let det = b.sub(det, hh);
                let adet = b.abs(det);
                let rtdisc = b.sqrt(adet);
                let cplx = b.compare(CmpDir::Ge, det, zero);
                let c1r = b.mul(tr, s);
                let c1i = b.mul(rtdisc, s);
                let c2i = b.neg(c1i);
                let r1 = b.add(tr, rtdisc);
                let r2 = b.sub(tr, rtdisc);
                let d1 = b.sub(r1, h22);
                let d1 = b.abs(d1);
                let d2v = b.sub(r2, h22);
                let d2v = b.abs(d2v);
                let use1 = b.compare(CmpDir::Le, d1, d2v);
                let r1s = b.mul(r1, s);
                let r2s = b.mul(r2, s);
                let rr = b.select(use1, r1s, r2s);
                let rt1r = b.select(cplx, c1r, rr);
                let rt2r = rt1r;
                let rt1i = b.select(cplx, c1i, zero);
                let rt2i = b.select(cplx, c2i, zero);
                let rt = select_all(b, s_zero, &[zero; 4], &[rt1r, rt1i, rt2r, rt2i]);
                (rt[0], rt[1], rt[2], rt[3])
            };
            // Where to start the sweep: the lowest m in [l, i-2] (searching up from i-2) whose
            // bulge would make H[m, m-1] negligible; its first reflector vector.
            let (m, v0) = {
                let hmm = dg;
                let hm1m = next(b, sub); // H[m+1, m]
                let hmm1 = sup; // H[m, m+1]
                let hm1m1 = next(b, dg); // H[m+1, m+1]
                let hm2m1 = next(b, hm1m); // H[m+2, m+1]
                let hmmm1 = sub; // H[m, m-1]
                let hm1m1p = prev(b, dg); // H[m-1, m-1]
                let rv = |b: &mut Builder, x: Value| b.broadcast_in_dim(x, &[np], &[]);
                let r1r = rv(b, rt1r);
                let r1i = rv(b, rt1i);
                let r2r = rv(b, rt2r);
                let r2i = rv(b, rt2i);
                let t = b.sub(hmm, r2r);
                let t = b.abs(t);
                let a2i = b.abs(r2i);
                let ah = b.abs(hm1m);
                let s = b.add(t, a2i);
                let s = b.add(s, ah);
                let h21s = b.div(hm1m, s);
                let x = b.mul(h21s, hmm1);
                let y1 = b.sub(hmm, r1r);
                let y2 = b.sub(hmm, r2r);
                let y2 = b.div(y2, s);
                let y = b.mul(y1, y2);
                let w = b.div(r2i, s);
                let w = b.mul(r1i, w);
                let v1 = b.add(x, y);
                let v1 = b.sub(v1, w);
                let t = b.add(hmm, hm1m1);
                let t = b.sub(t, r1r);
                let t = b.sub(t, r2r);
                let v2 = b.mul(h21s, t);
                let v3 = b.mul(h21s, hm2m1);
                let a1 = b.abs(v1);
                let a2 = b.abs(v2);
                let a3 = b.abs(v3);
                let s = b.add(a1, a2);
                let s = b.add(s, a3);
                let v1 = b.div(v1, s);
                let v2 = b.div(v2, s);
                let v3 = b.div(v3, s);
                let a2 = b.abs(v2);
                let a3 = b.abs(v3);
                let t = b.add(a2, a3);
                let hm = b.abs(hmmm1);
                let h00 = b.mul(hm, t);
                let a1 = b.abs(v1);
                let uv = spl(b, ulp, e, &[np]);
                let u1 = b.mul(uv, a1);
                let p1 = b.abs(hm1m1p);
                let p2 = b.abs(hmm);
                let p3 = b.abs(hm1m1);
                let ps = b.add(p1, p2);
                let ps = b.add(ps, p3);
                let h01 = b.mul(u1, ps);
                let stop = b.compare(CmpDir::Le, h00, h01);
                let lv = b.broadcast_in_dim(l_new, &[np], &[]);
                let at_l = b.compare(CmpDir::Eq, kpos, lv);
                let stop = b.or(stop, at_l);
                let ge_l = b.compare(CmpDir::Ge, kpos, lv);
                let im2 = b.sub(i, two_i);
                let im2v = b.broadcast_in_dim(im2, &[np], &[]);
                let le = b.compare(CmpDir::Le, kpos, im2v);
                let cand = b.and(stop, ge_l);
                let cand = b.and(cand, le);
                let m = last_where(b, cand, kpos);
                let m = b.max(m, l_new);
                let v1m = pick1(b, v1, m);
                let v2m = pick1(b, v2, m);
                let v3m = pick1(b, v3, m);
                (m, [v1m, v2m, v3m])
            };
            // The sweep: k = m .. i-1 (none when deflated).
            let k_end = b.select(deflated, m, i);
            let sw = b.while_loop(
                &[m, h, z, v0[0], v0[1], v0[2]],
                |b, v| b.compare(CmpDir::Lt, v[0], k_end),
                |b, v| {
                    let (k, h, z) = (v[0], v[1], v[2]);
                    let one_i = b.constant_i64(1, I64E);
                    let zero_i = b.constant_i64(0, I64E);
                    let zero = b.constant_f64(0.0, e);
                    let one = b.constant_f64(1.0, e);
                    let three = b.constant_i64(3, I64E);
                    let ik = b.sub(i, k);
                    let ik1 = b.add(ik, one_i);
                    let nr = b.min(three, ik1);
                    let nr3 = b.compare(CmpDir::Eq, nr, three);
                    let after = b.compare(CmpDir::Gt, k, m);
                    // Vector: from column k-1 below the diagonal after the first step.
                    let km1 = b.sub(k, one_i);
                    let km1c = b.max(km1, zero_i);
                    let colv = b.dynamic_slice(h, &[k, km1c], &[3, 1]);
                    let colv = b.reshape(colv, &[3]);
                    let cv = unstack(b, colv, 0);
                    let va = b.select(after, cv[0], v[3]);
                    let vb = b.select(after, cv[1], v[4]);
                    let vc = b.select(after, cv[2], v[5]);
                    let vc = b.select(nr3, vc, zero);
                    let xs = stack(b, &[vb, vc], 0);
                    let (beta, t1, xv) = ev_larfg(b, ev, va, xs);
                    let xv = unstack(b, xv, 0);
                    let v2 = xv[0];
                    let v3 = b.select(nr3, xv[1], zero);
                    // Column k-1 after the first step: beta, then zeros.
                    let h = {
                        let cur = ev.at(b, h, k, km1c);
                        let m_gt_l = b.compare(CmpDir::Gt, m, l_new);
                        let t = b.sub(one, t1);
                        let scaled = b.mul(cur, t);
                        let first = b.select(m_gt_l, scaled, cur);
                        let nv = b.select(after, beta, first);
                        let h = ev.set(b, h, k, km1c, nv);
                        let k1 = b.add(k, one_i);
                        let cur1 = ev.at(b, h, k1, km1c);
                        let nv1 = b.select(after, zero, cur1);
                        let h = ev.set(b, h, k1, km1c, nv1);
                        let two = b.constant_i64(2, I64E);
                        let k2 = b.add(k, two);
                        let cur2 = ev.at(b, h, k2, km1c);
                        let im1 = b.sub(i, one_i);
                        let lt = b.compare(CmpDir::Lt, k, im1);
                        let z2 = b.and(after, lt);
                        let nv2 = b.select(z2, zero, cur2);
                        ev.set(b, h, k2, km1c, nv2)
                    };
                    let t2 = b.mul(t1, v2);
                    let t3 = b.mul(t1, v3);
                    let t = [t1, t2, t3];
                    // From the left: rows k..k+2, columns k..n-1.
                    let rows = b.dynamic_slice(h, &[k, zero_i], &[3, np]);
                    let r = unstack(b, rows, 0);
                    let nw = reflect3(b, &r, [v2, v3], t, nr3);
                    let kv = b.broadcast_in_dim(k, &[np], &[]);
                    let cols_ok = b.compare(CmpDir::Ge, kpos, kv);
                    let nn = ispl(b, n, &[np]);
                    let in_n = b.compare(CmpDir::Lt, kpos, nn);
                    let cols_ok = b.and(cols_ok, in_n);
                    let nw = select_all(b, cols_ok, &nw, &r);
                    let rows = stack(b, &nw, 0);
                    let h = b.dynamic_update_slice(h, rows, &[k, zero_i]);
                    // From the right: columns k..k+2, rows 0..min(k+3, i).
                    let apply_right = |b: &mut Builder, m: Value, rows_n: i64, limit: Option<Value>| -> Value {
                        let cols = b.dynamic_slice(m, &[zero_i, k], &[rows_n, 3]);
                        let c = unstack(b, cols, 1);
                        let nw = reflect3(b, &c, [v2, v3], t, nr3);
                        let nw = match limit {
                            Some(lim) => {
                                let pos = idx(b, &[rows_n], 0);
                                let lv = b.broadcast_in_dim(lim, &[rows_n], &[]);
                                let ok = b.compare(CmpDir::Le, pos, lv);
                                select_all(b, ok, &nw, &c)
                            }
                            None => nw,
                        };
                        let cols = stack(b, &nw, 1);
                        b.dynamic_update_slice(m, cols, &[zero_i, k])
                    };
                    let k3 = b.add(k, three);
                    let lim = b.min(k3, i);
                    let h = apply_right(b, h, np, Some(lim));
                    let z = apply_right(b, z, n, None);
                    let k1 = b.add(k, one_i);
                    vec![k1, h, z, va, v2, v3]
                },
            );
            let (h_sw, z_sw) = (sw[1], sw[2]);
            // ---- deflation: one eigenvalue, or a standardized 2x2 block ----
            let (h_df, z_df, wr_df, wi_df) = {
                let one_blk = b.compare(CmpDir::Eq, l_new, i);
                let im1c = b.max(im1, zero_i);
                let a = ev.at(b, h, im1c, im1c);
                let bb = ev.at(b, h, im1c, i);
                let c = ev.at(b, h, i, im1c);
                let d = ev.at(b, h, i, i);
                let ([na, nb, nc, nd], [r1r, r1i, r2r, r2i], cs, sn) = ev_lanv2(b, ev, a, bb, c, d);
                let h2 = ev.set(b, h, im1c, im1c, na);
                let h2 = ev.set(b, h2, im1c, i, nb);
                let h2 = ev.set(b, h2, i, im1c, nc);
                let h2 = ev.set(b, h2, i, i, nd);
                // Rotate rows i-1, i (columns > i) and columns i-1, i (rows < i-1), and Z.
                // rotate_pair: lines i-1 and i of m along `axis` (rows 0, columns 1) rotated by
                // (cs, sn), changed only where `keep` holds along them.
                let rotate_pair = |b: &mut Builder, m: Value, axis: usize, keep: Option<Value>| -> Value {
                    let len = b.dims(m)[1 - axis];
                    let (start, size) = if axis == 0 { ([im1c, zero_i], [2, len]) } else { ([zero_i, im1c], [len, 2]) };
                    let blk = b.dynamic_slice(m, &start, &size);
                    let xy = unstack(b, blk, axis);
                    let csv = b.broadcast_in_dim(cs, &[len], &[]);
                    let snv = b.broadcast_in_dim(sn, &[len], &[]);
                    let (nx, ny) = plane_rot(b, xy[0], xy[1], csv, snv);
                    let nw = match keep {
                        Some(k) => select_all(b, k, &[nx, ny], &xy),
                        None => vec![nx, ny],
                    };
                    let blk = stack(b, &nw, axis);
                    b.dynamic_update_slice(m, blk, &start)
                };
                let iv = b.broadcast_in_dim(i, &[np], &[]);
                let gt = b.compare(CmpDir::Gt, kpos, iv);
                let h2 = rotate_pair(b, h2, 0, Some(gt));
                let im1v = b.broadcast_in_dim(im1c, &[np], &[]);
                let lt = b.compare(CmpDir::Lt, kpos, im1v);
                let h2 = rotate_pair(b, h2, 1, Some(lt));
                let z2 = rotate_pair(b, z, 1, None);
                let wr2 = ev.vset(b, wr, im1c, r1r);
                let wr2 = ev.vset(b, wr2, i, r2r);
                let wi2 = ev.vset(b, wi, im1c, r1i);
                let wi2 = ev.vset(b, wi2, i, r2i);
                let hii = ev.at(b, h, i, i);
                let wr1 = ev.vset(b, wr, i, hii);
                let wi1 = ev.vset(b, wi, i, zero);
                (
                    b.select(one_blk, h, h2),
                    b.select(one_blk, z, z2),
                    b.select(one_blk, wr1, wr2),
                    b.select(one_blk, wi1, wi2),
                )
            };
            let h = b.select(deflated, h_df, h_sw);
            let z = b.select(deflated, z_df, z_sw);
            let wr = b.select(deflated, wr_df, wr);
            let wi = b.select(deflated, wi_df, wi);
            let lm1 = b.sub(l_new, one_i);
            let i_n = b.select(deflated, lm1, i);
            let l_n = b.select(deflated, ilo, l_new);
            let its1 = b.add(its, one_i);
            let its_n = b.select(deflated, zero_i, its1);
            let kd_n = b.select(deflated, zero_i, kdefl1);
            let failed = b.compare(CmpDir::Gt, its_n, itmax);
            vec![h, z, wr, wi, i_n, l_n, its_n, kd_n, failed]
        },
    );
    let t = b.slice(out[0], &[0, 0], &[n, n], &[1, 1]);
    let zf = b.slice(out[1], &[0, 0], &[n, n], &[1, 1]);
    // A failed iteration leaves NaN eigenvalues (LAPACK reports info > 0).
    let nanv = spl(b, f64::NAN, e, &[n]);
    let failed = b.broadcast_in_dim(out[8], &[n], &[]);
    let wr = b.select(failed, nanv, out[2]);
    let wi = b.select(failed, nanv, out[3]);
    (t, zf, wr, wi)
}
