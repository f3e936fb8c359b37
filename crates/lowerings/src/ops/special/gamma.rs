//! The gamma family: polygamma (digamma, trigamma), special_zeta (Hurwitz zeta), the
//! regularized incomplete gamma functions igamma/igammac, and mvlgamma.
use crate::args::Args;
use crate::blocks::loops::{loop_more, next_count, select_all};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{bits_of, float_result, float_unary, no_complex, operands, pair};
use stablehlo::{ElemType, Ex, Value, E};

pub(crate) const OPS: &[Op] = &[
    op("polygamma", polygamma),
    op("special_polygamma", polygamma),
    // mvlgamma.out and mvlgamma_ (special_multigammaln.out calls mvlgamma.out); the functional
    // form is PyTorch's composite of the same steps.
    op("mvlgamma", mvlgamma),
    op("igamma", |cx, a| igamma(cx, a, false)),
    op("igammac", |cx, a| igamma(cx, a, true)),
    op("special_zeta", zeta),
];

// ---- polygamma, trigamma, zeta -------------------------------------------------------------------

/// polygamma(n, self): digamma for n = 0, PyTorch's trigamma for n = 1, and
/// (-1)^(n+1) n! zeta(n + 1, x) above.
fn polygamma(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let n = args.int("n")?;
    check!(n >= 0, Runtime, "polygamma(n, x) does not support negative n.");
    float_unary(cx, args, |cx, x| match n {
        0 => digamma(cx, x),
        1 => trigamma(cx, x),
        _ => {
            // (-1)^(n+1) exp(lgamma(n + 1)) zeta(n + 1, x)
            let n1 = Ex::new(cx).of(x).k((n + 1) as f64).v;
            let z = zeta_values(cx, n1, x);
            let e = Ex::new(cx);
            let f = e.of(n1).chlo("lgamma").exp();
            let f = if n % 2 == 1 { f } else { -f };
            (f * z).v
        }
    })
}

/// digamma as PyTorch defines it at zero: copysign(inf, -x) (chlo.digamma gives NaN there).
fn digamma(cx: &mut Cx, x: Value) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let d = x.chlo("digamma");
    let (inf, ninf) = (x.k(f64::INFINITY), x.k(f64::NEG_INFINITY));
    let (ue, sign) = bits_of(x.elem());
    let bits = e.of(e.with(|b| b.bitcast_convert(x.v, ue)));
    let negative = (bits & sign).ne(0i64);
    let at0 = negative.select(inf, ninf);
    x.eq(0.0).select(at0, d).v
}

/// PyTorch's trigamma: reflection below 1/2, six recurrence steps, then the asymptotic series.
fn trigamma(cx: &mut Cx, x: Value) -> Value {
    let pi = std::f64::consts::PI;
    let e = Ex::new(cx);
    let x = e.of(x);
    let reflect = x.lt(0.5);
    let s = (pi * x).sin();
    let mut result = reflect.select(-((pi * pi) / (s * s)), 0.0);
    let mut x = reflect.select(1.0 - x, x);
    for _ in 0..6 {
        result = result + 1.0 / (x * x);
        x = x + 1.0;
    }
    let ixx = 1.0 / (x * x);
    // (1 + 1/(2x) + ixx (1/6 - ixx (1/30 - ixx / 42))) / x
    let t = ixx * (1.0 / 6.0 - ixx * (1.0 / 30.0 - ixx * (1.0 / 42.0)));
    result = result + (1.0 + 1.0 / (2.0 * x) + t) / x;
    reflect.select(-result, result).v
}

/// special_zeta(self, other): the Hurwitz zeta function; no 16-bit floats, like PyTorch's CPU
/// kernel.
fn zeta(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    no_complex(dt, args.op)?;
    let dt = float_result(dt);
    check!(!matches!(dt, DType::BF16 | DType::F16), NotImplemented, "\"zeta_cpu\" not implemented for '{}'", dt.torch_name());
    let (a, q) = pair(cx, x, y, dt)?;
    one(zeta_values(cx, a, q))
}

/// `a^e` for an exponent that is an integer wherever `a` is negative (std::pow's rule).
fn pow_signed<'e>(a: E<'e>, e: E<'e>) -> E<'e> {
    let p = a.abs().pow(e);
    // e odd: e - 2 floor(e / 2) == +-1.
    let odd = (e - (e * 0.5).floor() * 2.0).eq(1.0);
    (a.lt(0.0) & odd).select(-p, p)
}

