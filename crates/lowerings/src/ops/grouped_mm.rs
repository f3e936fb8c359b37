//! Grouped matrix products of mixture-of-experts layers, where consecutive runs of rows
//! (tokens sorted by expert) meet their own expert's weights: torch._grouped_mm, and the float8
//! and float4 forms torch._scaled_grouped_mm and F.scaled_grouped_mm (`_scaled_grouped_mm_v2`,
//! row-wise, MXFP8, MXFP4 and NVFP4 scales; PyTorch runs them on CUDA only). `offs`
//! holds the int32 end of each group; rows after the last end give zeros. One program per call
//! instead of PyTorch's composite (one product per group, after a host read of `offs`):
//! `chlo.ragged_dot` where the plugin compiles it (`set_ragged_dot`), else dense products of
//! every group that keep each row's own (G times the arithmetic; XLA:CPU has no ragged dot).
use crate::args::{Args, Tensor};
use crate::blocks::block_scales::{along_k, ceil_div, operand_values, round_up, swizzled_index, unswizzle_groups};
use crate::blocks::gather::{take_1d, take_along};
use crate::blocks::precision;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, op, Op, Out};
use std::sync::atomic::{AtomicBool, Ordering};
use stablehlo::{CmpDir, Ex, Value};

static RAGGED_DOT: AtomicBool = AtomicBool::new(false);

/// Whether the plugin compiles `chlo.ragged_dot` (set once by the engine for its platform).
pub fn set_ragged_dot(supported: bool) {
    RAGGED_DOT.store(supported, Ordering::Relaxed);
}

pub(crate) const OPS: &[Op] = &[
    // Routed: its composite runs one product per group after reading the offsets on the host.
    op("_grouped_mm", grouped_mm).routed(&["_grouped_mm"]),
    op("_scaled_grouped_mm", scaled_grouped_mm),
    op("_scaled_grouped_mm_v2", scaled_grouped_mm_v2).float4_mixes(),
];

/// Group sizes from group ends: [e0, e1 - e0, e2 - e1, ...].
fn group_sizes(cx: &mut Cx, offs: Value) -> Value {
    let g = cx.dims(offs)[0];
    let ends = cx.cast(offs, DType::I32);
    if g == 0 {
        return ends;
    }
    let zero = cx.full(0.0, DType::I32, &[1]);
    let head = cx.b.slice(ends, &[0], &[g - 1], &[1]);
    let starts = cx.b.concatenate(&[zero, head], 0);
    cx.b.sub(ends, starts)
}

/// The group of each position 0..P given group ends: int64 [P], G for positions past the last
/// end.
fn group_of(cx: &mut Cx, offs: Value, positions: i64) -> Value {
    let g = cx.dims(offs)[0];
    let ends = cx.cast(offs, DType::I64);
    let ty = stablehlo::TensorType { elem: DType::I64.elem(), dims: vec![positions, g] };
    let pos = cx.b.iota(&ty, 0);
    let ends = cx.b.broadcast_in_dim(ends, &[positions, g], &[1]);
    // group(p) = number of ends <= p.
    let past = cx.b.compare(CmpDir::Le, ends, pos);
    let past = cx.cast(past, DType::I64);
    crate::blocks::reduce::reduce(cx, past, &[1], crate::blocks::reduce::Red::Sum)
}

/// One-hot group membership [P, G] (f32 0/1) of positions 0..P given group ends; positions
/// past the last end belong to no group.
fn membership(cx: &mut Cx, offs: Value, positions: i64, acc: DType) -> Value {
    let g = cx.dims(offs)[0];
    let group = group_of(cx, offs, positions);
    let group = cx.b.broadcast_in_dim(group, &[positions, g], &[0]);
    let ty = stablehlo::TensorType { elem: DType::I64.elem(), dims: vec![positions, g] };
    let col = cx.b.iota(&ty, 1);
    let member = cx.b.compare(CmpDir::Eq, group, col);
    cx.cast(member, acc)
}

fn transpose_last(cx: &mut Cx, v: Value) -> Value {
    let n = cx.dims(v).len() as i64;
    let mut perm: Vec<i64> = (0..n).collect();
    perm.swap(n as usize - 1, n as usize - 2);
    cx.b.transpose(v, &perm)
}

