//! The normal distribution functions: ndtri, log_ndtr, and erfcx (the scaled complementary
//! error function).
use crate::{op, Op};
use crate::cx::Cx;
use crate::dtype::DType;
use super::{float_unary_no16, polevl};
use stablehlo::{ElemType, Ex, Value};

pub(crate) const OPS: &[Op] = &[
    op("special_ndtri", |cx, a| float_unary_no16(cx, a, "ndtri_cpu", ndtri_values)),
    op("special_log_ndtr", |cx, a| float_unary_no16(cx, a, "log_ndtr_cpu", log_ndtr_values)),
    op("special_erfcx", |cx, a| float_unary_no16(cx, a, "erfcx_cpu", erfcx_values)),
];

// ---- normal distribution functions ------------------------------------------------------------------

/// special_ndtri: the inverse of the standard normal CDF (Cephes ndtri).
fn ndtri_values(cx: &mut Cx, y0: Value) -> Value {
    const P0: [f64; 5] = [-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1, 1.39312609387279679503E1, -1.23916583867381258016E0];
    const Q0: [f64; 9] = [
        1.00000000000000000000E0, 1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1, -2.25462687854119370527E2,
        2.00260212380060660359E2, -8.20372256168333339912E1, 1.59056225126211695515E1, -1.18331621121330003142E0,
    ];
    const P1: [f64; 9] = [
        4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1, 4.40805073893200834700E1, 1.46849561928858024014E1,
        2.18663306850790267539E0, -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4,
    ];
    const Q1: [f64; 9] = [
        1.00000000000000000000E0, 1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1, 1.50425385692907503408E1,
        2.50464946208309415979E0, -1.42182922854787788574E-1, -3.80806407691578277194E-2, -9.33259480895457427372E-4,
    ];
    const P2: [f64; 9] = [
        3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0, 1.33303460815807542389E0, 2.01485389549179081538E-1,
        1.23716634817820021358E-2, 3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9,
    ];
    const Q2: [f64; 9] = [
        1.00000000000000000000E0, 6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0, 2.16236993594496635890E-1,
        1.34204006088543189037E-2, 3.28014464682127739104E-4, 2.89247864745380683936E-6, 6.79019408009981274425E-9,
    ];
    let exp_m2 = 0.13533528323661269189;
    let e = Ex::new(cx);
    let y0 = e.of(y0);
    // Upper tail: work with 1 - y and negate at the end.
    let upper = y0.gt(1.0 - exp_m2);
    let y = upper.select(1.0 - y0, y0);
    // Central region |y - 0.5| <= 3/8.
    let central = y.gt(exp_m2);
    let yc = y - 0.5;
    let y2 = yc * yc;
    let xc = (yc + yc * (y2 * polevl(y2, &P0) / polevl(y2, &Q0))) * 2.50662827463100050242E0;
    // Tails.
    let x = (-2.0 * y.ln()).sqrt();
    let x0 = x - x.ln() / x;
    let z = 1.0 / x;
    let (p1, q1, p2, q2) = (polevl(z, &P1), polevl(z, &Q1), polevl(z, &P2), polevl(z, &Q2));
    let near = x.lt(8.0);
    let xt = x0 - z * near.select(p1, p2) / near.select(q1, q2);
    let xt = upper.select(xt, -xt);
    let r = central.select(xc, xt);
    // Boundaries: -inf at 0, inf at 1, NaN outside [0, 1] (and for NaN).
    let r = (y0.ge(0.0) & y0.le(1.0)).select(r, f64::NAN);
    let r = y0.eq(1.0).select(f64::INFINITY, r);
    y0.eq(0.0).select(f64::NEG_INFINITY, r).v
}

/// The scaled complementary error function exp(x^2) erfc(x). For 0 <= x < 2 the product with
/// x^2 split so that exp sees it exactly; above, the continued fraction (the 5-term form of
/// PyTorch beyond 50); below zero 2 exp(x^2) - erfcx(-x).
fn erfcx_values(cx: &mut Cx, x: Value) -> Value {
    let dt = cx.dtype(x);
    let e = Ex::new(cx);
    let x = e.of(x);
    let ax = x.abs();
    // Split |x| = hi + lo with hi holding the top half of the mantissa bits.
    let (bits_elem, mask) = if dt == DType::F64 { (ElemType::U64, !0x3ff_ffffi64) } else { (ElemType::U32, !0xfffi64) };
    let bits = e.of(e.with(|b| b.bitcast_convert(ax.v, bits_elem)));
    let hb = (bits & mask).v;
    let hi = e.of(e.with(|b| b.bitcast_convert(hb, dt.elem())));
    let lo = ax - hi;
    let ex2 = (hi * hi).exp() * (2.0 * hi * lo + lo * lo).exp();
    let small = ex2 * ax.chlo("erfc");
    // Continued fraction 1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))).
    let ispi = 0.56418958354775628694807945156;
    let mut t = ax;
    for i in (1..=20).rev() {
        t = ax + (i as f64 / 2.0) / t;
    }
    let cf = ispi / t;
    // Beyond 50: ispi (x^2 (x^2 + 4.5) + 2) / (x (x^2 (x^2 + 5) + 3.75)).
    let x2 = ax * ax;
    let far = ispi * (x2 * (x2 + 4.5) + 2.0) / (ax * (x2 * (x2 + 5.0) + 3.75));
    let far = ax.gt(5e7).select(ispi / ax, far);
    let pos = ax.lt(2.0).select(small, cf);
    let pos = ax.gt(50.0).select(far, pos);
    // x < 0: 2 exp(x^2) - erfcx(-x), computed like PyTorch (x*x rounded, then exp).
    let ex = 2.0 * (x * x).exp();
    let negv = x.lt(-6.1).select(ex, ex - pos);
    let negv = x.lt(-26.7).select(f64::INFINITY, negv);
    let r = x.lt(0.0).select(negv, pos);
    x.ne(x).select(x, r).v
}

/// log of the standard normal CDF: log(erfcx(-t) / 2) - t^2 below -1, else
/// log1p(-erfc(t) / 2), with t = x / sqrt(2).
fn log_ndtr_values(cx: &mut Cx, x: Value) -> Value {
    let t = (Ex::new(cx).of(x) * std::f64::consts::FRAC_1_SQRT_2).v;
    let nt = (-Ex::new(cx).of(t)).v;
    let ec = erfcx_values(cx, nt);
    let e = Ex::new(cx);
    let [x, t, ec] = e.all([x, t, ec]);
    let low = (ec * 0.5).ln() - t * t;
    let high = (-(t.chlo("erfc") * 0.5)).ln_1p();
    x.lt(-1.0).select(low, high).v
}
