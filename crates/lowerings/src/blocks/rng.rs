//! Draws from the device generator shared by several families: `uniform01`, uniform floats in
//! [0, 1) from the call's generator state.
use crate::args::Args;
use crate::cx::Cx;
use crate::error::Result;
use stablehlo::{ElemType, RngAlgorithm, TensorType, Value};

/// Uniform floats in [0, 1) of `dims`, in f32 (f64 for double outputs), from the call's state.
pub(crate) fn uniform01(cx: &mut Cx, args: &Args, dims: &[i64], double: bool) -> Result<Value> {
    let state = args.generator("generator")?;
    let (bits_elem, float_elem, shift, one_bits) =
        if double { (ElemType::U64, ElemType::F64, 12, 0x3FF0_0000_0000_0000i64) } else { (ElemType::U32, ElemType::F32, 9, 0x3F80_0000i64) };
    let (_, bits) = cx.rng_bit_generator(RngAlgorithm::ThreeFry, state, &TensorType { elem: bits_elem, dims: dims.to_vec() });
    // Mantissa bits under exponent 0 give [1, 2); subtract one.
    let sh = cx.b.splat_i64(shift, &TensorType { elem: bits_elem, dims: dims.to_vec() });
    let m = cx.shift_right_logical(bits, sh);
    let e = cx.b.splat_i64(one_bits, &TensorType { elem: bits_elem, dims: dims.to_vec() });
    let f = cx.or(m, e);
    let f = cx.bitcast_convert(f, float_elem);
    let one_ = cx.b.splat_f64(1.0, &TensorType { elem: float_elem, dims: dims.to_vec() });
    Ok(cx.sub(f, one_))
}