/// (self, mat2, offs?, bias?, out_dtype?) -> Tensor
fn grouped_mm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    let offs: Option<Tensor> = args.opt_tensor("offs")?;
    check!(args.opt_tensor("bias")?.is_none(), Runtime, "Bias tensor provided, but it is not supported yet.");
    check!(
        a.dtype == b.dtype && a.dtype.is_float(),
        Runtime,
        "Expected mat_a and mat_b to have the same floating-point dtype, got mat_a.dtype={} and mat_b.dtype={}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    let out_dtype = args.dtype("out_dtype")?.unwrap_or(a.dtype);
    check!(out_dtype.is_float(), Runtime, "_grouped_mm: out_dtype must be a floating-point dtype");
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(
        matches!(ad.len(), 2 | 3) && matches!(bd.len(), 2 | 3),
        Runtime,
        "Multiplicands must be 2D or 3D but got mat_a.dim()={} and mat_b.dim()={}",
        ad.len(),
        bd.len()
    );
    let (a2, b2) = (ad.len() == 2, bd.len() == 2);
    if !(a2 && b2) {
        check!(ad[ad.len() - 1] == bd[bd.len() - 2], Runtime, "contraction dimension of mat_a and mat_b must match");
    }
    let acc = a.dtype.opmath().elem();
    precision::set_for(cx, a.dtype);
    let out = if !a2 && !b2 {
        check!(offs.is_none(), Runtime, "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.");
        check!(ad[0] == bd[0], Runtime, "batched dimension has to match");
        product(cx, a.v, b.v, None, acc)
    } else {
        let Some(offs) = offs else {
            bail!(Runtime, "Offsets tensor not provided, but is needed for {}D/{}D multiplicand layouts.", ad.len(), bd.len());
        };
        check!(cx.dims(offs.v).len() == 1, Runtime, "Offsets tensor must be 1D, but got offs.dim()={}.", cx.dims(offs.v).len());
        check!(
            offs.dtype == DType::I32,
            Runtime,
            "Offsets tensor must be integer (int32) tensor, but got {}.",
            offs.dtype.torch_name()
        );
        let g = cx.dims(offs.v)[0];
        match (a2, b2) {
            (true, false) => check!(g == bd[0], Runtime, "matrix batch sizes have to match"),
            (true, true) => check!(ad[1] == bd[0], Runtime, "contraction dimension of mat_a and mat_b must match"),
            _ => check!(g == ad[0], Runtime, "matrix batch sizes have to match"),
        }
        product(cx, a.v, b.v, Some(offs.v), acc)
    };
    one(cx.cast(out, out_dtype))
}

/// The grouped product of `a` and `b` summed in `acc`: batched for 3d-3d (no `offs`), else by
/// the groups `offs` ends.
fn product(cx: &mut Cx, a: Value, b: Value, offs: Option<Value>, acc: stablehlo::ElemType) -> Value {
    let (a2, b2) = (cx.dims(a).len() == 2, cx.dims(b).len() == 2);
    match offs {
        None => cx.b.dot_general(a, b, &[0], &[0], &[2], &[1], acc),
        Some(offs) if RAGGED_DOT.load(Ordering::Relaxed) => ragged(cx, a, b, offs, a2, b2, acc),
        Some(offs) => dense(cx, a, b, offs, a2, b2, acc),
    }
}

/// The grouped product as one `chlo.ragged_dot`.
fn ragged(cx: &mut Cx, a: Value, b: Value, offs: Value, a2: bool, b2: bool, acc: stablehlo::ElemType) -> Value {
    let sizes = group_sizes(cx, offs);
    match (a2, b2) {
        // Rows of a grouped, one expert matrix per group: [M, K] x [G, K, N] -> [M, N].
        (true, false) => cx.b.ragged_dot(a, b, sizes, 1, 1, 0, Some(0), acc),
        // The shared dim grouped (the weight gradient): [M, K] x [K, N] -> [G, M, N].
        (true, true) => cx.b.ragged_dot(a, b, sizes, 1, 0, 1, None, acc),
        // Columns of b grouped: [G, M, K] x [K, N] -> [M, N], as [N, K] x [G, K, M] -> [N, M].
        _ => {
            let bt = transpose_last(cx, b);
            let at = transpose_last(cx, a);
            let r = cx.b.ragged_dot(bt, at, sizes, 1, 1, 0, Some(0), acc);
            transpose_last(cx, r)
        }
    }
}

