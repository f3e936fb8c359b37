//! Eigenvalues and singular values: linalg_eig and _linalg_eigvals (LAPACK's real nonsymmetric
//! geev, in this directory's balance.rs, schur.rs and vectors.rs), _linalg_eigh and
//! _linalg_svd (Jacobi methods, jacobi.rs).
//!
//! geev is reproduced step for step, one matrix at a time (balancing, Hessenberg reduction,
//! Francis double-shift QR, eigenvectors of the Schur form, LAPACK's normalization): only the
//! same sequence of steps gives LAPACK's eigenvalue order and eigenvector phases. This file
//! holds the driver, the two ops and the scalar and line builders the steps share.
mod balance;
pub(crate) mod jacobi;
mod schur;
mod vectors;

use crate::args::{Args, Tensor};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::linalg::{any_over, check_square, cspl, flat_batch, iota as idx, max as max_over, pick1, sum as sum_over, swap_lines, I64E};
use crate::{check, one, Out, op, Op};
use self::balance::{ev_gebal, ev_hessenberg};
use self::schur::ev_lahqr;
use self::vectors::ev_vectors;
use stablehlo::{Builder, ElemType, Ex, Value, E};

pub(crate) const OPS: &[Op] = &[
    // linalg.eig raises for non-finite input: its size program checks.
    op("linalg_eig", linalg_eig).sized(eig_nonfinite),
    op("_linalg_eigvals", linalg_eigvals),
];

// ---- the real nonsymmetric eigenproblem (LAPACK's ?geev, one matrix at a time) ------------------

/// One matrix's working type and size, and element access.
struct Ev {
    e: ElemType,
    n: i64,
}

impl Ev {
    /// m[i, j] as a 0-d value.
    fn at<'e>(&self, m: E<'e>, i: E<'e>, j: E<'e>) -> E<'e> {
        m.make(|b| {
            let v = b.dynamic_slice(m.v, &[i.v, j.v], &[1, 1]);
            b.reshape(v, &[])
        })
    }
    fn set<'e>(&self, m: E<'e>, i: E<'e>, j: E<'e>, v: E<'e>) -> E<'e> {
        m.make(|b| {
            let v = b.reshape(v.v, &[1, 1]);
            b.dynamic_update_slice(m.v, v, &[i.v, j.v])
        })
    }
    fn vat<'e>(&self, v: E<'e>, i: E<'e>) -> E<'e> {
        v.make(|b| {
            let x = b.dynamic_slice(v.v, &[i.v], &[1]);
            b.reshape(x, &[])
        })
    }
    fn vset<'e>(&self, v: E<'e>, i: E<'e>, x: E<'e>) -> E<'e> {
        v.make(|b| {
            let x = b.reshape(x.v, &[1]);
            b.dynamic_update_slice(v.v, x, &[i.v])
        })
    }
    fn ulp(&self) -> f64 {
        if self.e == ElemType::F64 { f64::EPSILON } else { f32::EPSILON as f64 }
    }
    fn safmin(&self) -> f64 {
        if self.e == ElemType::F64 { f64::MIN_POSITIVE } else { f32::MIN_POSITIVE as f64 }
    }
}

/// Fortran's SIGN(a, s) elementwise: |a| with the sign of s (s >= 0 counts as positive).
fn fsign<'e>(a: E<'e>, s: E<'e>) -> E<'e> {
    let aa = a.abs();
    s.lt(0.0).select(-aa, aa)
}

/// LAPACK's dlapy2 elementwise: sqrt(x^2 + y^2) without overflow.
fn lapy2<'e>(x: E<'e>, y: E<'e>) -> E<'e> {
    let (xa, ya) = (x.abs(), y.abs());
    let (w, z) = (xa.max(ya), xa.min(ya));
    let q = z / w;
    z.eq(0.0).select(w, w * (1.0 + q * q).sqrt())
}

