//! The normal distribution functions: ndtri, log_ndtr, and erfcx (the scaled complementary
//! error function).
use crate::{op, Op};
use crate::cx::Cx;
use crate::dtype::DType;
use super::{cmp_k, float_unary_no16, is_nan, k, polevl};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

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
    let one_ = k(cx, 1.0, y0);
    // Upper tail: work with 1 - y and negate at the end.
    let upper = cmp_k(cx, CmpDir::Gt, y0, 1.0 - exp_m2);
    let omy = cx.sub(one_, y0);
    let y = cx.select(upper, omy, y0);
    // Central region |y - 0.5| <= 3/8.
    let central = cmp_k(cx, CmpDir::Gt, y, exp_m2);
    let half = k(cx, 0.5, y);
    let yc = cx.sub(y, half);
    let y2 = cx.mul(yc, yc);
    let p = polevl(cx, y2, &P0);
    let q = polevl(cx, y2, &Q0);
    let t = cx.mul(y2, p);
    let t = cx.div(t, q);
    let t = cx.mul(yc, t);
    let xc = cx.add(yc, t);
    let s2pi = k(cx, 2.50662827463100050242E0, y);
    let xc = cx.mul(xc, s2pi);
    // Tails.
    let l = cx.log(y);
    let m2 = k(cx, -2.0, y);
    let x = cx.mul(m2, l);
    let x = cx.sqrt(x);
    let lx = cx.log(x);
    let lxx = cx.div(lx, x);
    let x0 = cx.sub(x, lxx);
    let z = cx.div(one_, x);
    let p1 = polevl(cx, z, &P1);
    let q1 = polevl(cx, z, &Q1);
    let p2 = polevl(cx, z, &P2);
    let q2 = polevl(cx, z, &Q2);
    let near = cmp_k(cx, CmpDir::Lt, x, 8.0);
    let pn = cx.select(near, p1, p2);
    let qn = cx.select(near, q1, q2);
    let x1 = cx.mul(z, pn);
    let x1 = cx.div(x1, qn);
    let xt = cx.sub(x0, x1);
    let xt_neg = cx.neg(xt);
    let xt = cx.select(upper, xt, xt_neg);
    let r = cx.select(central, xc, xt);
    // Boundaries: -inf at 0, inf at 1, NaN outside [0, 1] (and for NaN).
    let at0 = cmp_k(cx, CmpDir::Eq, y0, 0.0);
    let at1 = cmp_k(cx, CmpDir::Eq, y0, 1.0);
    let ninf = k(cx, f64::NEG_INFINITY, y0);
    let inf = k(cx, f64::INFINITY, y0);
    let nan = k(cx, f64::NAN, y0);
    let ge0 = cmp_k(cx, CmpDir::Ge, y0, 0.0);
    let le1 = cmp_k(cx, CmpDir::Le, y0, 1.0);
    let inside = cx.and(ge0, le1);
    let r = cx.select(inside, r, nan);
    let r = cx.select(at1, inf, r);
    cx.select(at0, ninf, r)
}

