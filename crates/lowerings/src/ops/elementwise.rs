//! Elementwise ops: arithmetic with PyTorch's type promotion (and the fused _add_relu),
//! comparisons, logical and bitwise ops, unary math (sigmoid and tanh included),
//! where/clamp/masked_fill, conj_physical, the isinf/isnan family and equal.
use crate::args::{Arg, Args, Scalar};
use crate::blocks::operands::{float_result, operands, pair, Operand};
use crate::blocks::nan::{is_nan, nan_min_max};
use crate::blocks::type_names::{convert_type_name, meta_name};
use crate::cx::Cx;
use crate::dtype::{result_type, DType};
use crate::error::{ErrorKind, Result, TorchError};
use crate::{bail, check, one, Out, op, Op, ops};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("add", add).pointwise(),
    op("sub", sub).pointwise(),
    op("rsub", rsub).pointwise(),
    op("mul", mul).pointwise(),
    op("div", div).pointwise(),
    op("true_divide", div).pointwise(),
    op("floor_divide", floor_divide).pointwise(),
    op("remainder", remainder).pointwise(),
    op("fmod", fmod).pointwise(),
    op("pow", pow).pointwise(),
    op("maximum", maximum).pointwise(),
    op("minimum", minimum).pointwise(),
    op("atan2", atan2).pointwise(),
    op("eq", |cx, a| compare(cx, a, CmpDir::Eq)).pointwise().float4(),
    op("ne", |cx, a| compare(cx, a, CmpDir::Ne)).pointwise().float4(),
    op("lt", |cx, a| compare(cx, a, CmpDir::Lt)).pointwise(),
    op("le", |cx, a| compare(cx, a, CmpDir::Le)).pointwise(),
    op("gt", |cx, a| compare(cx, a, CmpDir::Gt)).pointwise(),
    op("ge", |cx, a| compare(cx, a, CmpDir::Ge)).pointwise(),
    op("logical_and", |cx, a| logical(cx, a, Cx::and_)).pointwise(),
    op("logical_or", |cx, a| logical(cx, a, Cx::or_)).pointwise(),
    op("logical_xor", |cx, a| logical(cx, a, Cx::xor_)).pointwise(),
    op("logical_not", logical_not).pointwise(),
    op("bitwise_and", |cx, a| bitwise(cx, a, Cx::and_)).pointwise(),
    op("bitwise_or", |cx, a| bitwise(cx, a, Cx::or_)).pointwise(),
    op("bitwise_xor", |cx, a| bitwise(cx, a, Cx::xor_)).pointwise(),
    op("bitwise_not", bitwise_not).pointwise(),
    op("neg", neg).pointwise(),
    op("abs", abs).pointwise(),
    op("sign", sign).pointwise(),
    op("sgn", sign).pointwise(),
    op("where", where_).pointwise().float4(),
    op("clamp", clamp).pointwise(),
    op("clip", clamp).pointwise(),
    op("clamp_min", clamp_min).pointwise(),
    op("clamp_max", clamp_max).pointwise(),
    op("masked_fill", masked_fill).pointwise(),
    op("_add_relu", add_relu).pointwise(),
    op("sigmoid", |cx, a| float_unary(cx, a, |cx, x| cx.logistic(x))).pointwise(),
    op("tanh", |cx, a| float_unary(cx, a, |cx, x| cx.tanh(x))).pointwise(),
    op("exp", |cx, a| float_unary(cx, a, |cx, x| cx.exp(x))).pointwise(),
    op("exp2", |cx, a| float_unary(cx, a, |cx, x| cx.exp2(x))).pointwise(),
    op("expm1", |cx, a| float_unary(cx, a, |cx, x| cx.expm1(x))).pointwise(),
    op("log", |cx, a| float_unary(cx, a, |cx, x| cx.log(x))).pointwise(),
    op("log1p", |cx, a| float_unary(cx, a, |cx, x| cx.log1p(x))).pointwise(),
    op("log2", |cx, a| float_unary(cx, a, log2)).pointwise(),
    op("log10", |cx, a| float_unary(cx, a, |cx, x| log_base(cx, x, 10.0))).pointwise(),
    op("sqrt", |cx, a| float_unary(cx, a, |cx, x| cx.sqrt(x))).pointwise(),
    op("rsqrt", |cx, a| float_unary(cx, a, |cx, x| cx.rsqrt(x))).pointwise(),
    op("reciprocal", |cx, a| {
        float_unary(cx, a, |cx, x| {
            let one = cx.full(1.0, cx.dtype(x), &cx.dims(x));
            cx.div(one, x)
        })
    }).pointwise(),
    op("sin", |cx, a| float_unary(cx, a, |cx, x| cx.sin(x))).pointwise(),
    op("cos", |cx, a| float_unary(cx, a, |cx, x| cx.cos(x))).pointwise(),
    op("tan", |cx, a| float_unary(cx, a, |cx, x| cx.tan(x))).pointwise(),
    ops(&["asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma"], chlo_unary).pointwise(),
    op("floor", |cx, a| rounding(cx, a, |cx, x| cx.floor(x))).pointwise(),
    op("ceil", |cx, a| rounding(cx, a, |cx, x| cx.ceil(x))).pointwise(),
    op("round", round).pointwise(),
    op("trunc", |cx, a| rounding(cx, a, trunc_value)).pointwise(),
    op("fix", |cx, a| rounding(cx, a, trunc_value)).pointwise(),
    op("frac", |cx, a| {
        float_only(cx, a, |cx, x| {
            let t = trunc_value(cx, x);
            cx.sub(x, t)
        })
    }).pointwise(),
    op("conj_physical", conj_physical).pointwise(),
    op("equal", equal),
    op("_conj_physical", conj_physical).pointwise(),
    op("isnan", |cx, a| {
        let x = a.tensor("self")?;
        // Float4 has no NaN.
        let nan_free = !x.dtype.is_float() || x.dtype == DType::F4E2M1FNX2;
        let out = if nan_free { cx.full(0.0, DType::Bool, &cx.dims(x.v)) } else { cx.compare(CmpDir::Ne, x.v, x.v) };
        one(out)
    }).pointwise().float4(),
    op("isinf", |cx, a| {
        let x = a.tensor("self")?;
        let dims = cx.dims(x.v);
        if !x.dtype.is_float() {
            return one(cx.full(0.0, DType::Bool, &dims));
        }
        let ax = cx.abs(x.v);
        let inf = cx.full(f64::INFINITY, x.dtype, &dims);
        one(cx.compare(CmpDir::Eq, ax, inf))
    }).pointwise(),
    op("isposinf", |cx, a| is_signed_inf(cx, a, f64::INFINITY)).pointwise(),
    op("isneginf", |cx, a| is_signed_inf(cx, a, f64::NEG_INFINITY)).pointwise(),
    op("isfinite", |cx, a| {
        let x = a.tensor("self")?;
        let out = if x.dtype.is_float() { cx.is_finite(x.v) } else { cx.full(1.0, DType::Bool, &cx.dims(x.v)) };
        one(out)
    }).pointwise(),
];