/// The grouped product from every group's dense product, keeping each position's own group.
fn dense(cx: &mut Cx, a: Value, b: Value, offs: Value, a2: bool, b2: bool, acc: stablehlo::ElemType) -> Value {
    let acc_dt = DType::from_elem(acc);
    let (ad, bd) = (cx.dims(a), cx.dims(b));
    match (a2, b2) {
        // [M, K] x [G, K, N]: all [M, G, N], then row m keeps group(m).
        (true, false) => {
            let all = cx.b.dot_general(a, b, &[], &[], &[1], &[1], acc);
            let member = membership(cx, offs, ad[0], acc_dt);
            cx.b.dot_general(member, all, &[0], &[0], &[1], &[1], acc)
        }
        // [M, K] x [K, N] grouped along K: a masked per group [G, M, K] x b -> [G, M, N].
        (true, true) => {
            let member = membership(cx, offs, ad[1], acc_dt);
            let g = cx.dims(member)[1];
            let mask = cx.b.transpose(member, &[1, 0]);
            let mask = cx.cast(mask, DType::from_elem(cx.b.elem(a)));
            let mask = cx.b.broadcast_in_dim(mask, &[g, ad[0], ad[1]], &[0, 2]);
            let ab = cx.b.broadcast_in_dim(a, &[g, ad[0], ad[1]], &[1, 2]);
            let masked = cx.b.mul(ab, mask);
            cx.b.dot_general(masked, b, &[], &[], &[2], &[0], acc)
        }
        // [G, M, K] x [K, N] grouped along N: all [G, M, N], then column n keeps group(n).
        _ => {
            let all = cx.b.dot_general(a, b, &[], &[], &[2], &[0], acc);
            let member = membership(cx, offs, bd[1], acc_dt);
            let r = cx.b.dot_general(all, member, &[2], &[0], &[0], &[1], acc);
            cx.b.transpose(r, &[1, 0])
        }
    }
}

/// PyTorch's ScalingType and SwizzleType numbering (F.scaled_grouped_mm's recipes).
const TENSOR_WISE: i64 = 0;
const ROW_WISE: i64 = 1;
const BLOCK_1X16: i64 = 2;
const BLOCK_1X32: i64 = 3;
const SWIZZLE_32_4_4: i64 = 1;

/// (self, mat2, scale_a, scale_b, offs?, bias?, scale_result?, out_dtype?, use_fast_accum) ->
/// Tensor: float8 e4m3 operands with float32 row-wise scales or MXFP8's float8_e8m0fnu block
/// scales, as CUDA's kernels take them, with their checks and messages. As bfloat16.
fn scaled_grouped_mm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (a, b) = (args.tensor("self")?, args.tensor("mat2")?);
    let offs = args.opt_tensor("offs")?;
    check_scaled_operands(cx, args, &a, &b, offs.as_ref())?;
    check!(args.opt_tensor("scale_result")?.is_none(), Value, "Scale result not supported yet");
    check_offsets(cx, &a, &b, offs.as_ref())?;
    let (sa, sb) = (args.tensor("scale_a")?, args.tensor("scale_b")?);
    let f32_scales = sa.dtype == DType::F32 && sb.dtype == DType::F32;
    let mx_scales = sa.dtype == DType::F8E8M0FNU && sb.dtype == DType::F8E8M0FNU;
    check!(
        f32_scales || mx_scales,
        Value,
        "For FP8 tensorwise and rowwise, both scales must both be float32 tensors. For MXFP8, scales must both be float8_e8m0fnu tensors."
    );
    if mx_scales {
        check_block_scales(cx, (&a, &b), (&sa, &sb))?;
    } else {
        check_row_scales(cx, args, (&a, &b), (&sa, &sb), offs.as_ref())?;
    }
    check!(
        args.dtype("out_dtype")?.is_none_or(|d| d == DType::BF16),
        Value,
        "Only bf16 high precision output types are supported for grouped gemm"
    );
    if mx_scales && a.dtype == DType::F8E4M3FN && b.dtype == DType::F8E4M3FN {
        return block_scaled(cx, (&a, &b), (&sa, &sb), None, offs.as_ref(), 32);
    }
    check!(f32_scales, Value, "For grouped FP8 rowwise, both scales must be float32 tensors");
    check_float8_operands(&a, &b)?;
    row_scaled(cx, (&a, &b), (&sa, &sb), offs.as_ref())
}