/// The scaled complementary error function exp(x^2) erfc(x). For 0 <= x < 2 the product with
/// x^2 split so that exp sees it exactly; above, the continued fraction (the 5-term form of
/// PyTorch beyond 50); below zero 2 exp(x^2) - erfcx(-x).
fn erfcx_values(cx: &mut Cx, x: Value) -> Value {
    let dt = cx.dtype(x);
    let ax = cx.abs(x);
    // Split |x| = hi + lo with hi holding the top half of the mantissa bits.
    let (bits_elem, mask) = if dt == DType::F64 { (ElemType::U64, !0x3ff_ffffi64) } else { (ElemType::U32, !0xfffi64) };
    let bits = cx.bitcast_convert(ax, bits_elem);
    let ty = TensorType::new(bits_elem, &cx.dims(x));
    let m = cx.b.splat_i64(mask, &ty);
    let hb = cx.and(bits, m);
    let hi = cx.bitcast_convert(hb, dt.elem());
    let lo = cx.sub(ax, hi);
    let hh = cx.mul(hi, hi);
    let e1 = cx.exp(hh);
    let two = k(cx, 2.0, x);
    let t = cx.mul(two, hi);
    let t = cx.mul(t, lo);
    let ll = cx.mul(lo, lo);
    let t = cx.add(t, ll);
    let e2 = cx.exp(t);
    let ex2 = cx.mul(e1, e2);
    let erfc = cx.chlo("erfc", &[ax]);
    let small = cx.mul(ex2, erfc);
    // Continued fraction 1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))).
    let ispi = 0.56418958354775628694807945156;
    let mut t = ax;
    for i in (1..=20).rev() {
        let c = k(cx, i as f64 / 2.0, x);
        let q = cx.div(c, t);
        t = cx.add(ax, q);
    }
    let ispi_v = k(cx, ispi, x);
    let cf = cx.div(ispi_v, t);
    // Beyond 50: ispi (x^2 (x^2 + 4.5) + 2) / (x (x^2 (x^2 + 5) + 3.75)).
    let x2 = cx.mul(ax, ax);
    let c45 = k(cx, 4.5, x);
    let n = cx.add(x2, c45);
    let n = cx.mul(x2, n);
    let n = cx.add(n, two);
    let n = cx.mul(ispi_v, n);
    let c5 = k(cx, 5.0, x);
    let d = cx.add(x2, c5);
    let d = cx.mul(x2, d);
    let c375 = k(cx, 3.75, x);
    let d = cx.add(d, c375);
    let d = cx.mul(ax, d);
    let far = cx.div(n, d);
    let huge = cmp_k(cx, CmpDir::Gt, ax, 5e7);
    let one_term = cx.div(ispi_v, ax);
    let far = cx.select(huge, one_term, far);
    let is_small = cmp_k(cx, CmpDir::Lt, ax, 2.0);
    let is_far = cmp_k(cx, CmpDir::Gt, ax, 50.0);
    let pos = cx.select(is_small, small, cf);
    let pos = cx.select(is_far, far, pos);
    // x < 0: 2 exp(x^2) - erfcx(-x), computed like PyTorch (x*x rounded, then exp).
    let xx = cx.mul(x, x);
    let ex = cx.exp(xx);
    let ex = cx.mul(two, ex);
    let below = cmp_k(cx, CmpDir::Lt, x, -6.1);
    let negv = cx.sub(ex, pos);
    let negv = cx.select(below, ex, negv);
    let very = cmp_k(cx, CmpDir::Lt, x, -26.7);
    let inf = k(cx, f64::INFINITY, x);
    let negv = cx.select(very, inf, negv);
    let is_neg = cmp_k(cx, CmpDir::Lt, x, 0.0);
    let r = cx.select(is_neg, negv, pos);
    let nan = is_nan(cx, x);
    cx.select(nan, x, r)
}

/// log of the standard normal CDF: log(erfcx(-t) / 2) - t^2 below -1, else
/// log1p(-erfc(t) / 2), with t = x / sqrt(2).
fn log_ndtr_values(cx: &mut Cx, x: Value) -> Value {
    let s = k(cx, std::f64::consts::FRAC_1_SQRT_2, x);
    let t = cx.mul(x, s);
    let nt = cx.neg(t);
    let e = erfcx_values(cx, nt);
    let half = k(cx, 0.5, x);
    let e = cx.mul(e, half);
    let l = cx.log(e);
    let tt = cx.mul(t, t);
    let low = cx.sub(l, tt);
    let c = cx.chlo("erfc", &[t]);
    let c = cx.mul(c, half);
    let c = cx.neg(c);
    let high = cx.log1p(c);
    let below = cmp_k(cx, CmpDir::Lt, x, -1.0);
    cx.select(below, low, high)
}
