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
use crate::ops::linalg::{check_square, cspl, flat_batch, iota as idx, ispl, splat as spl, sum as sum_over, I64E};
use crate::{check, one, Out, op, Op};
use self::balance::{ev_gebal, ev_hessenberg};
use self::schur::ev_lahqr;
use self::vectors::ev_vectors;
use stablehlo::{Builder, CmpDir, ElemType, Value};

pub(crate) const OPS: &[Op] = &[
    // linalg.eig raises for non-finite input: its size program checks.
    op("linalg_eig", linalg_eig).sized(eig_nonfinite),
    op("_linalg_eigvals", linalg_eigvals),
];

// ---- the real nonsymmetric eigenproblem (LAPACK's ?geev, one matrix at a time) ------------------

/// Scalar helpers for one matrix: 0-d constants of the working type and element access.
struct Ev {
    e: ElemType,
    n: i64,
}

impl Ev {
    fn c(&self, b: &mut Builder, x: f64) -> Value {
        b.constant_f64(x, self.e)
    }
    fn i(&self, b: &mut Builder, x: i64) -> Value {
        b.constant_i64(x, I64E)
    }
    /// m[i, j] as a 0-d value.
    fn at(&self, b: &mut Builder, m: Value, i: Value, j: Value) -> Value {
        let v = b.dynamic_slice(m, &[i, j], &[1, 1]);
        b.reshape(v, &[])
    }
    fn set(&self, b: &mut Builder, m: Value, i: Value, j: Value, v: Value) -> Value {
        let v = b.reshape(v, &[1, 1]);
        b.dynamic_update_slice(m, v, &[i, j])
    }
    fn vat(&self, b: &mut Builder, v: Value, i: Value) -> Value {
        let x = b.dynamic_slice(v, &[i], &[1]);
        b.reshape(x, &[])
    }
    fn vset(&self, b: &mut Builder, v: Value, i: Value, x: Value) -> Value {
        let x = b.reshape(x, &[1]);
        b.dynamic_update_slice(v, x, &[i])
    }
    fn ulp(&self) -> f64 {
        if self.e == ElemType::F64 { f64::EPSILON } else { f32::EPSILON as f64 }
    }
    fn safmin(&self) -> f64 {
        if self.e == ElemType::F64 { f64::MIN_POSITIVE } else { f32::MIN_POSITIVE as f64 }
    }
}

/// Fortran's SIGN(a, s) elementwise: |a| with the sign of s (s >= 0 counts as positive).
fn fsign(b: &mut Builder, a: Value, s: Value) -> Value {
    let d = b.dims(a).to_vec();
    let aa = b.abs(a);
    let na = b.neg(aa);
    let z = spl(b, 0.0, b.elem(a), &d);
    let neg = b.compare(CmpDir::Lt, s, z);
    b.select(neg, na, aa)
}

/// LAPACK's dlapy2 elementwise: sqrt(x^2 + y^2) without overflow.
fn lapy2(b: &mut Builder, x: Value, y: Value) -> Value {
    let (d, e) = (b.dims(x).to_vec(), b.elem(x));
    let xa = b.abs(x);
    let ya = b.abs(y);
    let w = b.max(xa, ya);
    let z = b.min(xa, ya);
    let q = b.div(z, w);
    let q2 = b.mul(q, q);
    let one = spl(b, 1.0, e, &d);
    let t = b.add(one, q2);
    let t = b.sqrt(t);
    let r = b.mul(w, t);
    let zero = spl(b, 0.0, e, &d);
    let z0 = b.compare(CmpDir::Eq, z, zero);
    b.select(z0, w, r)
}

/// The plane rotation (x, y) -> (cs x + sn y, cs y - sn x), elementwise (cs, sn of x's dims).
fn plane_rot(b: &mut Builder, x: Value, y: Value, cs: Value, sn: Value) -> (Value, Value) {
    let a1 = b.mul(cs, x);
    let a2 = b.mul(sn, y);
    let nx = b.add(a1, a2);
    let b1 = b.mul(cs, y);
    let b2 = b.mul(sn, x);
    let ny = b.sub(b1, b2);
    (nx, ny)
}

/// dlahqr's 3-row reflector I - t1 [1 v2 v3]^T [1 v2 v3] on three lines x (rows or columns):
/// x_j - t_j (x0 + v2 x1 + v3 x2) with t = [t1, t1 v2, t1 v3] (0-d values); the third line is
/// left as it is unless `three` (the sweep's last step has only two rows).
fn reflect3(b: &mut Builder, x: &[Value], v: [Value; 2], t: [Value; 3], three: Value) -> Vec<Value> {
    let d = b.dims(x[0]).to_vec();
    let v2 = b.broadcast_in_dim(v[0], &d, &[]);
    let v3 = b.broadcast_in_dim(v[1], &d, &[]);
    let x1 = b.mul(v2, x[1]);
    let x2 = b.mul(v3, x[2]);
    let sm = b.add(x[0], x1);
    let sm = b.add(sm, x2);
    let mut out = Vec::with_capacity(3);
    for j in 0..3 {
        let tj = b.broadcast_in_dim(t[j], &d, &[]);
        let y = b.mul(sm, tj);
        out.push(b.sub(x[j], y));
    }
    let three = b.broadcast_in_dim(three, &d, &[]);
    out[2] = b.select(three, out[2], x[2]);
    out
}

