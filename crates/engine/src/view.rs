//! Reading and writing PyTorch views (sizes, strides, offset) of a dense base buffer inside a
//! module: the gather is folded into the op's own program, and a write produces the new base.
use lowerings::{is_contiguous, Cx, DType};
use stablehlo::{ElemType, ScatterDims, TensorType, Value};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry<'a> {
    pub sizes: &'a [i64],
    pub strides: &'a [i64],
    pub offset: i64,
}

impl Geometry<'_> {
    pub fn numel(&self) -> i64 {
        self.sizes.iter().product()
    }

    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.sizes, self.strides)
    }

    /// Does this view cover all `base_numel` elements in row-major order?
    pub fn covers(&self, base_numel: i64) -> bool {
        self.offset == 0 && self.numel() == base_numel && is_contiguous(self.sizes, self.strides)
    }
}

/// The flat element indices of a view, as an i64 tensor of the view's shape.
fn flat_indices(cx: &mut Cx, g: &Geometry) -> Value {
    let dims = g.sizes.to_vec();
    let ty = TensorType { elem: ElemType::I64, dims: dims.clone() };
    let mut idx = cx.full(g.offset as f64, DType::I64, &dims);
    for (d, &stride) in g.strides.iter().enumerate() {
        if g.sizes[d] == 1 || stride == 0 {
            continue;
        }
        let i = cx.iota(&ty, d as i64);
        let s = cx.full(stride as f64, DType::I64, &dims);
        let term = cx.mul(i, s);
        idx = cx.add(idx, term);
    }
    idx
}

/// The view `g` of `base` (a dense value of `base_dims`) as a dense value of `g.sizes`.
pub fn read(cx: &mut Cx, base: Value, g: &Geometry) -> Value {
    let base_dims = cx.dims(base);
    let n: i64 = base_dims.iter().product();
    let dtype = cx.dtype(base);
    if g.sizes == base_dims.as_slice() && g.covers(n) {
        return base;
    }
    if g.numel() == 0 {
        return cx.full(0.0, dtype, g.sizes);
    }
    if g.covers(n) {
        return cx.reshape(base, g.sizes);
    }
    // Expanded dims (stride 0) are read once and broadcast.
    if g.strides.iter().zip(g.sizes).any(|(&s, &n)| s == 0 && n > 1) {
        let keep: Vec<usize> = (0..g.sizes.len()).filter(|&d| !(g.strides[d] == 0 && g.sizes[d] > 1)).collect();
        let sizes: Vec<i64> = keep.iter().map(|&d| g.sizes[d]).collect();
        let strides: Vec<i64> = keep.iter().map(|&d| g.strides[d]).collect();
        let inner = read(cx, base, &Geometry { sizes: &sizes, strides: &strides, offset: g.offset });
        let bdims: Vec<i64> = keep.iter().map(|&d| d as i64).collect();
        return cx.broadcast_in_dim(inner, g.sizes, &bdims);
    }
    let flat = cx.reshape(base, &[n]);
    let numel = g.numel();
    // A permutation of a contiguous block (transposes, permutes): slice, reshape, transpose.
    let mut order: Vec<usize> = (0..g.sizes.len()).collect();
    order.sort_by_key(|&d| std::cmp::Reverse(g.strides[d]));
    let sorted_sizes: Vec<i64> = order.iter().map(|&d| g.sizes[d]).collect();
    let sorted_strides: Vec<i64> = order.iter().map(|&d| g.strides[d]).collect();
    if is_contiguous(&sorted_sizes, &sorted_strides) && g.offset + numel <= n {
        let block = cx.slice(flat, &[g.offset], &[g.offset + numel], &[1]);
        let block = cx.reshape(block, &sorted_sizes);
        let mut perm = vec![0i64; order.len()];
        for (pos, &d) in order.iter().enumerate() {
            perm[d] = pos as i64;
        }
        return cx.transpose(block, &perm);
    }
    let idx = flat_indices(cx, g);
    lowerings::take_1d(cx, flat, idx)
}

/// `base` with the view `g` replaced by `value` (a dense value of `g.sizes`).
pub fn write(cx: &mut Cx, base: Value, g: &Geometry, value: Value) -> Value {
    let base_dims = cx.dims(base);
    let n: i64 = base_dims.iter().product();
    if g.covers(n) {
        // The whole storage is rewritten: the buffer takes the writer's shape.
        return value;
    }
    if g.numel() == 0 {
        return base;
    }
    let flat = cx.reshape(base, &[n]);
    let numel = g.numel();
    let flat_value = cx.reshape(value, &[numel]);
    let new_flat = if is_contiguous(g.sizes, g.strides) {
        let off = cx.constant_i64(g.offset, ElemType::I64);
        cx.dynamic_update_slice(flat, flat_value, &[off])
    } else {
        let idx = flat_indices(cx, g);
        scatter_flat(cx, flat, idx, flat_value)
    };
    cx.reshape(new_flat, &base_dims)
}