/// (self, mat2, scale_a[], recipe_a[], swizzle_a[], scale_b[], recipe_b[], swizzle_b[], offs?,
/// bias?, out_dtype?, contraction_dim[], use_fast_accum) -> Tensor: `F.scaled_grouped_mm`,
/// with CUDA's checks: the row-wise and MXFP8 recipes as `_scaled_grouped_mm`, and MXFP4 and
/// NVFP4 on float4 operands.
fn scaled_grouped_mm_v2(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (a, b) = (args.tensor("self")?, args.tensor("mat2")?);
    let offs = args.opt_tensor("offs")?;
    let contraction = args.ints("contraction_dim")?;
    check!(
        contraction.is_empty(),
        NotImplemented,
        "torchtpu: _scaled_grouped_mm_v2 with contraction_dim={:?} is not supported yet",
        contraction
    );
    check_scaled_operands(cx, args, &a, &b, offs.as_ref())?;
    check_offsets(cx, &a, &b, offs.as_ref())?;
    check!(
        args.dtype("out_dtype")?.is_none_or(|d| d == DType::BF16),
        Value,
        "Only bf16 high precision output types are supported for grouped gemm"
    );
    let (sa, sb) = (args.tensors("scale_a")?, args.tensors("scale_b")?);
    let (ra, rb) = (args.ints("recipe_a")?, args.ints("recipe_b")?);
    let float8 = |d: DType| matches!(d, DType::F8E4M3FN | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ);
    let (e4m3, fp4) = (DType::F8E4M3FN, DType::F4E2M1FNX2);
    let mats = |d: DType| a.dtype == d && b.dtype == d;
    let dtypes = |list: &[Tensor], want: &[DType]| list.len() == want.len() && list.iter().zip(want).all(|(t, d)| t.dtype == *d);
    let recipes = |r: &[i64]| ra.as_slice() == r && rb.as_slice() == r;
    // CUDA's recipes, tried in its order: row-wise, MXFP8, MXFP4, NVFP4.
    if recipes(&[ROW_WISE]) && float8(a.dtype) && float8(b.dtype) && dtypes(&sa, &[DType::F32]) && dtypes(&sb, &[DType::F32]) {
        check_row_scales(cx, args, (&a, &b), (&sa[0], &sb[0]), offs.as_ref())?;
        check_float8_operands(&a, &b)?;
        return row_scaled(cx, (&a, &b), (&sa[0], &sb[0]), offs.as_ref());
    }
    let mx = recipes(&[BLOCK_1X32]) && dtypes(&sa, &[DType::F8E8M0FNU]) && dtypes(&sb, &[DType::F8E8M0FNU]);
    let nv = recipes(&[BLOCK_1X16, TENSOR_WISE]) && dtypes(&sa, &[e4m3, DType::F32]) && dtypes(&sb, &[e4m3, DType::F32]);
    let (block, globals) = match () {
        _ if mx && (mats(e4m3) || mats(fp4)) => (32, None),
        _ if nv && mats(fp4) => (16, Some((&sa[1], &sb[1]))),
        _ => bail!(Value, "No gemm implementation was found"),
    };
    check_block_scales(cx, (&a, &b), (&sa[0], &sb[0]))?;
    if mats(e4m3) {
        let swizzles = (args.ints("swizzle_a")?, args.ints("swizzle_b")?);
        check!(
            swizzles.0.first() == Some(&SWIZZLE_32_4_4) && swizzles.1.first() == Some(&SWIZZLE_32_4_4),
            Value,
            "For CUDA MXFP8 grouped gemm, both scale swizzle types must be SWIZZLE_32_4_4"
        );
    }
    block_scaled(cx, (&a, &b), (&sa[0], &sb[0]), globals, offs.as_ref(), block)
}

/// The row-wise kernel's operands: float8 e4m3.
fn check_float8_operands(a: &Tensor, b: &Tensor) -> Result<()> {
    for mat in [a, b] {
        check!(mat.dtype == DType::F8E4M3FN, Value, "Expected mat_a to be Float8_e4m3 matrix got {}", mat.dtype.torch_name());
    }
    Ok(())
}

