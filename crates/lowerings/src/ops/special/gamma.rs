//! The gamma family: polygamma (digamma, trigamma), special_zeta (Hurwitz zeta), the
//! regularized incomplete gamma functions igamma/igammac, and mvlgamma.
use crate::args::Args;
use crate::blocks::loops::{loop_more, next_count, select_all};
use crate::blocks::reduce::acc_type;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{bits_of, bk, cmp_k, count_like, float_result, float_unary, k, no_complex, operands, pair};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};

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
            let n1 = k(cx, (n + 1) as f64, x);
            let z = zeta_values(cx, n1, x);
            let lg = cx.chlo("lgamma", &[n1]);
            let f = cx.exp(lg);
            let f = if n % 2 == 1 { f } else { cx.neg(f) };
            cx.mul(f, z)
        }
    })
}

/// digamma as PyTorch defines it at zero: copysign(inf, -x) (chlo.digamma gives NaN there).
fn digamma(cx: &mut Cx, x: Value) -> Value {
    let d = cx.chlo("digamma", &[x]);
    let inf = k(cx, f64::INFINITY, x);
    let ninf = k(cx, f64::NEG_INFINITY, x);
    let (ue, sign) = bits_of(cx.elem(x));
    let bits = cx.bitcast_convert(x, ue);
    let ty = TensorType::new(ue, &cx.dims(x));
    let sm = cx.b.splat_i64(sign, &ty);
    let sb = cx.and(bits, sm);
    let z = cx.b.splat_i64(0, &ty);
    let negative = cx.compare(CmpDir::Ne, sb, z);
    let at0 = cx.select(negative, inf, ninf);
    let is0 = cmp_k(cx, CmpDir::Eq, x, 0.0);
    cx.select(is0, at0, d)
}

