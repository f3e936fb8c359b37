//! Shape ops that move data (the pure views are metadata in the C++ shim): cat, _stack, _chunk_cat,
//! narrow_copy, flip, roll, tril/triu (and tril/triu_indices), unfold_backward, repeat,
//! repeat_interleave, channel_shuffle, constant_pad_nd, slice_scatter and select_scatter.
use crate::args::Args;
use crate::blocks::gather::{count_all, cumsum_1d, nonzero_coords, scatter_along, Combine};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::{can_cast, promote, DType};
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("cat", cat).bucketed().float4(),
    // Routed: PyTorch's composite _stack.out concatenates without the new dim (its CPU kernel
    // stacks).
    op("_stack", stack).routed(&["_stack", "_stack.out"]).float4(),
    op("narrow_copy", narrow_copy).float4(),
    // Routed: its composites (FSDP2's gradient packing) pad and copy one tensor at a time, and
    // read past a 0-d input's sizes.
    op("_chunk_cat", chunk_cat).routed(&["_chunk_cat", "_chunk_cat.out"]),
    op("flip", flip).float4(),
    op("roll", roll).float4(),
    op("tril", |cx, a| triangle(cx, a, true)),
    op("triu", |cx, a| triangle(cx, a, false)),
    op("unfold_backward", unfold_backward),
    op("repeat_interleave", repeat_interleave).sized(repeat_interleave_size),
    op("tril_indices", |cx, a| triangle_indices(cx, a, true)),
    op("triu_indices", |cx, a| triangle_indices(cx, a, false)),
    op("channel_shuffle", channel_shuffle),
    op("native_channel_shuffle", channel_shuffle),
    op("slice_scatter", slice_scatter),
    op("repeat", repeat).float4(),
    op("constant_pad_nd", constant_pad_nd),
    op("select_scatter", select_scatter),
];

fn cat(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ts = args.tensors("tensors")?;
    check!(!ts.is_empty(), Value, "torch.cat(): expected a non-empty list of Tensors");
    let dtype = ts.iter().map(|t| t.dtype).reduce(promote).unwrap();
    if let Ok(out) = args.tensor("out") {
        check!(
            can_cast(dtype, out.dtype),
            Type,
            "torch.cat(): input types can't be cast to the desired output type {}",
            out.dtype.torch_name()
        );
    }
    let shapes: Vec<Vec<i64>> = ts.iter().map(|t| cx.dims(t.v)).collect();
    for (i, s) in shapes.iter().enumerate() {
        check!(!s.is_empty(), Runtime, "zero-dimensional tensor (at position {}) cannot be concatenated", i);
    }
    // Legacy: 1-D empty tensors are skipped whatever the other shapes.
    let skip = |s: &Vec<i64>| s.len() == 1 && s[0] == 0;
    let Some(first) = shapes.iter().position(|s| !skip(s)) else {
        return one(cx.full(0.0, dtype, &[0]));
    };
    let r = shapes[first].len();
    let dim = wrap_dim(args.int_or("dim", 0)?, r)?;
    let mut out = shapes[first].clone();
    out[dim] = 0;
    for (i, s) in shapes.iter().enumerate() {
        if skip(s) {
            continue;
        }
        check!(s.len() == r, Runtime, "Tensors must have same number of dimensions: got {} and {}", r, s.len());
        for d in 0..r {
            check!(
                d == dim || s[d] == shapes[first][d],
                Runtime,
                "Sizes of tensors must match except in dimension {}. Expected size {} but got size {} for tensor number {} in the list.",
                dim,
                shapes[first][d],
                s[d],
                i
            );
        }
        out[dim] += s[dim];
    }
    if out.iter().product::<i64>() == 0 {
        return one(cx.full(0.0, dtype, &out));
    }
    if cx.padded.is_some() {
        return one(cat_padded(cx, &ts, dim, dtype));
    }
    let parts: Vec<Value> = ts
        .iter()
        .zip(&shapes)
        .filter(|(_, s)| !skip(s) && s[dim] > 0)
        .map(|(t, _)| cx.cast(t.v, dtype))
        .collect();
    one(cx.concatenate(&parts, dim as i64))
}

