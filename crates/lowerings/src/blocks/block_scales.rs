//! Block scales of the low-precision recipes (MXFP8, MXFP4, NVFP4): float4 values unpacked,
//! cuBLAS's swizzled scale layout read back, and scales spread over their blocks' elements.
use crate::args::Tensor;
use crate::cx::Cx;
use crate::dtype::DType;
use stablehlo::{Ex, Value};

pub(crate) fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

pub(crate) fn round_up(a: i64, b: i64) -> i64 {
    ceil_div(a, b) * b
}

/// float4_e2m1fn_x2 bytes as float32 values, twice as many along `dim`: each byte's low nibble
/// first, as PyTorch's and cuBLAS's packing has them. An e2m1 code is a sign bit, a 2-bit
/// exponent (bias 1) and a 1-bit mantissa: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
pub(crate) fn float4_values(cx: &mut Cx, v: Value, dim: usize) -> Value {
    let mut dims = cx.dims(v);
    let bytes = cx.b.convert(v, stablehlo::ElemType::I32);
    let e = Ex::new(cx);
    let byte = e.of(bytes);
    let codes: Vec<Value> = [byte & 15i64, byte / 16i64]
        .iter()
        .map(|&code| {
            let mantissa = (code & 1i64).cast(stablehlo::ElemType::F32);
            let exponent = ((code / 2i64) & 3i64).cast(stablehlo::ElemType::F32);
            let normal = (exponent - 1.0).exp2() * (mantissa * 0.5 + 1.0);
            let magnitude = exponent.eq(0.0).select(mantissa * 0.5, normal);
            (code & 8i64).ne(0i64).select(-magnitude, magnitude).v
        })
        .collect();
    drop(e);
    // (.., n, ..) low and high values -> (.., n, 2, ..) -> (.., 2n, ..).
    let mut pair = dims.clone();
    pair.insert(dim + 1, 1);
    let parts: Vec<Value> = codes.iter().map(|&c| cx.b.reshape(c, &pair)).collect();
    let pairs = cx.b.concatenate(&parts, dim as i64 + 1);
    dims[dim] *= 2;
    cx.b.reshape(pairs, &dims)
}

/// An operand's values in float32; float4 pairs unpacked along `k_dim`.
pub(crate) fn operand_values(cx: &mut Cx, t: &Tensor, k_dim: usize) -> Value {
    if t.dtype == DType::F4E2M1FNX2 {
        float4_values(cx, t.v, k_dim)
    } else {
        cx.cast(t.v, DType::F32)
    }
}

/// cuBLAS's block-scaling-factor layout (SWIZZLE_32_4_4) read back as float32 scales of
/// `rows` x `cols`: the matrix padded to 128-row, 4-column tiles, the tiles in row-major order,
/// each stored as 32 x 16 with element (r, c) of the tile at [r % 32][(r / 32) * 4 + c].
pub(crate) fn unswizzle(cx: &mut Cx, v: Value, rows: i64, cols: i64) -> Value {
    let all = unswizzle_groups(cx, v, 1, rows, cols);
    cx.b.reshape(all, &[rows, cols])
}

/// `groups` matrices in the swizzled layout one after another (a grouped product's 3-d
/// operand): (groups, rows, cols), float32.
pub(crate) fn unswizzle_groups(cx: &mut Cx, v: Value, groups: i64, rows: i64, cols: i64) -> Value {
    let (tile_rows, tile_cols) = (ceil_div(rows, 128), ceil_div(cols, 4));
    let v = cx.cast(v, DType::F32);
    let tiles = cx.b.reshape(v, &[groups, tile_rows, tile_cols, 32, 4, 4]);
    // (tile row, tile column, r % 32, r / 32, c) -> (tile row, r / 32, r % 32, tile column, c)
    let ordered = cx.b.transpose(tiles, &[0, 1, 4, 3, 2, 5]);
    let padded = cx.b.reshape(ordered, &[groups, tile_rows * 128, tile_cols * 4]);
    cx.b.slice(padded, &[0, 0, 0], &[groups, rows, cols], &[1, 1, 1])
}

/// Where element (r, c) of a matrix with `col_tiles` 4-column tiles sits in the swizzled layout
/// (integer values of any shape, as expressions).
pub(crate) fn swizzled_index<'e>(r: stablehlo::E<'e>, c: stablehlo::E<'e>, col_tiles: stablehlo::E<'e>) -> stablehlo::E<'e> {
    ((r / 128i64) * col_tiles + c / 4i64) * 512i64 + (r % 32i64) * 16i64 + ((r % 128i64) / 32i64) * 4i64 + c % 4i64
}

/// Scales (rows, ceil(k / block)) spread over each block's elements: (rows, k), float32.
pub(crate) fn along_k(cx: &mut Cx, scales: Value, block: i64, k: i64) -> Value {
    let rows = cx.dims(scales)[0];
    let blocks = ceil_div(k, block);
    let scales = cx.cast(scales, DType::F32);
    let scales = cx.b.slice(scales, &[0, 0], &[rows, blocks], &[1, 1]);
    let spread = cx.b.broadcast_in_dim(scales, &[rows, blocks, block], &[0, 1]);
    let flat = cx.b.reshape(spread, &[rows, blocks * block]);
    cx.b.slice(flat, &[0, 0], &[rows, k], &[1, 1])
}