/// CUDA's checks of a scaled grouped product's operands, in its order: mat_a row-major and
/// mat_b column-major (eager calls; a compiled graph's tracing checked them), 2-d or 3-d,
/// contraction sizes, sizes divisible by 16, no bias, offsets exactly for the layouts with a
/// 2-d operand.
fn check_scaled_operands(cx: &Cx, args: &Args, a: &Tensor, b: &Tensor, offs: Option<&Tensor>) -> Result<()> {
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(matches!(ad.len(), 2 | 3), Value, "mat_a has to be 2 or 3d");
    check!(matches!(bd.len(), 2 | 3), Value, "mat_b has to be 2 or 3d");
    if let (Some(sa), Some(sb)) = (args.strides_of("self", 0), args.strides_of("mat2", 0)) {
        check!(!column_major(&ad, sa, a.dtype)?, Value, "Expected mat1 to not be transposed");
        check!(column_major(&bd, sb, b.dtype)?, Value, "Expected mat2 to be transposed");
    }
    let (a2, b2) = (ad.len() == 2, bd.len() == 2);
    if !(a2 && b2) {
        check!(ad[ad.len() - 1] == bd[bd.len() - 2], Value, "contraction dimension of mat_a and mat_b must match");
    }
    check!(
        ad[ad.len() - 1] % 16 == 0,
        Value,
        "Expected trailing dimension of mat_a to be divisible by 16 but got mat1 shape: ({}).",
        shape_str(&ad)
    );
    check!(
        bd[bd.len() - 2] % 16 == 0 && bd[bd.len() - 1] % 16 == 0,
        Value,
        "Expected mat_b shape to be divisible by 16 but got mat_b shape: ({}).",
        shape_str(&bd)
    );
    check!(args.opt_tensor("bias")?.is_none(), Value, "Bias not supported yet");
    check!(offs.is_some() == (a2 || b2), Value, "Have to provide offsets if there is a 2d matrix");
    Ok(())
}

/// Whether a matrix (its last two dims) is stored column-major, with CUDA's errors for a
/// layout that is neither, or whose leading stride is not a multiple of 16 bytes.
fn column_major(dims: &[i64], strides: &[i64], dtype: DType) -> Result<bool> {
    let n = dims.len();
    let alignment = (16 / dtype.size().max(1)) as i64;
    let (rows, cols, row_stride, col_stride) = (dims[n - 2], dims[n - 1], strides[n - 2], strides[n - 1]);
    let (column, lead) = if row_stride == 1 && col_stride >= rows.max(1) {
        (true, col_stride)
    } else if col_stride == 1 && row_stride >= cols.max(1) {
        (false, row_stride)
    } else {
        bail!(Runtime, "Invalid strides/sizes, got {} for strides and {} for sizes", shape_str(strides), shape_str(dims));
    };
    check!(lead % alignment == 0, Runtime, "strides should be multiple of 16 bytes");
    Ok(column)
}

/// The offsets' rank and dtype, and the group count against the 3-d operand's.
fn check_offsets(cx: &Cx, a: &Tensor, b: &Tensor, offs: Option<&Tensor>) -> Result<()> {
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    let Some(offs) = offs else {
        check!(ad[0] == bd[0], Runtime, "batched dimension has to match");
        return Ok(());
    };
    check!(cx.dims(offs.v).len() == 1, Value, "offs has to be 1D");
    check!(offs.dtype == DType::I32, Value, "Offsets have to be int32");
    let g = cx.dims(offs.v)[0];
    match (ad.len(), bd.len()) {
        (2, 3) => check!(g == bd[0], Runtime, "matrix batch sizes have to match"),
        (3, 2) => check!(g == ad[0], Runtime, "matrix batch sizes have to match"),
        _ => {}
    }
    Ok(())
}

/// CUDA's checks of float32 row-wise scales: one per row of a 2-d mat_a and per column of a
/// 2-d mat_b (per group and row or column when both are 2-d), (G, rows) and (G, columns) for a
/// 3-d one.
fn check_row_scales(cx: &Cx, args: &Args, mats: (&Tensor, &Tensor), scales: (&Tensor, &Tensor), offs: Option<&Tensor>) -> Result<()> {
    let both_2d = cx.dims(mats.0.v).len() == 2 && cx.dims(mats.1.v).len() == 2;
    let multiplier = if both_2d { offs.map_or(1, |o| cx.dims(o.v)[0]) } else { 1 };
    for (arg, name, mat, scale) in [(0, "scale_a", mats.0, scales.0), (1, "scale_b", mats.1, scales.1)] {
        let (md, sd) = (cx.dims(mat.v), cx.dims(scale.v));
        let strides = args.strides_of(name, 0);
        if md.len() == 2 {
            check!(sd.len() == 1, Runtime, "scale must be a 1D tensor, but got {}D, arg {}", sd.len(), arg);
            check!(strides.is_none_or(|s| sd[0] <= 1 || s[0] == 1), Runtime, "scale must be contiguous for arg {}", arg);
            check!(sd[0] == md[arg] * multiplier, Runtime, "scale must have the same length as mat for arg {}", arg);
        } else {
            check!(sd.len() == 2, Runtime, "scale must be a 2D tensor, but got {}D for arg {}", sd.len(), arg);
            check!(strides.is_none_or(|s| s[1] == 1), Runtime, "scale must be contiguous in the last dimension for arg {}", arg);
            check!(sd[0] == md[0], Runtime, "scale must have the same batch dimension as mat for arg {}", arg);
            check!(sd[1] == md[1 + arg], Runtime, "scale must have the same first dimension as mat for arg {}", arg);
        }
    }
    Ok(())
}

