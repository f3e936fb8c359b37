//! Scaled float8 matrix products (`torch._scaled_mm`, `F.scaled_mm`), what float8 training and
//! inference recipes call: one dot_general on the float8 operands, summed in float32, then the
//! scales. PyTorch's CPU kernel (the reference) scales the operands first and multiplies in
//! float32; the scales factor out of each row's and column's sum, so both agree to float32
//! rounding.
use crate::args::{Args, Tensor};
use crate::blocks::contract::contract;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::{ErrorKind, Result, TorchError};
use crate::{bail, check, one, op, Op, Out};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[op("_scaled_mm", scaled_mm), op("_scaled_mm_v2", scaled_mm_v2)];

fn is_float8(d: DType) -> bool {
    use DType::*;
    matches!(d, F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ | F8E8M0FNU)
}

/// How the scales apply (PyTorch's ScalingType): one per matrix, or one per row of a and
/// column of b.
#[derive(Copy, Clone, PartialEq)]
enum Scaling {
    TensorWise,
    RowWise,
}

/// Contiguous strides of `dims` (what PyTorch's message prints for a dense scale).
fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1].max(1);
    }
    s
}

/// PyTorch's get_joint_scaling: tensor-wise on both sides, or row-wise on both, else its error.
fn joint_scaling(cx: &Cx, a: &Tensor, b: &Tensor, sa: &Tensor, sb: &Tensor) -> Result<Scaling> {
    let (ad, bd, sad, sbd) = (cx.dims(a.v), cx.dims(b.v), cx.dims(sa.v), cx.dims(sb.v));
    let float8 = is_float8(a.dtype) && is_float8(b.dtype);
    let f32_scales = sa.dtype == DType::F32 && sb.dtype == DType::F32;
    let numel = |d: &[i64]| d.iter().product::<i64>();
    if float8 && f32_scales && numel(&sad) == 1 && numel(&sbd) == 1 {
        return Ok(Scaling::TensorWise);
    }
    // Row-wise: scale_a is (M, 1) and scale_b is (1, N).
    if float8 && f32_scales && sad == [ad[0], 1] && sbd == [1, bd[1]] {
        return Ok(Scaling::RowWise);
    }
    let (ss, sbs) = (strides(&sad), strides(&sbd));
    bail!(
        Value,
        "Invalid scaling configuration.\n\
         - For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n\
         - For RowWise scaling, a and b should be float8, scales should be float, scale_a should be ({}, 1) and \
         scale_b should be (1, {}), and both should be contiguous.\n\
         Got mat_a.dtype()={}, scale_a.dtype()={}, scale_a.size()={}, scale_a.stride()={}, mat_b.dtype()={}, \
         scale_b.dtype()={}, scale_b.size()={} and scale_b.stride()={}",
        ad[0],
        bd[1],
        a.dtype.torch_name(),
        sa.dtype.torch_name(),
        shape_str(&sad),
        shape_str(&ss),
        b.dtype.torch_name(),
        sb.dtype.torch_name(),
        shape_str(&sbd),
        shape_str(&sbs)
    );
}

/// (self, mat2, scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum) -> Tensor.
/// `use_fast_accum` changes nothing: the sum is always float32.
fn scaled_mm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    let sa = args.tensor("scale_a")?;
    let sb = args.tensor("scale_b")?;
    let out_dtype = args.dtype("out_dtype")?;
    check!(cx.dims(a.v).len() == 2, Runtime, "mat1 must be a matrix");
    check!(cx.dims(b.v).len() == 2, Runtime, "mat2 must be a matrix");
    if let (Some(d), Some(out)) = (out_dtype, args.opt_tensor("out")?) {
        check!(d == out.dtype, Value, "out_dtype must match output matrix type");
    }
    let scaling = joint_scaling(cx, &a, &b, &sa, &sb)?;
    check_product_shapes(cx, &a, &b, ErrorKind::Runtime)?;
    let scale_result = args.opt_tensor("scale_result")?;
    if let Some(r) = &scale_result {
        check!(cx.numel(r.v) == 1 && r.dtype == DType::F32, Runtime, "scale_result must be a float scalar");
    }
    let bias = args.opt_tensor("bias")?;
    check_bias_size(cx, &b, bias.as_ref(), ErrorKind::Runtime)?;
    // PyTorch applies scale_result (as its reciprocal) only for a float8 out_dtype it was given.
    let scale_result = scale_result.filter(|_| matches!(out_dtype, Some(DType::F8E4M3FN | DType::F8E5M2)));
    one(scaled_product(cx, &a, &b, scaling, &sa, &sb, bias, scale_result, out_dtype.unwrap_or(a.dtype)))
}

