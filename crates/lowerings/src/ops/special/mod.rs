//! Special and remaining elementwise math: polygamma, logit, xlogy/xlog1py, entr, ndtri,
//! log_ndtr, erfcx, the modified Bessel functions i0/i0e/i1/i1e, sinc, logaddexp(2), hypot,
//! copysign, nextafter, fmax/fmin, heaviside, frexp, gcd/lcm, bit shifts, nan_to_num,
//! signbit, angle, igamma/igammac and zeta; the orthogonal polynomials (Chebyshev, shifted
//! Chebyshev, Legendre, Laguerre, Hermite), the Bessel functions J0/J1/Y0/Y1/K0/K1 (and scaled
//! K), the spherical j0 and Airy Ai.
//!
//! 16-bit floats are computed in float32 and rounded once, as PyTorch's CPU kernels upcast
//! them; the Cephes-derived algorithms follow PyTorch's ATen/native/Math.h.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::loops::{any_true, loop_more, next_count, select_all};
use crate::blocks::reduce::acc_type;
use crate::cx::Cx;
use crate::dtype::{result_type, DType, Rank};
use crate::error::Result;
use crate::{bail, check, one, Out, Registry};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("polygamma", polygamma);
    r.add("special_polygamma", polygamma);
    r.add("logit", logit);
    // mvlgamma.out and mvlgamma_ (special_multigammaln.out calls mvlgamma.out); the functional
    // form is PyTorch's composite of the same steps.
    r.add("mvlgamma", mvlgamma);
    r.add("kaiser_window", kaiser_window);
    r.add("special_logit", logit);
    r.add("logit_backward", logit_backward);
    r.add("xlogy", |cx, a| xlog(cx, a, false));
    r.add("special_xlogy", |cx, a| xlog(cx, a, false));
    r.add("special_xlog1py", |cx, a| xlog(cx, a, true));
    r.add("special_entr", entr);
    r.add("special_ndtri", |cx, a| float_unary_no16(cx, a, "ndtri_cpu", ndtri_values));
    r.add("special_log_ndtr", |cx, a| float_unary_no16(cx, a, "log_ndtr_cpu", log_ndtr_values));
    r.add("special_erfcx", |cx, a| float_unary_no16(cx, a, "erfcx_cpu", erfcx_values));
    r.add("i0", |cx, a| float_unary(cx, a, |cx, x| bessel_i0(cx, x, false)));
    r.add("special_i0", |cx, a| float_unary(cx, a, |cx, x| bessel_i0(cx, x, false)));
    r.add("special_i0e", |cx, a| float_unary(cx, a, |cx, x| bessel_i0(cx, x, true)));
    r.add("special_i1", |cx, a| float_unary(cx, a, |cx, x| bessel_i1(cx, x, false)));
    r.add("special_i1e", |cx, a| float_unary(cx, a, |cx, x| bessel_i1(cx, x, true)));
    r.add("special_modified_bessel_i0", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_i0_cpu", |cx, x| bessel_i0(cx, x, false))
    });
    r.add("special_modified_bessel_i1", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_i1_cpu", |cx, x| bessel_i1(cx, x, false))
    });
    r.add("sinc", |cx, a| float_unary(cx, a, sinc_values));
    r.add("logaddexp", |cx, a| logaddexp(cx, a, false));
    r.add("logaddexp2", |cx, a| logaddexp(cx, a, true));
    r.add("hypot", hypot);
    r.add("copysign", copysign);
    r.add("nextafter", nextafter);
    r.add("fmax", |cx, a| fmax_fmin(cx, a, true));
    r.add("fmin", |cx, a| fmax_fmin(cx, a, false));
    r.add("heaviside", heaviside);
    r.add("frexp", frexp);
    r.add("gcd", |cx, a| gcd_lcm(cx, a, false));
    r.add("lcm", |cx, a| gcd_lcm(cx, a, true));
    r.add("__lshift__", |cx, a| shift(cx, a, true));
    r.add("__rshift__", |cx, a| shift(cx, a, false));
    // `x <<= n` and `x >>= n` (in-place, written into self by the engine).
    r.add("__ilshift__", |cx, a| shift(cx, a, true));
    r.add("__irshift__", |cx, a| shift(cx, a, false));
    r.add("bitwise_left_shift", |cx, a| shift(cx, a, true));
    r.add("bitwise_right_shift", |cx, a| shift(cx, a, false));
    r.add("nan_to_num", nan_to_num);
    r.add("signbit", signbit);
    r.add("angle", angle);
    r.add("igamma", |cx, a| igamma(cx, a, false));
    r.add("igammac", |cx, a| igamma(cx, a, true));
    r.add("special_zeta", zeta);
    r.add("special_chebyshev_polynomial_t", |cx, a| polynomial(cx, a, Poly::Chebyshev('T', false), "chebyshev_polynomial_t_cpu"));
    r.add("special_chebyshev_polynomial_u", |cx, a| polynomial(cx, a, Poly::Chebyshev('U', false), "chebyshev_polynomial_u_cpu"));
    r.add("special_chebyshev_polynomial_v", |cx, a| polynomial(cx, a, Poly::Chebyshev('V', false), "chebyshev_polynomial_v_cpu"));
    r.add("special_chebyshev_polynomial_w", |cx, a| polynomial(cx, a, Poly::Chebyshev('W', false), "chebyshev_polynomial_w_cpu"));
    r.add("special_shifted_chebyshev_polynomial_t", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('T', true), "shifted_chebyshev_polynomial_t_cpu")
    });
    r.add("special_shifted_chebyshev_polynomial_u", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('U', true), "shifted_chebyshev_polynomial_u_cpu")
    });
    r.add("special_shifted_chebyshev_polynomial_v", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('V', true), "shifted_chebyshev_polynomial_v_cpu")
    });
    r.add("special_shifted_chebyshev_polynomial_w", |cx, a| {
        polynomial(cx, a, Poly::Chebyshev('W', true), "shifted_chebyshev_polynomial_w_cpu")
    });
    r.add("special_legendre_polynomial_p", |cx, a| polynomial(cx, a, Poly::Legendre, "legendre_polynomial_p_cpu"));
    r.add("special_laguerre_polynomial_l", |cx, a| polynomial(cx, a, Poly::Laguerre, "laguerre_polynomial_l_cpu"));
    r.add("special_hermite_polynomial_h", |cx, a| polynomial(cx, a, Poly::HermiteH, "hermite_polynomial_h_cpu"));
    r.add("special_hermite_polynomial_he", |cx, a| polynomial(cx, a, Poly::HermiteHe, "hermite_polynomial_he_cpu"));
    r.add("special_bessel_j0", |cx, a| float_unary_no16(cx, a, "bessel_j0_cpu", bessel_j0_values));
    r.add("special_bessel_j1", |cx, a| float_unary_no16(cx, a, "bessel_j1_cpu", bessel_j1_values));
    r.add("special_bessel_y0", |cx, a| float_unary_no16(cx, a, "bessel_y0_cpu", bessel_y0_values));
    r.add("special_bessel_y1", |cx, a| float_unary_no16(cx, a, "bessel_y1_cpu", bessel_y1_values));
    r.add("special_modified_bessel_k0", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_k0_cpu", |cx, x| bessel_k_values(cx, x, false, false))
    });
    r.add("special_modified_bessel_k1", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_k1_cpu", |cx, x| bessel_k_values(cx, x, true, false))
    });
    r.add("special_scaled_modified_bessel_k0", |cx, a| {
        float_unary_no16(cx, a, "scaled_modified_bessel_k0_cpu", |cx, x| bessel_k_values(cx, x, false, true))
    });
    r.add("special_scaled_modified_bessel_k1", |cx, a| {
        float_unary_no16(cx, a, "scaled_modified_bessel_k1_cpu", |cx, x| bessel_k_values(cx, x, true, true))
    });
    r.add("special_spherical_bessel_j0", |cx, a| float_unary_no16(cx, a, "spherical_bessel_j0_cpu", spherical_j0_values));
    r.add("special_airy_ai", |cx, a| float_unary_no16(cx, a, "airy_ai_cpu", airy_ai_values));
}

