//! Special functions, one family per file: gamma.rs, logit.rs, ndtr.rs, bessel.rs and
//! polynomials.rs; math.rs holds the remaining elementwise math that shares their operand
//! handling. This file holds that handling and the series helpers they share.
//!
//! 16-bit floats are computed in float32 and rounded once, as PyTorch's CPU kernels upcast
//! them; the Cephes-derived algorithms follow PyTorch's ATen/native/Math.h.
pub(crate) mod bessel;
pub(crate) mod gamma;
pub(crate) mod logit;
pub(crate) mod math;
pub(crate) mod ndtr;
pub(crate) mod polynomials;

use crate::args::{Arg, Args, Tensor};
use crate::blocks::operands::{float_result, operands, pair};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out};
use stablehlo::{ElemType, Value, E};

// ---- operands and shared helpers ---------------------------------------------------------------

fn no_complex(d: DType, op: &str) -> Result<()> {
    check!(!d.is_complex(), NotImplemented, "{}: complex tensors are not supported on tpu yet", op);
    Ok(())
}

/// The operand of a unary op: `self`, or `x` in the schemas that name it so
/// (special_airy_ai, special_scaled_modified_bessel_k0, ...).
fn unary_operand(args: &Args) -> Result<Tensor> {
    match args.probe("x") {
        Some(Arg::Tensor(t)) if args.probe("self").is_none() => Ok(*t),
        _ => args.tensor("self"),
    }
}

/// A unary float op: integer inputs give float32; 16-bit floats compute in float32.
fn float_unary(cx: &mut Cx, args: &Args, f: impl FnOnce(&mut Cx, Value) -> Value) -> Result<Vec<Out>> {
    let x = unary_operand(args)?;
    no_complex(x.dtype, args.op)?;
    let dt = float_result(x.dtype);
    let v = cx.cast(x.v, dt.opmath());
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
    let (u, v) = pair(cx, x, y, dt.opmath())?;
    let r = f(cx, u, v);
    one(cx.cast(r, dt))
}

/// A binary op defined for floating dtypes only (no integer promotion to float).
fn floats_only_binary(cx: &mut Cx, args: &Args, kernel: &str, f: impl FnOnce(&mut Cx, Value, Value) -> Value) -> Result<Vec<Out>> {
    let (x, y, dt) = operands(args, "self", "other")?;
    no_complex(dt, args.op)?;
    check!(dt.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    let (u, v) = pair(cx, x, y, dt.opmath())?;
    let r = f(cx, u, v);
    one(cx.cast(r, dt))
}

/// Horner evaluation of coeffs[0] x^n + ... + coeffs[n] (Cephes polevl).
fn polevl<'e>(x: E<'e>, coeffs: &[f64]) -> E<'e> {
    let mut r = x.k(coeffs[0]);
    for &c in &coeffs[1..] {
        r = r * x + c;
    }
    r
}

/// Clenshaw evaluation of a Chebyshev series (Cephes chbevl).
fn chbevl<'e>(x: E<'e>, coeffs: &[f64]) -> E<'e> {
    let mut b0 = x.k(coeffs[0]);
    let mut b1 = x.k(0.0);
    let mut b2 = b1;
    for &c in &coeffs[1..] {
        b2 = b1;
        b1 = b0;
        b0 = x * b1 - b2 + c;
    }
    0.5 * (b0 - b2)
}

/// The unsigned integer type with the bit width of a float type.
fn bits_of(e: ElemType) -> (ElemType, i64) {
    match e {
        ElemType::F64 => (ElemType::U64, i64::MIN),
        ElemType::F32 => (ElemType::U32, 1 << 31),
        _ => (ElemType::U16, 1 << 15),
    }
}
