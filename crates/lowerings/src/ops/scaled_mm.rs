//! Scaled float8 and float4 matrix products (`torch._scaled_mm`, `F.scaled_mm`), what float8
//! and float4 training and inference recipes call: one dot_general on the float8 operands,
//! summed in float32, then the scales. PyTorch's CPU kernel (the reference) scales the operands
//! first and multiplies in float32; the scales factor out of each row's and column's sum, so
//! both agree to float32 rounding. Block-wise scales (MXFP8, MXFP4, NVFP4 and DeepSeek-style
//! recipes, which PyTorch's CPU kernel does not run) vary along the sum: the operands are
//! scaled first, as CUDA's recipes define them, and multiplied in float32. float4_e2m1fn_x2
//! operands hold two values per byte along K (the low nibble first), so their K is twice their
//! size. `use_fast_accum` changes nothing: the sum is always float32.
use crate::args::{contiguous_strides, is_contiguous, Args, Tensor};
use crate::blocks::block_scales::{along_k, ceil_div, operand_values, round_up, unswizzle};
use crate::blocks::contract::contract;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::{ErrorKind, Result, TorchError};
use crate::{bail, check, one, op, Op, Out};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[op("_scaled_mm", scaled_mm).float4_mixes(), op("_scaled_mm_v2", scaled_mm_v2).float4_mixes()];

fn is_float8(d: DType) -> bool {
    use DType::*;
    matches!(d, F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ | F8E8M0FNU)
}

/// How the scales apply (PyTorch's ScalingType): one per matrix, one per row of a and
/// column of b, or per block (each operand's float32 scale per element, (M, K) and (K, N),
/// and for NVFP4's two-level form the product of both operands' float32 scales).
#[derive(Copy, Clone, PartialEq)]
enum Scaling {
    TensorWise,
    RowWise,
    Blocks { a: Value, b: Value, global: Option<Value> },
}

/// PyTorch's ScalingType and SwizzleType numbering.
const TENSOR_WISE: i64 = 0;
const ROW_WISE: i64 = 1;
const BLOCK_1X16: i64 = 2;
const BLOCK_1X32: i64 = 3;
const BLOCK_1X128: i64 = 4;
const BLOCK_128X128: i64 = 5;
const SWIZZLE_32_4_4: i64 = 1;

/// PyTorch's get_joint_scaling: tensor-wise on both sides, row-wise on both, or CUDA's MX
/// (1x32) or NVFP4 (1x16) block scales in cuBLAS's swizzled layout, else CPU's error.
fn joint_scaling(cx: &mut Cx, a: &Tensor, b: &Tensor, sa: &Tensor, sb: &Tensor, layouts: (&[i64], &[i64])) -> Result<Scaling> {
    let (ad, bd, sad, sbd) = (cx.dims(a.v), cx.dims(b.v), cx.dims(sa.v), cx.dims(sb.v));
    let contiguous = is_contiguous(&sad, layouts.0) && is_contiguous(&sbd, layouts.1);
    let float8 = is_float8(a.dtype) && is_float8(b.dtype);
    let f32_scales = sa.dtype == DType::F32 && sb.dtype == DType::F32;
    let numel = |d: &[i64]| d.iter().product::<i64>();
    if float8 && f32_scales && numel(&sad) == 1 && numel(&sbd) == 1 {
        return Ok(Scaling::TensorWise);
    }
    // Row-wise: scale_a is (M, 1) and scale_b is (1, N), both contiguous.
    if float8 && f32_scales && sad == [ad[0], 1] && sbd == [1, bd[1]] && contiguous {
        check_row_strides(layouts)?;
        return Ok(Scaling::RowWise);
    }
    // Block-wise, as CUDA's is_blockwise_1x32_scaling and is_blockwise_1x16_scaling: the
    // operands' formats and the scales' dtype and count say which.
    let fp4 = a.dtype == DType::F4E2M1FNX2 && b.dtype == DType::F4E2M1FNX2;
    let k = unpacked_k(cx, a, b);
    let counts = |block| (swizzled_count(ad[0], k, block), swizzled_count(bd[1], k, block));
    let mx = (float8 || fp4) && sa.dtype == DType::F8E8M0FNU && sb.dtype == DType::F8E8M0FNU;
    let nv = fp4 && sa.dtype == DType::F8E4M3FN && sb.dtype == DType::F8E4M3FN;
    for (block, matches) in [(32, mx), (16, nv)] {
        if matches && (numel(&sad), numel(&sbd)) == counts(block) {
            let (ea, eb) = swizzled_scales(cx, (sa, sb), (ad[0], bd[1]), block, k);
            return Ok(Scaling::Blocks { a: ea, b: eb, global: None });
        }
    }
    let (ss, sbs) = layouts;
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
        shape_str(ss),
        b.dtype.torch_name(),
        sb.dtype.torch_name(),
        shape_str(&sbd),
        shape_str(sbs)
    );
}