// ---- operands and shared helpers ---------------------------------------------------------------

/// A tensor or a Python number in a promoting binary op.
#[derive(Copy, Clone)]
enum Num {
    T(Tensor),
    S(Scalar),
}

impl Num {
    fn get(args: &Args, name: &str) -> Result<Num> {
        match args.get(name) {
            Some(Arg::Tensor(t)) => Ok(Num::T(*t)),
            _ => Ok(Num::S(args.scalar(name)?)),
        }
    }
    fn promo(&self) -> (DType, Rank) {
        match self {
            Num::T(t) => (t.dtype, t.rank),
            Num::S(s) => (s.dtype(), Rank::Wrapped),
        }
    }
    fn value(&self, cx: &mut Cx, dtype: DType) -> Value {
        match self {
            Num::T(t) => cx.cast(t.v, dtype),
            Num::S(s) => cx.scalar(*s, dtype),
        }
    }
}

/// Both operands, and their promoted dtype.
fn operands(args: &Args, a: &str, b: &str) -> Result<(Num, Num, DType)> {
    let x = Num::get(args, a)?;
    let y = Num::get(args, b)?;
    let dt = result_type(&[x.promo(), y.promo()]).unwrap();
    Ok((x, y, dt))
}

/// Both operands converted to `dtype` and broadcast together.
fn pair(cx: &mut Cx, a: Num, b: Num, dtype: DType) -> Result<(Value, Value)> {
    let av = a.value(cx, dtype);
    let bv = b.value(cx, dtype);
    let vs = cx.broadcast_all(&[av, bv])?;
    Ok((vs[0], vs[1]))
}

/// The dtype of ops that always produce floats: integers and bools give the default float.
fn float_result(d: DType) -> DType {
    if d.is_float() || d.is_complex() {
        d
    } else {
        DType::F32
    }
}

fn no_complex(d: DType, op: &str) -> Result<()> {
    check!(!d.is_complex(), NotImplemented, "{}: complex tensors are not supported on tpu yet", op);
    Ok(())
}

/// The operand of a unary op: `self`, or `x` in the schemas that name it so
/// (special_airy_ai, special_scaled_modified_bessel_k0, ...).
fn unary_operand(args: &Args) -> Result<Tensor> {
    match args.get("x") {
        Some(Arg::Tensor(t)) if args.get("self").is_none() => Ok(*t),
        _ => args.tensor("self"),
    }
}

/// A unary float op: integer inputs give float32; 16-bit floats compute in float32.
fn float_unary(cx: &mut Cx, args: &Args, f: impl FnOnce(&mut Cx, Value) -> Value) -> Result<Vec<Out>> {
    let x = unary_operand(args)?;
    no_complex(x.dtype, args.op)?;
    let dt = float_result(x.dtype);
    let v = cx.cast(x.v, acc_type(dt));
    let r = f(cx, v);
    one(cx.cast(r, dt))
}

/// A unary float op that PyTorch's CPU kernels do not provide for 16-bit floats.
fn float_unary_no16(cx: &mut Cx, args: &Args, kernel: &str, f: impl FnOnce(&mut Cx, Value) -> Value) -> Result<Vec<Out>> {
    let x = unary_operand(args)?;
    check!(
        !matches!(x.dtype, DType::BF16 | DType::F16),
        NotImplemented,
        "\"{}\" not implemented for '{}'",
        kernel,
        x.dtype.torch_name()
    );
    float_unary(cx, args, f)
}

/// A binary op of floats with PyTorch's float promotion (integers give float32), computed in
/// float32 for 16-bit floats.
fn float_binary(cx: &mut Cx, args: &Args, a: &str, b: &str, f: impl FnOnce(&mut Cx, Value, Value) -> Value) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, a, b)?;
    no_complex(dt, args.op)?;
    let dt = float_result(dt);
    let (u, v) = pair(cx, x, y, acc_type(dt))?;
    let r = f(cx, u, v);
    one(cx.cast(r, dt))
}

/// A binary op defined for floating dtypes only (no integer promotion to float).
fn floats_only_binary(cx: &mut Cx, args: &Args, kernel: &str, f: impl FnOnce(&mut Cx, Value, Value) -> Value) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    no_complex(dt, args.op)?;
    check!(dt.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    let (u, v) = pair(cx, x, y, acc_type(dt))?;
    let r = f(cx, u, v);
    one(cx.cast(r, dt))
}

/// The constant `x` with the dtype and dims of `like`.
fn k(cx: &mut Cx, x: f64, like: Value) -> Value {
    let (dt, dims) = (cx.dtype(like), cx.dims(like));
    cx.full(x, dt, &dims)
}

fn is_nan(cx: &mut Cx, v: Value) -> Value {
    cx.compare(CmpDir::Ne, v, v)
}

/// `a op b` against the constant `c`.
fn cmp_k(cx: &mut Cx, dir: CmpDir, a: Value, c: f64) -> Value {
    let cv = k(cx, c, a);
    cx.compare(dir, a, cv)
}

/// Horner evaluation of coeffs[0] x^n + ... + coeffs[n] (Cephes polevl).
fn polevl(cx: &mut Cx, x: Value, coeffs: &[f64]) -> Value {
    let mut r = k(cx, coeffs[0], x);
    for &c in &coeffs[1..] {
        r = cx.mul(r, x);
        let cv = k(cx, c, x);
        r = cx.add(r, cv);
    }
    r
}

/// Clenshaw evaluation of a Chebyshev series (Cephes chbevl).
fn chbevl(cx: &mut Cx, x: Value, coeffs: &[f64]) -> Value {
    let mut b0 = k(cx, coeffs[0], x);
    let mut b1 = k(cx, 0.0, x);
    let mut b2 = b1;
    for &c in &coeffs[1..] {
        b2 = b1;
        b1 = b0;
        let t = cx.mul(x, b1);
        let t = cx.sub(t, b2);
        let cv = k(cx, c, x);
        b0 = cx.add(t, cv);
    }
    let d = cx.sub(b0, b2);
    let half = k(cx, 0.5, x);
    cx.mul(half, d)
}

/// A constant of `x` shaped like `like` inside a region.
fn bk(b: &mut Builder, x: f64, like: Value) -> Value {
    let ty = b.ty(like).clone();
    b.splat_f64(x, &ty)
}

/// The 0-d int64 `i` as a float shaped like `like` (a series' term number).
fn count_like(b: &mut Builder, i: Value, like: Value) -> Value {
    let f = b.convert(i, b.elem(like));
    b.broadcast_in_dim(f, &b.dims(like).to_vec(), &[])
}

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

// ---- logit, xlogy, entr ------------------------------------------------------------------------------

/// The `eps` of logit: a runtime value; None behaves like a negative eps (no clamping).
fn logit_eps(cx: &mut Cx, args: &Args, dt: DType, dims: &[i64]) -> Result<Value> {
    let s = match args.get("eps") {
        None | Some(Arg::None) => Scalar::Int(-1),
        _ => args.scalar("eps")?,
    };
    Ok(cx.scalar_like(s, dt, dims))
}

/// logit(self, eps): log(z / (1 - z)) with z = clamp(x, eps, 1 - eps) when eps >= 0.
fn logit(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(x.dtype, "logit")?;
    let dt = float_result(x.dtype);
    // PyTorch's vectorized kernel rounds each step in 16-bit floats: compute in `dt`.
    let v = cx.cast(x.v, dt);
    let dims = cx.dims(v);
    let eps = logit_eps(cx, args, dt, &dims)?;
    let one_ = k(cx, 1.0, v);
    let hi = cx.sub(one_, eps);
    let c = cx.max(v, eps);
    let c = cx.min(c, hi);
    // NaN stays NaN through the clamp, as std::min/max in PyTorch's kernel.
    let nan = is_nan(cx, v);
    let c = cx.select(nan, v, c);
    let zero = k(cx, 0.0, v);
    let no_clamp = cx.compare(CmpDir::Lt, eps, zero);
    let z = cx.select(no_clamp, v, c);
    let d = cx.sub(one_, z);
    let q = cx.div(z, d);
    let r = cx.log(q);
    one(cx.cast(r, dt))
}