fn stack(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ts = args.tensors("tensors")?;
    check!(!ts.is_empty(), Runtime, "stack expects a non-empty TensorList");
    let first = cx.dims(ts[0].v);
    for (i, t) in ts.iter().enumerate() {
        let s = cx.dims(t.v);
        check!(s == first, Runtime, "stack expects each tensor to be equal size, but got {:?} at entry 0 and {:?} at entry {}", first, s, i);
    }
    let dim = wrap_dim(args.int_or("dim", 0)?, first.len() + 1)?;
    let dtype = ts.iter().map(|t| t.dtype).reduce(promote).unwrap();
    if let Ok(out) = args.tensor("out") {
        check!(can_cast(dtype, out.dtype), Runtime, "result type {} can't be cast to the desired output type {}", dtype.torch_name(), out.dtype.torch_name());
    }
    let mut dims = first.clone();
    dims.insert(dim, 1);
    let parts: Vec<Value> = ts.iter().map(|t| {
        let v = cx.cast(t.v, dtype);
        cx.reshape(v, &dims)
    }).collect();
    one(cx.concatenate(&parts, dim as i64))
}

/// cat in a bucketed program: the inputs are padded along `dim` and their real sizes are
/// runtime values, so each result lane along `dim` takes the input whose real range holds it,
/// at its position in that input (the padding lanes past the real total repeat real values).
fn cat_padded(cx: &mut Cx, ts: &[crate::Tensor], dim: usize, dtype: DType) -> Value {
    let padded = cx.padded.as_ref().unwrap();
    let out = padded.results[0].clone();
    let reals: Vec<Value> = ts.iter().map(|t| padded.real_sizes(t.v).expect("a padded input")[dim]).collect();
    let n = out[dim];
    let ty = TensorType { elem: ElemType::I64, dims: vec![n] };
    let lane = cx.iota(&ty, 0);
    let mut start = cx.full(0.0, DType::I64, &[]);
    let mut result: Option<Value> = None;
    for (t, &real) in ts.iter().zip(&reals) {
        // Lane i reads this input at i - start, clamped into its real range.
        let from = cx.broadcast_in_dim(start, &[n], &[]);
        let at = cx.sub(lane, from);
        let zero = cx.full(0.0, DType::I64, &[n]);
        let one = cx.full(1.0, DType::I64, &[]);
        let last = cx.sub(real, one);
        let last = cx.broadcast_in_dim(last, &[n], &[]);
        let at = cx.max(at, zero);
        let at = cx.min(at, last);
        let v = cx.cast(t.v, dtype);
        let taken = crate::blocks::gather::take_along(cx, v, dim, at);
        result = Some(match result {
            None => taken,
            Some(prev) => {
                // Lanes at or past this input's start take it.
                let mine = cx.compare(CmpDir::Ge, lane, from);
                let mine = cx.broadcast_in_dim(mine, &out, &[dim as i64]);
                cx.select(mine, taken, prev)
            }
        });
        start = cx.add(start, real);
    }
    result.unwrap()
}

fn flip(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    let mut dims = Vec::new();
    for d in args.ints("dims")? {
        let w = wrap_dim(d, xd.len())?;
        check!(!dims.contains(&(w as i64)), Runtime, "dim {} appears multiple times in the list of dims", w);
        dims.push(w as i64);
    }
    if xd.is_empty() {
        return one(x.v);
    }
    one(cx.reverse(x.v, &dims))
}

/// x rolled by `shift` along `dim`: element i moves to (i + shift) mod size.
fn roll_dim(cx: &mut Cx, x: Value, shift: i64, dim: usize) -> Value {
    let xd = cx.dims(x);
    let n = xd[dim];
    if n == 0 {
        return x;
    }
    let s = shift.rem_euclid(n);
    if s == 0 {
        return x;
    }
    let r = xd.len();
    let zero = vec![0; r];
    let ones = vec![1; r];
    let mut mid = xd.clone();
    mid[dim] = n - s;
    let mut start = zero.clone();
    start[dim] = n - s;
    let tail = cx.slice(x, &start, &xd, &ones);
    let head = cx.slice(x, &zero, &mid, &ones);
    cx.concatenate(&[tail, head], dim as i64)
}