// ---- helpers --------------------------------------------------------------------------------

// Builder methods under names usable as fn pointers.
impl Cx {
    fn and_(&mut self, a: Value, b: Value) -> Value {
        self.b.and(a, b)
    }
    fn or_(&mut self, a: Value, b: Value) -> Value {
        self.b.or(a, b)
    }
    fn xor_(&mut self, a: Value, b: Value) -> Value {
        self.b.xor(a, b)
    }
}

// ---- arithmetic ------------------------------------------------------------------------------

fn alpha_checked(args: &Args, dt: DType) -> Result<Option<Scalar>> {
    let alpha = match args.opt_scalar("alpha")? {
        None => return Ok(None),
        Some(a) => a,
    };
    match alpha {
        Scalar::Float(_) => check!(
            dt.is_float() || dt.is_complex(),
            Runtime,
            "For integral input tensors, argument alpha must not be a floating point number."
        ),
        Scalar::Bool(_) => {
            check!(dt == DType::Bool, Runtime, "Boolean alpha only supported for Boolean results.")
        }
        Scalar::Int(_) => {}
        Scalar::Complex(..) => {
            check!(dt.is_complex(), Runtime, "For non-complex input tensors, argument alpha must not be a complex number.")
        }
    }
    Ok(match alpha {
        Scalar::Int(1) | Scalar::Bool(true) => None,
        a => Some(a),
    })
}