/// The grouped product with row-wise scales: summed in float32, times scale_a's element for
/// the output's row and scale_b's for its column (each the group's own where the operand is
/// grouped), as bfloat16.
fn row_scaled(cx: &mut Cx, mats: (&Tensor, &Tensor), scales: (&Tensor, &Tensor), offs: Option<&Tensor>) -> Result<Vec<Out>> {
    let (a, b) = (mats.0.v, mats.1.v);
    let (ad, bd) = (cx.dims(a), cx.dims(b));
    let offs = offs.map(|o| o.v);
    // float8 values are exact in float32 (and in bfloat16: any matmul precision is exact).
    let (a, b) = if RAGGED_DOT.load(Ordering::Relaxed) { (a, b) } else { (cx.cast(a, DType::F32), cx.cast(b, DType::F32)) };
    let product = product(cx, a, b, offs, stablehlo::ElemType::F32);
    let out_dims = cx.dims(product);
    let (sa, sb) = (cx.cast(scales.0.v, DType::F32), cx.cast(scales.1.v, DType::F32));
    let (sa, sb) = match (ad.len(), bd.len(), offs) {
        // Rows grouped: scale_a per row, scale_b (G, N) by each row's group.
        (2, 3, Some(offs)) => {
            let rows = by_group(cx, sb, offs, ad[0]);
            (cx.b.broadcast_in_dim(sa, &out_dims, &[0]), rows)
        }
        // Columns grouped: scale_a (G, M) by each column's group, scale_b per column.
        (3, 2, Some(offs)) => {
            let cols = by_group(cx, sa, offs, bd[1]);
            (cx.b.transpose(cols, &[1, 0]), cx.b.broadcast_in_dim(sb, &out_dims, &[1]))
        }
        // A product per group (K grouped, or batched): scales per group, row and column.
        _ => {
            let g = out_dims[0];
            let (sa, sb) = (cx.b.reshape(sa, &[g, out_dims[1]]), cx.b.reshape(sb, &[g, out_dims[2]]));
            (cx.b.broadcast_in_dim(sa, &out_dims, &[0, 1]), cx.b.broadcast_in_dim(sb, &out_dims, &[0, 2]))
        }
    };
    let out = cx.b.mul(product, sa);
    let out = cx.b.mul(out, sb);
    one(cx.cast(out, DType::BF16))
}

/// The rows of `scales` (G, n) for positions 0..P by the group each is in: (P, n). Positions
/// past the last group take the last group's (their product is zero).
fn by_group(cx: &mut Cx, scales: Value, offs: Value, positions: i64) -> Value {
    let g = cx.dims(offs)[0];
    let group = group_of(cx, offs, positions);
    let last = cx.full((g - 1).max(0) as f64, DType::I64, &[positions]);
    let group = cx.b.min(group, last);
    take_along(cx, scales, 0, group)
}