/// logit_backward(grad_output, self, eps): grad / (x (1 - x)); outside [eps, 1 - eps] zero
/// (eps >= 0) or NaN outside [0, 1] (no eps), and grad * inf at 0 and 1 without eps.
fn logit_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let dt = result_type(&[(g.dtype, g.rank), (x.dtype, x.rank)]).unwrap();
    check!(dt.is_float(), NotImplemented, "\"logit_backward_cpu\" not implemented for '{}'", dt.torch_name());
    let acc = acc_type(dt);
    let gv = cx.cast(g.v, acc);
    let xv = cx.cast(x.v, acc);
    let vs = cx.broadcast_all(&[gv, xv])?;
    let (gv, xv) = (vs[0], vs[1]);
    let dims = cx.dims(xv);
    let eps = logit_eps(cx, args, acc, &dims)?;
    let one_ = k(cx, 1.0, xv);
    let zero = k(cx, 0.0, xv);
    let omx = cx.sub(one_, xv);
    let den = cx.mul(xv, omx);
    let plain = cx.div(gv, den);
    // With eps: zero outside [eps, 1 - eps].
    let hi = cx.sub(one_, eps);
    let below = cx.compare(CmpDir::Lt, xv, eps);
    let above = cx.compare(CmpDir::Gt, xv, hi);
    let outside = cx.or(below, above);
    let clamped = cx.select(outside, zero, plain);
    // Without: NaN outside [0, 1], grad * inf at the ends.
    let nanv = k(cx, f64::NAN, xv);
    let inf = k(cx, f64::INFINITY, xv);
    let ginf = cx.mul(gv, inf);
    let at0 = cx.compare(CmpDir::Eq, xv, zero);
    let at1 = cx.compare(CmpDir::Eq, xv, one_);
    let ends = cx.or(at0, at1);
    let free = cx.select(ends, ginf, plain);
    let lo0 = cx.compare(CmpDir::Lt, xv, zero);
    let hi1 = cx.compare(CmpDir::Gt, xv, one_);
    let out01 = cx.or(lo0, hi1);
    let free = cx.select(out01, nanv, free);
    let no_eps = cx.compare(CmpDir::Lt, eps, zero);
    let r = cx.select(no_eps, free, clamped);
    one(cx.cast(r, dt))
}

/// xlogy(self, other) = x * log(y) (0 where x == 0, NaN where y is NaN); with `log1p`,
/// special_xlog1py = x * log1p(y). Either side may be a Python number.
fn xlog(cx: &mut Cx, args: &Args, log1p: bool) -> Result<Vec<Out>> {
    float_binary(cx, args, "self", "other", |cx, x, y| {
        let l = if log1p { cx.log1p(y) } else { cx.log(y) };
        let p = cx.mul(x, l);
        let zero = k(cx, 0.0, x);
        let x0 = cx.compare(CmpDir::Eq, x, zero);
        let r = cx.select(x0, zero, p);
        let yn = is_nan(cx, y);
        let nan = k(cx, f64::NAN, x);
        cx.select(yn, nan, r)
    })
}

/// special_entr: -x log x for x > 0, 0 at 0, -inf below, NaN for NaN.
fn entr(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    float_unary(cx, args, |cx, x| {
        let l = cx.log(x);
        let p = cx.mul(x, l);
        let p = cx.neg(p);
        let zero = k(cx, 0.0, x);
        let ninf = k(cx, f64::NEG_INFINITY, x);
        let pos = cx.compare(CmpDir::Gt, x, zero);
        let is0 = cx.compare(CmpDir::Eq, x, zero);
        let r = cx.select(is0, zero, ninf);
        let r = cx.select(pos, p, r);
        let nan = is_nan(cx, x);
        cx.select(nan, x, r)
    })
}

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

// ---- Bessel functions ---------------------------------------------------------------------------------

const I0E_A: [f64; 30] = [
    -4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16, 1.71539128555513303061E-15,
    -1.16853328779934516808E-14, 7.67618549860493561688E-14, -4.85644678311192946090E-13, 2.95505266312963983461E-12,
    -1.72682629144155570723E-11, 9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
    -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7, 1.11738753912010371815E-6,
    -4.41673835845875056359E-6, 1.64484480707288970893E-5, -5.75419501008210370398E-5, 1.88502885095841655729E-4,
    -5.76375574538582365885E-4, 1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
    -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2, 1.71620901522208775349E-1,
    -3.04682672343198398683E-1, 6.76795274409476084995E-1,
];

const I0E_B: [f64; 25] = [
    -7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17, 3.46122286769746109310E-17,
    -2.82762398051658348494E-16, -3.42548561967721913462E-16, 1.77256013305652638360E-15, 3.81168066935262242075E-15,
    -9.55484669882830764870E-15, -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
    7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11, -3.14991652796324136454E-11,
    1.18891471078464383424E-11, 4.94060238822496958910E-10, 3.39623202570838634515E-9, 2.26666899049817806459E-8,
    2.04891858946906374183E-7, 2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
    8.04490411014108831608E-1,
];

const I1E_A: [f64; 29] = [
    2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16, -1.10559694773538630805E-15,
    7.60068429473540693410E-15, -5.04218550472791168711E-14, 3.22379336594557470981E-13, -1.98397439776494371520E-12,
    1.17361862988909016308E-11, -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
    9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7, -8.56872026469545474066E-7,
    3.47025130813767847674E-6, -1.32731636560394358279E-5, 4.78156510755005422638E-5, -1.61760815825896745588E-4,
    5.12285956168575772895E-4, -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
    2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1, -1.76416518357834055153E-1,
    2.52587186443633654823E-1,
];

const I1E_B: [f64; 25] = [
    7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17, -3.20952592199342395980E-17,
    2.96262899764595013876E-16, 3.30820231092092828324E-16, -1.88035477551078244854E-15, -3.81440307243700780478E-15,
    1.04202769841288027642E-14, 4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
    -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11, 3.25260358301548823856E-11,
    -1.89749581235054123450E-11, -5.58974346219658380687E-10, -3.83538038596423702205E-9, -2.63146884688951950684E-8,
    -2.51223623787020892529E-7, -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
    7.78576235018280120474E-1,
];

/// The two Chebyshev pieces of a Cephes Bessel function: on [0, 8] in y = x/2 - 2 and above
/// in 32/x - 2 (divided by sqrt(x)); `x` is |x|.
fn bessel_pieces(cx: &mut Cx, ax: Value, a: &[f64], b: &[f64]) -> (Value, Value, Value) {
    let half = k(cx, 0.5, ax);
    let two = k(cx, 2.0, ax);
    let y = cx.mul(ax, half);
    let y = cx.sub(y, two);
    let near = chbevl(cx, y, a);
    let c32 = k(cx, 32.0, ax);
    let z = cx.div(c32, ax);
    let z = cx.sub(z, two);
    let far = chbevl(cx, z, b);
    let sq = cx.sqrt(ax);
    let far = cx.div(far, sq);
    let is_near = cmp_k(cx, CmpDir::Le, ax, 8.0);
    (is_near, near, far)
}

/// i0 (or i0e with `scaled`): even, exp(|x|) times the Chebyshev pieces.
fn bessel_i0(cx: &mut Cx, x: Value, scaled: bool) -> Value {
    let ax = cx.abs(x);
    let (is_near, near, far) = bessel_pieces(cx, ax, &I0E_A, &I0E_B);
    let r = cx.select(is_near, near, far);
    if scaled {
        return r;
    }
    let e = cx.exp(ax);
    cx.mul(e, r)
}

/// i1 (or i1e): odd, x times the near piece below 8. PyTorch's float kernels use shortened
/// tables (the last 17 and 7 coefficients).
fn bessel_i1(cx: &mut Cx, x: Value, scaled: bool) -> Value {
    let double = cx.dtype(x) == DType::F64;
    let (a, b): (&[f64], &[f64]) = if double { (&I1E_A, &I1E_B) } else { (&I1E_A[12..], &I1E_B[18..]) };
    let ax = cx.abs(x);
    let (is_near, near, far) = bessel_pieces(cx, ax, a, b);
    let near = cx.mul(near, ax);
    let r = cx.select(is_near, near, far);
    let r = if scaled {
        r
    } else {
        let e = cx.exp(ax);
        cx.mul(e, r)
    };
    let neg = cmp_k(cx, CmpDir::Lt, x, 0.0);
    let nr = cx.neg(r);
    cx.select(neg, nr, r)
}

