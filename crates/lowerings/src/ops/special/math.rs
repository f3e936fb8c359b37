//! The remaining elementwise math that shares this directory's operand handling: sinc,
//! logaddexp(2), hypot, copysign, nextafter, fmax/fmin, heaviside, frexp, signbit, nan_to_num,
//! angle, gcd/lcm and the bit shifts.
use crate::args::{Arg, Args};
use crate::blocks::loops::any_true;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use super::{bits_of, float_result, float_unary, floats_only_binary, no_complex, operands, pair};
use stablehlo::{CmpDir, ElemType, Ex, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("sinc", |cx, a| float_unary(cx, a, sinc_values)),
    op("logaddexp", |cx, a| logaddexp(cx, a, false)),
    op("logaddexp2", |cx, a| logaddexp(cx, a, true)),
    op("hypot", hypot),
    op("copysign", copysign),
    op("nextafter", nextafter),
    op("fmax", |cx, a| fmax_fmin(cx, a, true)),
    op("fmin", |cx, a| fmax_fmin(cx, a, false)),
    op("heaviside", heaviside),
    op("frexp", frexp),
    op("gcd", |cx, a| gcd_lcm(cx, a, false)),
    op("lcm", |cx, a| gcd_lcm(cx, a, true)),
    op("__lshift__", |cx, a| shift(cx, a, true)),
    op("__rshift__", |cx, a| shift(cx, a, false)),
    // `x <<= n` and `x >>= n` (in-place, written into self by the engine).
    op("__ilshift__", |cx, a| shift(cx, a, true)),
    op("__irshift__", |cx, a| shift(cx, a, false)),
    op("bitwise_left_shift", |cx, a| shift(cx, a, true)),
    op("bitwise_right_shift", |cx, a| shift(cx, a, false)),
    op("nan_to_num", nan_to_num),
    op("signbit", signbit),
    op("angle", angle),
];

// ---- sinc, logaddexp, hypot, copysign, nextafter -----------------------------------------------------

/// sinc(x) = sin(pi x) / (pi x), 1 at 0.
fn sinc_values(cx: &mut Cx, x: Value) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let p = std::f64::consts::PI * x;
    let r = p.sin() / p;
    x.eq(0.0).select(1.0, r).v
}

/// logaddexp(a, b) = m + log1p(exp(-|a - b|)) with m = max(a, b); equal infinities give
/// themselves. With `base2`, logaddexp2 in powers of two.
fn logaddexp(cx: &mut Cx, args: &Args, base2: bool) -> Result<Vec<Out>> {
    let kernel = if base2 { "logaddexp2_cpu" } else { "logaddexp_cpu" };
    floats_only_binary(cx, args, kernel, |cx, a, b| {
        let e = Ex::new(cx);
        let [a, b] = e.all([a, b]);
        let m = a.max(b);
        let d = -(a - b).abs();
        let r = if base2 { m + d.exp2().ln_1p() * (1.0 / std::f64::consts::LN_2) } else { m + d.exp().ln_1p() };
        let r = (a.abs().eq(f64::INFINITY) & a.eq(b)).select(a, r);
        // NaN in either operand propagates (max may drop it).
        let r = a.ne(a).select(a, r);
        b.ne(b).select(b, r).v
    })
}

/// hypot(a, b) = sqrt(a^2 + b^2) without overflow: M sqrt(1 + (m/M)^2); inf wins over NaN.
fn hypot(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    floats_only_binary(cx, args, "hypot_cpu", |cx, a, b| {
        let e = Ex::new(cx);
        let [a, b] = e.all([a, b]);
        let (aa, ab) = (a.abs(), b.abs());
        let big = aa.max(ab);
        let q = aa.min(ab) / big;
        let r = big * (1.0 + q * q).sqrt();
        let r = big.eq(0.0).select(0.0, r);
        let r = (a.ne(a) | b.ne(b)).select(f64::NAN, r);
        (aa.eq(f64::INFINITY) | ab.eq(f64::INFINITY)).select(f64::INFINITY, r).v
    })
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
    let e = Ex::new(cx);
    let [a, b, m] = e.all([a, b, m]);
    let m = a.ne(a).select(b, m);
    one(b.ne(b).select(a, m).v)
}

/// heaviside(self, values): values where self == 0, else (self > 0); same dtypes only.
fn heaviside(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let v = args.tensor("values")?;
    check!(!x.dtype.is_complex() && !v.dtype.is_complex(), Runtime, "heaviside is not yet implemented for complex tensors.");
    check!(x.dtype == v.dtype, Runtime, "heaviside is not yet implemented for tensors with different dtypes.");
    let vs = cx.broadcast_all(&[x.v, v.v])?;
    let (a, b) = (vs[0], vs[1]);
    let (is0, pos) = {
        let e = Ex::new(cx);
        let a = e.of(a);
        (a.eq(0.0).v, a.gt(0.0).v)
    };
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
    let (sub, w) = {
        let e = Ex::new(cx);
        let v = e.of(v);
        let sub = v.abs().lt(min_normal);
        (sub.v, sub.select(v * 2f64.powi(scale_bits), v).v)
    };
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
    let regular = {
        let e = Ex::new(cx);
        let v = e.of(v);
        (v.is_finite() & !v.eq(0.0)).v
    };
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
    let nan = cx.compare(CmpDir::Ne, x.v, x.v);
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
    let e = Ex::new(cx);
    let v = e.of(v);
    let r = v.lt(0.0).select(std::f64::consts::PI, v.k(0.0));
    one(v.ne(v).select(v, r).v)
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
            let nz = Ex::new(bb).of(v[0]).ne(0.0).v;
            any_true(bb, nz)
        },
        |bb, v| {
            let e = Ex::new(bb);
            let [a, b] = e.all([v[0], v[1]]);
            let nz = a.ne(0.0);
            let r = b % nz.select(a, 1.0);
            vec![nz.select(r, a).v, nz.select(a, b).v]
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