/// The Hurwitz zeta function zeta(x, q) = sum_k (q + k)^-x as PyTorch computes it (Cephes):
/// direct summation until the terms are negligible or q + k > 9 (at least 9 terms), then
/// Euler-Maclaurin with twelve Bernoulli terms.
fn zeta_values(cx: &mut Cx, xv: Value, qv: Value) -> Value {
    const A: [f64; 12] = [
        12.0,
        -720.0,
        30240.0,
        -1209600.0,
        47900160.0,
        -1.8924375803183791606e9,
        7.47242496e10,
        -2.950130727918164224e12,
        1.1646782814350067249e14,
        -4.5979787224074726105e15,
        1.8152105401943546773e17,
        -7.1661652561756670113e18,
    ];
    let machep = if cx.dtype(xv) == DType::F64 { 1.11022302462515654042E-16 } else { 5.9604644775390625E-8 };
    let init = {
        let e = Ex::new(cx);
        let [x, q] = e.all([xv, qv]);
        let s0 = pow_signed(q, -x);
        let zero = x.k(0.0);
        let f = zero.ne(zero);
        let zero_i = e.with(|b| b.constant_i64(0, ElemType::I64));
        // State: (i, a, b, s, active, returned).
        [zero_i, q.v, zero.v, s0.v, (!f).v, f.v]
    };
    let r = cx.while_loop(
        &init,
        |b, v| loop_more(b, v[0], v[4], 100_000),
        |b, v| {
            let e = Ex::new(b);
            let [a, bb, s, active, returned] = e.all([v[1], v[2], v[3], v[4], v[5]]);
            let x = e.of(xv);
            let a1 = a + 1.0;
            let b1 = pow_signed(a1, -x);
            let s1 = s + b1;
            let ms = machep * s1;
            let conv = (-ms).lt(b1) & b1.lt(ms);
            let st = e.with(|b| select_all(b, active.v, &[a1.v, b1.v, s1.v], &[a.v, bb.v, s.v]));
            let [a, bb, s] = e.all([st[0], st[1], st[2]]);
            let returned = returned | (active & conv);
            let i1 = e.of(e.with(|b| next_count(b, v[0])));
            // Keep going while (i < 9 || a <= 9) and not converged.
            let early = i1.lt(9i64).splat(&a.dims());
            let active = active & ((early | a.le(9.0)) & !conv);
            vec![i1.v, a.v, bb.v, s.v, active.v, returned.v]
        },
    );
    let e = Ex::new(cx);
    let [x, q] = e.all([xv, qv]);
    let [w, mut bv, mut s, mut returned] = e.all([r[1], r[2], r[3], r[5]]);
    // Euler-Maclaurin tail.
    s = returned.select(s, s + bv * w / (x - 1.0) - 0.5 * bv);
    let mut av = x.k(1.0);
    let mut kv = 0.0;
    for &ai in &A {
        av = av * (x + kv);
        bv = bv / w;
        let t = av * bv / ai;
        let s1 = s + t;
        let conv = (t / s1).abs().lt(machep);
        s = returned.select(s, s1);
        returned = returned | conv;
        kv += 1.0;
        av = av * (x + kv);
        bv = bv / w;
        kv += 1.0;
    }
    // Special values, checked first in PyTorch: x == 1 -> inf, x < 1 -> NaN, q <= 0 at an
    // integer -> inf, q <= 0 with a non-integer x -> NaN.
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let q_int = q.eq(q.floor());
    let x_frac = x.ne(x.floor());
    let r = x_frac.select(nan, s);
    let r = q_int.select(inf, r);
    let r = q.le(0.0).select(r, s);
    let r = x.lt(1.0).select(nan, r);
    x.eq(1.0).select(inf, r).v
}

// ---- incomplete gamma -------------------------------------------------------------------------------------

/// igamma/igammac(self=a, other=x): the regularized lower (upper) incomplete gamma function,
/// by the power series for x < a + 1 and the continued fraction above, each iterated (at most
/// 2000 times) until every element has converged.
fn igamma(cx: &mut Cx, args: &Args, upper: bool) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    no_complex(dt, args.op)?;
    let kernel = if upper { "igammac_cpu" } else { "igamma_cpu" };
    check!(dt.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    let (a, xv) = pair(cx, x, y, dt.opmath())?;
    let r = igamma_values(cx, a, xv, upper);
    one(cx.cast(r, dt))
}