/// PyTorch's trigamma: reflection below 1/2, six recurrence steps, then the asymptotic series.
fn trigamma(cx: &mut Cx, x: Value) -> Value {
    let pi = std::f64::consts::PI;
    let reflect = cmp_k(cx, CmpDir::Lt, x, 0.5);
    let one_ = k(cx, 1.0, x);
    let pix = k(cx, pi, x);
    let s = cx.mul(pix, x);
    let s = cx.sin(s);
    let s2 = cx.mul(s, s);
    let pi2 = k(cx, pi * pi, x);
    let refl = cx.div(pi2, s2);
    let refl = cx.neg(refl);
    let zero = k(cx, 0.0, x);
    let mut result = cx.select(reflect, refl, zero);
    let omx = cx.sub(one_, x);
    let mut x = cx.select(reflect, omx, x);
    for _ in 0..6 {
        let xx = cx.mul(x, x);
        let t = cx.div(one_, xx);
        result = cx.add(result, t);
        x = cx.add(x, one_);
    }
    let xx = cx.mul(x, x);
    let ixx = cx.div(one_, xx);
    // (1 + 1/(2x) + ixx (1/6 - ixx (1/30 - ixx / 42))) / x
    let c42 = k(cx, 1.0 / 42.0, x);
    let t = cx.mul(ixx, c42);
    let c30 = k(cx, 1.0 / 30.0, x);
    let t = cx.sub(c30, t);
    let t = cx.mul(ixx, t);
    let c6 = k(cx, 1.0 / 6.0, x);
    let t = cx.sub(c6, t);
    let t = cx.mul(ixx, t);
    let two = k(cx, 2.0, x);
    let x2 = cx.mul(two, x);
    let h = cx.div(one_, x2);
    let s = cx.add(one_, h);
    let s = cx.add(s, t);
    let s = cx.div(s, x);
    result = cx.add(result, s);
    let neg = cx.neg(result);
    cx.select(reflect, neg, result)
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
fn pow_signed(b: &mut Builder, a: Value, e: Value) -> Value {
    let aa = b.abs(a);
    let p = b.pow(aa, e);
    let z = bk(b, 0.0, a);
    let neg = b.compare(CmpDir::Lt, a, z);
    // e odd: e - 2 floor(e / 2) == +-1.
    let half = bk(b, 0.5, a);
    let h = b.mul(e, half);
    let f = b.floor(h);
    let two = bk(b, 2.0, a);
    let f2 = b.mul(f, two);
    let r = b.sub(e, f2);
    let o = bk(b, 1.0, a);
    let odd = b.compare(CmpDir::Eq, r, o);
    let flip = b.and(neg, odd);
    let np = b.neg(p);
    b.select(flip, np, p)
}

/// The Hurwitz zeta function zeta(x, q) = sum_k (q + k)^-x as PyTorch computes it (Cephes):
/// direct summation until the terms are negligible or q + k > 9 (at least 9 terms), then
/// Euler-Maclaurin with twelve Bernoulli terms.
fn zeta_values(cx: &mut Cx, x: Value, q: Value) -> Value {
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
    let machep = if cx.dtype(x) == DType::F64 { 1.11022302462515654042E-16 } else { 5.9604644775390625E-8 };
    let nx = cx.neg(x);
    let s0 = pow_signed(&mut cx.b, q, nx);
    let zero = k(cx, 0.0, x);
    let zero_i = cx.constant_i64(0, ElemType::I64);
    let f = cx.compare(CmpDir::Ne, zero, zero);
    let t = cx.not(f);
    // State: (i, a, b, s, active, returned).
    let r = cx.while_loop(
        &[zero_i, q, zero, s0, t, f],
        |b, v| loop_more(b, v[0], v[4], 100_000),
        |b, v| {
            let (i, a, bb, s, active, returned) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            let o = bk(b, 1.0, a);
            let a1 = b.add(a, o);
            let nx = b.neg(x);
            let b1 = pow_signed(b, a1, nx);
            let s1 = b.add(s, b1);
            let m = bk(b, machep, a);
            let ms = b.mul(m, s1);
            let nms = b.neg(ms);
            let lo = b.compare(CmpDir::Lt, nms, b1);
            let hi = b.compare(CmpDir::Lt, b1, ms);
            let conv = b.and(lo, hi);
            let st = select_all(b, active, &[a1, b1, s1], &[a, bb, s]);
            let (a, bb, s) = (st[0], st[1], st[2]);
            let now = b.and(active, conv);
            let returned = b.or(returned, now);
            let i1 = next_count(b, i);
            // Keep going while (i < 9 || a <= 9) and not converged.
            let nine_i = b.constant_i64(9, ElemType::I64);
            let early = b.compare(CmpDir::Lt, i1, nine_i);
            let early = b.broadcast_in_dim(early, &b.dims(a).to_vec(), &[]);
            let nine = bk(b, 9.0, a);
            let small = b.compare(CmpDir::Le, a, nine);
            let cont = b.or(early, small);
            let nc = b.not(conv);
            let cont = b.and(cont, nc);
            let active = b.and(active, cont);
            vec![i1, a, bb, s, active, returned]
        },
    );
    let (a, mut bv, mut s, mut returned) = (r[1], r[2], r[3], r[5]);
    // Euler-Maclaurin tail.
    let w = a;
    let one_ = k(cx, 1.0, x);
    let xm1 = cx.sub(x, one_);
    let t = cx.mul(bv, w);
    let t = cx.div(t, xm1);
    let s1 = cx.add(s, t);
    let half = k(cx, 0.5, x);
    let hb = cx.mul(half, bv);
    let s1 = cx.sub(s1, hb);
    s = cx.select(returned, s, s1);
    let mut av = one_;
    let mut kv = 0.0;
    for &ai in &A {
        let xk = k(cx, kv, x);
        let xk = cx.add(x, xk);
        av = cx.mul(av, xk);
        bv = cx.div(bv, w);
        let t = cx.mul(av, bv);
        let ac = k(cx, ai, x);
        let t = cx.div(t, ac);
        let s1 = cx.add(s, t);
        let ratio = cx.div(t, s1);
        let ratio = cx.abs(ratio);
        let conv = cmp_k(cx, CmpDir::Lt, ratio, machep);
        s = cx.select(returned, s, s1);
        returned = cx.or(returned, conv);
        kv += 1.0;
        let xk = k(cx, kv, x);
        let xk = cx.add(x, xk);
        av = cx.mul(av, xk);
        bv = cx.div(bv, w);
        kv += 1.0;
    }
    // Special values, checked first in PyTorch: x == 1 -> inf, x < 1 -> NaN, q <= 0 at an
    // integer -> inf, q <= 0 with a non-integer x -> NaN.
    let inf = k(cx, f64::INFINITY, x);
    let nan = k(cx, f64::NAN, x);
    let qf = cx.floor(q);
    let q_int = cx.compare(CmpDir::Eq, q, qf);
    let xf = cx.floor(x);
    let x_frac = cx.compare(CmpDir::Ne, x, xf);
    let q_le0 = cmp_k(cx, CmpDir::Le, q, 0.0);
    let r = cx.select(x_frac, nan, s);
    let r = cx.select(q_int, inf, r);
    let r = cx.select(q_le0, r, s);
    let x_lt1 = cmp_k(cx, CmpDir::Lt, x, 1.0);
    let r = cx.select(x_lt1, nan, r);
    let x_eq1 = cmp_k(cx, CmpDir::Eq, x, 1.0);
    cx.select(x_eq1, inf, r)
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
    let (a, xv) = pair(cx, x, y, acc_type(dt))?;
    let r = igamma_values(cx, a, xv, upper);
    one(cx.cast(r, dt))
}

fn igamma_values(cx: &mut Cx, a: Value, x: Value, upper: bool) -> Value {
    let eps = if cx.dtype(a) == DType::F64 { 1.11022302462515654042E-16 } else { 5.9604644775390625E-8 };
    // Prefactor x^a e^-x / Gamma(a).
    let lx = cx.log(x);
    let t = cx.mul(a, lx);
    let t = cx.sub(t, x);
    let lg = cx.chlo("lgamma", &[a]);
    let t = cx.sub(t, lg);
    let fac = cx.exp(t);
    let one_ = k(cx, 1.0, a);
    let use_series = {
        let ap1 = cx.add(a, one_);
        cx.compare(CmpDir::Lt, x, ap1)
    };
    // Elements outside the regular domain (NaN, infinities, zeros, negatives) take their
    // boundary values later and skip the iterations.
    let fa = cx.is_finite(a);
    let fx = cx.is_finite(x);
    let apos = cmp_k(cx, CmpDir::Gt, a, 0.0);
    let xpos = cmp_k(cx, CmpDir::Gt, x, 0.0);
    let regular = cx.and(fa, fx);
    let regular = cx.and(regular, apos);
    let regular = cx.and(regular, xpos);
    let special = cx.not(regular);
    // Series: sum_n x^n / (a+1)...(a+n), times fac / a. Elements already done stop updating.
    let zero_i = cx.constant_i64(0, ElemType::I64);
    let not_series = cx.not(use_series);
    let done0 = cx.or(not_series, special);
    let s = cx.while_loop(
        &[zero_i, a, one_, one_, done0],
        |b, v| {
            let nd = b.not(v[4]);
            loop_more(b, v[0], nd, 2000)
        },
        |b, v| {
            let (i, r, c, ans, done) = (v[0], v[1], v[2], v[3], v[4]);
            let o = bk(b, 1.0, r);
            let r1 = b.add(r, o);
            let xr = b.div(x, r1);
            let c1 = b.mul(c, xr);
            let ans1 = b.add(ans, c1);
            let e = bk(b, eps, r);
            let lim = b.mul(e, ans1);
            let conv = b.compare(CmpDir::Le, c1, lim);
            let st = select_all(b, done, &[r, c, ans], &[r1, c1, ans1]);
            let done = b.or(done, conv);
            let i = next_count(b, i);
            vec![i, st[0], st[1], st[2], done]
        },
    );
    let series = cx.mul(s[3], fac);
    let series = cx.div(series, a);
    // Continued fraction for the upper function (modified Lentz, as in Numerical Recipes).
    let tiny = if cx.dtype(a) == DType::F64 { 1e-300 } else { 1e-30 };
    let bv = {
        let t = cx.add(x, one_);
        cx.sub(t, a)
    };
    let tiny_v = k(cx, tiny, a);
    let c0 = cx.div(one_, tiny_v);
    let d0 = cx.div(one_, bv);
    let h0 = d0;
    let cf_done = cx.or(use_series, special);
    let s2 = cx.while_loop(
        &[zero_i, bv, c0, d0, h0, cf_done],
        |b, v| {
            let nd = b.not(v[5]);
            loop_more(b, v[0], nd, 2000)
        },
        |b, v| {
            let (i, bq, c, d, h, done) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            let i1 = next_count(b, i);
            let n = count_like(b, i1, bq);
            // an = -n (n - a); b += 2
            let nma = b.sub(n, a);
            let an = b.mul(n, nma);
            let an = b.neg(an);
            let two = bk(b, 2.0, bq);
            let bq1 = b.add(bq, two);
            let t = b.mul(an, d);
            let d1 = b.add(t, bq1);
            let tn = bk(b, tiny, bq);
            let ad = b.abs(d1);
            let small = b.compare(CmpDir::Lt, ad, tn);
            let d1 = b.select(small, tn, d1);
            let t = b.div(an, c);
            let c1 = b.add(bq1, t);
            let ac = b.abs(c1);
            let small = b.compare(CmpDir::Lt, ac, tn);
            let c1 = b.select(small, tn, c1);
            let o = bk(b, 1.0, bq);
            let d1 = b.div(o, d1);
            let del = b.mul(d1, c1);
            let h1 = b.mul(h, del);
            let dm1 = b.sub(del, o);
            let adm = b.abs(dm1);
            let e = bk(b, eps, bq);
            let conv = b.compare(CmpDir::Lt, adm, e);
            let st = select_all(b, done, &[bq, c, d, h], &[bq1, c1, d1, h1]);
            let done = b.or(done, conv);
            vec![i1, st[0], st[1], st[2], st[3], done]
        },
    );
    let cf = cx.mul(s2[4], fac);
    let lower = {
        let oc = cx.sub(one_, cf);
        cx.select(use_series, series, oc)
    };
    let upper_v = {
        let os = cx.sub(one_, series);
        cx.select(use_series, os, cf)
    };
    let r = if upper { upper_v } else { lower };
    igamma_boundaries(cx, a, x, r, upper)
}

/// PyTorch's (SciPy's) special cases, in its order of precedence: NaN for negative arguments,
/// then a == 0, x == 0, infinite a, infinite x.
fn igamma_boundaries(cx: &mut Cx, a: Value, x: Value, r: Value, upper: bool) -> Value {
    let (at_a0, at_x0, at_a_inf, at_x_inf) = if upper { (0.0, 1.0, 1.0, 0.0) } else { (1.0, 0.0, 0.0, 1.0) };
    let nan = k(cx, f64::NAN, a);
    let inf = k(cx, f64::INFINITY, a);
    let x_inf = cx.compare(CmpDir::Eq, x, inf);
    let v = k(cx, at_x_inf, a);
    let r = cx.select(x_inf, v, r);
    let a_inf = cx.compare(CmpDir::Eq, a, inf);
    let v = k(cx, at_a_inf, a);
    let v = cx.select(x_inf, nan, v);
    let r = cx.select(a_inf, v, r);
    let x0 = cmp_k(cx, CmpDir::Eq, x, 0.0);
    let v = k(cx, at_x0, a);
    let r = cx.select(x0, v, r);
    let a0 = cmp_k(cx, CmpDir::Eq, a, 0.0);
    let xpos = cmp_k(cx, CmpDir::Gt, x, 0.0);
    let v = k(cx, at_a0, a);
    let v = cx.select(xpos, v, nan);
    let r = cx.select(a0, v, r);
    let xneg = cmp_k(cx, CmpDir::Lt, x, 0.0);
    let aneg = cmp_k(cx, CmpDir::Lt, a, 0.0);
    let bad = cx.or(xneg, aneg);
    cx.select(bad, nan, r)
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
    let acc = acc_type(dt);
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