fn add_sub(cx: &mut Cx, args: &Args, subtract: bool, reverse: bool) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    if subtract {
        let kind = crate::torch_version::bool_minus_error();
        if x.promo().0 == DType::Bool && y.promo().0 == DType::Bool {
            return Err(TorchError::new(kind, "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."));
        }
        if x.promo().0 == DType::Bool || y.promo().0 == DType::Bool {
            return Err(TorchError::new(kind, "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."));
        }
    }
    let alpha = alpha_checked(args, dt)?;
    let (mut a, mut b) = pair(cx, x, y, dt)?;
    if let Some(alpha) = alpha {
        let s = cx.scalar(alpha, dt);
        let d = cx.dims(b);
        let s = cx.broadcast_in_dim(s, &d, &[]);
        b = cx.mul(b, s);
    }
    if reverse {
        std::mem::swap(&mut a, &mut b);
    }
    let out = if subtract {
        cx.sub(a, b)
    } else if dt == DType::Bool {
        cx.or(a, b)
    } else {
        cx.add(a, b)
    };
    one(out)
}

fn add(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    add_sub(cx, args, false, false)
}

fn sub(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    add_sub(cx, args, true, false)
}

/// rsub(self, other, alpha) = other - alpha * self.
fn rsub(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let alpha = alpha_checked(args, dt)?;
    let (mut a, b) = pair(cx, x, y, dt)?;
    if let Some(alpha) = alpha {
        let s = cx.scalar(alpha, dt);
        let d = cx.dims(a);
        let s = cx.broadcast_in_dim(s, &d, &[]);
        a = cx.mul(a, s);
    }
    one(cx.sub(b, a))
}

fn mul(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let (a, b) = pair(cx, x, y, dt)?;
    one(if dt == DType::Bool { cx.and(a, b) } else { cx.mul(a, b) })
}

fn div(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    match args.str("rounding_mode")? {
        None => {
            let dt = float_result(dt);
            let (a, b) = pair(cx, x, y, dt)?;
            one(cx.div(a, b))
        }
        Some("trunc") => {
            let (a, b) = pair(cx, x, y, dt)?;
            if dt.is_integral() {
                one(cx.div(a, b))
            } else {
                let q = cx.div(a, b);
                one(trunc_value(cx, q))
            }
        }
        Some("floor") => {
            let (a, b) = pair(cx, x, y, dt)?;
            one(floor_divide_values(cx, a, b, dt))
        }
        Some(m) => bail!(
            Runtime,
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{}'",
            m
        ),
    }
}

fn floor_divide(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    check!(dt != DType::Bool, NotImplemented, "\"div_floor_cpu\" not implemented for 'Bool'");
    let (a, b) = pair(cx, x, y, dt)?;
    one(floor_divide_values(cx, a, b, dt))
}

/// Where the truncated remainder r = fmod(a, b) is nonzero and its sign is not b's: the
/// elements Python's floor division and modulo move one step from C's (zero: 0 like r).
fn floor_fix(cx: &mut Cx, r: Value, b: Value, zero: Value) -> Value {
    let r_nz = cx.compare(CmpDir::Ne, r, zero);
    let r_neg = cx.compare(CmpDir::Lt, r, zero);
    let b_neg = cx.compare(CmpDir::Lt, b, zero);
    let differ = cx.xor(r_neg, b_neg);
    cx.and(r_nz, differ)
}