fn roll(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let shifts = args.ints("shifts")?;
    let dims = args.opt_ints("dims")?.unwrap_or_default();
    let xd = cx.dims(x.v);
    check!(!shifts.is_empty(), Runtime, "`shifts` required");
    if let (true, Some(d)) = (xd.is_empty(), dims.first()) {
        check!(false, Index, "Dimension specified as {} but tensor has no dimensions", d);
    }
    if dims.is_empty() {
        check!(shifts.len() == 1, Runtime, "shifts and dimensions must align. shifts: {}, dims:{}", shifts.len(), dims.len());
        let n: i64 = xd.iter().product();
        let flat = cx.reshape(x.v, &[n]);
        let rolled = roll_dim(cx, flat, shifts[0], 0);
        return one(cx.reshape(rolled, &xd));
    }
    check!(
        shifts.len() == dims.len(),
        Runtime,
        "shifts and dimensions must align. shifts: {}, dims:{}",
        shifts.len(),
        dims.len()
    );
    let mut v = x.v;
    for (&s, &d) in shifts.iter().zip(&dims) {
        let d = wrap_dim(d, xd.len())?;
        if xd.is_empty() {
            continue;
        }
        v = roll_dim(cx, v, s, d);
    }
    one(v)
}

fn triangle(cx: &mut Cx, args: &Args, lower: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let k = args.int_or("diagonal", 0)?;
    let xd = cx.dims(x.v);
    let r = xd.len();
    check!(r >= 2, Runtime, "{}: input tensor must have at least 2 dimensions", if lower { "tril" } else { "triu" });
    let ty = TensorType::new(ElemType::I64, &xd);
    let row = cx.iota(&ty, r as i64 - 2);
    let col = cx.iota(&ty, r as i64 - 1);
    let diff = cx.sub(col, row);
    let kk = cx.full(k as f64, DType::I64, &xd);
    let keep = cx.compare(if lower { CmpDir::Le } else { CmpDir::Ge }, diff, kk);
    let zero = cx.full(0.0, x.dtype, &xd);
    one(cx.select(keep, x.v, zero))
}

/// The gradient of Tensor.unfold(dim, size, step): every window's elements added back.
fn unfold_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_in")?;
    let sizes = args.ints("input_sizes")?;
    let size = args.int("size")?;
    let step = args.int("step")?;
    let gd = cx.dims(g.v);
    if sizes.is_empty() {
        // A 0-d input unfolds into one window of one element.
        return one(cx.reshape(g.v, &[]));
    }
    let dim = wrap_dim(args.int("dim")?, sizes.len())?;
    let r = sizes.len();
    let nw = gd[dim];
    if gd.iter().product::<i64>() == 0 {
        return one(cx.full(0.0, g.dtype, &sizes));
    }
    // [pre, nw, post, size] -> [pre, nw, size, post] -> [pre, nw * size, post]
    let mut perm: Vec<i64> = (0..=dim as i64).collect();
    perm.push(r as i64);
    perm.extend(dim as i64 + 1..r as i64);
    let t = cx.transpose(g.v, &perm);
    let mut flat = sizes.clone();
    flat[dim] = nw * size;
    let upd = cx.reshape(t, &flat);
    let idx: Vec<i64> = (0..nw).flat_map(|w| (0..size).map(move |j| w * step + j)).collect();
    let idx = cx.constant_array_i64(&idx, &[nw * size], ElemType::I64);
    let zeros = cx.full(0.0, g.dtype, &sizes);
    one(scatter_along(cx, zeros, dim, idx, upd, Combine::Add))
}

fn repeats_arg(cx: &Cx, args: &Args) -> Result<crate::Tensor> {
    let r = args.tensor("repeats")?;
    check!(cx.rank(r.v) <= 1, Runtime, "repeat_interleave only accept 1D vector as repeat");
    check!(matches!(r.dtype, DType::I64 | DType::I32), Runtime, "repeats has to be Long or Int tensor");
    Ok(r)
}

fn repeat_interleave_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let r = repeats_arg(cx, args)?;
    if let Some(n) = args.opt_int("output_size")? {
        return one(cx.constant_i64(n, ElemType::I64));
    }
    one(count_all(cx, r.v))
}

/// repeat_interleave(repeats): i repeated repeats[i] times, for every i.
fn repeat_interleave(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let r = repeats_arg(cx, args)?;
    let total = args.int("__size")?;
    let n: i64 = cx.dims(r.v).iter().product();
    if total == 0 || n == 0 {
        return one(cx.full(0.0, r.dtype, &[total]));
    }
    let rv = cx.reshape(r.v, &[n]);
    let rv = cx.convert(rv, ElemType::I64);
    // out[k] = #{i : cumsum(repeats)[i] <= k}
    let ends = cumsum_1d(cx, rv);
    let marks = cx.full(0.0, DType::I64, &[total + 1]);
    let ones = cx.full(1.0, DType::I64, &[n]);
    let hi = cx.full(total as f64, DType::I64, &[n]);
    let ends = cx.min(ends, hi);
    let marks = scatter_along(cx, marks, 0, ends, ones, Combine::Add);
    let marks = cx.slice(marks, &[0], &[total], &[1]);
    let out = cumsum_1d(cx, marks);
    one(cx.convert(out, r.dtype.elem()))
}

