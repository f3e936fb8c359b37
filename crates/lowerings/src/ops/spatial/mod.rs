//! Spatial neural-network ops, one family per file: pool.rs (max, average, adaptive,
//! fractional pooling, unpooling), upsample.rs (interpolation), pad.rs (reflection/replication
//! padding), fold.rs (im2col/col2im) and grid_sample.rs. This file holds their shared helpers.
//!
//! Most of these ops move data along each spatial dim independently. Their index and weight
//! tables are computed here, on the host, in the arithmetic PyTorch's CPU kernels use (float32
//! for float, bfloat16 and half inputs, float64 for double), and enter the program as small 1-D
//! constants: the forward op gathers along one dim at a time and weighs the taps, its backward
//! scatter-adds along the same indices. Windowed maxima and sums use reduce_window. 16-bit
//! floats are computed in float32 and rounded once, like PyTorch's CPU kernels.
pub(crate) mod fold;
pub(crate) mod grid_sample;
pub(crate) mod pad;
pub(crate) mod pool;
pub(crate) mod upsample;

use crate::args::{Arg, Args};
use crate::blocks::gather::{scatter_along, take_along, Combine};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check};
use stablehlo::{Builder, CmpDir, ElemType, ScatterDims, TensorType, Value};

// ---- shared helpers ---------------------------------------------------------------------------

const I64: ElemType = ElemType::I64;

/// PyTorch's dispatch error for a dtype a CPU kernel does not handle.
fn dtype_check(ok: bool, kernel: &str, d: DType) -> Result<()> {
    check!(ok, NotImplemented, "\"{}\" not implemented for '{}'", kernel, d.torch_name());
    Ok(())
}

/// A gradient's dtype against the input's, with PyTorch's message naming the tensor (`what`).
fn check_grad_dtype(what: &str, x: DType, g: DType) -> Result<()> {
    check!(g == x, Runtime, "expected dtype {} for `{}` but got dtype {}", x.torch_name(), what, g.torch_name());
    Ok(())
}