/// Row-wise scales are read with unit stride along their second dim, whatever its size.
fn check_row_strides(layouts: (&[i64], &[i64])) -> Result<()> {
    for (name, strides) in [("scale_a", layouts.0), ("scale_b", layouts.1)] {
        check!(strides[1] == 1, Value, "expected {}.stride(1) to be 1, but got {}", name, strides[1]);
    }
    Ok(())
}

/// A scale's strides (the first of a list's): the call's view in eager mode, dense in a
/// compiled graph (whose tracing checked the layout).
fn layout(cx: &Cx, args: &Args, name: &str, t: &Tensor) -> Vec<i64> {
    args.strides_of(name, 0).map_or_else(|| contiguous_strides(&cx.dims(t.v)), <[i64]>::to_vec)
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
    check_product_shapes(cx, &a, &b, ErrorKind::Runtime)?;
    let layouts = (layout(cx, args, "scale_a", &sa), layout(cx, args, "scale_b", &sb));
    let scaling = joint_scaling(cx, &a, &b, &sa, &sb, (&layouts.0, &layouts.1))?;
    let scale_result = args.opt_tensor("scale_result")?;
    if let Some(r) = &scale_result {
        check!(cx.numel(r.v) == 1 && r.dtype == DType::F32, Runtime, "scale_result must be a float scalar");
    }
    let bias = args.opt_tensor("bias")?;
    check_bias_size(cx, &b, bias.as_ref(), ErrorKind::Runtime)?;
    // PyTorch applies scale_result (as its reciprocal) only for a float8 out_dtype it was given.
    let scale_result = scale_result.filter(|_| matches!(out_dtype, Some(DType::F8E4M3FN | DType::F8E5M2)));
    let out_dtype = result_dtype(out_dtype.unwrap_or(a.dtype))?;
    one(scaled_product(cx, &a, &b, scaling, &sa, &sb, bias, scale_result, out_dtype))
}