/// The plane rotation (x, y) -> (cs x + sn y, cs y - sn x), elementwise (cs, sn of x's dims).
fn plane_rot<'e>(x: E<'e>, y: E<'e>, cs: E<'e>, sn: E<'e>) -> (E<'e>, E<'e>) {
    (cs * x + sn * y, cs * y - sn * x)
}

/// dlahqr's 3-row reflector I - t1 [1 v2 v3]^T [1 v2 v3] on three lines x (rows or columns):
/// x_j - t_j (x0 + v2 x1 + v3 x2) with t = [t1, t1 v2, t1 v3] (0-d values); the third line is
/// left as it is unless `three` (the sweep's last step has only two rows).
fn reflect3<'e>(x: [E<'e>; 3], v: [E<'e>; 2], t: [E<'e>; 3], three: E<'e>) -> [E<'e>; 3] {
    let d = x[0].dims();
    let sm = x[0] + v[0].splat(&d) * x[1] + v[1].splat(&d) * x[2];
    let [y0, y1, y2] = [0, 1, 2].map(|j| x[j] - sm * t[j].splat(&d));
    [y0, y1, three.splat(&d).select(y2, x[2])]
}

/// `p ? t : f` for each pair of lines (p broadcast alike).
fn select_all<'e, const N: usize>(p: E<'e>, t: [E<'e>; N], f: [E<'e>; N]) -> [E<'e>; N] {
    std::array::from_fn(|k| p.select(t[k], f[k]))
}

/// Rows i .. i + count of a matrix m [r, c] (i 0-d).
fn rows_at<'e>(m: E<'e>, i: E<'e>, count: i64) -> E<'e> {
    let c = m.dims()[1];
    m.make(|b| {
        let z = b.constant_i64(0, I64E);
        b.dynamic_slice(m.v, &[i.v, z], &[count, c])
    })
}

/// Columns j .. j + count of a matrix m [r, c] (j 0-d).
fn cols_at<'e>(m: E<'e>, j: E<'e>, count: i64) -> E<'e> {
    let r = m.dims()[0];
    m.make(|b| {
        let z = b.constant_i64(0, I64E);
        b.dynamic_slice(m.v, &[z, j.v], &[r, count])
    })
}

/// m with rows i .. by x (as many as x has).
fn put_rows<'e>(m: E<'e>, i: E<'e>, x: E<'e>) -> E<'e> {
    m.make(|b| {
        let z = b.constant_i64(0, I64E);
        b.dynamic_update_slice(m.v, x.v, &[i.v, z])
    })
}

/// m with columns j .. by x (as many as x has).
fn put_cols<'e>(m: E<'e>, j: E<'e>, x: E<'e>) -> E<'e> {
    m.make(|b| {
        let z = b.constant_i64(0, I64E);
        b.dynamic_update_slice(m.v, x.v, &[z, j.v])
    })
}

/// Row i of a matrix m [r, c] as [c] (i 0-d).
fn row_at<'e>(m: E<'e>, i: E<'e>) -> E<'e> {
    let c = m.dims()[1];
    let x = rows_at(m, i, 1);
    x.make(|b| b.reshape(x.v, &[c]))
}

/// Column j of a matrix m [r, c] as [r] (j 0-d).
fn col_at<'e>(m: E<'e>, j: E<'e>) -> E<'e> {
    let r = m.dims()[0];
    let x = cols_at(m, j, 1);
    x.make(|b| b.reshape(x.v, &[r]))
}

/// m [r, c] with row i replaced by x [c].
fn put_row<'e>(m: E<'e>, i: E<'e>, x: E<'e>) -> E<'e> {
    let c = m.dims()[1];
    put_rows(m, i, x.make(|b| b.reshape(x.v, &[1, c])))
}

/// m [r, c] with column j replaced by x [r].
fn put_col<'e>(m: E<'e>, j: E<'e>, x: E<'e>) -> E<'e> {
    let r = m.dims()[0];
    put_cols(m, j, x.make(|b| b.reshape(x.v, &[r, 1])))
}