/// Python's floor division, as PyTorch computes it.
fn floor_divide_values(cx: &mut Cx, a: Value, b: Value, dt: DType) -> Value {
    let dims = cx.dims(a);
    let zero = cx.full(0.0, dt, &dims);
    if dt.is_integral() {
        // q = trunc(a / b) - 1 where the remainder is nonzero and the signs differ.
        let q = cx.div(a, b);
        let r = cx.rem(a, b);
        let fix = floor_fix(cx, r, b, zero);
        let one_ = cx.full(1.0, dt, &dims);
        let qm1 = cx.sub(q, one_);
        return cx.select(fix, qm1, q);
    }
    // Floats: div = (a - fmod(a, b)) / b, corrected toward floor, then rounded to the nearest
    // integer so that inexact quotients land where PyTorch puts them.
    let m = cx.rem(a, b);
    let am = cx.sub(a, m);
    let mut d = cx.div(am, b);
    let fix = floor_fix(cx, m, b, zero);
    let one_ = cx.full(1.0, dt, &dims);
    let dm1 = cx.sub(d, one_);
    d = cx.select(fix, dm1, d);
    let fl = cx.floor(d);
    let diff = cx.sub(d, fl);
    let half = cx.full(0.5, dt, &dims);
    let up = cx.compare(CmpDir::Gt, diff, half);
    let fl1 = cx.add(fl, one_);
    let fl = cx.select(up, fl1, fl);
    // d == 0 keeps the sign of a / b; b == 0 gives a / b (inf or nan).
    let d_zero = cx.compare(CmpDir::Eq, d, zero);
    let q = cx.div(a, b);
    let signed_zero = cx.mul(zero, q);
    let out = cx.select(d_zero, signed_zero, fl);
    let b_zero = cx.compare(CmpDir::Eq, b, zero);
    cx.select(b_zero, q, out)
}

fn remainder(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    check!(dt != DType::Bool, NotImplemented, "\"remainder_cpu\" not implemented for 'Bool'");
    let (a, b) = pair(cx, x, y, dt)?;
    let dims = cx.dims(a);
    let zero = cx.full(0.0, dt, &dims);
    let r = cx.rem(a, b);
    let fix = floor_fix(cx, r, b, zero);
    let rb = cx.add(r, b);
    one(cx.select(fix, rb, r))
}

fn fmod(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    check!(dt != DType::Bool, NotImplemented, "\"fmod_cpu\" not implemented for 'Bool'");
    let (a, b) = pair(cx, x, y, dt)?;
    one(cx.rem(a, b))
}

fn pow(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "exponent")?;
    if dt.is_integral() {
        if let Operand::S(Scalar::Int(e)) = y {
            check!(e >= 0, Runtime, "Integers to negative integer powers are not allowed.");
        }
    }
    check!(dt != DType::Bool, NotImplemented, "\"pow\" not implemented for 'Bool'");
    let (a, b) = pair(cx, x, y, dt)?;
    one(cx.pow(a, b))
}

fn min_max(cx: &mut Cx, args: &Args, is_max: bool) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    check!(
        !dt.is_complex(),
        Runtime,
        "{} not implemented for complex tensors.",
        if is_max { "maximum" } else { "minimum" }
    );
    let (a, b) = pair(cx, x, y, dt)?;
    one(nan_min_max(cx, a, b, is_max))
}

fn maximum(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    min_max(cx, args, true)
}

fn minimum(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    min_max(cx, args, false)
}

fn atan2(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let dt = float_result(dt);
    let (a, b) = pair(cx, x, y, dt)?;
    one(cx.atan2(a, b))
}

// ---- comparison, logical, bitwise -------------------------------------------------------------

fn compare(cx: &mut Cx, args: &Args, dir: CmpDir) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let (a, b) = pair(cx, x, y, dt)?;
    one(cx.compare(dir, a, b))
}

fn logical(cx: &mut Cx, args: &Args, f: fn(&mut Cx, Value, Value) -> Value) -> Result<Vec<Out>> {
    let (x, y, _) = operands(args, "self", "other")?;
    let (a, b) = pair(cx, x, y, DType::Bool)?;
    one(f(cx, a, b))
}