/// CUDA's checks of block scales (MXFP8, MXFP4, NVFP4): a 2-d operand's are 2-d with at least
/// a row per row of the operand (per column of mat_b) — the groups' segments, whose sizes depend
/// on the offsets; a 3-d operand's are (G, one swizzled (N, K blocks) matrix per group).
fn check_block_scales(cx: &Cx, mats: (&Tensor, &Tensor), scales: (&Tensor, &Tensor)) -> Result<()> {
    for (arg, mat, scale) in [(0, mats.0, scales.0), (1, mats.1, scales.1)] {
        let (md, sd) = (cx.dims(mat.v), cx.dims(scale.v));
        if md.len() == 2 {
            check!(
                sd.len() == 2,
                Runtime,
                "for block-scaled, scale must have same number of dimensions as parent tensor, but got mat.dim() = 2 and scale.dim() = {} for arg {}",
                sd.len(),
                arg
            );
            check!(
                sd[0] >= md[arg],
                Runtime,
                "for block-scaled, arg {} tensor shape ({}, {}) must have scale.shape[0] >= {} but got scale.shape=({}, {})",
                arg,
                md[0],
                md[1],
                md[arg],
                sd[0],
                sd[1]
            );
        } else {
            let (g, k, n) = (md[0], unpacked(mat.dtype, md[1]), md[2]);
            let block = if mat.dtype == DType::F4E2M1FNX2 && scale.dtype == DType::F8E4M3FN { 16 } else { 32 };
            let (bk, bn) = (round_up(k / block, 4), round_up(n, 128));
            check!(
                sd.len() == 2,
                Runtime,
                "for block-scaled 2d-3d grouped GEMM, the 3d tensor of shape (G,K,N) must have a 2d scale of shape (G, blocked_scale_K * blocked_scale_N),but scale is {}D for arg {}",
                sd.len(),
                arg
            );
            check!(
                sd[0] == g && sd[1] == bk * bn,
                Runtime,
                "for block-scaled grouped GEMM, the tensor shape ({}, {}, {}) must have scale shape ({},{},{}) for arg {}, got: {}, {}",
                g,
                k,
                n,
                g,
                bk,
                bn,
                arg,
                sd[0],
                sd[1]
            );
        }
    }
    Ok(())
}

/// K of an operand: twice its size for float4 pairs.
fn unpacked(dtype: DType, size: i64) -> i64 {
    if dtype == DType::F4E2M1FNX2 {
        2 * size
    } else {
        size
    }
}

/// The grouped product with block scales (2d-3d: tokens grouped; 2d-2d: K grouped, the offsets
/// counting values, not float4 bytes): each operand decoded and scaled per element in float32
/// (exact for MX's power-of-two scales), multiplied by group, times NVFP4's per-group global
/// scales, as bfloat16.
fn block_scaled(cx: &mut Cx, mats: (&Tensor, &Tensor), scales: (&Tensor, &Tensor), globals: Option<(&Tensor, &Tensor)>, offs: Option<&Tensor>, block: i64) -> Result<Vec<Out>> {
    let (a, b) = mats;
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(ad.len() == 2, Value, "MXFP8 grouped GEMM currently only supports 2d-2d and 2d-3d cases");
    let Some(offs) = offs else { bail!(Value, "MXFP8 2d-2d and 2d-3d grouped GEMMs requires offsets") };
    // K and the offsets count values: float4 operands hold two per byte along K.
    let k = unpacked(a.dtype, ad[1]);
    let (m, g) = (ad[0], cx.dims(offs.v)[0]);
    let af = operand_values(cx, a, 1);
    let (af, bf) = if bd.len() == 3 {
        let n = bd[2];
        let sa = segment_scales(cx, scales.0.v, offs.v, m, k, block, Grouped::Rows);
        let bf = operand_values(cx, b, 1);
        // (G, N, K blocks) per group, spread along K: (G, K, N).
        let kb = ceil_div(k, block);
        let per = unswizzle_groups(cx, scales.1.v, g, n, kb);
        let per = cx.b.reshape(per, &[g * n, kb]);
        let sb = along_k(cx, per, block, k);
        let sb = cx.b.reshape(sb, &[g, n, k]);
        let sb = cx.b.transpose(sb, &[0, 2, 1]);
        (cx.b.mul(af, sa), cx.b.mul(bf, sb))
    } else {
        let n = bd[1];
        let sa = segment_scales(cx, scales.0.v, offs.v, m, k, block, Grouped::K);
        let sb = segment_scales(cx, scales.1.v, offs.v, n, k, block, Grouped::K);
        let sb = cx.b.transpose(sb, &[1, 0]);
        let bf = operand_values(cx, b, 0);
        (cx.b.mul(af, sa), cx.b.mul(bf, sb))
    };
    let mut out = product(cx, af, bf, Some(offs.v), stablehlo::ElemType::F32);
    if let Some((ga, gb)) = globals {
        // NVFP4's global scales: one per group and operand.
        let (ga, gb) = (cx.cast(ga.v, DType::F32), cx.cast(gb.v, DType::F32));
        let global = cx.b.mul(ga, gb);
        let dims = cx.dims(out);
        let per = if bd.len() == 3 {
            let column = cx.b.reshape(global, &[g, 1]);
            let rows = by_group(cx, column, offs.v, m);
            cx.b.broadcast_in_dim(rows, &dims, &[0, 1])
        } else {
            cx.b.broadcast_in_dim(global, &dims, &[0])
        };
        out = cx.b.mul(out, per);
    }
    one(cx.cast(out, DType::BF16))
}