fn igamma_values(cx: &mut Cx, av: Value, xv: Value, upper: bool) -> Value {
    let f64_ = cx.dtype(av) == DType::F64;
    let eps = if f64_ { 1.11022302462515654042E-16 } else { 5.9604644775390625E-8 };
    let tiny = if f64_ { 1e-300 } else { 1e-30 };
    let e = Ex::new(cx);
    let [a, x] = e.all([av, xv]);
    // Prefactor x^a e^-x / Gamma(a).
    let fac = (a * x.ln() - x - a.chlo("lgamma")).exp();
    let use_series = x.lt(a + 1.0);
    // Elements outside the regular domain (NaN, infinities, zeros, negatives) take their
    // boundary values later and skip the iterations.
    let special = !(a.is_finite() & x.is_finite() & a.gt(0.0) & x.gt(0.0));
    // Series: sum_n x^n / (a+1)...(a+n), times fac / a. Elements already done stop updating.
    let one_ = a.k(1.0).v;
    let zero_i = e.with(|b| b.constant_i64(0, ElemType::I64));
    let done0 = !use_series | special;
    let s = e.with(|b| {
        b.while_loop(
            &[zero_i, av, one_, one_, done0.v],
            |b, v| {
                let nd = b.not(v[4]);
                loop_more(b, v[0], nd, 2000)
            },
            |b, v| {
                let e = Ex::new(b);
                let [r, c, ans, done] = e.all([v[1], v[2], v[3], v[4]]);
                let r1 = r + 1.0;
                let c1 = c * (e.of(xv) / r1);
                let ans1 = ans + c1;
                let conv = c1.le(eps * ans1);
                let st = e.with(|b| select_all(b, done.v, &[r.v, c.v, ans.v], &[r1.v, c1.v, ans1.v]));
                let done = done | conv;
                let i = e.with(|b| next_count(b, v[0]));
                vec![i, st[0], st[1], st[2], done.v]
            },
        )
    });
    let series = e.of(s[3]) * fac / a;
    // Continued fraction for the upper function (modified Lentz, as in Numerical Recipes).
    let bv = x + 1.0 - a;
    let c0 = 1.0 / a.k(tiny);
    let d0 = 1.0 / bv;
    let cf_done = use_series | special;
    let s2 = e.with(|b| {
        b.while_loop(
            &[zero_i, bv.v, c0.v, d0.v, d0.v, cf_done.v],
            |b, v| {
                let nd = b.not(v[5]);
                loop_more(b, v[0], nd, 2000)
            },
            |b, v| {
                let i1 = next_count(b, v[0]);
                let e = Ex::new(b);
                let [bq, c, d, h, done] = e.all([v[1], v[2], v[3], v[4], v[5]]);
                let a = e.of(av);
                let n = e.of(i1).cast(bq.elem()).splat(&bq.dims());
                // an = -n (n - a); b += 2
                let an = -(n * (n - a));
                let bq1 = bq + 2.0;
                let d1 = an * d + bq1;
                let d1 = d1.abs().lt(tiny).select(tiny, d1);
                let c1 = bq1 + an / c;
                let c1 = c1.abs().lt(tiny).select(tiny, c1);
                let d1 = 1.0 / d1;
                let del = d1 * c1;
                let h1 = h * del;
                let conv = (del - 1.0).abs().lt(eps);
                let st = e.with(|b| select_all(b, done.v, &[bq.v, c.v, d.v, h.v], &[bq1.v, c1.v, d1.v, h1.v]));
                let done = done | conv;
                vec![i1, st[0], st[1], st[2], st[3], done.v]
            },
        )
    });
    let cf = e.of(s2[4]) * fac;
    let r = if upper { use_series.select(1.0 - series, cf) } else { use_series.select(series, 1.0 - cf) };
    igamma_boundaries(a, x, r, upper).v
}

/// PyTorch's (SciPy's) special cases, in its order of precedence: NaN for negative arguments,
/// then a == 0, x == 0, infinite a, infinite x.
fn igamma_boundaries<'e>(a: E<'e>, x: E<'e>, r: E<'e>, upper: bool) -> E<'e> {
    let (at_a0, at_x0, at_a_inf, at_x_inf) = if upper { (0.0, 1.0, 1.0, 0.0) } else { (1.0, 0.0, 0.0, 1.0) };
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let x_inf = x.eq(inf);
    let r = x_inf.select(at_x_inf, r);
    let r = a.eq(inf).select(x_inf.select(nan, a.k(at_a_inf)), r);
    let r = x.eq(0.0).select(at_x0, r);
    let r = a.eq(0.0).select(x.gt(0.0).select(a.k(at_a0), nan), r);
    (x.lt(0.0) | a.lt(0.0)).select(nan, r)
}

// ---- mvlgamma ---------------------------------------------------------------------------------------

/// mvlgamma(self, p): sum over j < p of lgamma(x - j / 2), plus p (p - 1) / 4 log(pi), in
/// self's float dtype (the default float for integers), as PyTorch's composite computes it:
/// the lgamma terms rounded to the dtype, summed in ascending order of the offsets
/// ((1 - p) / 2, ..., 0).
fn mvlgamma(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let p = args.int("p")?;
    check!(x.dtype != DType::Bool, Runtime, "The input tensor may not be a boolean tensor.");
    check!(p >= 1, Runtime, "p has to be greater than or equal to 1");
    check!(!x.dtype.is_complex(), NotImplemented, "\"lgamma_vml_cpu\" not implemented for '{}'", x.dtype.torch_name());
    let dt = if x.dtype.is_float() { x.dtype } else { DType::F32 };
    let acc = dt.opmath();
    let dims = cx.dims(x.v);
    let xv = cx.cast(x.v, acc);
    let mut total: Option<Value> = None;
    for j in (0..p).rev() {
        // Offsets in the order PyTorch's arange makes them: -(p - 1) / 2 first.
        let off = -(j as f64) * 0.5;
        let o = cx.full(off, acc, &dims);
        let t = cx.add(xv, o);
        let t = cx.chlo("lgamma", &[t]);
        let t = crate::blocks::round16::round_to(cx, t, dt);
        total = Some(match total {
            None => t,
            Some(s) => cx.add(s, t),
        });
    }
    let total = total.unwrap();
    let c = (p * (p - 1)) as f64 * std::f64::consts::PI.ln() * 0.25;
    let cv = cx.full(c, acc, &dims);
    let total = crate::blocks::round16::round_to(cx, total, dt);
    let r = cx.add(total, cv);
    one(cx.cast(r, dt))
}