/// tril_indices / triu_indices(row, col, offset=0): the coordinates of the lower (upper)
/// triangle, row by row, as a [2, N] tensor.
fn triangle_indices(cx: &mut Cx, args: &Args, lower: bool) -> Result<Vec<Out>> {
    let name = if lower { "tril_indices" } else { "triu_indices" };
    let row = args.int("row")?;
    let col = args.int("col")?;
    let offset = args.int_or("offset", 0)?;
    check!(row >= 0, Runtime, "row must be non-negative, got{}", row);
    check!(col >= 0, Runtime, "col must be non-negative, got{}", col);
    // A ScalarType with a default may arrive as its integer code.
    let dtype = match args.get("dtype") {
        Some(crate::Arg::Int(code)) => DType::from_code(*code as i8).unwrap_or(DType::I64),
        _ => args.dtype("dtype")?.unwrap_or(DType::I64),
    };
    check!(
        dtype.is_int(),
        NotImplemented,
        "\"{}\" not implemented for '{}'",
        name,
        dtype.torch_name()
    );
    // How many elements, counted on the host: the shape is static.
    let n: i64 = (0..row)
        .map(|r| {
            if lower {
                (r + offset + 1).clamp(0, col)
            } else {
                (col - (r + offset).max(0)).clamp(0, col)
            }
        })
        .sum();
    if n == 0 {
        return one(cx.full(0.0, dtype, &[2, 0]));
    }
    let ty = TensorType::new(ElemType::I64, &[row, col]);
    let r = cx.iota(&ty, 0);
    let c = cx.iota(&ty, 1);
    let diff = cx.sub(c, r);
    let k = cx.full(offset as f64, DType::I64, &[row, col]);
    let mask = cx.compare(if lower { CmpDir::Le } else { CmpDir::Ge }, diff, k);
    let coords = nonzero_coords(cx, mask, n, 0);
    let t = cx.transpose(coords, &[1, 0]);
    one(cx.convert(t, dtype.elem()))
}

/// channel_shuffle(self, groups): [N, C, *] -> [N, g, C/g, *] -> swap -> [N, C, *].
fn channel_shuffle(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let g = args.int("groups")?;
    let xd = cx.dims(x.v);
    check!(
        xd.len() > 2,
        Runtime,
        "channel_shuffle expects input with > 2 dims, but got input with sizes [{}]",
        xd.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    );
    check!(g > 0, Runtime, "Number of groups to divide channels in must be positive. Value of groups:{}", g);
    let c = xd[1];
    check!(c % g == 0, Runtime, "Number of channels must be divisible by groups. Got {} channels and {} groups.", c, g);
    if xd.iter().product::<i64>() == 0 {
        return one(x.v);
    }
    let mut split = vec![xd[0], g, c / g];
    split.extend(&xd[2..]);
    let v = cx.reshape(x.v, &split);
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend(3..split.len() as i64);
    let t = cx.transpose(v, &perm);
    one(cx.reshape(t, &xd))
}

/// narrow_copy(self, dim, start, length) (its out= form; the functional one is a composite):
/// a copy of `length` entries of `dim` from `start`, with PyTorch's CPU checks.
fn narrow_copy(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    check!(!dims.is_empty(), Runtime, "narrow() cannot be applied to a 0-dim tensor.");
    if let Ok(out) = args.tensor("out") {
        check!(
            out.dtype == x.dtype,
            Runtime,
            "Expected self.dtype() == output.dtype() to be true, but got false.  (Could this error message be improved?  If so, please report an enhancement request to PyTorch.)"
        );
    }
    let dim = args.int("dim")?;
    check!(
        dim < dims.len() as i64,
        Runtime,
        "Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false.  (Could this error message be improved?  If so, please report an enhancement request to PyTorch.)"
    );
    let dim = wrap_dim(dim, dims.len())?;
    let mut start = args.int("start")?;
    let length = args.int("length")?;
    let cur = dims[dim];
    check!(
        -cur <= start && start <= cur,
        Index,
        "start out of range (expected to be in range of [{}, {}], but got {})",
        -cur,
        cur,
        start
    );
    if start < 0 {
        start += cur;
    }
    check!(length >= 0 && start <= cur - length, Runtime, "start ({}) + length ({}) exceeds dimension size ({}).", start, length, cur);
    let n = dims.len();
    let mut lo = vec![0; n];
    lo[dim] = start;
    let mut hi = dims.clone();
    hi[dim] = start + length;
    one(cx.slice(x.v, &lo, &hi, &vec![1; n]))
}