/// The N slices of `m` along `axis`, that axis dropped: the rows or columns of a thin block (or
/// the entries of a short vector), for the 2- and 3-line updates of the QR sweep.
fn unstack<'e, const N: usize>(m: E<'e>, axis: usize) -> [E<'e>; N] {
    let d = m.dims();
    assert_eq!(d[axis], N as i64, "unstack: {N} lines along axis {axis} of {d:?}");
    let mut line = d.clone();
    line.remove(axis);
    std::array::from_fn(|j| {
        let mut lo = vec![0; d.len()];
        lo[axis] = j as i64;
        let mut hi = d.clone();
        hi[axis] = j as i64 + 1;
        m.make(|b| {
            let x = b.slice(m.v, &lo, &hi, &vec![1; d.len()]);
            b.reshape(x, &line)
        })
    })
}

/// The inverse of `unstack`: equal lines joined along a new `axis`.
fn stack<'e>(lines: &[E<'e>], axis: usize) -> E<'e> {
    let mut d = lines[0].dims();
    d.insert(axis, 1);
    lines[0].make(|b| {
        let parts: Vec<Value> = lines.iter().map(|x| b.reshape(x.v, &d)).collect();
        b.concatenate(&parts, axis as i64)
    })
}

/// x shifted one place back along `axis`: x[.., k + 1, ..] at k, zeros filling the end.
fn next_along<'e>(x: E<'e>, axis: usize) -> E<'e> {
    let d = x.dims();
    let zeros = vec![0; d.len()];
    let mut lo = zeros.clone();
    lo[axis] = 1;
    x.make(|b| {
        let s = b.slice(x.v, &lo, &d, &vec![1; d.len()]);
        let z = b.constant_f64(0.0, b.elem(x.v));
        b.pad(s, z, &zeros, &lo, &zeros)
    })
}

/// x shifted one place on along `axis`: x[.., k - 1, ..] at k, zeros filling the start.
fn prev_along<'e>(x: E<'e>, axis: usize) -> E<'e> {
    let d = x.dims();
    let zeros = vec![0; d.len()];
    let mut hi = d.clone();
    hi[axis] -= 1;
    let mut low = zeros.clone();
    low[axis] = 1;
    x.make(|b| {
        let s = b.slice(x.v, &zeros, &hi, &vec![1; d.len()]);
        let z = b.constant_f64(0.0, b.elem(x.v));
        b.pad(s, z, &low, &zeros, &zeros)
    })
}

/// The positions along `axis` of a tensor of dims `d` (int64; `like` only lends its builder).
fn pos<'e>(like: E<'e>, d: &[i64], axis: usize) -> E<'e> {
    like.make(|b| idx(b, d, axis))
}

/// The sum of x over `dims`.
fn sum<'e>(x: E<'e>, dims: &[i64]) -> E<'e> {
    x.make(|b| sum_over(b, x.v, dims))
}

/// Whether x holds anywhere along `dims`.
fn any<'e>(x: E<'e>, dims: &[i64]) -> E<'e> {
    x.make(|b| any_over(b, x.v, dims))
}

/// The largest x along `dims`.
fn amax<'e>(x: E<'e>, dims: &[i64]) -> E<'e> {
    x.make(|b| max_over(b, x.v, dims))
}

/// v[i] of a 1-d v (i a 0-d int64; 0 when out of range).
fn pick<'e>(v: E<'e>, i: E<'e>) -> E<'e> {
    v.make(|b| pick1(b, v.v, i.v))
}

/// `m` with its lines i1 and i2 along `axis` (rows 0, columns 1) exchanged.
fn swapped<'e>(m: E<'e>, i1: E<'e>, i2: E<'e>, axis: usize) -> E<'e> {
    m.make(|b| swap_lines(b, m.v, i1.v, i2.v, axis))
}