/// Row i of a matrix m [r, c] as [c] (i 0-d).
fn row_at(b: &mut Builder, m: Value, i: Value) -> Value {
    let c = b.dims(m)[1];
    let z = b.constant_i64(0, I64E);
    let x = b.dynamic_slice(m, &[i, z], &[1, c]);
    b.reshape(x, &[c])
}

/// Column j of a matrix m [r, c] as [r] (j 0-d).
fn col_at(b: &mut Builder, m: Value, j: Value) -> Value {
    let r = b.dims(m)[0];
    let z = b.constant_i64(0, I64E);
    let x = b.dynamic_slice(m, &[z, j], &[r, 1]);
    b.reshape(x, &[r])
}

/// m [r, c] with row i replaced by x [c].
fn put_row(b: &mut Builder, m: Value, i: Value, x: Value) -> Value {
    let c = b.dims(m)[1];
    let z = b.constant_i64(0, I64E);
    let x = b.reshape(x, &[1, c]);
    b.dynamic_update_slice(m, x, &[i, z])
}

/// m [r, c] with column j replaced by x [r].
fn put_col(b: &mut Builder, m: Value, j: Value, x: Value) -> Value {
    let r = b.dims(m)[0];
    let z = b.constant_i64(0, I64E);
    let x = b.reshape(x, &[r, 1]);
    b.dynamic_update_slice(m, x, &[z, j])
}

/// The slices of `m` along `axis`, that axis dropped: the rows or columns of a thin block (or
/// the entries of a short vector), for the 2- and 3-line updates of the QR sweep.
fn unstack(b: &mut Builder, m: Value, axis: usize) -> Vec<Value> {
    let d = b.dims(m).to_vec();
    let mut line = d.clone();
    line.remove(axis);
    (0..d[axis])
        .map(|j| {
            let mut lo = vec![0; d.len()];
            lo[axis] = j;
            let mut hi = d.clone();
            hi[axis] = j + 1;
            let x = b.slice(m, &lo, &hi, &vec![1; d.len()]);
            b.reshape(x, &line)
        })
        .collect()
}

/// The inverse of `unstack`: equal lines joined along a new `axis`.
fn stack(b: &mut Builder, lines: &[Value], axis: usize) -> Value {
    let mut d = b.dims(lines[0]).to_vec();
    d.insert(axis, 1);
    let parts: Vec<Value> = lines.iter().map(|&x| b.reshape(x, &d)).collect();
    b.concatenate(&parts, axis as i64)
}

/// x shifted one place back along `axis`: x[.., k + 1, ..] at k, zeros filling the end.
fn next_along(b: &mut Builder, x: Value, axis: usize) -> Value {
    let d = b.dims(x).to_vec();
    let zeros = vec![0; d.len()];
    let mut lo = zeros.clone();
    lo[axis] = 1;
    let s = b.slice(x, &lo, &d, &vec![1; d.len()]);
    let z = b.constant_f64(0.0, b.elem(x));
    b.pad(s, z, &zeros, &lo, &zeros)
}

/// x shifted one place on along `axis`: x[.., k - 1, ..] at k, zeros filling the start.
fn prev_along(b: &mut Builder, x: Value, axis: usize) -> Value {
    let d = b.dims(x).to_vec();
    let zeros = vec![0; d.len()];
    let mut hi = d.clone();
    hi[axis] -= 1;
    let s = b.slice(x, &zeros, &hi, &vec![1; d.len()]);
    let mut low = zeros.clone();
    low[axis] = 1;
    let z = b.constant_f64(0.0, b.elem(x));
    b.pad(s, z, &low, &zeros, &zeros)
}

/// The diagonal m[k, k - off] of a square m, one entry per row k (0 where k - off is out of
/// range): off 0 the diagonal, 1 the subdiagonal, -1 the superdiagonal.
fn band(b: &mut Builder, m: Value, off: i64) -> Value {
    let d = b.dims(m).to_vec();
    let r = idx(b, &d, 0);
    let c = idx(b, &d, 1);
    let c = if off == 0 {
        c
    } else {
        let o = ispl(b, off, &d);
        b.add(c, o)
    };
    let on = b.compare(CmpDir::Eq, r, c);
    let z = spl(b, 0.0, b.elem(m), &d);
    let sel = b.select(on, m, z);
    sum_over(b, sel, &[1])
}

