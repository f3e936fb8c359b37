//! geev's last step: the eigenvectors of the Schur form (dtrevc3), back-transformed, the
//! balancing undone (dgebak) and normalized as dgeev does.
use crate::ops::linalg::{cspl, first_argmax, iota as idx, ispl, pick1, splat as spl, sum as sum_over, swap_lines, I64E};
use super::{band, col_at, fsign, lapy2, next_along, plane_rot, prev_along, row_at, Ev};
use stablehlo::{Builder, CmpDir, ElemType, Precision, Value};

/// A real value as a complex one (zero imaginary part).
fn cplx(b: &mut Builder, re: Value) -> Value {
    let d = b.dims(re).to_vec();
    let z = spl(b, 0.0, b.elem(re), &d);
    b.complex(re, z)
}

/// Right eigenvectors of the standardized quasi-triangular T (LAPACK's dtrevc3, back-transformed
/// by Z), the balancing undone (dgebak), each normalized as dgeev does: unit 2-norm; for a
/// complex pair, the largest component made real by a plane rotation (dlartg: LAPACK 3.10's
/// sign convention for float, the older one for double, as MKL's sgeev/dgeev). Returns the
/// complex eigenvector matrix [n, n] (a pair's second column the conjugate of the first).
pub(crate) fn ev_vectors(b: &mut Builder, ev: &Ev, t: Value, z: Value, scale: Value, ilo: Value, ihi: Value) -> Value {
    let n = ev.n;
    let e = ev.e;
    let ce = e.complex_of().unwrap();
    let d2 = [n, n];
    let zero = ev.c(b, 0.0);
    let ulp = ev.ulp();
    let smlnum = ev.safmin() * (n as f64 / ulp);
    // Subdiagonal and diagonal of T.
    let r = idx(b, &d2, 0);
    let c = idx(b, &d2, 1);
    let dg = band(b, t, 0);
    let sub = band(b, t, 1); // sub[k] = T[k, k-1]
    let sup = band(b, t, -1); // sup[k] = T[k, k+1]
    let sub_next = next_along(b, sub, 0); // T[k+1, k]
    let zv = spl(b, 0.0, e, &[n]);
    let second = b.compare(CmpDir::Ne, sub, zv);
    let first = b.compare(CmpDir::Ne, sub_next, zv);
    // Eigenvalue of each column: a pair's first column takes wr + i wi (wi > 0).
    let dg_next = next_along(b, dg, 0);
    let wi = {
        let a = b.abs(sub_next);
        let a = b.sqrt(a);
        let c = b.abs(sup);
        let c = b.sqrt(c);
        b.mul(a, c)
    };
    let wr = b.select(first, dg_next, dg);
    let wi = b.select(first, wi, zv);
    let lam = b.complex(wr, wi);
    let smin = {
        let a = b.abs(wr);
        let w = b.abs(wi);
        let s = b.add(a, w);
        let u = spl(b, ulp, e, &[n]);
        let s = b.mul(u, s);
        let sm = spl(b, smlnum, e, &[n]);
        b.max(s, sm)
    };
    // Initial vectors: 1 at the real eigenvalue; for a pair (k, k+1), LAPACK's choice.
    let x0 = {
        let onev = spl(b, 1.0, e, &[n]);
        let big = {
            let a = b.abs(sup);
            let c = b.abs(sub_next);
            b.compare(CmpDir::Ge, a, c)
        };
        let w_t12 = b.div(wi, sup);
        let w_t21 = b.div(wi, sub_next);
        let nw_t21 = b.neg(w_t21);
        // first component (row c) and second (row c + 1, imaginary) of a pair's column c
        let p1 = b.select(big, onev, nw_t21);
        let p2 = b.select(big, w_t12, onev);
        let diag_val = b.select(first, p1, onev);
        let diag_val = cplx(b, diag_val);
        let below = b.complex(zv, p2);
        let cz = cspl(b, 0.0, e, &d2);
        let on = b.compare(CmpDir::Eq, r, c);
        let dv = b.broadcast_in_dim(diag_val, &d2, &[1]);
        let x = b.select(on, dv, cz);
        let one2 = ispl(b, 1, &d2);
        let c1 = b.add(c, one2);
        let onb = b.compare(CmpDir::Eq, r, c1);
        let fb = b.broadcast_in_dim(first, &d2, &[1]);
        let onb = b.and(onb, fb);
        let bv = b.broadcast_in_dim(below, &d2, &[1]);
        let x = b.select(onb, bv, x);
        // Second columns of pairs are rebuilt from the first.
        let sb = b.broadcast_in_dim(second, &d2, &[1]);
        b.select(sb, cz, x)
    };
    let tc = cplx(b, t);
    b.set_precision(Some(Precision::Highest));
    let tx = b.dot_general(tc, x0, &[], &[], &[1], &[0], ce);
    let rhs0 = b.neg(tx);
    // Rows below each column's start are solved; the start is the column itself.
    let cz = cspl(b, 0.0, e, &d2);
    let above = b.compare(CmpDir::Lt, r, c);
    let rhs0 = b.select(above, rhs0, cz);
    let nm1 = ev.i(b, n - 1);
    let sol = b.while_loop(
        &[nm1, rhs0, cz],
        |b, v| {
            let z = b.constant_i64(0, I64E);
            b.compare(CmpDir::Ge, v[0], z)
        },
        |b, v| {
            let (j, rhs, x) = (v[0], v[1], v[2]);
            let one_i = b.constant_i64(1, I64E);
            let zero_i = b.constant_i64(0, I64E);
            let jm1 = b.sub(j, one_i);
            let jm1c = b.max(jm1, zero_i);
            let s_j = pick1(b, sub, j);
            let has = b.compare(CmpDir::Ne, s_j, zero);
            let jpos = b.compare(CmpDir::Ge, j, one_i);
            let two = b.and(has, jpos);
            let cols = idx(b, &[n], 0);
            let jv = b.broadcast_in_dim(j, &[n], &[]);
            let act1 = b.compare(CmpDir::Gt, cols, jv);
            let act2 = b.compare(CmpDir::Gt, cols, jv);
            let not_second = b.not(second);
            let act1 = b.and(act1, not_second);
            let act2 = b.and(act2, not_second);
            let rj = row_at(b, rhs, j);
            let rjm1 = row_at(b, rhs, jm1c);
            let tjj = ev.at(b, t, j, j);
            let tjj = b.broadcast_in_dim(tjj, &[n], &[]);
            let tjj = cplx(b, tjj);
            // 1x1: x = r / (T[j,j] - lambda), the divisor kept off zero by smin.
            let den = b.sub(tjj, lam);
            let dre = b.real(den);
            let dim = b.imag(den);
            let a1 = b.abs(dre);
            let a2 = b.abs(dim);
            let cn = b.add(a1, a2);
            let tiny = b.compare(CmpDir::Lt, cn, smin);
            let sminc = cplx(b, smin);
            let den = b.select(tiny, sminc, den);
            let x1 = b.div(rj, den);
            // 2x2 block (j-1, j) by Cramer's rule.
            let a = ev.at(b, t, jm1c, jm1c);
            let bb = ev.at(b, t, jm1c, j);
            let cc = ev.at(b, t, j, jm1c);
            let d = ev.at(b, t, j, j);
            let bc = |b: &mut Builder, x: Value| -> Value {
                let v = b.broadcast_in_dim(x, &[n], &[]);
                cplx(b, v)
            };
            let (a, bb, cc, d) = (bc(b, a), bc(b, bb), bc(b, cc), bc(b, d));
            let al = b.sub(a, lam);
            let dl = b.sub(d, lam);
            let p = b.mul(al, dl);
            let q = b.mul(bb, cc);
            let det = b.sub(p, q);
            let t1 = b.mul(dl, rjm1);
            let t2 = b.mul(bb, rj);
            let u1 = b.sub(t1, t2);
            let y1 = b.div(u1, det);
            let t1 = b.mul(al, rj);
            let t2 = b.mul(cc, rjm1);
            let u2 = b.sub(t1, t2);
            let y2 = b.div(u2, det);
            // Write the solution rows and update the right-hand sides above.
            let twov = b.broadcast_in_dim(two, &[n], &[]);
            let xj = b.select(twov, y2, x1);
            let act = b.select(twov, act2, act1);
            let rows2 = idx(b, &d2, 0);
            let jb = b.broadcast_in_dim(j, &d2, &[]);
            let jm1b = b.broadcast_in_dim(jm1c, &d2, &[]);
            let at_j = b.compare(CmpDir::Eq, rows2, jb);
            let at_jm1 = b.compare(CmpDir::Eq, rows2, jm1b);
            let twob = b.broadcast_in_dim(two, &d2, &[]);
            let at_jm1 = b.and(at_jm1, twob);
            let actb = b.broadcast_in_dim(act, &d2, &[1]);
            let xjb = b.broadcast_in_dim(xj, &d2, &[1]);
            let y1b = b.broadcast_in_dim(y1, &d2, &[1]);
            let w1 = b.and(at_j, actb);
            let x = b.select(w1, xjb, x);
            let w2 = b.and(at_jm1, actb);
            let x = b.select(w2, y1b, x);
            let tcj = col_at(b, t, j);
            let tcj = cplx(b, tcj);
            let tcjm1 = col_at(b, t, jm1c);
            let tcjm1 = cplx(b, tcjm1);
            let tj = b.broadcast_in_dim(tcj, &d2, &[0]);
            let tjm1 = b.broadcast_in_dim(tcjm1, &d2, &[0]);
            let p1 = b.mul(tj, xjb);
            let p2 = b.mul(tjm1, y1b);
            let zc = cspl(b, 0.0, e, &d2);
            let p2 = b.select(twob, p2, zc);
            let upd = b.add(p2, p1);
            let nr = b.sub(rhs, upd);
            let lim = b.select(two, jm1c, j);
            let limb = b.broadcast_in_dim(lim, &d2, &[]);
            let above = b.compare(CmpDir::Lt, rows2, limb);
            let w = b.and(above, actb);
            let rhs = b.select(w, nr, rhs);
            let two_i = b.constant_i64(2, I64E);
            let step = b.select(two, two_i, one_i);
            vec![b.sub(j, step), rhs, x]
        },
    );
    let x = b.add(x0, sol[2]);
    let zc = cplx(b, z);
    b.set_precision(Some(Precision::Highest));
    let v = b.dot_general(zc, x, &[], &[], &[1], &[0], ce);
    // dgebak: undo the scaling (rows ilo..ihi), then the permutations.
    let v = {
        let rr = idx(b, &d2, 0);
        let lo = b.broadcast_in_dim(ilo, &d2, &[]);
        let hi = b.broadcast_in_dim(ihi, &d2, &[]);
        let ge = b.compare(CmpDir::Ge, rr, lo);
        let le = b.compare(CmpDir::Le, rr, hi);
        let inr = b.and(ge, le);
        let ne = b.compare(CmpDir::Ne, ilo, ihi);
        let neb = b.broadcast_in_dim(ne, &d2, &[]);
        let inr = b.and(inr, neb);
        let sc = cplx(b, scale);
        let scb = b.broadcast_in_dim(sc, &d2, &[0]);
        let vs = b.mul(v, scb);
        b.select(inr, vs, v)
    };
    let z0 = ev.i(b, 0);
    let perm = b.while_loop(
        &[z0, v],
        |b, v| {
            let nn = b.constant_i64(n, I64E);
            b.compare(CmpDir::Lt, v[0], nn)
        },
        |b, v| {
            let (ii, m) = (v[0], v[1]);
            let one_i = b.constant_i64(1, I64E);
            let lt = b.compare(CmpDir::Lt, ii, ilo);
            let gt = b.compare(CmpDir::Gt, ii, ihi);
            let lm = b.sub(ilo, one_i);
            let rev = b.sub(lm, ii);
            let i = b.select(lt, rev, ii);
            let k = pick1(b, scale, i);
            let k = b.convert(k, I64E);
            let outside = b.or(lt, gt);
            let ne = b.compare(CmpDir::Ne, k, i);
            let go = b.and(outside, ne);
            let nm1 = b.constant_i64(n - 1, I64E);
            let z0 = b.constant_i64(0, I64E);
            let kc = b.clamp(z0, k, nm1);
            let sw = swap_lines(b, m, i, kc, 0);
            let m = b.select(go, sw, m);
            vec![b.add(ii, one_i), m]
        },
    );
    let v = perm[1];
    // dgeev's normalization.
    let re = b.real(v);
    let im = b.imag(v);
    let sq = |b: &mut Builder, x: Value| -> Value {
        let p = b.mul(x, x);
        let s = sum_over(b, p, &[0]);
        b.sqrt(s)
    };
    let nre = sq(b, re);
    let nim = sq(b, im);
    // Real columns: v / ||v||.
    let onev = spl(b, 1.0, e, &[n]);
    let inv_re = b.div(onev, nre);
    // Pairs: scale by 1 / hypot(||re||, ||im||), then rotate the largest component real.
    let hyp = lapy2(b, nre, nim);
    let inv_p = b.div(onev, hyp);
    let is_pair = first;
    let scl = b.select(is_pair, inv_p, inv_re);
    let sclb = b.broadcast_in_dim(scl, &d2, &[1]);
    let re = b.mul(re, sclb);
    let im = b.mul(im, sclb);
    let work = {
        let a = b.mul(re, re);
        let c = b.mul(im, im);
        b.add(a, c)
    };
    // First row of the largest |v_k|^2 per column.
    let (kk, _) = first_argmax(b, work, 0, -1.0);
    let rows = idx(b, &d2, 0);
    let kb = b.broadcast_in_dim(kk, &d2, &[1]);
    let atk = b.compare(CmpDir::Eq, rows, kb);
    let zz = spl(b, 0.0, e, &d2);
    let fsel = b.select(atk, re, zz);
    let f = sum_over(b, fsel, &[0]);
    let gsel = b.select(atk, im, zz);
    let g = sum_over(b, gsel, &[0]);
    let (cs, sn) = {
        let g0 = b.compare(CmpDir::Eq, g, zv);
        let f0 = b.compare(CmpDir::Eq, f, zv);
        let ff = b.mul(f, f);
        let gg = b.mul(g, g);
        let s = b.add(ff, gg);
        let dd = b.sqrt(s);
        // The general case, and sn for f == 0 (the two conventions differ only there).
        let (cs, sn, sn_f0) = if e == ElemType::F64 {
            // LAPACK before 3.10 (MKL's dlartg): cs = f / r, sn = g / r, r > 0 unless
            // |f| > |g| and f < 0.
            let cs = b.div(f, dd);
            let sn = b.div(g, dd);
            let fa = b.abs(f);
            let ga = b.abs(g);
            let gt = b.compare(CmpDir::Gt, fa, ga);
            let neg = b.compare(CmpDir::Lt, cs, zv);
            let flip = b.and(gt, neg);
            let ncs = b.neg(cs);
            let nsn = b.neg(sn);
            let cs = b.select(flip, ncs, cs);
            let sn = b.select(flip, nsn, sn);
            (cs, sn, onev)
        } else {
            // LAPACK 3.10's slartg: r has the sign of f.
            let fa = b.abs(f);
            let cs = b.div(fa, dd);
            let rr = fsign(b, dd, f);
            let sn = b.div(g, rr);
            let sg = fsign(b, onev, g);
            (cs, sn, sg)
        };
        let cs = b.select(f0, zv, cs);
        let sn = b.select(f0, sn_f0, sn);
        let cs = b.select(g0, onev, cs);
        let sn = b.select(g0, zv, sn);
        (cs, sn)
    };
    let csb = b.broadcast_in_dim(cs, &d2, &[1]);
    let snb = b.broadcast_in_dim(sn, &d2, &[1]);
    let (re_r, im_r) = plane_rot(b, re, im, csb, snb);
    let im_r = b.select(atk, zz, im_r);
    let pb = b.broadcast_in_dim(is_pair, &d2, &[1]);
    let re = b.select(pb, re_r, re);
    let im = b.select(pb, im_r, im);
    // A pair's second column: the conjugate of the first.
    let re_p = prev_along(b, re, 1);
    let im_p = prev_along(b, im, 1);
    let im_pn = b.neg(im_p);
    let sb = b.broadcast_in_dim(second, &d2, &[1]);
    let re = b.select(sb, re_p, re);
    let im = b.select(sb, im_pn, im);
    // Real columns carry no imaginary part.
    let realcol = {
        let a = b.or(first, second);
        b.not(a)
    };
    let rb = b.broadcast_in_dim(realcol, &d2, &[1]);
    let im = b.select(rb, zz, im);
    b.complex(re, im)
}