fn logical_not(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let b = cx.cast(x.v, DType::Bool);
    one(cx.not(b))
}

fn bitwise(cx: &mut Cx, args: &Args, f: fn(&mut Cx, Value, Value) -> Value) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    check!(dt.is_integral(), NotImplemented, "\"bitwise_cpu\" not implemented for '{}'", dt.torch_name());
    let (a, b) = pair(cx, x, y, dt)?;
    one(f(cx, a, b))
}

fn bitwise_not(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_integral(), NotImplemented, "\"bitwise_not_cpu\" not implemented for '{}'", x.dtype.torch_name());
    one(cx.not(x.v))
}

// ---- unary -----------------------------------------------------------------------------------

/// A float op: integer inputs are computed in the default float dtype.
fn float_unary(cx: &mut Cx, args: &Args, f: impl FnOnce(&mut Cx, Value) -> Value) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dt = float_result(x.dtype);
    let v = cx.cast(x.v, dt);
    one(f(cx, v))
}

/// A float op with no integer version in PyTorch.
fn float_only(cx: &mut Cx, args: &Args, f: impl FnOnce(&mut Cx, Value) -> Value) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_float(), NotImplemented, "\"{}_cpu\" not implemented for '{}'", args.op, x.dtype.torch_name());
    one(f(cx, x.v))
}

/// Float math that CHLO provides under the op's own name (erfinv is chlo.erf_inv).
fn chlo_unary(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let chlo = if args.op == "erfinv" { "erf_inv" } else { args.op };
    float_unary(cx, args, |cx, x| cx.chlo(chlo, &[x]))
}

/// log2 as the binary exponent plus the log of the mantissa in [sqrt(1/2), sqrt(2)): exact at
/// powers of two and as accurate as log next to them, where log(x) / ln 2 is not (log2(8) gave
/// 2.9999998, so floor(log2(8)) gave 2, and MX recipes' ceil(log2(amax / 448)) picked another
/// block scale than CPU's). 16-bit floats go through float32, as on CPU.
fn log2(cx: &mut Cx, x: Value) -> Value {
    let dtype = cx.dtype(x);
    let (bits, mantissa, bias) = match dtype {
        DType::F32 => (DType::U32, 23, 127),
        DType::F64 => (DType::U64, 52, 1023),
        DType::F16 | DType::BF16 => {
            let wide = cx.cast(x, DType::F32);
            let l = log2(cx, wide);
            return cx.cast(l, dtype);
        }
        _ => return log_base(cx, x, 2.0),
    };
    let dims = cx.dims(x);
    let fallback = log_base(cx, x, 2.0);
    let (uint, float) = (bits.elem(), dtype.elem());
    let e = stablehlo::Ex::new(cx);
    let x_ = e.of(x);
    // Subnormals scaled into the normal range first, where the plugin keeps them (XLA:CPU
    // flushes them to zero: there log2 of one is -inf, as log's is).
    let smallest_normal = 2f64.powi(1 - bias as i32);
    let subnormal = x_.lt(smallest_normal);
    let scaled = subnormal.select(x_ * 2f64.powi(mantissa as i32), x_);
    let word = scaled.make(|b| b.bitcast_convert(scaled.v, uint));
    let field = word.make(|b| {
        let shift = b.splat_i64(mantissa, &stablehlo::TensorType::new(uint, &dims));
        b.shift_right_logical(word.v, shift)
    });
    let exponent = field.cast(float) - bias as f64;
    let exponent = subnormal.select(exponent - mantissa as f64, exponent);
    let one_bits = (bias as i64) << mantissa;
    let significand = (word & ((1i64 << mantissa) - 1)) | one_bits;
    let m = significand.make(|b| b.bitcast_convert(significand.v, float));
    let big = m.gt(std::f64::consts::SQRT_2);
    let (m, exponent) = (big.select(m * 0.5, m), big.select(exponent + 1.0, exponent));
    let r = exponent + m.ln() * std::f64::consts::LOG2_E;
    // Zero, negatives, infinities and NaN as log gives them.
    let finite_positive = x_.gt(0.0) & x_.is_finite();
    let v = finite_positive.select(r, fallback).v;
    drop(e);
    v
}

