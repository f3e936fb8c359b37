//! The orthogonal polynomials of torch.special: Chebyshev T/U/V/W (and shifted), Legendre P,
//! Laguerre L and Hermite H/He, by their recurrences.
use crate::args::Args;
use crate::blocks::loops::{any_true, next_count};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{bk, cmp_k, count_like, float_result, k, operands, pair};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("special_chebyshev_polynomial_t", |cx, a| polynomial(cx, a, Poly::Chebyshev('T', false), "chebyshev_polynomial_t_cpu")),
    op("special_chebyshev_polynomial_u", |cx, a| polynomial(cx, a, Poly::Chebyshev('U', false), "chebyshev_polynomial_u_cpu")),
    op("special_chebyshev_polynomial_v", |cx, a| polynomial(cx, a, Poly::Chebyshev('V', false), "chebyshev_polynomial_v_cpu")),
    op("special_chebyshev_polynomial_w", |cx, a| polynomial(cx, a, Poly::Chebyshev('W', false), "chebyshev_polynomial_w_cpu")),
    op("special_shifted_chebyshev_polynomial_t", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('T', true), "shifted_chebyshev_polynomial_t_cpu")
    }),
    op("special_shifted_chebyshev_polynomial_u", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('U', true), "shifted_chebyshev_polynomial_u_cpu")
    }),
    op("special_shifted_chebyshev_polynomial_v", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('V', true), "shifted_chebyshev_polynomial_v_cpu")
    }),
    op("special_shifted_chebyshev_polynomial_w", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('W', true), "shifted_chebyshev_polynomial_w_cpu")
    }),
    op("special_legendre_polynomial_p", |cx, a| polynomial(cx, a, Poly::Legendre, "legendre_polynomial_p_cpu")),
    op("special_laguerre_polynomial_l", |cx, a| polynomial(cx, a, Poly::Laguerre, "laguerre_polynomial_l_cpu")),
    op("special_hermite_polynomial_h", |cx, a| polynomial(cx, a, Poly::HermiteH, "hermite_polynomial_h_cpu")),
    op("special_hermite_polynomial_he", |cx, a| polynomial(cx, a, Poly::HermiteHe, "hermite_polynomial_he_cpu")),
];

// ---- orthogonal polynomials -----------------------------------------------------------------------

/// The polynomial families of torch.special, each evaluated as PyTorch's Math.h does.
#[derive(Copy, Clone, PartialEq)]
enum Poly {
    /// Chebyshev polynomials of the first to fourth kind (T, U, V, W); `true` for the
    /// shifted ones (of 2x - 1).
    Chebyshev(char, bool),
    Legendre,
    Laguerre,
    HermiteH,
    HermiteHe,
}

