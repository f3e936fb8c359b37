//! geev's last step: the eigenvectors of the Schur form (dtrevc3), back-transformed, the
//! balancing undone (dgebak) and normalized as dgeev does.
use crate::ops::linalg::{first_argmax, I64E};
use super::{band, col_at, fsign, lapy2, next_along, pick, plane_rot, pos, prev_along, row_at, sum, swapped, Ev};
use stablehlo::{ElemType, Ex, Precision, E};

/// A real value as a complex one (zero imaginary part).
fn cplx(re: E) -> E {
    re.complex(0.0)
}

/// Complex zeros of the shape of the real `re`.
fn czero(re: E) -> E {
    let z = re.k(0.0);
    z.complex(z)
}

/// The product x y of two complex matrices [n, n] at full precision.
fn matmul<'e>(x: E<'e>, y: E<'e>) -> E<'e> {
    let ce = x.elem();
    x.make(|b| {
        b.set_precision(Some(Precision::Highest));
        b.dot_general(x.v, y.v, &[], &[], &[1], &[0], ce)
    })
}

/// Right eigenvectors of the standardized quasi-triangular T (LAPACK's dtrevc3, back-transformed
/// by Z), the balancing undone (dgebak), each normalized as dgeev does: unit 2-norm; for a
/// complex pair, the largest component made real by a plane rotation (dlartg: LAPACK 3.10's
/// sign convention for float, the older one for double, as MKL's sgeev/dgeev). Returns the
/// complex eigenvector matrix [n, n] (a pair's second column the conjugate of the first).
pub(crate) fn ev_vectors<'e>(ev: &Ev, t: E<'e>, z: E<'e>, scale: E<'e>, ilo: E<'e>, ihi: E<'e>) -> E<'e> {
    let n = ev.n;
    let d2 = [n, n];
    let ulp = ev.ulp();
    let smlnum = ev.safmin() * (n as f64 / ulp);
    // Subdiagonal and diagonal of T.
    let (r, c) = (pos(t, &d2, 0), pos(t, &d2, 1));
    let dg = band(t, 0);
    let sub = band(t, 1); // sub[k] = T[k, k-1]
    let sup = band(t, -1); // sup[k] = T[k, k+1]
    let sub_next = next_along(sub, 0); // T[k+1, k]
    let second = sub.ne(0.0);
    let first = sub_next.ne(0.0);
    // Eigenvalue of each column: a pair's first column takes wr + i wi (wi > 0).
    let wi = sub_next.abs().sqrt() * sup.abs().sqrt();
    let wr = first.select(next_along(dg, 0), dg);
    let wi = first.select(wi, 0.0);
    let lam = wr.complex(wi);
    let smin = (ulp * (wr.abs() + wi.abs())).max(smlnum);
    let cz = czero(t);
    // Initial vectors: 1 at the real eigenvalue; for a pair (k, k+1), LAPACK's choice.
    let x0 = {
        let big = sup.abs().ge(sub_next.abs());
        let w_t12 = wi / sup;
        let w_t21 = wi / sub_next;
        // first component (row c) and second (row c + 1, imaginary) of a pair's column c
        let p1 = big.select(1.0, -w_t21);
        let p2 = big.select(w_t12, 1.0);
        let diag_val = cplx(first.select(p1, 1.0));
        let below = p2.k(0.0).complex(p2);
        let x = r.eq(c).select(diag_val.broadcast(&d2, &[1]), cz);
        let x = (r.eq(c + 1i64) & first.broadcast(&d2, &[1])).select(below.broadcast(&d2, &[1]), x);
        // Second columns of pairs are rebuilt from the first.
        second.broadcast(&d2, &[1]).select(cz, x)
    };
    // Rows below each column's start are solved; the start is the column itself.
    let rhs0 = r.lt(c).select(-matmul(cplx(t), x0), cz);
    let nm1 = t.make(|b| b.constant_i64(n - 1, I64E));
    let sol = t.with(|b| {
        b.while_loop(
            &[nm1.v, rhs0.v, cz.v],
            |b, v| {
                let e = Ex::new(b);
                e.of(v[0]).ge(0i64).v
            },
            |b, v| {
                let e = Ex::new(b);
                let [j, rhs, x] = e.all([v[0], v[1], v[2]]);
                let [t, sub, second, lam, smin] = e.all([t.v, sub.v, second.v, lam.v, smin.v]);
                let jm1c = (j - 1i64).max(0i64);
                let two = pick(sub, j).ne(0.0) & j.ge(1i64);
                // The columns this step solves: right of j, a pair's second column excepted (it
                // is rebuilt from the first).
                let act = pos(j, &[n], 0).gt(j.splat(&[n])) & !second;
                let (rj, rjm1) = (row_at(rhs, j), row_at(rhs, jm1c));
                // 1x1: x = r / (T[j,j] - lambda), the divisor kept off zero by smin.
                let den = cplx(ev.at(t, j, j).splat(&[n])) - lam;
                let den = (den.real().abs() + den.imag().abs()).lt(smin).select(cplx(smin), den);
                let x1 = rj / den;
                // 2x2 block (j-1, j) by Cramer's rule.
                let [a, bb, cc, d] =
                    [ev.at(t, jm1c, jm1c), ev.at(t, jm1c, j), ev.at(t, j, jm1c), ev.at(t, j, j)].map(|x| cplx(x.splat(&[n])));
                let (al, dl) = (a - lam, d - lam);
                let det = al * dl - bb * cc;
                let y1 = (dl * rjm1 - bb * rj) / det;
                let y2 = (al * rj - cc * rjm1) / det;
                // Write the solution rows and update the right-hand sides above.
                let twov = two.splat(&[n]);
                let xj = twov.select(y2, x1);
                let rows2 = pos(j, &d2, 0);
                let twob = two.splat(&d2);
                let actb = act.broadcast(&d2, &[1]);
                let xjb = xj.broadcast(&d2, &[1]);
                let y1b = y1.broadcast(&d2, &[1]);
                let x = (rows2.eq(j.splat(&d2)) & actb).select(xjb, x);
                let x = (rows2.eq(jm1c.splat(&d2)) & twob & actb).select(y1b, x);
                let tj = cplx(col_at(t, j)).broadcast(&d2, &[0]);
                let tjm1 = cplx(col_at(t, jm1c)).broadcast(&d2, &[0]);
                let upd = twob.select(tjm1 * y1b, czero(t)) + tj * xjb;
                let above = rows2.lt(two.select(jm1c, j).splat(&d2));
                let rhs = (above & actb).select(rhs - upd, rhs);
                let step = two.select(e.int(2, I64E), 1i64);
                vec![(j - step).v, rhs.v, x.v]
            },
        )
    });
    let x = x0 + t.of(sol[2]);
    let v = matmul(cplx(z), x);
    // dgebak: undo the scaling (rows ilo..ihi), then the permutations.
    let v = {
        let inr = r.ge(ilo.splat(&d2)) & r.le(ihi.splat(&d2)) & ilo.ne(ihi).splat(&d2);
        inr.select(v * cplx(scale).broadcast(&d2, &[0]), v)
    };
    let z0 = t.make(|b| b.constant_i64(0, I64E));
    let perm = t.with(|b| {
        b.while_loop(
            &[z0.v, v.v],
            |b, v| {
                let e = Ex::new(b);
                e.of(v[0]).lt(n).v
            },
            |b, v| {
                let e = Ex::new(b);
                let [ii, m, ilo, ihi, scale] = e.all([v[0], v[1], ilo.v, ihi.v, scale.v]);
                let (lt, gt) = (ii.lt(ilo), ii.gt(ihi));
                let i = lt.select(ilo - 1i64 - ii, ii);
                let k = pick(scale, i).cast(I64E);
                let go = (lt | gt) & k.ne(i);
                let kc = k.make(|b| {
                    let (lo, hi) = (b.constant_i64(0, I64E), b.constant_i64(n - 1, I64E));
                    b.clamp(lo, k.v, hi)
                });
                let m = go.select(swapped(m, i, kc, 0), m);
                vec![(ii + 1i64).v, m.v]
            },
        )
    });
    let v = t.of(perm[1]);
    // dgeev's normalization.
    let (re, im) = (v.real(), v.imag());
    let [nre, nim] = [re, im].map(|x| sum(x * x, &[0]).sqrt());
    // Real columns: v / ||v||; pairs: scale by 1 / hypot(||re||, ||im||), then rotate the
    // largest component real.
    let is_pair = first;
    let scl = is_pair.select(1.0 / lapy2(nre, nim), 1.0 / nre).broadcast(&d2, &[1]);
    let (re, im) = (re * scl, im * scl);
    let work = re * re + im * im;
    // First row of the largest |v_k|^2 per column.
    let kk = work.make(|b| first_argmax(b, work.v, 0, -1.0).0);
    let atk = r.eq(kk.broadcast(&d2, &[1]));
    let f = sum(atk.select(re, 0.0), &[0]);
    let g = sum(atk.select(im, 0.0), &[0]);
    let (cs, sn) = {
        let dd = (f * f + g * g).sqrt();
        // The general case, and sn for f == 0 (the two conventions differ only there).
        let (cs, sn, sn_f0) = if ev.e == ElemType::F64 {
            // LAPACK before 3.10 (MKL's dlartg): cs = f / r, sn = g / r, r > 0 unless
            // |f| > |g| and f < 0.
            let (cs, sn) = (f / dd, g / dd);
            let flip = f.abs().gt(g.abs()) & cs.lt(0.0);
            (flip.select(-cs, cs), flip.select(-sn, sn), f.k(1.0))
        } else {
            // LAPACK 3.10's slartg: r has the sign of f.
            (f.abs() / dd, g / fsign(dd, f), fsign(f.k(1.0), g))
        };
        let (f0, g0) = (f.eq(0.0), g.eq(0.0));
        (g0.select(1.0, f0.select(0.0, cs)), g0.select(0.0, f0.select(sn_f0, sn)))
    };
    let (re_r, im_r) = plane_rot(re, im, cs.broadcast(&d2, &[1]), sn.broadcast(&d2, &[1]));
    let im_r = atk.select(0.0, im_r);
    let pb = is_pair.broadcast(&d2, &[1]);
    let (re, im) = (pb.select(re_r, re), pb.select(im_r, im));
    // A pair's second column: the conjugate of the first.
    let sb = second.broadcast(&d2, &[1]);
    let re = sb.select(prev_along(re, 1), re);
    let im = sb.select(-prev_along(im, 1), im);
    // Real columns carry no imaginary part.
    let im = (!(first | second)).broadcast(&d2, &[1]).select(0.0, im);
    re.complex(im)
}