fn log_base(cx: &mut Cx, x: Value, base: f64) -> Value {
    let l = cx.log(x);
    let c = cx.full(1.0 / base.ln(), cx.dtype(x), &cx.dims(x));
    cx.mul(l, c)
}

fn trunc_value(cx: &mut Cx, x: Value) -> Value {
    let dims = cx.dims(x);
    let zero = cx.full(0.0, cx.dtype(x), &dims);
    let neg = cx.compare(CmpDir::Lt, x, zero);
    let c = cx.ceil(x);
    let f = cx.floor(x);
    cx.select(neg, c, f)
}

/// Rounding ops are the identity on integers.
fn rounding(cx: &mut Cx, args: &Args, f: fn(&mut Cx, Value) -> Value) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype != DType::Bool, NotImplemented, "\"{}_vml_cpu\" not implemented for 'Bool'", args.op);
    if x.dtype.is_integral() {
        return one(x.v);
    }
    one(f(cx, x.v))
}

fn round(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype != DType::Bool, NotImplemented, "\"round_vml_cpu\" not implemented for 'Bool'");
    let decimals = args.int_or("decimals", 0)?;
    if x.dtype.is_integral() && decimals == 0 {
        return one(x.v);
    }
    check!(x.dtype.is_float(), Runtime, "round with decimals is not supported for '{}'", x.dtype.torch_name());
    if decimals == 0 {
        return one(cx.round_nearest_even(x.v));
    }
    let dims = cx.dims(x.v);
    let scale = cx.full(10f64.powi(decimals.unsigned_abs() as i32), x.dtype, &dims);
    let (up, down): (fn(&mut Cx, Value, Value) -> Value, fn(&mut Cx, Value, Value) -> Value) =
        if decimals > 0 { (|c, a, b| c.mul(a, b), |c, a, b| c.div(a, b)) } else { (|c, a, b| c.div(a, b), |c, a, b| c.mul(a, b)) };
    let s = up(cx, x.v, scale);
    let r = cx.round_nearest_even(s);
    one(down(cx, r, scale))
}

fn neg(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    if x.dtype == DType::Bool {
        return Err(TorchError::new(
            crate::torch_version::bool_minus_error(),
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.",
        ));
    }
    one(cx.neg(x.v))
}

fn abs(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype != DType::Bool, NotImplemented, "\"abs_cpu\" not implemented for 'Bool'");
    if x.dtype.is_unsigned() {
        return one(x.v);
    }
    one(cx.abs(x.v))
}

fn sign(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    if x.dtype == DType::Bool {
        return one(x.v);
    }
    let s = cx.sign(x.v);
    if !x.dtype.is_float() {
        return one(s);
    }
    // PyTorch: sign(nan) = 0.
    let nan = is_nan(cx, x.v);
    let zero = cx.full(0.0, x.dtype, &cx.dims(x.v));
    one(cx.select(nan, zero, s))
}

// ---- selection and clamping -------------------------------------------------------------------

fn where_(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let cond = args.tensor("condition")?;
    check!(
        cond.dtype == DType::Bool || cond.dtype == DType::U8,
        Runtime,
        "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
        cond.dtype.torch_name()
    );
    let (x, y, dt) = operands(args, "self", "other")?;
    let c = cx.cast(cond.v, DType::Bool);
    let a = x.value(cx, dt);
    let b = y.value(cx, dt);
    let vs = cx.broadcast_all(&[c, a, b])?;
    one(cx.select(vs[0], vs[1], vs[2]))
}