/// (self, mat2, scale_a[], recipe_a[], swizzle_a[], scale_b[], recipe_b[], swizzle_b[], bias?,
/// out_dtype?, contraction_dim[], use_fast_accum) -> Tensor: `F.scaled_mm`. Tensor-wise and
/// row-wise recipes, as PyTorch's CPU kernel; swizzles are ignored there too.
fn scaled_mm_v2(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(ad.len() == 2, Value, "mat_a must be a matrix");
    check!(bd.len() == 2, Value, "mat_b must be a matrix");
    check!(
        is_float8(a.dtype) && is_float8(b.dtype),
        Value,
        "Expected both inputs to be fp8 or fp4 types but got mat_a.dtype={} and mat_b.dtype={}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    let contraction = args.ints("contraction_dim")?;
    check!(
        contraction.is_empty() || contraction == [1, 0],
        NotImplemented,
        "torchtpu: _scaled_mm_v2 with contraction_dim={:?} is not supported yet",
        contraction
    );
    check_product_shapes(cx, &a, &b, ErrorKind::Value)?;
    let bias = args.opt_tensor("bias")?;
    check_bias_size(cx, &b, bias.as_ref(), ErrorKind::Value)?;
    if let Some(bias) = &bias {
        check!(
            matches!(bias.dtype, DType::F32 | DType::BF16 | DType::F16),
            Value,
            "Bias must be Float32 or BFloat16 or Half, but got {}",
            bias.dtype.torch_name()
        );
    }
    let (sa, sb) = (args.tensors("scale_a")?, args.tensors("scale_b")?);
    let (ra, rb) = (args.ints("recipe_a")?, args.ints("recipe_b")?);
    // PyTorch's ScalingType numbering: 0 TensorWise, 1 RowWise.
    let scaling = match (ra.as_slice(), rb.as_slice(), sa.as_slice(), sb.as_slice()) {
        ([0], [0], [x], [y]) if x.dtype == DType::F32 && y.dtype == DType::F32 && cx.numel(x.v) == 1 && cx.numel(y.v) == 1 => {
            Some(Scaling::TensorWise)
        }
        ([1], [1], [x], [y]) if x.dtype == DType::F32 && y.dtype == DType::F32 => {
            let (xd, yd) = (cx.dims(x.v), cx.dims(y.v));
            check!(xd == [ad[0], 1], Value, "scale_a must have shape [{}, 1], got [{}]", ad[0], shape_str(&xd));
            check!(yd == [1, bd[1]], Value, "scale_b must have shape [1, {}], got [{}]", bd[1], shape_str(&yd));
            Some(Scaling::RowWise)
        }
        _ => None,
    };
    let Some(scaling) = scaling else {
        bail!(
            Value,
            "Invalid scaling configuration for _scaled_mm_v2: unsupported recipe(s). Got mat_a.dtype={}, \
             mat_b.dtype={}, recipe_a.size()={}, recipe_b.size()={}",
            a.dtype.torch_name(),
            b.dtype.torch_name(),
            ra.len(),
            rb.len()
        );
    };
    let out_dtype = args.dtype("out_dtype")?.unwrap_or(a.dtype);
    one(scaled_product(cx, &a, &b, scaling, &sa[0], &sb[0], bias, None, out_dtype))
}

/// PyTorch's check that a (M, K) and b (K, N) multiply; `_scaled_mm` raises it as a
/// RuntimeError, `_scaled_mm_v2` as a ValueError.
fn check_product_shapes(cx: &Cx, a: &Tensor, b: &Tensor, kind: ErrorKind) -> Result<()> {
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    if ad[1] != bd[0] {
        let message = format!("mat_a and mat_b shapes cannot be multiplied ({}x{} and {}x{})", ad[0], ad[1], bd[0], bd[1]);
        return Err(TorchError::new(kind, message));
    }
    Ok(())
}

/// A bias has one element per column of the product.
fn check_bias_size(cx: &Cx, b: &Tensor, bias: Option<&Tensor>, kind: ErrorKind) -> Result<()> {
    let (n, got) = (cx.dims(b.v)[1], bias.map_or(0, |t| cx.numel(t.v)));
    if bias.is_some() && got != n {
        return Err(TorchError::new(kind, format!("Bias must be size {n} but got {got}")));
    }
    Ok(())
}

/// (a @ b) * scales (+ bias) (/ scale_result), in float32, as `out_dtype`.
#[allow(clippy::too_many_arguments)]
fn scaled_product(
    cx: &mut Cx,
    a: &Tensor,
    b: &Tensor,
    scaling: Scaling,
    sa: &Tensor,
    sb: &Tensor,
    bias: Option<Tensor>,
    scale_result: Option<Tensor>,
    out_dtype: DType,
) -> Value {
    let (m, n) = (cx.dims(a.v)[0], cx.dims(b.v)[1]);
    let product = if a.dtype == b.dtype {
        contract(cx, a.v, b.v, (&[], &[]), (&[1], &[0]))
    } else {
        // Mixed formats (e4m3 x e5m2): float32 holds both exactly.
        let (af, bf) = (cx.cast(a.v, DType::F32), cx.cast(b.v, DType::F32));
        contract(cx, af, bf, (&[], &[]), (&[1], &[0]))
    };
    let product = cx.cast(product, DType::F32);
    let (sa, sb) = match scaling {
        Scaling::TensorWise => (as_scalar(cx, sa.v), as_scalar(cx, sb.v)),
        Scaling::RowWise => (sa.v, sb.v),
    };
    let sa = cx.b.broadcast_to(sa, &[m, n]);
    let sb = cx.b.broadcast_to(sb, &[m, n]);
    let mut out = cx.b.mul(product, sa);
    out = cx.b.mul(out, sb);
    if let Some(bias) = bias {
        let bias = cx.cast(bias.v, DType::F32);
        let bias = cx.b.broadcast_to(bias, &[m, n]);
        out = cx.b.add(out, bias);
    }
    if let Some(r) = scale_result {
        let r = as_scalar(cx, r.v);
        let one_ = cx.full(1.0, DType::F32, &[]);
        let inv = cx.b.div(one_, r);
        let inv = cx.b.broadcast_to(inv, &[m, n]);
        out = cx.b.mul(out, inv);
    }
    cx.cast(out, out_dtype)
}

/// A one-element tensor as a 0-d value.
fn as_scalar(cx: &mut Cx, v: Value) -> Value {
    cx.b.reshape(v, &[])
}