/// special_<poly>(x, n): x and n may each be a tensor or a Python number (the x_scalar and
/// n_scalar overloads). Both promote to a float dtype (integers and bools give float32) and
/// n is read as an integer by truncation; float32 and float64 only, like PyTorch's CPU kernels.
fn polynomial(cx: &mut Cx, args: &Args, poly: Poly, kernel: &str) -> Result<Vec<Out>> {
    let (x, n, dt) = operands(args, "x", "n")?;
    let dt = float_result(dt);
    check!(matches!(dt, DType::F32 | DType::F64), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    let (xv, nv) = pair(cx, x, n, dt)?;
    let ni = truncate_n(cx, nv);
    one(match poly {
        Poly::Chebyshev(kind, shifted) => chebyshev_values(cx, xv, ni, kind, shifted),
        Poly::Legendre => legendre_values(cx, xv, ni),
        Poly::Laguerre => laguerre_values(cx, xv, ni),
        Poly::HermiteH => hermite_values(cx, xv, ni, true),
        Poly::HermiteHe => hermite_values(cx, xv, ni, false),
    })
}

/// n as int64 like static_cast<int64_t> on x86: truncation toward zero, and NaN, infinities
/// and values beyond the int64 range give INT64_MIN (here -1: every family gives 0 below 0).
fn truncate_n(cx: &mut Cx, n: Value) -> Value {
    let an = cx.abs(n);
    let fits = cmp_k(cx, CmpDir::Lt, an, 9.223372036854775808e18);
    let dims = cx.dims(n);
    let z = cx.full(0.0, cx.dtype(n), &dims);
    let safe = cx.select(fits, n, z);
    let ni = cx.convert(safe, ElemType::I64);
    let m1 = cx.full(-1.0, DType::I64, &dims);
    cx.select(fits, ni, m1)
}

/// An int64 constant shaped like `like`.
fn ik(cx: &mut Cx, x: i64, like: Value) -> Value {
    let dims = cx.dims(like);
    let ty = TensorType::new(ElemType::I64, &dims);
    cx.b.splat_i64(x, &ty)
}

/// `a op c` for an int64 `a` and constant `c`.
fn icmp(cx: &mut Cx, dir: CmpDir, a: Value, c: i64) -> Value {
    let cv = ik(cx, c, a);
    cx.compare(dir, a, cv)
}

/// The int64 `n` as a float like `like` (C++'s int64 -> T conversion).
fn to_float(cx: &mut Cx, n: Value, like: Value) -> Value {
    let e = cx.elem(like);
    cx.convert(n, e)
}

/// The three-term recurrence of the polynomial families: `iters` times per element (0 or less
/// for none), (p, q) <- (q, step(k, p, q)) with k = 1, 2, ... as a float; with `stop_nan`, an
/// element stops once q is NaN (PyTorch's loop condition). Returns the last q. One while loop
/// for the whole tensor, running until no element is active.
fn recurrence(
    cx: &mut Cx,
    iters: Value,
    p0: Value,
    q0: Value,
    stop_nan: bool,
    step: impl FnOnce(&mut Builder, Value, Value, Value) -> Value,
) -> Value {
    fn active(b: &mut Builder, j: Value, iters: Value, q: Value, stop_nan: bool) -> Value {
        let dims = b.dims(iters).to_vec();
        let jb = b.broadcast_in_dim(j, &dims, &[]);
        let more = b.compare(CmpDir::Lt, jb, iters);
        if !stop_nan {
            return more;
        }
        let ok = b.compare(CmpDir::Eq, q, q);
        b.and(more, ok)
    }
    let zero_i = cx.constant_i64(0, ElemType::I64);
    let r = cx.while_loop(
        &[zero_i, p0, q0],
        |b, v| {
            let a = active(b, v[0], iters, v[2], stop_nan);
            any_true(b, a)
        },
        |b, v| {
            let (j, p, q) = (v[0], v[1], v[2]);
            let a = active(b, j, iters, q, stop_nan);
            let j1 = next_count(b, j);
            let kf = count_like(b, j1, q);
            let r = step(b, kf, p, q);
            let p = b.select(a, q, p);
            let q = b.select(a, r, q);
            vec![j1, p, q]
        },
    );
    r[2]
}

/// +-v by the parity of n: v for even n, -v for odd.
fn by_parity(cx: &mut Cx, n: Value, v: Value) -> Value {
    let two = ik(cx, 2, n);
    let r = cx.rem(n, two);
    let z = ik(cx, 0, n);
    let even = cx.compare(CmpDir::Eq, r, z);
    let nv = cx.neg(v);
    cx.select(even, v, nv)
}

/// Chebyshev polynomials T, U, V, W (of x, or of y = 2x - 1 when shifted): n < 0 gives 0,
/// the ends (x = +-1, or x = 1 and 0 shifted) their closed forms, |y| < 1 with n above a
/// threshold the trigonometric form, and the recurrence r = 2y q - p otherwise.
fn chebyshev_values(cx: &mut Cx, x: Value, n: Value, kind: char, shifted: bool) -> Value {
    let one_ = k(cx, 1.0, x);
    let y = if shifted {
        // 2 (x - 1/2) is x + x - 1 rounded once, as PyTorch computes it; written so, XLA
        // cannot fold the + 1 of acos's expansion into it ((a - 1) + 1 -> a).
        let h = k(cx, 0.5, x);
        let t = cx.sub(x, h);
        let two = k(cx, 2.0, x);
        cx.mul(t, two)
    } else {
        x
    };
    let nf = to_float(cx, n, x);
    let n1 = {
        let o = ik(cx, 1, n);
        let t = cx.add(n, o);
        to_float(cx, t, x)
    };
    let n21 = {
        let nn = cx.add(n, n);
        let o = ik(cx, 1, n);
        let t = cx.add(nn, o);
        to_float(cx, t, x)
    };
    // The ends.
    let (at_pos, at_neg) = if shifted {
        (cmp_k(cx, CmpDir::Eq, x, 1.0), cmp_k(cx, CmpDir::Eq, x, 0.0))
    } else {
        (cmp_k(cx, CmpDir::Eq, x, 1.0), cmp_k(cx, CmpDir::Eq, x, -1.0))
    };
    let (pos_v, neg_mag) = match kind {
        'T' => (one_, one_),
        'U' => (n1, n1),
        'V' => (one_, n21),
        _ => (n21, one_),
    };
    let neg_v = by_parity(cx, n, neg_mag);
    // The trigonometric form.
    let threshold = match (kind, shifted) {
        ('T', _) => 6,
        ('W', true) => 4,
        (_, true) => 6,
        _ => 8,
    };
    let ay = cx.abs(y);
    let inside = cmp_k(cx, CmpDir::Lt, ay, 1.0);
    let big_n = icmp(cx, CmpDir::Gt, n, threshold);
    let trig = cx.and(inside, big_n);
    let theta = cx.chlo("acos", &[y]);
    let two = k(cx, 2.0, x);
    let half = k(cx, 0.5, x);
    let trig_v = match kind {
        'T' => {
            let a = cx.mul(nf, theta);
            cx.cos(a)
        }
        'U' => {
            let s = cx.sin(theta);
            let a = cx.mul(n1, theta);
            let sa = cx.sin(a);
            let q = cx.div(sa, s);
            let ca = cx.cos(a);
            let alt = cx.mul(n1, ca);
            let alt = cx.div(alt, y);
            let s0 = cmp_k(cx, CmpDir::Ne, s, 0.0);
            cx.select(s0, q, alt)
        }
        'V' => {
            let h = cx.div(theta, two);
            let sh = cx.sin(h);
            let nh = cx.add(nf, half);
            let a = cx.mul(nh, theta);
            let ca = cx.cos(a);
            let ch = cx.cos(h);
            let q = cx.div(ca, ch);
            let regular = cmp_k(cx, CmpDir::Ne, sh, 1.0);
            cx.select(regular, q, neg_v)
        }
        _ => {
            let h = cx.div(theta, two);
            let ch = cx.cos(h);
            let nh = cx.add(nf, half);
            let a = cx.mul(nh, theta);
            let sa = cx.sin(a);
            let sh = cx.sin(h);
            let q = cx.div(sa, sh);
            let parity = by_parity(cx, n, one_);
            // (PyTorch's shifted W skips the x > 0 case here.)
            let alt = if shifted {
                parity
            } else {
                let xp = cmp_k(cx, CmpDir::Gt, x, 0.0);
                cx.select(xp, n21, parity)
            };
            let regular = cmp_k(cx, CmpDir::Ne, ch, 1.0);
            cx.select(regular, q, alt)
        }
    };
    // The recurrence from p = 1 and q = P_1.
    let yy = cx.add(y, y);
    let q0 = match kind {
        'T' => y,
        'U' => yy,
        'V' => cx.sub(yy, one_),
        _ => cx.add(yy, one_),
    };
    let ends = cx.or(at_pos, at_neg);
    let skip = cx.or(ends, trig);
    let iters = rec_iters(cx, n, Some(skip));
    let rec = recurrence(cx, iters, one_, q0, true, |b, _k, p, q| {
        let t = b.mul(yy, q);
        b.sub(t, p)
    });
    poly_result(cx, n, rec, &[(trig, trig_v), (at_neg, neg_v), (at_pos, pos_v)])
}

/// A polynomial's value from its recurrence `rec` (the last q): 1 for n = 0, then each of
/// `cases` (condition, value) over it in order, and 0 for n < 0.
fn poly_result(cx: &mut Cx, n: Value, rec: Value, cases: &[(Value, Value)]) -> Value {
    let one_ = k(cx, 1.0, rec);
    let n0 = icmp(cx, CmpDir::Eq, n, 0);
    let mut r = cx.select(n0, one_, rec);
    for &(c, v) in cases {
        r = cx.select(c, v, r);
    }
    let neg = icmp(cx, CmpDir::Lt, n, 0);
    let zero = k(cx, 0.0, rec);
    cx.select(neg, zero, r)
}

/// (aq - k p) / (k + 1), the step of the Legendre and Laguerre recurrences (aq = a_k q).
fn over_k1_step(b: &mut Builder, kf: Value, p: Value, aq: Value) -> Value {
    let kp = b.mul(kf, p);
    let t = b.sub(aq, kp);
    let o = bk(b, 1.0, kf);
    let k1 = b.add(kf, o);
    b.div(t, k1)
}

/// The iteration counts of a recurrence started at P_1: n - 1, or none where `skip` holds.
fn rec_iters(cx: &mut Cx, n: Value, skip: Option<Value>) -> Value {
    let m1 = ik(cx, 1, n);
    let nm1 = cx.sub(n, m1);
    match skip {
        Some(s) => {
            let z = ik(cx, 0, n);
            cx.select(s, z, nm1)
        }
        None => nm1,
    }
}

/// Legendre P_n(x): 0 for n < 0, +-1 at x = +-1, else ((2k+1) x q - k p) / (k+1).
fn legendre_values(cx: &mut Cx, x: Value, n: Value) -> Value {
    let one_ = k(cx, 1.0, x);
    let ax = cx.abs(x);
    let ends = cmp_k(cx, CmpDir::Eq, ax, 1.0);
    let parity = by_parity(cx, n, one_);
    let xp = cmp_k(cx, CmpDir::Gt, x, 0.0);
    let end_v = cx.select(xp, one_, parity);
    let iters = rec_iters(cx, n, Some(ends));
    let rec = recurrence(cx, iters, one_, x, true, |b, kf, p, q| {
        let o = bk(b, 1.0, kf);
        let k2 = b.add(kf, kf);
        let k21 = b.add(k2, o);
        let t = b.mul(k21, x);
        let aq = b.mul(t, q);
        over_k1_step(b, kf, p, aq)
    });
    poly_result(cx, n, rec, &[(ends, end_v)])
}

/// Laguerre L_n(x): 0 for n < 0, 1 at x = 0, else ((2k + 1 - x) q - k p) / (k+1).
fn laguerre_values(cx: &mut Cx, x: Value, n: Value) -> Value {
    let one_ = k(cx, 1.0, x);
    let omx = cx.sub(one_, x);
    let at0 = cmp_k(cx, CmpDir::Eq, x, 0.0);
    let iters = rec_iters(cx, n, Some(at0));
    let rec = recurrence(cx, iters, one_, omx, true, |b, kf, p, q| {
        let k2 = b.add(kf, kf);
        let t = b.add(k2, omx);
        let aq = b.mul(t, q);
        over_k1_step(b, kf, p, aq)
    });
    poly_result(cx, n, rec, &[(at0, one_)])
}

/// Hermite polynomials, physicists' H (`physicists`) or probabilists' He: 0 for n < 0, NaN
/// beyond PyTorch's limit (128 in float32, 512 in float64), else r = 2x q - 2k p (H) or
/// x q - k p (He), without PyTorch's NaN stop.
fn hermite_values(cx: &mut Cx, x: Value, n: Value, physicists: bool) -> Value {
    let one_ = k(cx, 1.0, x);
    let limit = if cx.dtype(x) == DType::F64 { 512 } else { 128 };
    let too_big = icmp(cx, CmpDir::Gt, n, limit);
    let q0 = if physicists { cx.add(x, x) } else { x };
    let iters = rec_iters(cx, n, Some(too_big));
    let rec = recurrence(cx, iters, one_, q0, false, |b, kf, p, q| {
        if physicists {
            let xx = b.add(x, x);
            let t = b.mul(xx, q);
            let k2 = b.add(kf, kf);
            let kp = b.mul(k2, p);
            b.sub(t, kp)
        } else {
            let t = b.mul(x, q);
            let kp = b.mul(kf, p);
            b.sub(t, kp)
        }
    });
    // (n = 0 is never too big: the order of the two cases does not matter.)
    let nan = k(cx, f64::NAN, x);
    poly_result(cx, n, rec, &[(too_big, nan)])
}