fn clamp_values(cx: &mut Cx, args: &Args, lo: Option<Operand>, hi: Option<Operand>) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(lo.is_some() || hi.is_some(), Runtime, "torch.clamp: At least one of 'min' or 'max' must not be None");
    let mut ops = vec![(x.dtype, x.rank)];
    ops.extend(lo.iter().chain(hi.iter()).map(|o| o.promo()));
    let dt = result_type(&ops).unwrap();
    check!(dt != DType::Bool, NotImplemented, "\"clamp_cpu\" not implemented for 'Bool'");
    let mut vals = vec![cx.cast(x.v, dt)];
    for o in lo.iter().chain(hi.iter()) {
        vals.push(o.value(cx, dt));
    }
    let vs = cx.broadcast_all(&vals)?;
    let mut out = vs[0];
    let mut i = 1;
    // PyTorch: min(max(x, lo), hi), with NaN in x or a bound propagating.
    if lo.is_some() {
        out = nan_min_max(cx, out, vs[i], true);
        i += 1;
    }
    if hi.is_some() {
        out = nan_min_max(cx, out, vs[i], false);
    }
    one(out)
}

/// A clamp bound: a tensor, or a number (which PyTorch converts to double first).
fn opt_operand(args: &Args, name: &str) -> Result<Option<Operand>> {
    match args.get(name) {
        None | Some(Arg::None) => Ok(None),
        _ => match Operand::get(args, name)? {
            Operand::S(s) => Ok(Some(Operand::S(s.to_real(DType::F64)?))),
            t => Ok(Some(t)),
        },
    }
}

fn clamp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let lo = opt_operand(args, "min")?;
    let hi = opt_operand(args, "max")?;
    clamp_values(cx, args, lo, hi)
}

fn clamp_min(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let lo = opt_operand(args, "min")?;
    if let Some(v) = bool_clamp(cx, args, lo, Cx::or_)? {
        return one(v);
    }
    clamp_values(cx, args, lo, None)
}

fn clamp_max(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let hi = opt_operand(args, "max")?;
    if let Some(v) = bool_clamp(cx, args, hi, Cx::and_)? {
        return one(v);
    }
    clamp_values(cx, args, None, hi)
}

/// clamp_min.Tensor / clamp_max.Tensor of bool tensors: PyTorch's maximum / minimum kernels
/// (which the tensor overloads run) take bools: `or` / `and`. The number overloads raise.
fn bool_clamp(cx: &mut Cx, args: &Args, bound: Option<Operand>, f: fn(&mut Cx, Value, Value) -> Value) -> Result<Option<Value>> {
    let x = args.tensor("self")?;
    match bound {
        Some(Operand::T(b)) if x.dtype == DType::Bool && b.dtype == DType::Bool => {
            let vs = cx.broadcast_all(&[x.v, b.v])?;
            Ok(Some(f(cx, vs[0], vs[1])))
        }
        _ => Ok(None),
    }
}

fn masked_fill(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let mask = args.tensor("mask")?;
    check!(
        mask.dtype == DType::Bool,
        Runtime,
        "masked_fill_ only supports boolean masks, but got mask with dtype {}",
        mask.dtype.torch_name()
    );
    let value = match args.get("value") {
        Some(Arg::Tensor(t)) => {
            check!(
                cx.dims(t.v).is_empty(),
                Runtime,
                "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
                cx.dims(t.v).len()
            );
            if t.dtype.is_complex() && !x.dtype.is_complex() && x.dtype != DType::Bool {
                // CPU reads the value on the host and refuses an imaginary part; here the device
                // checks it, raising at the next synchronization (at the op in launch-blocking mode).
                let im = cx.imag(t.v);
                let im = cx.reshape(im, &[]);
                let zero = cx.full(0.0, t.dtype.to_real(), &[]);
                let imaginary = cx.compare(CmpDir::Ne, im, zero);
                let message = format!("value cannot be converted to type {} without overflow", convert_type_name(x.dtype));
                cx.add_condition_check(imaginary, ErrorKind::Runtime, message);
            }
            cx.cast(t.v, x.dtype)
        }
        _ => {
            let s = args.scalar("value")?.to_real(x.dtype)?;
            cx.scalar(s, x.dtype)
        }
    };
    let vs = cx.broadcast_all(&[x.v, mask.v, value])?;
    one(cx.select(vs[1], vs[2], vs[0]))
}