fn is_floating(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

fn product(d: &[i64]) -> i64 {
    d.iter().product()
}

/// Floor division (at::div_rtn).
fn div_floor(a: i64, b: i64) -> i64 {
    let q = a / b;
    if a % b != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn ints_const(cx: &mut Cx, xs: &[i64]) -> Value {
    cx.constant_array_i64(xs, &[xs.len() as i64], I64)
}

fn zeros(cx: &mut Cx, dtype: DType, dims: &[i64]) -> Value {
    cx.full(0.0, dtype, dims)
}

/// `x` gathered along `axis` at the constant indices `idx`.
fn take(cx: &mut Cx, x: Value, axis: usize, idx: &[i64]) -> Value {
    let i = ints_const(cx, idx);
    take_along(cx, x, axis, i)
}

/// The transpose of `take`: `g` (with `idx.len()` entries along `axis`) summed into `size`
/// slots along `axis`.
fn take_transpose(cx: &mut Cx, g: Value, axis: usize, idx: &[i64], size: i64) -> Value {
    let mut dims = cx.dims(g);
    dims[axis] = size;
    let dt = cx.dtype(g);
    let z = zeros(cx, dt, &dims);
    if idx.is_empty() || dims.contains(&0) {
        return z;
    }
    let i = ints_const(cx, idx);
    scatter_along(cx, z, axis, i, g, Combine::Add)
}

/// One dim of a separable resampling: output position o reads input `idx[t][o]` with weight
/// `w[t][o]` for each tap t (no weights: a copy of the single tap).
struct Taps {
    idx: Vec<Vec<i64>>,
    w: Option<Vec<Vec<f64>>>,
}

impl Taps {
    fn len(&self) -> usize {
        self.idx[0].len()
    }
}

/// The taps of `taps` applied along `axis` of `x` (in the dtype the weights are applied in).
fn apply_taps(cx: &mut Cx, x: Value, axis: usize, taps: &Taps) -> Value {
    let w = match &taps.w {
        None => return take(cx, x, axis, &taps.idx[0]),
        Some(w) => w,
    };
    let elem = cx.elem(x);
    let n = taps.len() as i64;
    let mut acc: Option<Value> = None;
    for (idx, wt) in taps.idx.iter().zip(w) {
        let v = take(cx, x, axis, idx);
        let dims = cx.dims(v);
        let wc = cx.constant_array_f64(wt, &[n], elem);
        let wb = cx.broadcast_in_dim(wc, &dims, &[axis as i64]);
        let p = cx.mul(v, wb);
        acc = Some(match acc {
            None => p,
            Some(a) => cx.add(a, p),
        });
    }
    acc.unwrap()
}

/// The transpose of `apply_taps`: `g` (with `taps.len()` entries along `axis`) weighed and
/// summed into `size` input positions (one scatter over all taps).
fn apply_taps_transpose(cx: &mut Cx, g: Value, axis: usize, taps: &Taps, size: i64) -> Value {
    let mut parts = Vec::new();
    let mut idx = Vec::new();
    for (t, ix) in taps.idx.iter().enumerate() {
        let v = match &taps.w {
            None => g,
            Some(w) => {
                let dims = cx.dims(g);
                let elem = cx.elem(g);
                let wc = cx.constant_array_f64(&w[t], &[ix.len() as i64], elem);
                let wb = cx.broadcast_in_dim(wc, &dims, &[axis as i64]);
                cx.mul(g, wb)
            }
        };
        parts.push(v);
        idx.extend_from_slice(ix);
    }
    let all = cx.concatenate(&parts, axis as i64);
    take_transpose(cx, all, axis, &idx, size)
}

/// The flat index within the plane of the last `n` dims of `dims`, for every element (int64).
fn plane_iota(cx: &mut Cx, dims: &[i64], n: usize) -> Value {
    let r = dims.len();
    let ty = TensorType::new(I64, dims);
    let mut acc: Option<Value> = None;
    let mut stride = 1i64;
    for a in (r - n..r).rev() {
        let io = cx.iota(&ty, a as i64);
        let term = if stride == 1 {
            io
        } else {
            let s = cx.b.splat_i64(stride, &ty);
            cx.mul(io, s)
        };
        acc = Some(match acc {
            None => term,
            Some(v) => cx.add(v, term),
        });
        stride *= dims[a];
    }
    acc.unwrap()
}

/// The smallest value of a dtype (-inf for floats): what max pooling pads with.
fn lowest(cx: &mut Cx, dtype: DType) -> Value {
    let e = dtype.elem();
    if dtype.is_float() {
        return cx.constant_f64(f64::NEG_INFINITY, e);
    }
    let v = match dtype {
        DType::I8 => i8::MIN as i64,
        DType::I16 => i16::MIN as i64,
        DType::I32 => i32::MIN as i64,
        DType::I64 => i64::MIN,
        _ => 0,
    };
    cx.constant_i64(v, e)
}

/// Combines two (value, flat index) candidates of a max pooling window the way PyTorch's CPU
/// loops pick: NaN wins (the later NaN among several), otherwise the larger value, and among
/// equal values the earlier position.
fn argmax_pair(b: &mut Builder, v1: Value, i1: Value, v2: Value, i2: Value) -> Vec<Value> {
    let gt = b.compare(CmpDir::Gt, v2, v1);
    let eq = b.compare(CmpDir::Eq, v2, v1);
    let earlier = b.compare(CmpDir::Lt, i2, i1);
    let tie = b.and(eq, earlier);
    let mut second = b.or(gt, tie);
    if b.elem(v1).is_float() {
        let n1 = b.compare(CmpDir::Ne, v1, v1);
        let n2 = b.compare(CmpDir::Ne, v2, v2);
        let later = b.compare(CmpDir::Gt, i2, i1);
        let f = b.constant_bool(false);
        let t = b.constant_bool(true);
        let if_n2 = b.select(n1, later, t);
        let if_not_n2 = b.select(n1, f, second);
        second = b.select(n2, if_n2, if_not_n2);
    }
    let v = b.select(second, v2, v1);
    let i = b.select(second, i2, i1);
    vec![v, i]
}

/// Sums `upd` (dims L + S_out) into a zero tensor of dims L + S_in at the flat plane indices
/// `idx` (same dims as `upd`): the backward of max pooling and the forward of max unpooling
/// (`combine`: Add or Replace). Works in `acc` and returns that dtype.
fn plane_scatter(cx: &mut Cx, upd: Value, idx: Value, out_dims: &[i64], n: usize, acc: DType, combine: Combine) -> Value {
    let ud = cx.dims(upd);
    let lead = ud.len() - n;
    let b = product(&ud[..lead]);
    let k = product(&ud[lead..]);
    let m = product(&out_dims[lead..]);
    if b * k == 0 || b * m == 0 {
        return zeros(cx, acc, out_dims);
    }
    let u = cx.cast(upd, acc);
    let u = cx.reshape(u, &[b * k]);
    let i = cx.convert(idx, I64);
    let i = cx.reshape(i, &[b, k]);
    let ty = TensorType::new(I64, &[b, k]);
    let row = cx.iota(&ty, 0);
    let mm = cx.b.splat_i64(m, &ty);
    let off = cx.mul(row, mm);
    // Indices outside the plane must not land in the next plane: send them out of range.
    let lo = cx.b.splat_i64(0, &ty);
    let bad_lo = cx.compare(CmpDir::Lt, i, lo);
    let bad_hi = cx.compare(CmpDir::Ge, i, mm);
    let bad = cx.or(bad_lo, bad_hi);
    let flat = cx.add(i, off);
    let far = cx.b.splat_i64(b * m, &ty);
    let flat = cx.select(bad, far, flat);
    let flat = cx.reshape(flat, &[b * k, 1]);
    let z = zeros(cx, acc, &[b * m]);
    let dn = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
        ..Default::default()
    };
    let s = cx.scatter(z, flat, u, &dn, move |bb, cur, new| match combine {
        Combine::Replace => new,
        _ => bb.add(cur, new),
    });
    cx.reshape(s, out_dims)
}

/// Reads an optional float argument (a compiled-in value: ops that read one are specialized).
fn opt_float(args: &Args, name: &str) -> Result<Option<f64>> {
    Ok(match args.get(name) {
        None | Some(Arg::None) => None,
        Some(Arg::Float(f)) => Some(f.value),
        Some(Arg::Int(i)) => Some(*i as f64),
        _ => bail!(Type, "{}(): expected argument '{}' to be a float", args.op, name),
    })
}