/// _chunk_cat(tensors, dim, num_chunks) (FSDP2's gradient packing): each tensor padded with
/// zeros along `dim` to a multiple of num_chunks, viewed as [..dim, num_chunks, -1], and the
/// views concatenated along dim + 1. PyTorch's checks; a 0-d input, which PyTorch's kernel
/// reads past its sizes for, gets the IndexError of `size(dim)`.
fn chunk_cat(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ts = args.tensors("tensors")?;
    let dim = args.int("dim")?;
    let num_chunks = args.int("num_chunks")?;
    check!(num_chunks >= 1, Runtime, "_chunk_cat expects positive num_chunks");
    check!(!ts.is_empty(), Runtime, "_chunk_cat expects a non-empty input tensor list");
    let shapes: Vec<Vec<i64>> = ts.iter().map(|t| cx.dims(t.v)).collect();
    for (t, s) in ts.iter().zip(&shapes) {
        check!(s.iter().product::<i64>() > 0, Runtime, "_chunk_cat expects non-empty tensor");
        check!(t.dtype == ts[0].dtype, Runtime, "_chunk_cat expects all input tensors with the same dtype");
    }
    let dim = if shapes.iter().all(|s| s.len() == shapes[0].len()) {
        let d = wrap_dim(dim, shapes[0].len())?;
        check!(!shapes[0].is_empty(), Index, "Dimension specified as {} but tensor has no dimensions", dim);
        d
    } else {
        check!(dim >= 0, Runtime, "_chunk_cat expects non-negative dim when input tensors have different ndims");
        for s in &shapes {
            check!((dim as usize) < s.len(), Runtime, "_chunk_cat expects dim < ndim for all input tensors");
        }
        dim as usize
    };
    for s in &shapes {
        check!(s[..dim] == shapes[0][..dim], Runtime, "_chunk_cat expects same sizes of 0,...,dim-1 dimensions for all tensors");
    }
    if let Ok(out) = args.tensor("out") {
        check!(
            can_cast(ts[0].dtype, out.dtype),
            Runtime,
            "result type {} can't be cast to the desired output type {}",
            ts[0].dtype.torch_name(),
            out.dtype.torch_name()
        );
    }
    let mut parts = Vec::new();
    for (t, s) in ts.iter().zip(&shapes) {
        let size = s[dim];
        let padded = (size + num_chunks - 1) / num_chunks * num_chunks;
        let mut v = t.v;
        if padded != size {
            let zero = cx.full(0.0, t.dtype, &[]);
            let mut high = vec![0; s.len()];
            high[dim] = padded - size;
            v = cx.pad(v, zero, &vec![0; s.len()], &high, &vec![0; s.len()]);
        }
        let inner = padded / num_chunks * s[dim + 1..].iter().product::<i64>();
        let mut view = s[..dim].to_vec();
        view.push(num_chunks);
        view.push(inner);
        parts.push(cx.reshape(v, &view));
    }
    one(cx.concatenate(&parts, dim as i64 + 1))
}

/// repeat(self, repeats): tiles the tensor; `repeats` may add leading dims.
fn repeat(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let reps = args.ints("repeats")?;
    let xd = cx.dims(x.v);
    check!(
        reps.len() >= xd.len(),
        Runtime,
        "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor"
    );
    let mut dims = vec![1i64; reps.len() - xd.len()];
    dims.extend(&xd);
    // Broadcast to [r0, d0, r1, d1, ...] then merge each pair.
    let mut wide = Vec::new();
    let mut keep = Vec::new();
    for (i, (&r, &d)) in reps.iter().zip(&dims).enumerate() {
        wide.push(r);
        wide.push(d);
        keep.push(2 * i as i64 + 1);
    }
    let v = cx.reshape(x.v, &dims);
    let b = cx.broadcast_in_dim(v, &wide, &keep);
    let out: Vec<i64> = reps.iter().zip(&dims).map(|(r, d)| r * d).collect();
    one(cx.reshape(b, &out))
}