// ---- _add_relu ---------------------------------------------------------------------------------

/// _add_relu(self, other, alpha) (Tensor and Scalar overloads): clamp(self + alpha * other,
/// 0, max of self's dtype) in the promoted dtype, as PyTorch's add_clamp kernel computes it:
/// alpha converted to the result dtype unchecked (ints truncate it), NaN kept, +inf
/// clamped to the largest finite value of self's dtype.
fn add_relu(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    let xt = args.tensor("self")?;
    let (a, mut b) = pair(cx, x, y, dt)?;
    let hi = match xt.dtype {
        DType::I32 => i32::MAX as f64,
        DType::I64 => i64::MAX as f64,
        DType::I16 => i16::MAX as f64,
        DType::I8 => i8::MAX as f64,
        DType::F32 => f32::MAX as f64,
        DType::F64 => f64::MAX,
        d => bail!(Runtime, "false INTERNAL ASSERT FAILED at \"aten/src/ATen/native/BinaryOps.cpp\": Unsupported datatype for add_relu:{}", meta_name(d)),
    };
    if let Some(alpha) = args.opt_scalar("alpha")? {
        if !matches!(alpha, Scalar::Int(1) | Scalar::Bool(true)) {
            let s = cx.scalar(alpha, dt);
            let d = cx.dims(b);
            let s = cx.broadcast_in_dim(s, &d, &[]);
            b = cx.mul(b, s);
        }
    }
    let sum = cx.add(a, b);
    let dims = cx.dims(sum);
    let zero = cx.full(0.0, dt, &dims);
    let neg = cx.compare(CmpDir::Lt, sum, zero);
    let out = cx.select(neg, zero, sum);
    // An int64 maximum is the dtype's own (no clamp needed; f64 cannot carry it exactly).
    if xt.dtype == DType::I64 || (dt.is_integral() && hi >= dtype_max(dt)) {
        return one(out);
    }
    let top = cx.full(hi, dt, &dims);
    let big = cx.compare(CmpDir::Gt, out, top);
    one(cx.select(big, top, out))
}

/// The largest value of an integer dtype, as f64.
fn dtype_max(d: DType) -> f64 {
    match d {
        DType::U8 => u8::MAX as f64,
        DType::I8 => i8::MAX as f64,
        DType::I16 => i16::MAX as f64,
        DType::I32 => i32::MAX as f64,
        _ => i64::MAX as f64,
    }
}

// ---- conj_physical, isposinf/isneginf, equal ---------------------------------------------------

fn conj_physical(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    if !x.dtype.is_complex() {
        return one(x.v);
    }
    let re = cx.real(x.v);
    let im = cx.imag(x.v);
    let im = cx.neg(im);
    one(cx.complex(re, im))
}

fn is_signed_inf(cx: &mut Cx, args: &Args, inf: f64) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    if !x.dtype.is_float() {
        return one(cx.full(0.0, DType::Bool, &dims));
    }
    let v = cx.full(inf, x.dtype, &dims);
    one(cx.compare(CmpDir::Eq, x.v, v))
}

/// equal(self, other) -> bool: same shape and all elements equal (NaN is never equal).
fn equal(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("other")?;
    if cx.dims(a.v) != cx.dims(b.v) {
        return one(cx.b.constant_bool(false));
    }
    let dt = crate::promote(a.dtype, b.dtype);
    let (x, y) = (cx.cast(a.v, dt), cx.cast(b.v, dt));
    let eq = cx.compare(CmpDir::Eq, x, y);
    let all: Vec<i64> = (0..cx.dims(eq).len() as i64).collect();
    let init = cx.b.constant_bool(true);
    let r = cx.reduce(&[eq], &[init], &all, |b, v| vec![b.and(v[0], v[1])]);
    one(r[0])
}