// ---- views with another dtype than their storage's -----------------------------------------
//
// A storage's bytes seen through a tensor of another dtype (Tensor.view(dtype), view_as_real,
// view_as_complex): the base is re-read as a 1-d value of the view's dtype, the view's
// geometry (in units of that dtype) applies to it, and a write converts the result back.
// Between two dtypes the bytes travel as a "raw" stream: complex values as their (re, im)
// parts, bools as u8, everything else as itself; raw streams convert by bitcast.

/// The 1-d `flat` with element idx[i] set to values[i] (idx and values: any equal dims).
pub fn scatter_flat(cx: &mut Cx, flat: Value, idx: Value, values: Value) -> Value {
    let lanes: i64 = cx.dims(idx).iter().product();
    let idx = cx.reshape(idx, &[lanes, 1]);
    let values = cx.reshape(values, &[lanes]);
    let dn = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: vec![0],
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
        ..Default::default()
    };
    cx.scatter(flat, idx, values, &dn, |_, _old, new| new)
}

fn raw_elem(d: DType) -> ElemType {
    match d {
        DType::C64 => ElemType::F32,
        DType::C128 => ElemType::F64,
        DType::Bool => ElemType::U8,
        _ => d.elem(),
    }
}

/// `v` as a 1-d stream of `raw_elem(dtype(v))`.
fn to_raw(cx: &mut Cx, v: Value) -> Value {
    let n = cx.numel(v);
    let flat = cx.reshape(v, &[n]);
    match cx.dtype(v) {
        DType::C64 | DType::C128 => {
            let re = cx.real(flat);
            let im = cx.imag(flat);
            let re = cx.reshape(re, &[n, 1]);
            let im = cx.reshape(im, &[n, 1]);
            let pairs = cx.concatenate(&[re, im], 1);
            cx.reshape(pairs, &[2 * n])
        }
        DType::Bool => cx.convert(flat, ElemType::U8),
        _ => flat,
    }
}

/// A 1-d raw stream of `raw_elem(to)` as a 1-d value of `to` (an odd trailing part is dropped).
fn from_raw(cx: &mut Cx, raw: Value, to: DType) -> Value {
    match to {
        DType::C64 | DType::C128 => {
            let m = cx.numel(raw) / 2;
            let even = cx.slice(raw, &[0], &[2 * m], &[1]);
            let pairs = cx.reshape(even, &[m, 2]);
            let re = cx.slice(pairs, &[0, 0], &[m, 1], &[1, 1]);
            let im = cx.slice(pairs, &[0, 1], &[m, 2], &[1, 1]);
            let re = cx.reshape(re, &[m]);
            let im = cx.reshape(im, &[m]);
            cx.complex(re, im)
        }
        DType::Bool => cx.cast(raw, DType::Bool),
        _ => raw,
    }
}

/// A 1-d stream re-read as elements of `elem` (a partial trailing element is dropped).
fn rebits(cx: &mut Cx, raw: Value, elem: ElemType) -> Value {
    let (win, wout) = (cx.elem(raw).bit_width() as i64, elem.bit_width() as i64);
    let n = cx.numel(raw);
    if win >= wout {
        let v = cx.bitcast_convert(raw, elem);
        return cx.reshape(v, &[n * (win / wout)]);
    }
    let k = wout / win;
    let m = n / k;
    let whole = cx.slice(raw, &[0], &[m * k], &[1]);
    let grouped = cx.reshape(whole, &[m, k]);
    cx.bitcast_convert(grouped, elem)
}

/// The bytes of `base` (any dims) as a 1-d value of `to`.
pub fn reinterpret(cx: &mut Cx, base: Value, to: DType) -> Value {
    let raw = to_raw(cx, base);
    let raw = rebits(cx, raw, raw_elem(to));
    from_raw(cx, raw, to)
}

/// Whether `elems` elements of `from` and their reinterpretation as `to` are the same bytes
/// (no trailing part dropped, no bool or complex conversion), so a buffer may hold either.
pub fn same_bytes_as(from: DType, elems: i64, to: DType) -> bool {
    let plain = |d: DType| !matches!(d, DType::Bool | DType::C64 | DType::C128);
    plain(from) && plain(to) && (elems * from.size() as i64) % to.size() as i64 == 0
}

/// `value` (the reinterpreted `orig`, after a write) back in `orig`'s dtype and dims; trailing
/// bytes too short for one element of the view's dtype keep `orig`'s values.
pub fn restore(cx: &mut Cx, value: Value, orig: Value) -> Value {
    let dims = cx.dims(orig);
    let n: i64 = dims.iter().product();
    let dtype = cx.dtype(orig);
    let mut back = reinterpret(cx, value, dtype);
    let m = cx.numel(back);
    if m < n {
        let flat = cx.reshape(orig, &[n]);
        let tail = cx.slice(flat, &[m], &[n], &[1]);
        back = cx.concatenate(&[back, tail], 0);
    }
    cx.reshape(back, &dims)
}