/// constant_pad_nd(self, pad, value): `pad` holds (low, high) pairs from the last dim
/// backwards; negative amounts crop.
fn constant_pad_nd(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let pad = args.ints("pad")?;
    let dims = cx.dims(x.v);
    check!(pad.len() % 2 == 0, Runtime, "Length of pad must be even but instead it equals {}", pad.len());
    check!(
        pad.len() / 2 <= dims.len(),
        Runtime,
        "Length of pad should be no more than twice the number of dimensions of the input. Pad length is {} while the input has {} dimensions.",
        pad.len(),
        dims.len()
    );
    let mut lo = vec![0; dims.len()];
    let mut hi = vec![0; dims.len()];
    for (i, pair) in pad.chunks(2).enumerate() {
        let d = dims.len() - 1 - i;
        lo[d] = pair[0];
        hi[d] = pair[1];
        check!(
            dims[d] + pair[0] + pair[1] >= 0,
            Runtime,
            "The input size {}, plus negative padding {} and {} resulted in a negative output size, which is invalid. Check dimension {} of your input.",
            dims[d],
            pair[0],
            pair[1],
            d
        );
    }
    let value = match args.opt_scalar("value")? {
        Some(s) => cx.scalar(s.to_real(x.dtype)?, x.dtype),
        None => cx.full(0.0, x.dtype, &[]),
    };
    one(cx.pad(x.v, value, &lo, &hi, &vec![0; dims.len()]))
}

/// `base` with positions start, start+step, ... < end along `d` replaced by `src`.
fn strided_update(cx: &mut Cx, base: stablehlo::Value, src: stablehlo::Value, d: usize, start: i64, step: i64) -> stablehlo::Value {
    let dims = cx.dims(base);
    let sdims = cx.dims(src);
    let n = sdims[d];
    if n == 0 {
        return base;
    }
    let nd = dims.len();
    // Spread src along d with step-1 gaps, placed at `start`, and select it where it landed.
    let mut lo = vec![0; nd];
    let mut hi = vec![0; nd];
    let mut interior = vec![0; nd];
    lo[d] = start;
    interior[d] = step - 1;
    hi[d] = dims[d] - (start + (n - 1) * step + 1);
    let dt = cx.dtype(base);
    let zero = cx.full(0.0, dt, &[]);
    let spread = cx.pad(src, zero, &lo, &hi, &interior);
    let ones = cx.full(1.0, DType::Bool, &sdims);
    let no = cx.full(0.0, DType::Bool, &[]);
    let mask = cx.pad(ones, no, &lo, &hi, &interior);
    cx.select(mask, spread, base)
}

/// slice_scatter(self, src, dim, start, end, step): self with the slice replaced by src.
fn slice_scatter(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let src = args.tensor("src")?;
    let dims = cx.dims(x.v);
    let d = wrap_dim(args.int_or("dim", 0)?, dims.len())?;
    let n = dims[d];
    let step = args.int_or("step", 1)?;
    check!(step > 0, Runtime, "slice step must be positive");
    let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let start = clamp(args.opt_int("start")?.unwrap_or(0));
    let end = clamp(args.opt_int("end")?.unwrap_or(n)).max(start);
    let mut expect = dims.clone();
    expect[d] = (end - start + step - 1) / step;
    let sdims = cx.dims(src.v);
    check!(sdims == expect, Runtime, "Expected src to have a size equal to the slice of self. src size = {:?}, slice size = {:?}", sdims, expect);
    let s = cx.cast(src.v, x.dtype);
    one(strided_update(cx, x.v, s, d, start, step))
}

/// select_scatter(self, src, dim, index): self with the selected slice replaced by src.
fn select_scatter(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let src = args.tensor("src")?;
    let dims = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, dims.len())?;
    let n = dims[d];
    let i = args.int("index")?;
    check!(i >= -n && i < n, Index, "select(): index {} out of range for tensor of size {:?} at dimension {}", i, dims, d);
    let i = if i < 0 { i + n } else { i };
    let mut sd = dims.clone();
    sd[d] = 1;
    let s = cx.cast(src.v, x.dtype);
    let s = cx.reshape(s, &sd);
    one(strided_update(cx, x.v, s, d, i, 1))
}
