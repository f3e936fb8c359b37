//! Jagged nested tensors (layout=torch.jagged) to and from dense ones. A jagged tensor is its
//! values [total, ...] and offsets [B + 1] (sequence b is values[offsets[b]..offsets[b + 1]]);
//! to_padded_tensor pads it to [B, L, ...], and a padded batch packs back into values.
use crate::args::{Args, Tensor};
use crate::blocks::gather::{size, take_1d, take_along};
use crate::blocks::reduce::{reduce, Red};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("_jagged_to_padded_dense_forward", jagged_to_padded),
    op("_padded_dense_to_jagged_forward", padded_to_jagged).sized(padded_to_jagged_size),
];

/// The one offsets tensor as int64 [B + 1], and B.
fn offsets(cx: &mut Cx, args: &Args, one_length: bool) -> Result<(Value, i64)> {
    let list = args.tensors("offsets")?;
    let check_text = if one_length { "offsets_list.size() == 1 && max_lengths.size() == 1" } else { "offsets_list.size() == 1" };
    let lengths_ok = !one_length || args.ints("max_lengths")?.len() == 1;
    check!(list.len() == 1 && lengths_ok, Runtime, "{} INTERNAL ASSERT FAILED: only one jagged dim is supported", check_text);
    let o: Tensor = list[0];
    let dims = cx.dims(o.v);
    check!(dims.len() == 1 && dims[0] >= 1, Runtime, "expected offsets to be a 1-D tensor of B + 1 elements");
    Ok((cx.cast(o.v, DType::I64), dims[0] - 1))
}

/// offsets[from..from + n] as [n].
fn part(cx: &mut Cx, offsets: Value, from: i64, n: i64) -> Value {
    cx.slice(offsets, &[from], &[from + n], &[1])
}

/// [B, L, ...]: row j of sequence b is values[offsets[b] + j] when j < its length (longer
/// sequences are cut at L), else padding_value.
fn jagged_to_padded(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let values = args.tensor("values")?;
    let (offsets, b) = offsets(cx, args, true)?;
    let l = args.ints("max_lengths")?[0];
    let vdims = cx.dims(values.v);
    check!(!vdims.is_empty(), Runtime, "expected values to have at least 1 dim");
    let mut out_dims = vec![b, l];
    out_dims.extend_from_slice(&vdims[1..]);
    let pad = args.scalar("padding_value")?;
    let padding = cx.scalar_like(pad, values.dtype, &out_dims);
    if vdims[0] == 0 || b == 0 || l == 0 {
        return one(padding);
    }
    let starts = part(cx, offsets, 0, b);
    let ends = part(cx, offsets, 1, b);
    let lengths = cx.sub(ends, starts);
    let bl = [b, l];
    let j = cx.iota(&TensorType::new(ElemType::I64, &bl), 1);
    let starts = cx.broadcast_in_dim(starts, &bl, &[0]);
    let lengths = cx.broadcast_in_dim(lengths, &bl, &[0]);
    let valid = cx.compare(CmpDir::Lt, j, lengths);
    let rows = cx.add(starts, j);
    let last = cx.full((vdims[0] - 1) as f64, DType::I64, &bl);
    let rows = cx.min(rows, last);
    let flat = cx.reshape(rows, &[b * l]);
    let taken = take_along(cx, values.v, 0, flat);
    let taken = cx.reshape(taken, &out_dims);
    let valid = cx.broadcast_in_dim(valid, &out_dims, &[0, 1]);
    one(cx.select(valid, taken, padding))
}

/// The number of rows of the result: offsets[B] (total_L, when given, must equal it).
fn padded_to_jagged_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (offsets, b) = offsets(cx, args, false)?;
    let last = part(cx, offsets, b, 1);
    one(cx.reshape(last, &[]))
}

/// [total, ...]: row i is dense[s, i - offsets[s]] for the sequence s that holds i.
fn padded_to_jagged(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let dense = args.tensor("dense")?;
    let (offsets, b) = offsets(cx, args, false)?;
    let total = size(args)?;
    if let Some(given) = args.opt_int("total_L")? {
        check!(given == total, Runtime, "_padded_dense_to_jagged_forward(): final offset should match total_L value");
    }
    let ddims = cx.dims(dense.v);
    check!(ddims.len() >= 2 && ddims[0] == b, Runtime, "expected dense of shape [B, L, ...] for B + 1 offsets");
    let l = ddims[1];
    let mut out_dims = vec![total];
    out_dims.extend_from_slice(&ddims[2..]);
    if total == 0 || b == 0 || l == 0 {
        return one(cx.full(0.0, dense.dtype, &out_dims));
    }
    // The sequence of row i: how many sequences end at or before it.
    let ends = part(cx, offsets, 1, b);
    let i = cx.iota(&TensorType::new(ElemType::I64, &[total]), 0);
    let ends = cx.broadcast_in_dim(ends, &[total, b], &[1]);
    let rows = cx.broadcast_in_dim(i, &[total, b], &[0]);
    let ended = cx.compare(CmpDir::Le, ends, rows);
    let ended = cx.convert(ended, ElemType::I64);
    let seq = reduce(cx, ended, &[1], Red::Sum);
    let last_seq = cx.full((b - 1) as f64, DType::I64, &[total]);
    let seq = cx.min(seq, last_seq);
    let starts = part(cx, offsets, 0, b);
    let start = take_1d(cx, starts, seq);
    let within = cx.sub(i, start);
    let width = cx.full(l as f64, DType::I64, &[total]);
    let flat = cx.mul(seq, width);
    let flat = cx.add(flat, within);
    let mut packed_dims = vec![b * l];
    packed_dims.extend_from_slice(&ddims[2..]);
    let packed = cx.reshape(dense.v, &packed_dims);
    one(take_along(cx, packed, 0, flat))
}