// ---- sinc, logaddexp, hypot, copysign, nextafter -----------------------------------------------------

/// sinc(x) = sin(pi x) / (pi x), 1 at 0.
fn sinc_values(cx: &mut Cx, x: Value) -> Value {
    let pi = k(cx, std::f64::consts::PI, x);
    let p = cx.mul(pi, x);
    let s = cx.sin(p);
    let r = cx.div(s, p);
    let is0 = cmp_k(cx, CmpDir::Eq, x, 0.0);
    let one_ = k(cx, 1.0, x);
    cx.select(is0, one_, r)
}

/// logaddexp(a, b) = m + log1p(exp(-|a - b|)) with m = max(a, b); equal infinities give
/// themselves. With `base2`, logaddexp2 in powers of two.
fn logaddexp(cx: &mut Cx, args: &Args, base2: bool) -> Result<Vec<Out>> {
    let kernel = if base2 { "logaddexp2_cpu" } else { "logaddexp_cpu" };
    floats_only_binary(cx, args, kernel, |cx, a, b| {
        let m = cx.max(a, b);
        let d = cx.sub(a, b);
        let d = cx.abs(d);
        let d = cx.neg(d);
        let r = if base2 {
            let e = cx.exp2(d);
            let l = cx.log1p(e);
            let inv_ln2 = k(cx, 1.0 / std::f64::consts::LN_2, a);
            let l = cx.mul(l, inv_ln2);
            cx.add(m, l)
        } else {
            let e = cx.exp(d);
            let l = cx.log1p(e);
            cx.add(m, l)
        };
        let inf = k(cx, f64::INFINITY, a);
        let aa = cx.abs(a);
        let a_inf = cx.compare(CmpDir::Eq, aa, inf);
        let same = cx.compare(CmpDir::Eq, a, b);
        let both = cx.and(a_inf, same);
        let r = cx.select(both, a, r);
        // NaN in either operand propagates (max may drop it).
        let an = is_nan(cx, a);
        let r = cx.select(an, a, r);
        let bn = is_nan(cx, b);
        cx.select(bn, b, r)
    })
}

/// hypot(a, b) = sqrt(a^2 + b^2) without overflow: M sqrt(1 + (m/M)^2); inf wins over NaN.
fn hypot(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    floats_only_binary(cx, args, "hypot_cpu", |cx, a, b| {
        let aa = cx.abs(a);
        let ab = cx.abs(b);
        let big = cx.max(aa, ab);
        let small = cx.min(aa, ab);
        let q = cx.div(small, big);
        let q2 = cx.mul(q, q);
        let one_ = k(cx, 1.0, a);
        let s = cx.add(one_, q2);
        let s = cx.sqrt(s);
        let r = cx.mul(big, s);
        let zero = k(cx, 0.0, a);
        let big0 = cx.compare(CmpDir::Eq, big, zero);
        let r = cx.select(big0, zero, r);
        let nan = k(cx, f64::NAN, a);
        let an = is_nan(cx, a);
        let bn = is_nan(cx, b);
        let any_nan = cx.or(an, bn);
        let r = cx.select(any_nan, nan, r);
        let inf = k(cx, f64::INFINITY, a);
        let ai = cx.compare(CmpDir::Eq, aa, inf);
        let bi = cx.compare(CmpDir::Eq, ab, inf);
        let any_inf = cx.or(ai, bi);
        cx.select(any_inf, inf, r)
    })
}

/// The unsigned integer type with the bit width of a float type.
fn bits_of(e: ElemType) -> (ElemType, i64) {
    match e {
        ElemType::F64 => (ElemType::U64, i64::MIN),
        ElemType::F32 => (ElemType::U32, 1 << 31),
        _ => (ElemType::U16, 1 << 15),
    }
}

/// copysign(self, other): |self| with the sign bit of other (float promotion; `other` may be
/// a Python number).
fn copysign(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    no_complex(dt, "copysign")?;
    let dt = float_result(dt);
    let (a, b) = pair(cx, x, y, dt)?;
    let (ue, sign) = bits_of(dt.elem());
    let ab = cx.bitcast_convert(a, ue);
    let bb = cx.bitcast_convert(b, ue);
    let ty = TensorType::new(ue, &cx.dims(a));
    let sm = cx.b.splat_i64(sign, &ty);
    let mag = cx.not(sm);
    let m = cx.and(ab, mag);
    let s = cx.and(bb, sm);
    let r = cx.or(m, s);
    one(cx.bitcast_convert(r, dt.elem()))
}

/// nextafter(self, other): the next representable value (chlo.next_after).
fn nextafter(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    no_complex(dt, "nextafter")?;
    check!(dt.is_float(), NotImplemented, "\"nextafter_cpu\" not implemented for '{}'", dt.torch_name());
    let (a, b) = pair(cx, x, y, dt)?;
    one(cx.chlo("next_after", &[a, b]))
}

/// fmax/fmin: NaN-ignoring maximum/minimum (NaN only where both are NaN).
fn fmax_fmin(cx: &mut Cx, args: &Args, is_max: bool) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    check!(!dt.is_complex(), Runtime, "{} not implemented for complex tensors.", if is_max { "fmax" } else { "fmin" });
    let (a, b) = pair(cx, x, y, dt)?;
    let m = if dt == DType::Bool {
        if is_max { cx.or(a, b) } else { cx.and(a, b) }
    } else if is_max {
        cx.max(a, b)
    } else {
        cx.min(a, b)
    };
    if !dt.is_float() {
        return one(m);
    }
    let an = is_nan(cx, a);
    let bn = is_nan(cx, b);
    let m = cx.select(an, b, m);
    one(cx.select(bn, a, m))
}

/// heaviside(self, values): values where self == 0, else (self > 0); same dtypes only.
fn heaviside(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let v = args.tensor("values")?;
    check!(!x.dtype.is_complex() && !v.dtype.is_complex(), Runtime, "heaviside is not yet implemented for complex tensors.");
    check!(x.dtype == v.dtype, Runtime, "heaviside is not yet implemented for tensors with different dtypes.");
    let vs = cx.broadcast_all(&[x.v, v.v])?;
    let (a, b) = (vs[0], vs[1]);
    let zero = k(cx, 0.0, a);
    let is0 = cx.compare(CmpDir::Eq, a, zero);
    let pos = cx.compare(CmpDir::Gt, a, zero);
    let pos = cx.cast(pos, x.dtype);
    one(cx.select(is0, b, pos))
}

// ---- frexp, ldexp-free bit tricks, signbit, nan_to_num, angle ---------------------------------------

