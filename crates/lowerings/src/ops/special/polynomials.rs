//! The orthogonal polynomials of torch.special: Chebyshev T/U/V/W (and shifted), Legendre P,
//! Laguerre L and Hermite H/He, by their recurrences.
use crate::args::Args;
use crate::blocks::loops::{any_true, next_count};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{float_result, operands, pair};
use stablehlo::{ElemType, Ex, E};

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
    let e = Ex::new(cx);
    let (x, n) = (e.of(xv), truncate_n(e.of(nv)));
    let r = match poly {
        Poly::Chebyshev(kind, shifted) => chebyshev_values(x, n, kind, shifted),
        Poly::Legendre => legendre_values(x, n),
        Poly::Laguerre => laguerre_values(x, n),
        Poly::HermiteH => hermite_values(x, n, true),
        Poly::HermiteHe => hermite_values(x, n, false),
    };
    one(r.v)
}

/// n as int64 like static_cast<int64_t> on x86: truncation toward zero, and NaN, infinities
/// and values beyond the int64 range give INT64_MIN (here -1: every family gives 0 below 0).
fn truncate_n(n: E) -> E {
    let fits = n.abs().lt(9.223372036854775808e18);
    let ni = fits.select(n, 0.0).cast(ElemType::I64);
    fits.select(ni, -1i64)
}

/// The three-term recurrence of the polynomial families: `iters` times per element (0 or less
/// for none), (p, q) <- (q, step(k, p, q)) with k = 1, 2, ... as a float; with `stop_nan`, an
/// element stops once q is NaN (PyTorch's loop condition). Returns the last q. One while loop
/// for the whole tensor, running until no element is active.
fn recurrence<'e>(
    iters: E<'e>,
    p0: E<'e>,
    q0: E<'e>,
    stop_nan: bool,
    step: impl for<'a> FnOnce(E<'a>, E<'a>, E<'a>) -> E<'a>,
) -> E<'e> {
    fn active<'a>(j: E<'a>, iters: E<'a>, q: E<'a>, stop_nan: bool) -> E<'a> {
        let more = j.splat(&iters.dims()).lt(iters);
        if stop_nan {
            more & q.eq(q)
        } else {
            more
        }
    }
    let (iters, elem, dims) = (iters.v, q0.elem(), q0.dims());
    let r = q0.with(|b| {
        let zero_i = b.constant_i64(0, ElemType::I64);
        b.while_loop(
            &[zero_i, p0.v, q0.v],
            |b, v| {
                let a = {
                    let e = Ex::new(b);
                    active(e.of(v[0]), e.of(iters), e.of(v[2]), stop_nan).v
                };
                any_true(b, a)
            },
            |b, v| {
                let j1 = next_count(b, v[0]);
                let e = Ex::new(b);
                let [j, p, q] = e.all([v[0], v[1], v[2]]);
                let a = active(j, e.of(iters), q, stop_nan);
                let r = step(e.of(j1).cast(elem).splat(&dims), p, q);
                vec![j1, a.select(q, p).v, a.select(r, q).v]
            },
        )
    });
    q0.of(r[2])
}

/// +-v by the parity of n: v for even n, -v for odd.
fn by_parity<'e>(n: E<'e>, v: E<'e>) -> E<'e> {
    (n % 2i64).eq(0i64).select(v, -v)
}