fn flatten(cx: &mut Cx, v: Value) -> Value {
    let n = cx.numel(v);
    cx.b.reshape(v, &[n])
}

/// Which dim of a 2-d operand its groups run along.
#[derive(Copy, Clone, PartialEq)]
enum Grouped {
    /// The rows (2d-3d's mat_a: tokens by expert).
    Rows,
    /// K (2d-2d: a weight gradient's tokens).
    K,
}

/// A 2-d operand's block scales per element, (rows, k) float32 (k unpacked), from CUDA's layout
/// of a grouped operand's `scales`: each group's (rows, K blocks) scale matrix swizzled
/// on its own (SWIZZLE_32_4_4, padded to 128-row, 4-column tiles), the groups' segments one
/// after another: along the rows, each group's segment starts at a row of the (rows, `width`)
/// buffer; along K, right after the previous group's tiles. Elements in no group get scale 0.
fn segment_scales(cx: &mut Cx, scales: Value, offs: Value, rows: i64, k: i64, block: i64, grouped: Grouped) -> Value {
    let width = cx.dims(scales)[1];
    let flat = flatten(cx, scales);
    let positions = if grouped == Grouped::Rows { rows } else { k };
    let sizes = group_sizes(cx, offs);
    let sizes = cx.cast(sizes, DType::I64);
    let ends = cx.cast(offs, DType::I64);
    let groups = cx.dims(offs)[0];
    // Per group: its start, its scale matrix's 4-column tiles, and where its segment begins.
    let ty = stablehlo::TensorType { elem: stablehlo::ElemType::I64, dims: vec![rows, k] };
    let e = Ex::new(cx);
    let (sizes_e, ends_e) = (e.of(sizes), e.of(ends));
    let starts = (ends_e - sizes_e).v;
    let col_tiles = match grouped {
        Grouped::Rows => {
            let tiles = round_up(ceil_div(k, block), 4) / 4;
            e.full(tiles as f64, &stablehlo::TensorType { elem: stablehlo::ElemType::I64, dims: vec![groups] }).v
        }
        Grouped::K => (((sizes_e + (block - 1)) / block + 3i64) / 4i64).v,
    };
    let segment = match grouped {
        // A group's rows, padded to whole tiles, in a buffer `width` scales wide.
        Grouped::Rows => (((sizes_e + 127i64) / 128i64) * (128 * width)).v,
        Grouped::K => (e.of(col_tiles) * (round_up(rows, 128) * 4)).v,
    };
    drop(e);
    let segment_ends = crate::blocks::gather::cumsum_1d(cx, segment);
    let segment_starts = cx.b.sub(segment_ends, segment);
    let group = group_of(cx, offs, positions);
    let last = cx.full((groups - 1).max(0) as f64, DType::I64, &[positions]);
    let count = cx.full(groups as f64, DType::I64, &[positions]);
    let in_group = cx.b.compare(CmpDir::Lt, group, count);
    let group = cx.b.min(group, last);
    let per_position = |cx: &mut Cx, v: Value| take_1d(cx, v, group);
    let (start, tiles, base) = (per_position(cx, starts), per_position(cx, col_tiles), per_position(cx, segment_starts));
    let along = if grouped == Grouped::Rows { 0 } else { 1 };
    let spread = |cx: &mut Cx, v: Value| cx.b.broadcast_in_dim(v, &[rows, k], &[along]);
    let (start, tiles, base, in_group) = (spread(cx, start), spread(cx, tiles), spread(cx, base), spread(cx, in_group));
    let (row, col) = (cx.b.iota(&ty, 0), cx.b.iota(&ty, 1));
    let e = Ex::new(cx);
    let [row, col, start, tiles, base] = e.all([row, col, start, tiles, base]);
    let (r, c) = match grouped {
        Grouped::Rows => (row - start, col / block),
        Grouped::K => (row, (col - start) / block),
    };
    let index = (base + swizzled_index(r, c, tiles)).v;
    drop(e);
    let scales = take_1d(cx, flat, index);
    let scales = cx.cast(scales, DType::F32);
    let zero = cx.full(0.0, DType::F32, &[rows, k]);
    cx.b.select(in_group, scales, zero)
}
