//! The remaining elementwise math that shares this directory's operand handling: sinc,
//! logaddexp(2), hypot, copysign, nextafter, fmax/fmin, heaviside, frexp, signbit, nan_to_num,
//! angle, gcd/lcm and the bit shifts.
use crate::args::{Arg, Args};
use crate::blocks::loops::any_true;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use super::{bits_of, bk, cmp_k, float_result, float_unary, floats_only_binary, is_nan, k, no_complex, operands, pair};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

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