/// (self, mat2, scale_a[], recipe_a[], swizzle_a[], scale_b[], recipe_b[], swizzle_b[], bias?,
/// out_dtype?, contraction_dim[], use_fast_accum) -> Tensor: `F.scaled_mm`. Tensor-wise and
/// row-wise recipes as PyTorch's CPU kernel (swizzles are ignored there too); MXFP8, MXFP4,
/// NVFP4 and the DeepSeek-style 1x128 and 128x128 recipes as CUDA's (`block_scales`).
fn scaled_mm_v2(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(ad.len() == 2, Value, "mat_a must be a matrix");
    check!(bd.len() == 2, Value, "mat_b must be a matrix");
    let fp8_or_fp4 = |d: DType| is_float8(d) || d == DType::F4E2M1FNX2;
    check!(
        fp8_or_fp4(a.dtype) && fp8_or_fp4(b.dtype),
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
    let swizzles = (args.ints("swizzle_a")?, args.ints("swizzle_b")?);
    let float8 = is_float8(a.dtype) && is_float8(b.dtype);
    let scaling = match (ra.as_slice(), rb.as_slice(), sa.as_slice(), sb.as_slice()) {
        ([TENSOR_WISE], [TENSOR_WISE], [x], [y])
            if float8 && x.dtype == DType::F32 && y.dtype == DType::F32 && cx.numel(x.v) == 1 && cx.numel(y.v) == 1 =>
        {
            Some(Scaling::TensorWise)
        }
        ([ROW_WISE], [ROW_WISE], [x], [y]) if float8 && x.dtype == DType::F32 && y.dtype == DType::F32 => {
            let (xd, yd) = (cx.dims(x.v), cx.dims(y.v));
            check!(xd == [ad[0], 1], Value, "scale_a must have shape [{}, 1], got [{}]", ad[0], shape_str(&xd));
            check!(yd == [1, bd[1]], Value, "scale_b must have shape [1, {}], got [{}]", bd[1], shape_str(&yd));
            check_row_strides((&layout(cx, args, "scale_a", x), &layout(cx, args, "scale_b", y)))?;
            Some(Scaling::RowWise)
        }
        (ra, rb, sa, sb) => block_scales(cx, &a, &b, (ra, rb), (sa, sb), &swizzles)?,
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
    let out_dtype = result_dtype(args.dtype("out_dtype")?.unwrap_or(a.dtype))?;
    one(scaled_product(cx, &a, &b, scaling, &sa[0], &sb[0], bias, None, out_dtype))
}

/// The product's dtype; float4 pairs are no result type (no kernel writes them).
fn result_dtype(d: DType) -> Result<DType> {
    check!(d != DType::F4E2M1FNX2, NotImplemented, "torchtpu: a scaled matrix product cannot give Float4_e2m1fn_x2 results; pass out_dtype");
    Ok(d)
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
    if let Scaling::Blocks { a: ea, b: eb, global } = scaling {
        // Scaled operands in float32 (a float8 or float4 value times MX's power-of-two scale
        // is exact there; times a float8 or float32 scale, rounded once), summed in float32.
        let af = operand_values(cx, a, 1);
        let af = cx.b.mul(af, ea);
        let bf = operand_values(cx, b, 0);
        let bf = cx.b.mul(bf, eb);
        let mut product = contract(cx, af, bf, (&[], &[]), (&[1], &[0]));
        if let Some(global) = global {
            let global = cx.b.broadcast_to(global, &[m, n]);
            product = cx.b.mul(product, global);
        }
        return finish(cx, product, bias, scale_result, out_dtype);
    }
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
        _ => (sa.v, sb.v),
    };
    let sa = cx.b.broadcast_to(sa, &[m, n]);
    let sb = cx.b.broadcast_to(sb, &[m, n]);
    let out = cx.b.mul(product, sa);
    let out = cx.b.mul(out, sb);
    finish(cx, out, bias, scale_result, out_dtype)
}

/// The scaled float32 product plus the bias, over scale_result, as `out_dtype`.
fn finish(cx: &mut Cx, mut out: Value, bias: Option<Tensor>, scale_result: Option<Tensor>, out_dtype: DType) -> Value {
    let (m, n) = (cx.dims(out)[0], cx.dims(out)[1]);
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

/// F.scaled_mm's block-wise recipes, with the checks and messages PyTorch gives for CUDA (its
/// CPU kernel runs none of them): MX (one float8_e8m0fnu scale per 32 elements along K:
/// MXFP8 on float8_e4m3fn operands, MXFP4 on float4 ones), NVFP4 (float4 operands, one
/// float8_e4m3fn scale per 16 elements, and in its two-level form a float32 scale per operand
/// too), MX and NVFP4 scales in the SWIZZLE_32_4_4 layout cuBLAS reads, and DeepSeek's
/// (float8_e4m3fn operands, float32 scales per 1x128 or 128x128 block). Gives each operand's
/// scales per element; None where the recipes are none of these.
fn block_scales(cx: &mut Cx, a: &Tensor, b: &Tensor, recipes: (&[i64], &[i64]), scales: (&[Tensor], &[Tensor]), swizzles: &(Vec<i64>, Vec<i64>)) -> Result<Option<Scaling>> {
    let (block, scale_dtype) = match recipes {
        ([BLOCK_1X32], [BLOCK_1X32]) => (32, DType::F8E8M0FNU),
        ([BLOCK_1X16], [BLOCK_1X16]) | ([BLOCK_1X16, TENSOR_WISE], [BLOCK_1X16, TENSOR_WISE]) => (16, DType::F8E4M3FN),
        ([r], [q]) => {
            return match scales {
                ([x], [y]) => deepseek_blocks(cx, a, b, (*r, *q), (x, y)),
                _ => Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let (m, n) = (cx.dims(a.v)[0], cx.dims(b.v)[1]);
    let k = unpacked_k(cx, a, b);
    let levels = recipes.0.len();
    if levels == 2 {
        check!(
            scales.0.len() == 2 && scales.1.len() == 2,
            Value,
            "Two-level NVFP4 scaling requires 2 scale tensors per side, got {} and {}",
            scales.0.len(),
            scales.1.len()
        );
    }
    for (name, list, rows) in [("scale_a", scales.0, m), ("scale_b", scales.1, n)] {
        let want = swizzled_count(rows, k, block);
        let got = list.first().map_or(0, |s| cx.numel(s.v));
        let global_ok = levels == 1 || (cx.numel(list[1].v) == 1 && list[1].dtype == DType::F32);
        let ok = list.len() == levels && got == want && list.first().is_some_and(|s| s.dtype == scale_dtype) && global_ok;
        check!(ok, Value, "For Blockwise scaling {} should have {} elements, got: {}", name, want, got);
    }
    for (name, list) in [("swizzle_a", &swizzles.0), ("swizzle_b", &swizzles.1)] {
        let plural = if levels == 1 { "" } else { "s" };
        check!(list.len() == levels, Value, "{} must have {} value{}, got {}", name, levels, plural, list.len());
    }
    check!(swizzles.0[0] == SWIZZLE_32_4_4, Value, "scale_a must be swizzled to SWIZZLE_32_4_4 format");
    check!(swizzles.1[0] == SWIZZLE_32_4_4, Value, "scale_b must be swizzled to SWIZZLE_32_4_4 format");
    // CUDA's kernels: MXFP8 multiplies float8_e4m3fn operands, MXFP4 and NVFP4 float4 ones.
    let fp4 = a.dtype == DType::F4E2M1FNX2 && b.dtype == DType::F4E2M1FNX2;
    let e4m3 = a.dtype == DType::F8E4M3FN && b.dtype == DType::F8E4M3FN;
    if !(fp4 || (block == 32 && e4m3)) {
        return Ok(None);
    }
    let (ea, eb) = swizzled_scales(cx, (&scales.0[0], &scales.1[0]), (m, n), block, k);
    let global = (levels == 2).then(|| {
        let (ga, gb) = (as_scalar(cx, scales.0[1].v), as_scalar(cx, scales.1[1].v));
        cx.b.mul(ga, gb)
    });
    Ok(Some(Scaling::Blocks { a: ea, b: eb, global }))
}

/// The DeepSeek-style recipes: float8_e4m3fn operands, float32 scales per 1x128 block of one
/// operand and per 1x128 or 128x128 block of the other.
fn deepseek_blocks(cx: &mut Cx, a: &Tensor, b: &Tensor, recipes: (i64, i64), scales: (&Tensor, &Tensor)) -> Result<Option<Scaling>> {
    let (sa, sb) = scales;
    let e4m3 = a.dtype == DType::F8E4M3FN && b.dtype == DType::F8E4M3FN;
    let deepseek = matches!(recipes, (BLOCK_1X128, BLOCK_1X128) | (BLOCK_1X128, BLOCK_128X128) | (BLOCK_128X128, BLOCK_1X128));
    if !(deepseek && e4m3 && sa.dtype == DType::F32 && sb.dtype == DType::F32) {
        return Ok(None);
    }
    let (m, k, n) = (cx.dims(a.v)[0], cx.dims(a.v)[1], cx.dims(b.v)[1]);
    let ea = deepseek_scales(cx, "scale_a", sa, recipes.0, m, k)?;
    let eb = deepseek_scales(cx, "scale_b", sb, recipes.1, n, k)?;
    let eb = cx.b.transpose(eb, &[1, 0]);
    Ok(Some(Scaling::Blocks { a: ea, b: eb, global: None }))
}

/// K of the product: twice the operands' size where both hold float4 pairs.
fn unpacked_k(cx: &Cx, a: &Tensor, b: &Tensor) -> i64 {
    let k = cx.dims(a.v)[1];
    if a.dtype == DType::F4E2M1FNX2 && b.dtype == DType::F4E2M1FNX2 {
        2 * k
    } else {
        k
    }
}

/// How many scales an MX or NVFP4 operand of `rows` rows carries: its (rows, K blocks) matrix
/// padded to whole 128x4 tiles.
fn swizzled_count(rows: i64, k: i64, block: i64) -> i64 {
    round_up(rows, 128) * round_up(ceil_div(k, block), 4)
}

/// MX or NVFP4 scales in the swizzled layout, per element: a's (M, K) and b's (K, N).
fn swizzled_scales(cx: &mut Cx, scales: (&Tensor, &Tensor), rows: (i64, i64), block: i64, k: i64) -> (Value, Value) {
    let kb = ceil_div(k, block);
    let per_a = unswizzle(cx, scales.0.v, rows.0, kb);
    let per_b = unswizzle(cx, scales.1.v, rows.1, kb);
    let ea = along_k(cx, per_a, block, k);
    let eb = along_k(cx, per_b, block, k);
    (ea, cx.b.transpose(eb, &[1, 0]))
}

/// A DeepSeek-style operand's float32 scales per element, (rows, k), after CUDA's shape check:
/// a 1x128 recipe's scales are (rows, K blocks), a 128x128 one's (K blocks rounded up to 4, row
/// blocks).
fn deepseek_scales(cx: &mut Cx, name: &str, scales: &Tensor, recipe: i64, rows: i64, k: i64) -> Result<Value> {
    let kb = ceil_div(k, 128);
    let want = if recipe == BLOCK_1X128 { [rows, kb] } else { [round_up(kb, 4), ceil_div(rows, 128)] };
    let got = cx.dims(scales.v);
    check!(got == want, Value, "{} must have shape {} x {} Float elements, got {}", name, want[0], want[1], shape_str(&got));
    Ok(if recipe == BLOCK_1X128 { along_k(cx, scales.v, 128, k) } else { square_blocks(cx, scales.v, rows, k) })
}

/// 128x128-block scales, stored (round_up(k blocks, 4), row blocks) as CUDA's recipe has them,
/// spread over each block's elements: (rows, k), float32.
fn square_blocks(cx: &mut Cx, scales: Value, rows: i64, k: i64) -> Value {
    let (row_blocks, k_blocks) = (ceil_div(rows, 128), ceil_div(k, 128));
    let scales = cx.cast(scales, DType::F32);
    let used = cx.b.slice(scales, &[0, 0], &[k_blocks, row_blocks], &[1, 1]);
    let by_row = cx.b.transpose(used, &[1, 0]);
    let spread = cx.b.broadcast_in_dim(by_row, &[row_blocks, 128, k_blocks, 128], &[0, 2]);
    let flat = cx.b.reshape(spread, &[row_blocks * 128, k_blocks * 128]);
    cx.b.slice(flat, &[0, 0], &[rows, k], &[1, 1])
}