/// frexp(self) -> (mantissa, exponent): x = mantissa * 2^exponent with |mantissa| in
/// [0.5, 1); zero, infinities and NaN give themselves and exponent 0. Exponents are int32.
fn frexp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(
        x.dtype.is_float(),
        Runtime,
        "torch.frexp() only supports floating-point dtypes"
    );
    let dims = cx.dims(x.v);
    let double = x.dtype == DType::F64;
    let (fe, ue, mant_bits, bias) = if double { (DType::F64, ElemType::U64, 52i64, 1023i64) } else { (DType::F32, ElemType::U32, 23, 127) };
    let v = cx.cast(x.v, fe);
    // Subnormals: scale into the normal range first.
    let min_normal = if double { f64::MIN_POSITIVE } else { f32::MIN_POSITIVE as f64 };
    let scale_bits = if double { 54 } else { 25 };
    let av = cx.abs(v);
    let sub = cmp_k(cx, CmpDir::Lt, av, min_normal);
    let sc = k(cx, 2f64.powi(scale_bits), v);
    let scaled = cx.mul(v, sc);
    let w = cx.select(sub, scaled, v);
    let off_v = cx.full(scale_bits as f64, DType::I32, &dims);
    let zero_i = cx.full(0.0, DType::I32, &dims);
    let off = cx.select(sub, off_v, zero_i);
    let bits = cx.bitcast_convert(w, ue);
    let uty = TensorType::new(ue, &dims);
    let sh = cx.b.splat_i64(mant_bits, &uty);
    let e = cx.shift_right_logical(bits, sh);
    let emask = cx.b.splat_i64(if double { 0x7ff } else { 0xff }, &uty);
    let e = cx.and(e, emask);
    let e = cx.convert(e, ElemType::I32);
    let b1 = cx.full((bias - 1) as f64, DType::I32, &dims);
    let e = cx.sub(e, b1);
    let e = cx.sub(e, off);
    // Mantissa: keep sign and fraction, set the exponent field to bias - 1.
    let keep = if double { !(0x7ffi64 << 52) } else { !(0xffi64 << 23) & 0xffff_ffff };
    let km = cx.b.splat_i64(keep, &uty);
    let mb = cx.and(bits, km);
    let eb = cx.b.splat_i64((bias - 1) << mant_bits, &uty);
    let mb = cx.or(mb, eb);
    let m = cx.bitcast_convert(mb, fe.elem());
    let zero = k(cx, 0.0, v);
    let is0 = cx.compare(CmpDir::Eq, v, zero);
    let fin = cx.is_finite(v);
    let nz = cx.not(is0);
    let regular = cx.and(fin, nz);
    let m = cx.select(regular, m, v);
    let e = cx.select(regular, e, zero_i);
    let m = cx.cast(m, x.dtype);
    Ok(vec![Out::Tensor(m), Out::Tensor(e)])
}

/// signbit: the sign bit of floats (-0.0 and -NaN included), x < 0 for integers.
fn signbit(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(x.dtype, "signbit")?;
    let dims = cx.dims(x.v);
    if x.dtype.is_float() {
        let signed = match x.dtype.size() {
            8 => ElemType::I64,
            4 => ElemType::I32,
            2 => ElemType::I16,
            _ => ElemType::I8,
        };
        let bits = cx.bitcast_convert(x.v, signed);
        let z = cx.b.splat_i64(0, &TensorType::new(signed, &dims));
        return one(cx.compare(CmpDir::Lt, bits, z));
    }
    if x.dtype.is_unsigned() {
        return one(cx.full(0.0, DType::Bool, &dims));
    }
    let z = cx.full(0.0, x.dtype, &dims);
    one(cx.compare(CmpDir::Lt, x.v, z))
}

/// nan_to_num(self, nan=0, posinf=max, neginf=lowest): floats only; other dtypes copy.
fn nan_to_num(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(x.dtype, "nan_to_num")?;
    if !x.dtype.is_float() {
        return one(x.v);
    }
    let dims = cx.dims(x.v);
    let (max, lowest) = match x.dtype {
        DType::F64 => (f64::MAX, f64::MIN),
        DType::F32 => (f32::MAX as f64, f32::MIN as f64),
        DType::F16 => (65504.0, -65504.0),
        DType::BF16 => (3.3895313892515355e38, -3.3895313892515355e38),
        d => bail!(NotImplemented, "nan_to_num: {} is not supported on tpu", d.torch_name()),
    };
    let arg = |cx: &mut Cx, name: &str, default: f64| -> Result<Value> {
        Ok(match args.get(name) {
            None | Some(Arg::None) => cx.full(default, x.dtype, &dims),
            _ => {
                let s = args.scalar(name)?;
                cx.scalar_like(s, x.dtype, &dims)
            }
        })
    };
    let nan_v = arg(cx, "nan", 0.0)?;
    let pos_v = arg(cx, "posinf", max)?;
    let neg_v = arg(cx, "neginf", lowest)?;
    let inf = cx.full(f64::INFINITY, x.dtype, &dims);
    let ninf = cx.full(f64::NEG_INFINITY, x.dtype, &dims);
    let is_pos = cx.compare(CmpDir::Eq, x.v, inf);
    let is_neg = cx.compare(CmpDir::Eq, x.v, ninf);
    let nan = is_nan(cx, x.v);
    let r = cx.select(nan, nan_v, x.v);
    let r = cx.select(is_pos, pos_v, r);
    one(cx.select(is_neg, neg_v, r))
}

/// angle of real numbers: pi below zero, 0 otherwise, NaN stays NaN; integers give float32.
fn angle(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(x.dtype, "angle")?;
    let dt = float_result(x.dtype);
    let v = cx.cast(x.v, dt);
    let zero = k(cx, 0.0, v);
    let pi = k(cx, std::f64::consts::PI, v);
    let neg = cx.compare(CmpDir::Lt, v, zero);
    let r = cx.select(neg, pi, zero);
    let nan = is_nan(cx, v);
    one(cx.select(nan, v, r))
}

// ---- integer ops: gcd, lcm, shifts ---------------------------------------------------------------------