/// The diagonal m[k, k - off] of a square m, one entry per row k (0 where k - off is out of
/// range): off 0 the diagonal, 1 the subdiagonal, -1 the superdiagonal.
fn band<'e>(m: E<'e>, off: i64) -> E<'e> {
    let d = m.dims();
    let (r, c) = (pos(m, &d, 0), pos(m, &d, 1));
    let c = if off == 0 { c } else { c + off };
    sum(r.eq(c).select(m, 0.0), &[1])
}

/// m with the entries below its subdiagonal zeroed (its upper Hessenberg part).
fn hessenberg_part<'e>(m: E<'e>) -> E<'e> {
    let d = m.dims();
    let (r, c) = (pos(m, &d, 0), pos(m, &d, 1));
    r.le(c + 1i64).select(m, 0.0)
}

/// The largest position (`pos`, an iota over cand's one dim) where `cand` holds; -1 when none.
fn last_where<'e>(cand: E<'e>, pos: E<'e>) -> E<'e> {
    let ci = cand.select(pos, -1i64);
    ci.make(|b| {
        let mn = b.constant_i64(-1, I64E);
        b.reduce(&[ci.v], &[mn], &[0], |b, x| vec![b.max(x[0], x[1])])[0]
    })
}

/// m - tau v (v^T m): the Householder reflector I - tau v v^T applied to m [r, c] from the left.
fn reflect_left<'e>(m: E<'e>, v: E<'e>, tau: E<'e>) -> E<'e> {
    let d = m.dims();
    let vb = v.broadcast(&d, &[0]);
    let u = sum(m * vb, &[0]) * tau.splat(&[d[1]]);
    m - vb * u.broadcast(&d, &[1])
}

/// m - tau (m v) v^T: the same reflector applied from the right.
fn reflect_right<'e>(m: E<'e>, v: E<'e>, tau: E<'e>) -> E<'e> {
    let d = m.dims();
    let vb = v.broadcast(&d, &[1]);
    let w = sum(m * vb, &[1]) * tau.splat(&[d[0]]);
    m - w.broadcast(&d, &[0]) * vb
}

/// dgeev on each matrix of a batch [B, n, n] (real): (eigenvalues [B, n], eigenvectors [B, n, n])
/// as complex values, the vectors only when `vectors`. Matrices with a non-finite entry give NaN.
fn geev_batch(b: &mut Builder, a: Value, vectors: bool) -> (Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
    let ev = Ev { e, n };
    let w0 = cspl(b, 0.0, e, &[bs, n]);
    let v0 = cspl(b, 0.0, e, &[bs, n, n]);
    let z0 = b.constant_i64(0, I64E);
    let out = b.while_loop(
        &[z0, w0, v0],
        |b, v| {
            let ex = Ex::new(b);
            ex.of(v[0]).lt(bs).v
        },
        |b, v| {
            let ex = Ex::new(b);
            let [bi, wall, vall] = ex.all([v[0], v[1], v[2]]);
            let z0 = ex.int(0, I64E);
            let m = ex.make(|b| {
                let m = b.dynamic_slice(a, &[bi.v, z0.v, z0.v], &[1, n, n]);
                b.reshape(m, &[n, n])
            });
            let all_fin = m.make(|b| {
                let fin = b.is_finite(m.v);
                let t = b.constant_bool(true);
                b.reduce(&[fin], &[t], &[0, 1], |b, x| vec![b.and(x[0], x[1])])[0]
            });
            let m = all_fin.splat(&[n, n]).select(m, 0.0);
            let (ab, ilo, ihi, scale) = ev_gebal(&ev, m);
            let (h, q) = ev_hessenberg(&ev, ab, ilo, ihi);
            let (tt, zz, wr, wi) = ev_lahqr(&ev, h, q, ilo, ihi);
            let nan = wr.k(f64::NAN);
            let w = all_fin.splat(&[n]).select(wr.complex(wi), nan.complex(nan));
            let wall = wall.make(|b| {
                let w = b.reshape(w.v, &[1, n]);
                b.dynamic_update_slice(wall.v, w, &[bi.v, z0.v])
            });
            let vall = if vectors {
                let vv = ev_vectors(&ev, tt, zz, scale, ilo, ihi);
                let nan = tt.k(f64::NAN);
                let vv = all_fin.splat(&[n, n]).select(vv, nan.complex(nan));
                vall.make(|b| {
                    let vv = b.reshape(vv.v, &[1, n, n]);
                    b.dynamic_update_slice(vall.v, vv, &[bi.v, z0.v, z0.v])
                })
            } else {
                vall
            };
            vec![(bi + 1i64).v, wall.v, vall.v]
        },
    );
    (out[1], out[2])
}