/// m with the entries below its subdiagonal zeroed (its upper Hessenberg part).
fn hessenberg_part(b: &mut Builder, m: Value) -> Value {
    let d = b.dims(m).to_vec();
    let r = idx(b, &d, 0);
    let c = idx(b, &d, 1);
    let one = ispl(b, 1, &d);
    let c1 = b.add(c, one);
    let keep = b.compare(CmpDir::Le, r, c1);
    let z = spl(b, 0.0, b.elem(m), &d);
    b.select(keep, m, z)
}

/// The largest position (`pos`, an iota over cand's one dim) where `cand` holds; -1 when none.
fn last_where(b: &mut Builder, cand: Value, pos: Value) -> Value {
    let d = b.dims(pos).to_vec();
    let m1 = ispl(b, -1, &d);
    let ci = b.select(cand, pos, m1);
    let mn = b.constant_i64(-1, I64E);
    b.reduce(&[ci], &[mn], &[0], |b, x| vec![b.max(x[0], x[1])])[0]
}

/// m - tau v (v^T m): the Householder reflector I - tau v v^T applied to m [r, c] from the left.
fn reflect_left(b: &mut Builder, m: Value, v: Value, tau: Value) -> Value {
    let d = b.dims(m).to_vec();
    let vb = b.broadcast_in_dim(v, &d, &[0]);
    let p = b.mul(m, vb);
    let u = sum_over(b, p, &[0]);
    let tv = b.broadcast_in_dim(tau, &[d[1]], &[]);
    let u = b.mul(u, tv);
    let ub = b.broadcast_in_dim(u, &d, &[1]);
    let upd = b.mul(vb, ub);
    b.sub(m, upd)
}

/// m - tau (m v) v^T: the same reflector applied from the right.
fn reflect_right(b: &mut Builder, m: Value, v: Value, tau: Value) -> Value {
    let d = b.dims(m).to_vec();
    let vb = b.broadcast_in_dim(v, &d, &[1]);
    let p = b.mul(m, vb);
    let mv = sum_over(b, p, &[1]);
    let tv = b.broadcast_in_dim(tau, &[d[0]], &[]);
    let w = b.mul(mv, tv);
    let wb = b.broadcast_in_dim(w, &d, &[0]);
    let upd = b.mul(wb, vb);
    b.sub(m, upd)
}

/// dgeev on each matrix of a batch [B, n, n] (real): (eigenvalues [B, n], eigenvectors [B, n, n])
/// as complex values, the vectors only when `vectors`. Matrices with a non-finite entry give NaN.
fn geev_batch(b: &mut Builder, a: Value, vectors: bool) -> (Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
    let ce = e.complex_of().unwrap();
    let ev = Ev { e, n };
    let w0 = cspl(b, 0.0, e, &[bs, n]);
    let v0 = cspl(b, 0.0, e, &[bs, n, n]);
    let z0 = b.constant_i64(0, I64E);
    let out = b.while_loop(
        &[z0, w0, v0],
        |b, v| {
            let nb = b.constant_i64(bs, I64E);
            b.compare(CmpDir::Lt, v[0], nb)
        },
        |b, v| {
            let (bi, wall, vall) = (v[0], v[1], v[2]);
            let z0 = b.constant_i64(0, I64E);
            let m = b.dynamic_slice(a, &[bi, z0, z0], &[1, n, n]);
            let m = b.reshape(m, &[n, n]);
            let fin = b.is_finite(m);
            let t = b.constant_bool(true);
            let all_fin = b.reduce(&[fin], &[t], &[0, 1], |b, x| vec![b.and(x[0], x[1])])[0];
            let zm = spl(b, 0.0, e, &[n, n]);
            let fb = b.broadcast_in_dim(all_fin, &[n, n], &[]);
            let m = b.select(fb, m, zm);
            let (ab, ilo, ihi, scale) = ev_gebal(b, &ev, m);
            let (h, q) = ev_hessenberg(b, &ev, ab, ilo, ihi);
            let (tt, zz, wr, wi) = ev_lahqr(b, &ev, h, q, ilo, ihi);
            let w = b.complex(wr, wi);
            let nanc = cspl(b, f64::NAN, e, &[n]);
            let fv = b.broadcast_in_dim(all_fin, &[n], &[]);
            let w = b.select(fv, w, nanc);
            let w = b.reshape(w, &[1, n]);
            let wall = b.dynamic_update_slice(wall, w, &[bi, z0]);
            let vall = if vectors {
                let vv = ev_vectors(b, &ev, tt, zz, scale, ilo, ihi);
                let nanm = cspl(b, f64::NAN, e, &[n, n]);
                let fm = b.broadcast_in_dim(all_fin, &[n, n], &[]);
                let vv = b.select(fm, vv, nanm);
                let vv = b.reshape(vv, &[1, n, n]);
                b.dynamic_update_slice(vall, vv, &[bi, z0, z0])
            } else {
                vall
            };
            let one = b.constant_i64(1, I64E);
            vec![b.add(bi, one), wall, vall]
        },
    );
    let _ = ce;
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