/// Chebyshev polynomials T, U, V, W (of x, or of y = 2x - 1 when shifted): n < 0 gives 0,
/// the ends (x = +-1, or x = 1 and 0 shifted) their closed forms, |y| < 1 with n above a
/// threshold the trigonometric form, and the recurrence r = 2y q - p otherwise.
fn chebyshev_values<'e>(x: E<'e>, n: E<'e>, kind: char, shifted: bool) -> E<'e> {
    let one_ = x.k(1.0);
    // 2 (x - 1/2) is x + x - 1 rounded once, as PyTorch computes it; written so, XLA cannot
    // fold the + 1 of acos's expansion into it ((a - 1) + 1 -> a).
    let y = if shifted { (x - 0.5) * 2.0 } else { x };
    let float = |i: E<'e>| i.cast(x.elem());
    let (nf, n1, n21) = (float(n), float(n + 1i64), float(n + n + 1i64));
    // The ends.
    let at_pos = x.eq(1.0);
    let at_neg = x.eq(if shifted { 0.0 } else { -1.0 });
    let (pos_v, neg_mag) = match kind {
        'T' => (one_, one_),
        'U' => (n1, n1),
        'V' => (one_, n21),
        _ => (n21, one_),
    };
    let neg_v = by_parity(n, neg_mag);
    // The trigonometric form.
    let threshold = match (kind, shifted) {
        ('T', _) => 6,
        ('W', true) => 4,
        (_, true) => 6,
        _ => 8,
    };
    let trig = y.abs().lt(1.0) & n.gt(threshold as i64);
    let theta = y.chlo("acos");
    let trig_v = match kind {
        'T' => (nf * theta).cos(),
        'U' => {
            let (s, a) = (theta.sin(), n1 * theta);
            s.ne(0.0).select(a.sin() / s, n1 * a.cos() / y)
        }
        'V' => {
            let h = theta / 2.0;
            h.sin().ne(1.0).select(((nf + 0.5) * theta).cos() / h.cos(), neg_v)
        }
        _ => {
            let h = theta / 2.0;
            let q = ((nf + 0.5) * theta).sin() / h.sin();
            let parity = by_parity(n, one_);
            // (PyTorch's shifted W skips the x > 0 case here.)
            let alt = if shifted { parity } else { x.gt(0.0).select(n21, parity) };
            h.cos().ne(1.0).select(q, alt)
        }
    };
    // The recurrence from p = 1 and q = P_1.
    let yy = y + y;
    let q0 = match kind {
        'T' => y,
        'U' => yy,
        'V' => yy - 1.0,
        _ => yy + 1.0,
    };
    let iters = rec_iters(n, at_pos | at_neg | trig);
    let yy = yy.v;
    let rec = recurrence(iters, one_, q0, true, |_k, p, q| q.of(yy) * q - p);
    poly_result(n, rec, &[(trig, trig_v), (at_neg, neg_v), (at_pos, pos_v)])
}

/// A polynomial's value from its recurrence `rec` (the last q): 1 for n = 0, then each of
/// `cases` (condition, value) over it in order, and 0 for n < 0.
fn poly_result<'e>(n: E<'e>, rec: E<'e>, cases: &[(E<'e>, E<'e>)]) -> E<'e> {
    let mut r = n.eq(0i64).select(1.0, rec);
    for &(c, v) in cases {
        r = c.select(v, r);
    }
    n.lt(0i64).select(0.0, r)
}

/// (aq - k p) / (k + 1), the step of the Legendre and Laguerre recurrences (aq = a_k q).
fn over_k1_step<'a>(k: E<'a>, p: E<'a>, aq: E<'a>) -> E<'a> {
    (aq - k * p) / (k + 1.0)
}

/// The iteration counts of a recurrence started at P_1: n - 1, or none where `skip` holds.
fn rec_iters<'e>(n: E<'e>, skip: E<'e>) -> E<'e> {
    skip.select(0i64, n - 1i64)
}

/// Legendre P_n(x): 0 for n < 0, +-1 at x = +-1, else ((2k+1) x q - k p) / (k+1).
fn legendre_values<'e>(x: E<'e>, n: E<'e>) -> E<'e> {
    let one_ = x.k(1.0);
    let ends = x.abs().eq(1.0);
    let end_v = x.gt(0.0).select(one_, by_parity(n, one_));
    let xv = x.v;
    let rec = recurrence(rec_iters(n, ends), one_, x, true, |k, p, q| over_k1_step(k, p, (k + k + 1.0) * q.of(xv) * q));
    poly_result(n, rec, &[(ends, end_v)])
}

/// Laguerre L_n(x): 0 for n < 0, 1 at x = 0, else ((2k + 1 - x) q - k p) / (k+1).
fn laguerre_values<'e>(x: E<'e>, n: E<'e>) -> E<'e> {
    let one_ = x.k(1.0);
    let omx = one_ - x;
    let at0 = x.eq(0.0);
    let omx_v = omx.v;
    let rec = recurrence(rec_iters(n, at0), one_, omx, true, |k, p, q| over_k1_step(k, p, (k + k + q.of(omx_v)) * q));
    poly_result(n, rec, &[(at0, one_)])
}

/// Hermite polynomials, physicists' H (`physicists`) or probabilists' He: 0 for n < 0, NaN
/// beyond PyTorch's limit (128 in float32, 512 in float64), else r = 2x q - 2k p (H) or
/// x q - k p (He), without PyTorch's NaN stop.
fn hermite_values<'e>(x: E<'e>, n: E<'e>, physicists: bool) -> E<'e> {
    let limit = if x.elem() == ElemType::F64 { 512 } else { 128 };
    let too_big = n.gt(limit as i64);
    let q0 = if physicists { x + x } else { x };
    let xv = x.v;
    let rec = recurrence(rec_iters(n, too_big), x.k(1.0), q0, false, |k, p, q| {
        let x = q.of(xv);
        if physicists {
            (x + x) * q - (k + k) * p
        } else {
            x * q - k * p
        }
    });
    // (n = 0 is never too big: the order of the two cases does not matter.)
    poly_result(n, rec, &[(too_big, x.k(f64::NAN))])
}