/// gcd/lcm of integers (Euclid's algorithm, iterated while any pair is unfinished).
fn gcd_lcm(cx: &mut Cx, args: &Args, lcm: bool) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let kernel = if lcm { "lcm_cpu" } else { "gcd_cpu" };
    check!(dt.is_int(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    let (a, b) = pair(cx, x, y, dt)?;
    let g = gcd_values(cx, a, b);
    if !lcm {
        return one(g);
    }
    // lcm = |a / g * b|, 0 where g is 0.
    let dims = cx.dims(a);
    let zero = cx.full(0.0, dt, &dims);
    let one_ = cx.full(1.0, dt, &dims);
    let g0 = cx.compare(CmpDir::Eq, g, zero);
    let gs = cx.select(g0, one_, g);
    let q = cx.div(a, gs);
    let p = cx.mul(q, b);
    let p = if dt.is_unsigned() { p } else { cx.abs(p) };
    one(cx.select(g0, zero, p))
}

fn gcd_values(cx: &mut Cx, a: Value, b: Value) -> Value {
    let unsigned = cx.elem(a).is_unsigned();
    let (a, b) = if unsigned { (a, b) } else { (cx.abs(a), cx.abs(b)) };
    let r = cx.while_loop(
        &[a, b],
        |bb, v| {
            let z = bk(bb, 0.0, v[0]);
            let nz = bb.compare(CmpDir::Ne, v[0], z);
            any_true(bb, nz)
        },
        |bb, v| {
            let (a, b) = (v[0], v[1]);
            let z = bk(bb, 0.0, a);
            let o = bk(bb, 1.0, a);
            let nz = bb.compare(CmpDir::Ne, a, z);
            let sa = bb.select(nz, a, o);
            let r = bb.rem(b, sa);
            let na = bb.select(nz, r, a);
            let nb = bb.select(nz, a, b);
            vec![na, nb]
        },
    );
    r[1]
}

/// Bit shifts of integers (PyTorch's binary promotion); shifting by a negative amount or by
/// the width or more gives 0 (left) or the sign fill (right), which is StableHLO's rule too.
fn shift(cx: &mut Cx, args: &Args, left: bool) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let kernel = if left { "lshift_cpu" } else { "rshift_cpu" };
    check!(dt.is_int(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    let (a, b) = pair(cx, x, y, dt)?;
    one(if left {
        cx.shift_left(a, b)
    } else if dt.is_unsigned() {
        cx.shift_right_logical(a, b)
    } else {
        cx.shift_right_arithmetic(a, b)
    })
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

// ---- Bessel functions of the first and second kind, K, spherical j0, Airy Ai -----------------------

const J0_PP: [f64; 7] = [
    7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00, 5.44725003058768775090e+00,
    8.74716500199817011941e+00, 5.30324038235394892183e+00, 9.99999999999999997821e-01,
];
const J0_PQ: [f64; 7] = [
    9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00, 5.47097740330417105182e+00,
    8.76190883237069594232e+00, 5.30605288235394617618e+00, 1.00000000000000000218e+00,
];
const J0_QP: [f64; 8] = [
    -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01, -9.32060152123768231369e+01,
    -1.77681167980488050595e+02, -1.47077505154951170175e+02, -5.14105326766599330220e+01, -6.05014350600728481186e+00,
];
const J0_QQ: [f64; 7] = [
    6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03, 7.24046774195652478189e+03,
    5.93072701187316984827e+03, 2.06209331660327847417e+03, 2.42005740240291393179e+02,
];
const J0_RP: [f64; 4] = [-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14, 9.70862251047306323952e+15];
const J0_RQ: [f64; 8] = [
    4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07, 1.11855537045356834862e+10,
    2.11277520115489217587e+12, 3.10518229857422583814e+14, 3.18121955943204943306e+16, 1.71086294081043136091e+18,
];
const Y0_YP: [f64; 8] = [
    1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09, -9.82136065717911466409e+11,
    8.75906394395366999549e+13, -3.46628303384729719441e+15, 4.42733268572569800351e+16, -1.84950800436986690637e+16,
];
const Y0_YQ: [f64; 7] = [
    1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08, 8.64002487103935000337e+10,
    2.02979612750105546709e+13, 3.17157752842975028269e+15, 2.50596256172653059228e+17,
];
const J1_PP: [f64; 7] = [
    7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00, 5.11207951146807644818e+00,
    8.42404590141772420927e+00, 5.21451598682361504063e+00, 1.00000000000000000254e+00,
];
const J1_PQ: [f64; 7] = [
    5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00, 5.07386386128601488557e+00,
    8.39985554327604159757e+00, 5.20982848682361821619e+00, 9.99999999999999997461e-01,
];
const J1_QP: [f64; 8] = [
    5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01, 3.66779609360150777800e+02,
    7.10856304998926107277e+02, 5.97489612400613639965e+02, 2.11688757100572135698e+02, 2.52070205858023719784e+01,
];
const J1_QQ: [f64; 7] = [
    7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03, 9.56231892404756170795e+03,
    7.99704160447350683650e+03, 2.82619278517639096600e+03, 3.36093607810698293419e+02,
];
const J1_RP: [f64; 4] = [-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13, 3.68295732863852883286e+15];
const J1_RQ: [f64; 8] = [
    6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07, 2.21511595479792499675e+10,
    4.74914122079991414898e+12, 7.84369607876235854894e+14, 8.95222336184627338078e+16, 5.32278620332680085395e+18,
];
const Y1_YP: [f64; 6] = [
    1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14, -8.12770255501325109621e+15,
    2.02439475713594898196e+17, -7.78877196265950026825e+17,
];
const Y1_YQ: [f64; 8] = [
    5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07, 1.87601316108706159478e+10,
    3.88231277496238566008e+12, 6.20557727146953693363e+14, 6.87141087355300489866e+16, 3.97270608116560655612e+18,
];
const K0_A: [f64; 10] = [
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11, 1.90451637722020886025e-09,
    2.53479107902614945675e-07, 2.28621210311945178607e-05, 1.26461541144692592338e-03, 3.59799365153615016266e-02,
    3.44289899924628486886e-01, -5.35327393233902768720e-01,
];
const K0_B: [f64; 25] = [
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17, -1.67823109680541210385e-16,
    5.51205597852431940784e-16, -1.84859337734377901440e-15, 6.34007647740507060557e-15, -2.22751332699166985548e-14,
    8.03289077536357521100e-14, -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10, -1.69753450938905987466e-09,
    8.57403401741422608519e-09, -4.66048989768794782956e-08, 2.76681363944501510342e-07, -1.83175552271911948767e-06,
    1.39498137188764993662e-05, -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e+00,
];
const K1_A: [f64; 11] = [
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13, -1.41148839263352776110e-10,
    -2.21338763073472585583e-08, -2.43340614156596823496e-06, -1.73028895751305206302e-04, -6.97572385963986435018e-03,
    -1.22611180822657148235e-01, -3.53155960776544875667e-01, 1.52530022733894777053e+00,
];
const K1_B: [f64; 25] = [
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17, 1.83809354436663880070e-16,
    -6.05704724837331885336e-16, 2.03870316562433424052e-15, -7.01983709041831346144e-15, 2.47715442448130437068e-14,
    -8.97670518232499435011e-14, 3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10, 2.01504975519703286596e-09,
    -1.03457624656780970260e-08, 5.74108412545004946722e-08, -3.50196060308781257119e-07, 2.40648494783721712015e-06,
    -1.93619797416608296024e-05, 1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e+00,
];
const AIRY_AN: [f64; 8] = [
    3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01, 1.68089224934630576269e+02,
    1.59756391350164413639e+02, 7.05360906840444183113e+01, 1.40264691163389668864e+01, 9.99999999999999995305e-01,
];
const AIRY_AD: [f64; 8] = [
    5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01, 1.77318088145400459522e+02,
    1.64234692871529701831e+02, 7.14778400825575695274e+01, 1.40959135607834029598e+01, 1.00000000000000000470e+00,
];
const AIRY_AFN: [f64; 9] = [
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01, -2.79779981545119124951e-01,
    -4.91900132609500318020e-02, -4.06265923594885404393e-03, -1.59276496239262096340e-04, -2.77649108155232920844e-06,
    -1.67787698489114633780e-08,
];
const AIRY_AFD: [f64; 9] = [
    1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01, 9.18707402907259625840e+00,
    1.47529146771666414581e+00, 1.15687173795188044134e-01, 4.40291641615211203805e-03, 7.54720348287414296618e-05,
    4.51850092970580378464e-07,
];
const AIRY_AGN: [f64; 11] = [
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00, 9.39169229816650230044e-01,
    3.51465656105547619242e-01, 6.33888919628925490927e-02, 5.85804113048388458567e-03, 2.82851600836737019778e-04,
    6.98793669997260967291e-06, 8.11789239554389293311e-08, 3.41551784765923618484e-10,
];
const AIRY_AGD: [f64; 10] = [
    9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01, 5.47686069422975497931e+00,
    9.54293611618961883998e-01, 8.64580826352392193095e-02, 4.12656523824222607191e-03, 1.01259085116509135510e-04,
    1.17166733214413521882e-06, 4.91834570062930015649e-09,
];

/// sqrt(2/pi), the factor of the asymptotic forms of J and Y.
const SQRT_2_OVER_PI: f64 = 0.797884560802865355879892119868763737;
const TWO_OVER_PI: f64 = 0.636619772367581343075535053490057448;

/// The asymptotic form of J0/Y0 (`first` for J) or J1/Y1 beyond 5, for x > 0:
/// (P cos(x - phase) - 5/x Q sin(x - phase)) sqrt(2/pi) / sqrt(x) for J, with sin and cos
/// swapped and a plus for Y.
fn bessel_far(cx: &mut Cx, x: Value, order1: bool, first: bool) -> Value {
    let five = k(cx, 5.0, x);
    let z = if order1 {
        // (5/x) (5/x)
        let f = cx.div(five, x);
        cx.mul(f, f)
    } else {
        // 25 / (x x)
        let c = k(cx, 25.0, x);
        let xx = cx.mul(x, x);
        cx.div(c, xx)
    };
    let (pp, pq, qp, qq): (&[f64], &[f64], &[f64], &[f64]) =
        if order1 { (&J1_PP, &J1_PQ, &J1_QP, &J1_QQ) } else { (&J0_PP, &J0_PQ, &J0_QP, &J0_QQ) };
    let pp = polevl(cx, z, pp);
    let pq = polevl(cx, z, pq);
    let qp = polevl(cx, z, qp);
    let qq = polevl(cx, z, qq);
    let phase = if order1 { 2.356194490192344928846982537459627163 } else { 0.785398163397448309615660845819875721 };
    let ph = k(cx, phase, x);
    let s = cx.sub(x, ph);
    let (c1, c2) = if first { (cx.cos(s), cx.sin(s)) } else { (cx.sin(s), cx.cos(s)) };
    let a = cx.div(pp, pq);
    let a = cx.mul(a, c1);
    let f = cx.div(five, x);
    let q = cx.div(qp, qq);
    let b = cx.mul(f, q);
    let b = cx.mul(b, c2);
    let t = if first { cx.sub(a, b) } else { cx.add(a, b) };
    let c = k(cx, SQRT_2_OVER_PI, x);
    let t = cx.mul(t, c);
    let sq = cx.sqrt(x);
    cx.div(t, sq)
}

/// J0 (Cephes j0): even; 1 - x^2/4 below 1e-5, the rational form up to 5, asymptotic above.
fn bessel_j0_values(cx: &mut Cx, x: Value) -> Value {
    let ax = cx.abs(x);
    let xx = cx.mul(ax, ax);
    let four = k(cx, 4.0, x);
    let one_ = k(cx, 1.0, x);
    let t = cx.div(xx, four);
    let tiny_v = cx.sub(one_, t);
    let rp = polevl(cx, xx, &J0_RP);
    let rq = polevl(cx, xx, &J0_RQ);
    let c1 = k(cx, 5.78318596294678452118e+00, x);
    let c2 = k(cx, 3.04712623436620863991e+01, x);
    let a = cx.sub(xx, c1);
    let b = cx.sub(xx, c2);
    let near = cx.mul(a, b);
    let near = cx.mul(near, rp);
    let near = cx.div(near, rq);
    let far = bessel_far(cx, ax, false, true);
    let tiny = cmp_k(cx, CmpDir::Lt, ax, 0.00001);
    let near = cx.select(tiny, tiny_v, near);
    let is_near = cmp_k(cx, CmpDir::Le, ax, 5.0);
    cx.select(is_near, near, far)
}

/// J1 (Cephes j1): odd; the rational form up to 5, asymptotic above.
fn bessel_j1_values(cx: &mut Cx, x: Value) -> Value {
    let ax = cx.abs(x);
    // The rational form is odd in x: evaluate it at x itself, as -J1(-x) gives the same.
    let xx = cx.mul(x, x);
    let rp = polevl(cx, xx, &J1_RP);
    let rq = polevl(cx, xx, &J1_RQ);
    let c1 = k(cx, 1.46819706421238932572e+01, x);
    let c2 = k(cx, 4.92184563216946036703e+01, x);
    let near = cx.div(rp, rq);
    let near = cx.mul(near, x);
    let a = cx.sub(xx, c1);
    let near = cx.mul(near, a);
    let b = cx.sub(xx, c2);
    let near = cx.mul(near, b);
    let far = bessel_far(cx, ax, true, true);
    let neg = cmp_k(cx, CmpDir::Lt, x, 0.0);
    let nfar = cx.neg(far);
    let far = cx.select(neg, nfar, far);
    let is_near = cmp_k(cx, CmpDir::Le, ax, 5.0);
    cx.select(is_near, near, far)
}

/// Y0 (Cephes y0): -inf at 0, NaN below, the rational form plus (2/pi) log(x) J0(x) up to 5.
fn bessel_y0_values(cx: &mut Cx, x: Value) -> Value {
    let xx = cx.mul(x, x);
    let yp = polevl(cx, xx, &Y0_YP);
    let yq = polevl(cx, xx, &Y0_YQ);
    let r = cx.div(yp, yq);
    let c = k(cx, TWO_OVER_PI, x);
    let l = cx.log(x);
    let t = cx.mul(c, l);
    let j = bessel_j0_values(cx, x);
    let t = cx.mul(t, j);
    let near = cx.add(r, t);
    let far = bessel_far(cx, x, false, false);
    y_edges(cx, x, near, far, CmpDir::Lt)
}

/// Y1 (Cephes y1): -inf at 0, NaN below, x R(x^2) + (2/pi)(J1(x) log(x) - 1/x) up to 5.
fn bessel_y1_values(cx: &mut Cx, x: Value) -> Value {
    let xx = cx.mul(x, x);
    let yp = polevl(cx, xx, &Y1_YP);
    let yq = polevl(cx, xx, &Y1_YQ);
    let r = cx.div(yp, yq);
    let r = cx.mul(x, r);
    let j = bessel_j1_values(cx, x);
    let l = cx.log(x);
    let t = cx.mul(j, l);
    let one_ = k(cx, 1.0, x);
    let inv = cx.div(one_, x);
    let t = cx.sub(t, inv);
    let c = k(cx, TWO_OVER_PI, x);
    let t = cx.mul(c, t);
    let near = cx.add(r, t);
    let far = bessel_far(cx, x, true, false);
    y_edges(cx, x, near, far, CmpDir::Le)
}

/// The branches of Y0/Y1: up to 5 `near` (-inf at 0, NaN where `x nan_dir 0`), above `far`.
fn y_edges(cx: &mut Cx, x: Value, near: Value, far: Value, nan_dir: CmpDir) -> Value {
    let nan = k(cx, f64::NAN, x);
    let ninf = k(cx, f64::NEG_INFINITY, x);
    let bad = cmp_k(cx, nan_dir, x, 0.0);
    let near = cx.select(bad, nan, near);
    let at0 = cmp_k(cx, CmpDir::Eq, x, 0.0);
    let near = cx.select(at0, ninf, near);
    let is_near = cmp_k(cx, CmpDir::Le, x, 5.0);
    cx.select(is_near, near, far)
}

/// PyTorch's modified_bessel_i1_forward (full Chebyshev tables in every dtype) for x in (0, 8]:
/// 0.5 (a - p) x exp(x).
fn bessel_i1_near(cx: &mut Cx, x: Value) -> Value {
    let half = k(cx, 0.5, x);
    let two = k(cx, 2.0, x);
    let y = cx.mul(x, half);
    let y = cx.sub(y, two);
    let c = chbevl(cx, y, &I1E_A);
    let c = cx.mul(c, x);
    let e = cx.exp(x);
    cx.mul(c, e)
}

/// K0 or K1 (`order1`), times exp(x) when `scaled` (Cephes k0/k1/k0e/k1e as PyTorch writes
/// them): inf at 0, NaN below; Chebyshev series in x^2 - 2 with the log(x/2) I term up to 2,
/// in 8/x - 2 above.
fn bessel_k_values(cx: &mut Cx, x: Value, order1: bool, scaled: bool) -> Value {
    let half = k(cx, 0.5, x);
    let two = k(cx, 2.0, x);
    let xx = cx.mul(x, x);
    let y = cx.sub(xx, two);
    let hx = cx.mul(half, x);
    let l = cx.log(hx);
    let near = if order1 {
        let a = chbevl(cx, y, &K1_A);
        let i1 = bessel_i1_near(cx, x);
        let t = cx.mul(l, i1);
        let a = cx.div(a, x);
        cx.add(t, a)
    } else {
        let a = chbevl(cx, y, &K0_A);
        let i0 = bessel_i0(cx, x, false);
        let t = cx.mul(l, i0);
        cx.sub(a, t)
    };
    let near = if scaled {
        let e = cx.exp(x);
        cx.mul(near, e)
    } else {
        near
    };
    let eight = k(cx, 8.0, x);
    let z = cx.div(eight, x);
    let z = cx.sub(z, two);
    let b = chbevl(cx, z, if order1 { &K1_B } else { &K0_B });
    let b = if scaled {
        b
    } else {
        let nx = cx.neg(x);
        let e = cx.exp(nx);
        cx.mul(e, b)
    };
    let sq = cx.sqrt(x);
    let far = cx.div(b, sq);
    let is_near = cmp_k(cx, CmpDir::Le, x, 2.0);
    let r = cx.select(is_near, near, far);
    let nan = k(cx, f64::NAN, x);
    let neg = cmp_k(cx, CmpDir::Lt, x, 0.0);
    let r = cx.select(neg, nan, r);
    let inf = k(cx, f64::INFINITY, x);
    let at0 = cmp_k(cx, CmpDir::Eq, x, 0.0);
    cx.select(at0, inf, r)
}

/// The spherical Bessel function j0 = sin(x)/x: 0 at +-inf, a Taylor polynomial below 0.5.
fn spherical_j0_values(cx: &mut Cx, x: Value) -> Value {
    let f32_ = cx.dtype(x) != DType::F64;
    // PyTorch writes the coefficients as T(-1.0) / T(6.0) and so on: quotients rounded in T.
    let coef = |d: f64, sign: f64| {
        let q = if f32_ { (1.0f32 / d as f32) as f64 } else { 1.0 / d };
        sign * q
    };
    let xx = cx.mul(x, x);
    let dens = [6227020800.0, 39916800.0, 362880.0, 5040.0, 120.0, 6.0];
    let mut acc = k(cx, coef(dens[0], 1.0), x);
    let mut sign = -1.0;
    for &d in &dens[1..] {
        let t = cx.mul(xx, acc);
        let c = k(cx, coef(d, sign), x);
        acc = cx.add(c, t);
        sign = -sign;
    }
    let t = cx.mul(xx, acc);
    let one_ = k(cx, 1.0, x);
    let small = cx.add(one_, t);
    let s = cx.sin(x);
    let big = cx.div(s, x);
    let ax = cx.abs(x);
    let is_small = cmp_k(cx, CmpDir::Lt, ax, 0.5);
    let r = cx.select(is_small, small, big);
    let zero = k(cx, 0.0, x);
    let inf = cmp_k(cx, CmpDir::Eq, ax, f64::INFINITY);
    cx.select(inf, zero, r)
}

/// Airy Ai (Cephes airy as PyTorch writes it): NaN at +-inf, 0 above 103.892, the asymptotic
/// forms below -2.09 and from 2.09, and in between the Maclaurin series f(x) and g(x), summed
/// (one while loop for the tensor) until each term is below epsilon relative to f.
fn airy_ai_values(cx: &mut Cx, x: Value) -> Value {
    let double = cx.dtype(x) == DType::F64;
    let eps = if double { f64::EPSILON } else { f32::EPSILON as f64 };
    let one_ = k(cx, 1.0, x);
    let two = k(cx, 2.0, x);
    let three = k(cx, 3.0, x);
    let c_ai = k(cx, 5.64189583547756286948e-01, x);
    // x < -2.09: with w = -2 x sqrt(-x) / 3 and z = 1/w.
    let nx = cx.neg(x);
    let sn = cx.sqrt(nx);
    let m2 = k(cx, -2.0, x);
    let w = cx.mul(m2, x);
    let w = cx.mul(w, sn);
    let w = cx.div(w, three);
    let z = cx.div(one_, w);
    let zz = cx.mul(z, z);
    let afn = polevl(cx, zz, &AIRY_AFN);
    let afd = polevl(cx, zz, &AIRY_AFD);
    let agn = polevl(cx, zz, &AIRY_AGN);
    let agd = polevl(cx, zz, &AIRY_AGD);
    let qpi = k(cx, if double { 0.25 * std::f64::consts::PI } else { 0.25 * (std::f32::consts::PI as f64) }, x);
    let t = cx.add(w, qpi);
    let ssn = cx.sqrt(sn);
    let lead = cx.div(c_ai, ssn);
    let f = cx.mul(zz, afn);
    let f = cx.div(f, afd);
    let f = cx.add(one_, f);
    let st = cx.sin(t);
    let f = cx.mul(st, f);
    let g = cx.mul(z, agn);
    let g = cx.div(g, agd);
    let ct = cx.cos(t);
    let g = cx.mul(ct, g);
    let d = cx.sub(f, g);
    let neg_v = cx.mul(lead, d);
    // x >= 2.09: zeta = 2 x sqrt(x) / 3.
    let sx = cx.sqrt(x);
    let zeta = cx.mul(two, x);
    let zeta = cx.mul(zeta, sx);
    let zeta = cx.div(zeta, three);
    let iz = cx.div(one_, zeta);
    let an = polevl(cx, iz, &AIRY_AN);
    let ad = polevl(cx, iz, &AIRY_AD);
    let r = cx.div(an, ad);
    let r = cx.mul(c_ai, r);
    let ssx = cx.sqrt(sx);
    let den = cx.mul(two, ssx);
    let ez = cx.exp(zeta);
    let den = cx.mul(den, ez);
    let pos_v = cx.div(r, den);
    // In between: f = sum z^k / (3k)! * (1 4 ... (3k-2)), g likewise, with z = x^3.
    let below = cmp_k(cx, CmpDir::Lt, x, -2.09);
    let above = cmp_k(cx, CmpDir::Ge, x, 2.09);
    let outside = cx.or(below, above);
    let series = cx.not(outside);
    let xx = cx.mul(x, x);
    let z3 = cx.mul(xx, x);
    let zero_i = cx.constant_i64(0, ElemType::I64);
    let s = cx.while_loop(
        &[zero_i, one_, x, one_, x, series],
        |b, v| loop_more(b, v[0], v[5], 1000),
        |b, v| {
            let (j, m, n, f, g, active) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            // k runs 1 + 3j before this step: the divisors are 3j + 2, 3j + 3, 3j + 4.
            let three_i = b.constant_i64(3, ElemType::I64);
            let j3 = b.mul(j, three_i);
            let mut kv = [m; 3];
            for (i, slot) in kv.iter_mut().enumerate() {
                let c = b.constant_i64(2 + i as i64, ElemType::I64);
                let t = b.add(j3, c);
                *slot = count_like(b, t, m);
            }
            let m1 = b.mul(m, z3);
            let m1 = b.div(m1, kv[0]);
            let n1 = b.mul(n, z3);
            let n1 = b.div(n1, kv[1]);
            let m1 = b.div(m1, kv[1]);
            let f1 = b.add(f, m1);
            let n1 = b.div(n1, kv[2]);
            let g1 = b.add(g, n1);
            let t = b.div(m1, f1);
            let t = b.abs(t);
            let ev = bk(b, eps, m);
            let go_on = b.compare(CmpDir::Gt, t, ev);
            let st = select_all(b, active, &[m1, n1, f1, g1], &[m, n, f, g]);
            let active = b.and(active, go_on);
            let j = next_count(b, j);
            vec![j, st[0], st[1], st[2], st[3], active]
        },
    );
    let c1 = k(cx, 0.355028053887817239260, x);
    let c2 = k(cx, 0.258819403792806798405, x);
    let a = cx.mul(c1, s[3]);
    let b = cx.mul(c2, s[4]);
    let mid = cx.sub(a, b);
    let r = cx.select(above, pos_v, mid);
    let r = cx.select(below, neg_v, r);
    let zero = k(cx, 0.0, x);
    let far = cmp_k(cx, CmpDir::Gt, x, 103.892);
    let r = cx.select(far, zero, r);
    let nan = k(cx, f64::NAN, x);
    let ax = cx.abs(x);
    let inf = cmp_k(cx, CmpDir::Eq, ax, f64::INFINITY);
    cx.select(inf, nan, r)
}

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

/// kaiser_window(window_length, periodic, beta, dtype): i0(beta sqrt(1 - ((k - a) / a)^2)) /
/// i0(beta) with a = (N - 1) / 2 over N = window_length (+ 1 when periodic, the last dropped),
/// in f32 for 16-bit dtypes. Routed: PyTorch's composite runs a CPU-only kernel stub.
fn kaiser_window(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let n = args.int("window_length")?;
    let periodic = args.bool_or("periodic", true)?;
    let dt = args.dtype("dtype")?.unwrap_or(DType::F32);
    check!(
        dt.is_float(),
        Runtime,
        "kaiser_window expects floating point dtypes, got: TensorOptions(dtype={})",
        dt.torch_name()
    );
    check!(n >= 0, Runtime, "kaiser_window requires non-negative window length, got window_length={}", n);
    if n <= 1 {
        return one(cx.full(1.0, dt, &[n]));
    }
    let len = if periodic { n + 1 } else { n };
    let acc = acc_type(dt);
    let beta = match args.opt_scalar("beta")? {
        Some(s) => cx.scalar_like(s, acc, &[n]),
        None => cx.full(12.0, acc, &[n]),
    };
    let k = cx.iota(&TensorType { elem: acc.elem(), dims: vec![n] }, 0);
    // PyTorch's kernel gets arange's values in the window's dtype.
    let k = crate::blocks::round16::round_to(cx, k, dt);
    let alpha = cx.full((len - 1) as f64 / 2.0, acc, &[n]);
    let r = cx.sub(k, alpha);
    let r = cx.div(r, alpha);
    let r2 = cx.mul(r, r);
    let one_ = cx.full(1.0, acc, &[n]);
    let t = cx.sub(one_, r2);
    let t = cx.sqrt(t);
    let t = cx.mul(beta, t);
    let num = bessel_i0(cx, t, false);
    let den = bessel_i0(cx, beta, false);
    let w = cx.div(num, den);
    one(cx.cast(w, dt))
}