/// The checks of linalg.eig / linalg.eigvals, and the working real type.
fn eig_input(cx: &Cx, a: &Tensor) -> Result<()> {
    let api = "linalg.eig";
    check_square(cx, a, api)?;
    check!(
        a.dtype.is_float() || a.dtype.is_complex(),
        Runtime,
        "Unknown Complex ScalarType for {}",
        a.dtype.torch_name()
    );
    check!(
        matches!(a.dtype, DType::F32 | DType::F64 | DType::C64 | DType::C128),
        NotImplemented,
        "\"linalg_eig_out_cpu\" not implemented for '{}'",
        a.dtype.torch_name()
    );
    check!(
        !a.dtype.is_complex(),
        NotImplemented,
        "linalg.eig: complex input is not supported on tpu yet"
    );
    Ok(())
}

/// The size program of linalg_eig: 1 when some entry is not finite (PyTorch raises).
fn eig_nonfinite(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let z = cx.b.constant_i64(0, I64E);
    if eig_input(cx, &a).is_err() || cx.numel(a.v) == 0 {
        return one(z);
    }
    let fin = cx.is_finite(a.v);
    let nd = cx.dims(a.v).len() as i64;
    let t = cx.b.constant_bool(true);
    let all = cx.reduce(&[fin], &[t], &(0..nd).collect::<Vec<_>>(), |b, x| vec![b.and(x[0], x[1])])[0];
    let one_ = cx.b.constant_i64(1, I64E);
    one(cx.select(all, z, one_))
}

fn eig_common(cx: &mut Cx, a: &Tensor, vectors: bool) -> Result<(Value, Value)> {
    let d = cx.dims(a.v);
    let n = d[d.len() - 1];
    let batch = d[..d.len() - 2].to_vec();
    let bs: i64 = batch.iter().product();
    let ce = a.dtype.to_complex().elem();
    let mut wd = batch.clone();
    wd.push(n);
    if bs == 0 || n == 0 {
        let w = cx.full(0.0, a.dtype, &wd);
        let w = cx.cast(w, a.dtype.to_complex());
        let v = cx.full(0.0, a.dtype, &d);
        let v = cx.cast(v, a.dtype.to_complex());
        let _ = ce;
        return Ok((w, v));
    }
    let (m, _) = flat_batch(cx, a.v);
    let (w, v) = geev_batch(cx, m, vectors);
    let w = cx.reshape(w, &wd);
    let v = cx.reshape(v, &d);
    Ok((w, v))
}

/// linalg_eig(self) -> (eigenvalues, eigenvectors), complex: LAPACK's geev for real input,
/// reproducing its eigenvalue order (the order the QR iteration deflates them) and its
/// eigenvector normalization (unit norm; a complex pair's largest component real).
fn linalg_eig(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    eig_input(cx, &a)?;
    // Compiled graphs run without the size program (no data-dependent errors there).
    check!(args.int_or("__size", 0)? == 0, Runtime, "torch.linalg.eig: input tensor should not contain infs or NaNs.");
    let (w, v) = eig_common(cx, &a, true)?;
    Ok(vec![Out::Tensor(w), Out::Tensor(v)])
}

/// _linalg_eigvals(self): the eigenvalues of linalg_eig (NaN for a matrix with non-finite
/// entries, like LAPACK's).
fn linalg_eigvals(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    eig_input(cx, &a)?;
    let (w, _) = eig_common(cx, &a, false)?;
    one(w)
}
