//! Spatial neural-network ops: pooling (max, average, adaptive, unpooling), interpolation
//! (nearest, linear, cubic, antialiased), reflection/replication padding, im2col/col2im and
//! grid sampling, with the backward ops autograd calls.
//!
//! Most of these ops move data along each spatial dim independently. Their index and weight
//! tables are computed here, on the host, in the arithmetic PyTorch's CPU kernels use (float32
//! for float, bfloat16 and half inputs, float64 for double), and enter the program as small 1-D
//! constants: the forward op gathers along one dim at a time and weighs the taps, its backward
//! scatter-adds along the same indices. Windowed maxima and sums use reduce_window. 16-bit
//! floats are computed in float32 and rounded once, like PyTorch's CPU kernels.
use crate::args::{Arg, Args};
use crate::blocks::gather::{scatter_along, take_along, Combine};
use crate::blocks::reduce::acc_type;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, Registry};
use stablehlo::{Builder, CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("max_pool2d_with_indices", |cx, a| max_pool(cx, a, 2));
    r.add("max_pool3d_with_indices", |cx, a| max_pool(cx, a, 3));
    r.add("max_pool2d_with_indices_backward", |cx, a| max_pool_backward(cx, a, 2));
    r.add("max_pool3d_with_indices_backward", |cx, a| max_pool_backward(cx, a, 3));
    r.add("avg_pool2d", |cx, a| avg_pool(cx, a, 2));
    r.add("avg_pool3d", |cx, a| avg_pool(cx, a, 3));
    r.add("avg_pool2d_backward", |cx, a| avg_pool_backward(cx, a, 2));
    r.add("avg_pool3d_backward", |cx, a| avg_pool_backward(cx, a, 3));
    r.add("_adaptive_avg_pool2d", |cx, a| adaptive_avg_pool(cx, a, 2));
    r.add("_adaptive_avg_pool3d", |cx, a| adaptive_avg_pool(cx, a, 3));
    // The out= forms (their functional forms are composites calling the underscored ops).
    r.add("adaptive_avg_pool2d", |cx, a| adaptive_avg_pool(cx, a, 2));
    r.add("adaptive_avg_pool3d", |cx, a| adaptive_avg_pool(cx, a, 3));
    r.add("adaptive_avg_pool3d_backward", |cx, a| adaptive_avg_pool_backward(cx, a, 3));
    r.add("_adaptive_avg_pool2d_backward", |cx, a| adaptive_avg_pool_backward(cx, a, 2));
    r.add("_adaptive_avg_pool3d_backward", |cx, a| adaptive_avg_pool_backward(cx, a, 3));
    r.add("adaptive_max_pool2d", |cx, a| adaptive_max_pool(cx, a, 2));
    r.add("adaptive_max_pool3d", |cx, a| adaptive_max_pool(cx, a, 3));
    r.add("adaptive_max_pool2d_backward", |cx, a| adaptive_max_pool_backward(cx, a, 2));
    r.add("adaptive_max_pool3d_backward", |cx, a| adaptive_max_pool_backward(cx, a, 3));
    r.add("fractional_max_pool2d", |cx, a| fractional_max_pool(cx, a, 2));
    r.add("fractional_max_pool3d", |cx, a| fractional_max_pool(cx, a, 3));
    r.add("fractional_max_pool2d_backward", |cx, a| fractional_max_pool_backward(cx, a, 2));
    r.add("fractional_max_pool3d_backward", |cx, a| fractional_max_pool_backward(cx, a, 3));
    r.add("max_unpool2d", |cx, a| max_unpool(cx, a, 2));
    r.add("max_unpool3d", |cx, a| max_unpool(cx, a, 3));
    // Upsampling: the scales decide the index tables, so float arguments are compiled in.
    r.add_specialized("upsample_nearest1d", |cx, a| upsample(cx, a, 1, Mode::Nearest));
    r.add_specialized("upsample_nearest2d", |cx, a| upsample(cx, a, 2, Mode::Nearest));
    r.add_specialized("upsample_nearest3d", |cx, a| upsample(cx, a, 3, Mode::Nearest));
    r.add_specialized("_upsample_nearest_exact1d", |cx, a| upsample(cx, a, 1, Mode::NearestExact));
    r.add_specialized("_upsample_nearest_exact2d", |cx, a| upsample(cx, a, 2, Mode::NearestExact));
    r.add_specialized("_upsample_nearest_exact3d", |cx, a| upsample(cx, a, 3, Mode::NearestExact));
    r.add_specialized("upsample_linear1d", |cx, a| upsample(cx, a, 1, Mode::Linear));
    r.add_specialized("upsample_bilinear2d", |cx, a| upsample(cx, a, 2, Mode::Linear));
    r.add_specialized("upsample_trilinear3d", |cx, a| upsample(cx, a, 3, Mode::Linear));
    r.add_specialized("upsample_bicubic2d", |cx, a| upsample(cx, a, 2, Mode::Cubic));
    r.add_specialized("_upsample_bilinear2d_aa", |cx, a| upsample(cx, a, 2, Mode::LinearAa));
    r.add_specialized("_upsample_bicubic2d_aa", |cx, a| upsample(cx, a, 2, Mode::CubicAa));
    r.add_specialized("upsample_nearest1d_backward", |cx, a| upsample_backward(cx, a, 1, Mode::Nearest));
    r.add_specialized("upsample_nearest2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::Nearest));
    r.add_specialized("upsample_nearest3d_backward", |cx, a| upsample_backward(cx, a, 3, Mode::Nearest));
    r.add_specialized("_upsample_nearest_exact1d_backward", |cx, a| upsample_backward(cx, a, 1, Mode::NearestExact));
    r.add_specialized("_upsample_nearest_exact2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::NearestExact));
    r.add_specialized("_upsample_nearest_exact3d_backward", |cx, a| upsample_backward(cx, a, 3, Mode::NearestExact));
    r.add_specialized("upsample_linear1d_backward", |cx, a| upsample_backward(cx, a, 1, Mode::Linear));
    r.add_specialized("upsample_bilinear2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::Linear));
    r.add_specialized("upsample_trilinear3d_backward", |cx, a| upsample_backward(cx, a, 3, Mode::Linear));
    r.add_specialized("upsample_bicubic2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::Cubic));
    r.add_specialized("_upsample_bilinear2d_aa_backward", |cx, a| upsample_backward(cx, a, 2, Mode::LinearAa));
    r.add_specialized("_upsample_bicubic2d_aa_backward", |cx, a| upsample_backward(cx, a, 2, Mode::CubicAa));
    r.add("reflection_pad1d", |cx, a| pad(cx, a, 1, true));
    r.add("reflection_pad2d", |cx, a| pad(cx, a, 2, true));
    r.add("reflection_pad3d", |cx, a| pad(cx, a, 3, true));
    r.add("replication_pad1d", |cx, a| pad(cx, a, 1, false));
    r.add("replication_pad2d", |cx, a| pad(cx, a, 2, false));
    r.add("replication_pad3d", |cx, a| pad(cx, a, 3, false));
    r.add("reflection_pad1d_backward", |cx, a| pad_backward(cx, a, 1, true));
    r.add("reflection_pad2d_backward", |cx, a| pad_backward(cx, a, 2, true));
    r.add("reflection_pad3d_backward", |cx, a| pad_backward(cx, a, 3, true));
    r.add("replication_pad1d_backward", |cx, a| pad_backward(cx, a, 1, false));
    r.add("replication_pad2d_backward", |cx, a| pad_backward(cx, a, 2, false));
    r.add("replication_pad3d_backward", |cx, a| pad_backward(cx, a, 3, false));
    r.add("im2col", im2col);
    r.add("col2im", col2im);
    r.add("grid_sampler_2d", |cx, a| grid_sampler(cx, a, 2));
    r.add("grid_sampler_3d", |cx, a| grid_sampler(cx, a, 3));
    r.add("grid_sampler_2d_backward", |cx, a| grid_sampler_backward(cx, a, 2));
    r.add("grid_sampler_3d_backward", |cx, a| grid_sampler_backward(cx, a, 3));
}

// ---- shared helpers ---------------------------------------------------------------------------

const I64: ElemType = ElemType::I64;

fn shape_str(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

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

// ---- pooling windows -------------------------------------------------------------------------

fn word(n: usize) -> &'static str {
    match n {
        1 => "one",
        2 => "two",
        _ => "three",
    }
}

/// Kernel, stride, padding and dilation of a pooling call, one entry per spatial dim.
struct Window {
    k: Vec<i64>,
    s: Vec<i64>,
    p: Vec<i64>,
    d: Vec<i64>,
    ceil: bool,
}

fn window(args: &Args, n: usize, op: &str, dilated: bool) -> Result<Window> {
    let expand = |v: &[i64]| -> Vec<i64> {
        if v.len() == 1 {
            vec![v[0]; n]
        } else {
            v.to_vec()
        }
    };
    let k = args.ints("kernel_size")?;
    check!(
        k.len() == 1 || k.len() == n,
        Runtime,
        "{}: kernel_size must either be a single int, or a tuple of {} ints",
        op,
        word(n)
    );
    let s = args.opt_ints("stride")?.unwrap_or_default();
    check!(
        s.is_empty() || s.len() == 1 || s.len() == n,
        Runtime,
        "{}: stride must either be omitted, a single int, or a tuple of {} ints",
        op,
        word(n)
    );
    let p = args.opt_ints("padding")?.unwrap_or_else(|| vec![0]);
    check!(
        p.len() == 1 || p.len() == n,
        Runtime,
        "{}: padding must either be a single int, or a tuple of {} ints",
        op,
        word(n)
    );
    let d = if dilated { args.opt_ints("dilation")?.unwrap_or_else(|| vec![1]) } else { vec![1] };
    check!(
        d.len() == 1 || d.len() == n,
        Runtime,
        "{}: dilation must be either a single int, or a tuple of {} ints",
        op,
        word(n)
    );
    let k = expand(&k);
    let s = if s.is_empty() { k.clone() } else { expand(&s) };
    Ok(Window { k, s, p: expand(&p), d: expand(&d), ceil: args.bool_or("ceil_mode", false)? })
}

/// at::native::pooling_output_shape.
fn pooled_size(input: i64, k: i64, p: i64, s: i64, d: i64, ceil: bool) -> Result<i64> {
    check!(s != 0, Runtime, "stride should not be zero");
    check!(p >= 0, Runtime, "pad must be non-negative, but got pad: {}", p);
    check!(
        p <= ((k - 1) * d + 1) / 2,
        Runtime,
        "pad should be at most half of effective kernel size, but got pad={}, kernel_size={} and dilation={}",
        p,
        k,
        d
    );
    let mut o = div_floor(input + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 }, s) + 1;
    if ceil && (o - 1) * s >= input + p {
        o -= 1;
    }
    Ok(o)
}

/// Input rank check of a pooling op (3-D/4-D for 2 spatial dims, 4-D/5-D for 3).
fn pool_rank_check(dims: &[i64], n: usize, op: &str) -> Result<()> {
    if n == 2 {
        check!(
            dims.len() == 3 || dims.len() == 4,
            Runtime,
            "non-empty 3D or 4D (batch mode) tensor expected for input"
        );
    } else {
        check!(
            dims.len() == 4 || dims.len() == 5,
            Runtime,
            "{}: Expected 4D or 5D tensor for input, but got: {}",
            op,
            shape_str(dims)
        );
    }
    Ok(())
}

/// The output spatial sizes of a pooling call, with PyTorch's checks (pool2d_shape_check /
/// pool3d_shape_check).
fn pool_out(dims: &[i64], n: usize, w: &Window, op: &str, check_input_size: bool) -> Result<Vec<i64>> {
    pool_rank_check(dims, n, op)?;
    let sp = &dims[dims.len() - n..];
    let mut out = Vec::new();
    for i in 0..n {
        out.push(pooled_size(sp[i], w.k[i], w.p[i], w.s[i], w.d[i], w.ceil)?);
    }
    check!(w.k.iter().all(|&k| k > 0), Runtime, "kernel size should be greater than zero, but got {:?}", w.k);
    check!(w.s.iter().all(|&s| s > 0), Runtime, "stride should be greater than zero, but got {:?}", w.s);
    check!(w.d.iter().all(|&d| d > 0), Runtime, "dilation should be greater than zero, but got {:?}", w.d);
    let first = dims.len() - n - 1;
    let nonempty = if dims.len() == n + 1 { dims.iter().all(|&d| d != 0) } else { dims[first..].iter().all(|&d| d != 0) };
    if n == 2 {
        check!(
            nonempty,
            Runtime,
            "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:{}",
            shape_str(dims)
        );
    } else {
        check!(
            nonempty,
            Runtime,
            "{}: Expected input's non-batch dimensions to have positive length, but input has a shape of {}",
            op,
            shape_str(dims)
        );
    }
    if check_input_size {
        check!(
            (0..n).all(|i| sp[i] >= w.k[i]),
            Runtime,
            "input image {:?} smaller than kernel size {:?}",
            sp,
            w.k
        );
    }
    check!(
        (0..n).all(|i| w.k[i] / 2 >= w.p[i]),
        Runtime,
        "pad should be smaller than or equal to half of kernel size, but got padding {:?} and kernel size {:?}",
        w.p,
        w.k
    );
    let c = dims[first];
    check!(
        out.iter().all(|&o| o >= 1),
        Runtime,
        "Given input size: ({}x{}). Calculated output size: ({}x{}). Output size is too small",
        c,
        sp.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x"),
        c,
        out.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x")
    );
    Ok(out)
}

/// Checks that a backward op's tensor (grad_output or indices) has the pooled shape.
fn pooled_shape_check(what: &str, got: &[i64], in_dims: &[i64], out: &[i64]) -> Result<()> {
    let n = out.len();
    let mut want = in_dims[..in_dims.len() - n].to_vec();
    want.extend_from_slice(out);
    check!(
        got.len() == want.len(),
        Runtime,
        "Expected {} to have {} dimensions, but got {}",
        what,
        want.len(),
        got.len()
    );
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        check!(
            g == w,
            Runtime,
            "Expected tensor {} to have size {} at dimension {}, but got size {}",
            what,
            w,
            i,
            g
        );
    }
    Ok(())
}

/// Low/high padding (pooling padding on the left, up to the last window's end on the right)
/// and the window attributes of a pooling over the last `n` dims of `dims`.
fn window_attrs(dims: &[i64], w: &Window, out: &[i64]) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) {
    let r = dims.len();
    let n = out.len();
    let lead = r - n;
    let (mut low, mut high) = (vec![0; r], vec![0; r]);
    let (mut win, mut st, mut dil) = (vec![1; r], vec![1; r], vec![1; r]);
    for i in 0..n {
        let a = lead + i;
        let total = (out[i] - 1) * w.s[i] + (w.k[i] - 1) * w.d[i] + 1;
        low[a] = w.p[i];
        high[a] = total - dims[a] - w.p[i];
        win[a] = w.k[i];
        st[a] = w.s[i];
        dil[a] = w.d[i];
    }
    (low, high, win, st, dil)
}

/// Max pooling over the last `n` dims: the maxima and their flat indices within each plane.
fn max_windows(cx: &mut Cx, x: Value, w: &Window, out: &[i64]) -> (Value, Value) {
    let dims = cx.dims(x);
    let n = out.len();
    let r = dims.len();
    let dt = cx.dtype(x);
    let mut out_dims = dims[..r - n].to_vec();
    out_dims.extend_from_slice(out);
    if product(&out_dims) == 0 || product(&dims) == 0 {
        let v = zeros(cx, dt, &out_dims);
        let i = zeros(cx, DType::I64, &out_dims);
        return (v, i);
    }
    let idx = plane_iota(cx, &dims, n);
    let (low, high, win, st, dil) = window_attrs(&dims, w, out);
    let interior = vec![0; r];
    let lo = lowest(cx, dt);
    let sentinel = cx.constant_i64(i64::MAX, I64);
    let xp = cx.pad(x, lo, &low, &high, &interior);
    let ip = cx.pad(idx, sentinel, &low, &high, &interior);
    let res = cx.reduce_window(&[xp, ip], &[lo, sentinel], &win, &st, &[], &dil, &[], |b, a| {
        argmax_pair(b, a[0], a[1], a[2], a[3])
    });
    (res[0], res[1])
}

/// Window sums over the last `n` dims (zero padding, windows as in `window_attrs`).
fn sum_windows(cx: &mut Cx, x: Value, w: &Window, out: &[i64]) -> Value {
    let dims = cx.dims(x);
    let r = dims.len();
    let (low, high, win, st, dil) = window_attrs(&dims, w, out);
    let dt = cx.dtype(x);
    let z = cx.constant_f64(0.0, dt.elem());
    let xp = cx.pad(x, z, &low, &high, &vec![0; r]);
    cx.reduce_window(&[xp], &[z], &win, &st, &[], &dil, &[], |b, a| vec![b.add(a[0], a[1])])[0]
}

/// The transpose of `sum_windows`: every input position receives the sum of the gradients of
/// the windows that contain it. `in_dims` is the input's shape.
fn sum_windows_transpose(cx: &mut Cx, g: Value, w: &Window, in_dims: &[i64]) -> Value {
    let gd = cx.dims(g);
    let r = gd.len();
    let n = w.k.len();
    let lead = r - n;
    let dt = cx.dtype(g);
    if product(&gd) == 0 || product(in_dims) == 0 {
        return zeros(cx, dt, in_dims);
    }
    let z = cx.constant_f64(0.0, dt.elem());
    // Spread the gradients to their windows' first positions (interior padding), pad by the
    // kernel extent and sum over windows with stride 1: position p gets the windows that start
    // in (p - extent, p].
    let (mut low, mut high, mut interior) = (vec![0; r], vec![0; r], vec![0; r]);
    let (mut win, mut dil) = (vec![1; r], vec![1; r]);
    for i in 0..n {
        let a = lead + i;
        let ext = (w.k[i] - 1) * w.d[i];
        low[a] = ext;
        high[a] = ext;
        interior[a] = w.s[i] - 1;
        win[a] = w.k[i];
        dil[a] = w.d[i];
    }
    let gp = cx.pad(g, z, &low, &high, &interior);
    let summed = cx.reduce_window(&[gp], &[z], &win, &[], &[], &dil, &[], |b, a| vec![b.add(a[0], a[1])])[0];
    // `summed` covers the padded input from position 0 to the end of the last window: drop
    // the padding, and add zeros for trailing inputs no window reaches.
    let sd = cx.dims(summed);
    let (mut low, mut high) = (vec![0; r], vec![0; r]);
    for i in 0..n {
        let a = lead + i;
        low[a] = -w.p[i];
        high[a] = w.p[i] + in_dims[a] - sd[a];
    }
    cx.pad(summed, z, &low, &high, &vec![0; r])
}

// ---- max pooling ------------------------------------------------------------------------------

/// max_pool2d_with_indices / max_pool3d_with_indices (max_pool1d and max_pool2d reach the
/// first): values and flat indices within each plane.
fn max_pool(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let op = if n == 2 { "max_pool2d" } else { "max_pool3d" };
    let x = args.tensor("self")?;
    let w = window(args, n, op, true)?;
    let dims = cx.dims(x.v);
    pool_rank_check(&dims, n, op)?;
    let out = pool_out(&dims, n, &w, op, false)?;
    dtype_check(x.dtype != DType::Bool && !x.dtype.is_complex(), op, x.dtype)?;
    let (v, i) = max_windows(cx, x.v, &w, &out);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

fn max_pool_backward(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let op = if n == 2 { "max_pool2d_with_indices_backward" } else { "max_pool3d_with_indices_backward" };
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let idx = args.tensor("indices")?;
    let w = window(args, n, op, true)?;
    let dims = cx.dims(x.v);
    let out = pool_out(&dims, n, &w, op, false)?;
    pooled_shape_check("grad_output", &cx.dims(g.v), &dims, &out)?;
    pooled_shape_check("indices", &cx.dims(idx.v), &dims, &out)?;
    check_grad_dtype("gradInput", x.dtype, g.dtype)?;
    dtype_check(is_floating(x.dtype), op, x.dtype)?;
    let gi = plane_scatter(cx, g.v, idx.v, &dims, n, acc_type(x.dtype), Combine::Add);
    one(cx.cast(gi, x.dtype))
}

// ---- average pooling --------------------------------------------------------------------------

/// The divisor of each average pooling window along one dim: the window's size clipped to the
/// padded input (count_include_pad) or to the input.
fn avg_counts(input: i64, k: i64, s: i64, p: i64, out: i64, include_pad: bool) -> Vec<i64> {
    (0..out)
        .map(|o| {
            let start = o * s - p;
            let end = (start + k).min(input + p);
            let valid = end.min(input) - start.max(0);
            let c = if include_pad { end - start } else { valid };
            c.max(1)
        })
        .collect()
}

/// The divisors of average pooling for an output of dims `out_dims` (last `n` spatial), in `dt`.
fn avg_divisor(cx: &mut Cx, in_dims: &[i64], w: &Window, out_dims: &[i64], include_pad: bool, divisor: Option<i64>, dt: DType) -> Value {
    if let Some(d) = divisor {
        return cx.full(d as f64, dt, out_dims);
    }
    let n = w.k.len();
    let r = out_dims.len();
    let mut acc: Option<Value> = None;
    for i in 0..n {
        let a = r - n + i;
        let c = avg_counts(in_dims[a], w.k[i], w.s[i], w.p[i], out_dims[a], include_pad);
        let cv = ints_const(cx, &c);
        let cb = cx.broadcast_in_dim(cv, out_dims, &[a as i64]);
        acc = Some(match acc {
            None => cb,
            Some(v) => cx.mul(v, cb),
        });
    }
    cx.cast(acc.unwrap(), dt)
}

fn avg_pool_args(args: &Args, n: usize, op: &str) -> Result<(Window, bool, Option<i64>)> {
    let w = window(args, n, op, false)?;
    let include_pad = args.bool_or("count_include_pad", true)?;
    let divisor = args.opt_int("divisor_override")?;
    check!(divisor != Some(0), Runtime, "divisor must be not zero");
    Ok((w, include_pad, divisor))
}

fn avg_dtype_check(n: usize, d: DType) -> Result<()> {
    // avg_pool3d has no 16-bit CPU kernel.
    let ok = if n == 2 { is_floating(d) || d == DType::I64 } else { matches!(d, DType::F32 | DType::F64 | DType::I64) };
    dtype_check(ok, avg_kernel(n), d)
}

fn avg_kernel(n: usize) -> &'static str {
    if n == 2 {
        "avg_pool2d"
    } else {
        "avg_pool3d_out_frame"
    }
}

/// avg_pool2d / avg_pool3d (avg_pool1d reaches the first): window sums in the accumulation
/// dtype divided by the window size (integer division for int64 inputs).
fn avg_pool(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let op = if n == 2 { "avg_pool2d" } else { "avg_pool3d" };
    let x = args.tensor("self")?;
    let (w, include_pad, divisor) = avg_pool_args(args, n, op)?;
    let dims = cx.dims(x.v);
    pool_rank_check(&dims, n, op)?;
    let out = pool_out(&dims, n, &w, op, n == 3)?;
    avg_dtype_check(n, x.dtype)?;
    let mut out_dims = dims[..dims.len() - n].to_vec();
    out_dims.extend_from_slice(&out);
    if product(&out_dims) == 0 {
        return one(zeros(cx, x.dtype, &out_dims));
    }
    let acc = acc_type(x.dtype);
    let xv = cx.cast(x.v, acc);
    let sums = sum_windows(cx, xv, &w, &out);
    let div = avg_divisor(cx, &dims, &w, &out_dims, include_pad, divisor, acc);
    let y = cx.div(sums, div);
    one(cx.cast(y, x.dtype))
}

fn avg_pool_backward(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let op = if n == 2 { "avg_pool2d_backward" } else { "avg_pool3d_backward" };
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let (w, include_pad, divisor) = avg_pool_args(args, n, op)?;
    let dims = cx.dims(x.v);
    let out = pool_out(&dims, n, &w, op, n == 3)?;
    pooled_shape_check("grad_output", &cx.dims(g.v), &dims, &out)?;
    avg_dtype_check(n, x.dtype)?;
    let acc = acc_type(x.dtype);
    let gd = cx.dims(g.v);
    if product(&gd) == 0 || product(&dims) == 0 {
        return one(zeros(cx, x.dtype, &dims));
    }
    let gv = cx.cast(g.v, acc);
    let div = avg_divisor(cx, &dims, &w, &gd, include_pad, divisor, acc);
    let gv = cx.div(gv, div);
    let gi = sum_windows_transpose(cx, gv, &w, &dims);
    one(cx.cast(gi, x.dtype))
}

// ---- adaptive pooling -------------------------------------------------------------------------

/// The window [start, end) of adaptive pooling output `o` of `out` over `input` positions.
fn adaptive_window(o: i64, out: i64, input: i64) -> (i64, i64) {
    let start = (o / out) * input + ((o % out) * input) / out;
    let end = 1 + ((o + 1) * input - 1) / out;
    (start, end)
}

/// Gather indices of adaptive pooling along one dim: `out` windows of `k` taps each (k the
/// widest window); taps past a window's end read `filler` (or repeat its last element).
fn adaptive_taps(input: i64, out: i64, filler: Option<i64>) -> (Vec<i64>, i64, Vec<i64>) {
    let k = (0..out).map(|o| {
        let (s, e) = adaptive_window(o, out, input);
        e - s
    });
    let k = k.max().unwrap_or(1).max(1);
    let mut idx = Vec::new();
    let mut counts = Vec::new();
    for o in 0..out {
        let (s, e) = adaptive_window(o, out, input);
        counts.push(e - s);
        for t in 0..k {
            idx.push(if s + t < e { s + t } else { filler.unwrap_or(e - 1) });
        }
    }
    (idx, k, counts)
}

/// `x` (dims L + S) gathered into adaptive windows: dims L + (O1, K1, O2, K2, ...), with the
/// tap lists per dim (`pad_zero`: taps past a window read an appended zero).
fn adaptive_gather(cx: &mut Cx, x: Value, out: &[i64], pad_zero: bool) -> (Value, Vec<Vec<i64>>, Vec<i64>, Vec<Vec<i64>>) {
    let dims = cx.dims(x);
    let n = out.len();
    let lead = dims.len() - n;
    let mut y = x;
    if pad_zero {
        let dt = cx.dtype(x);
        let z = cx.constant_f64(0.0, dt.elem());
        let r = dims.len();
        let mut high = vec![0; r];
        for h in high.iter_mut().skip(lead) {
            *h = 1;
        }
        y = cx.pad(y, z, &vec![0; r], &high, &vec![0; r]);
    }
    let mut taps = Vec::new();
    let mut ks = Vec::new();
    let mut counts = Vec::new();
    for i in 0..n {
        let input = dims[lead + i];
        let (idx, k, c) = adaptive_taps(input, out[i], if pad_zero { Some(input) } else { None });
        y = take(cx, y, lead + i, &idx);
        taps.push(idx);
        ks.push(k);
        counts.push(c);
    }
    let mut split = dims[..lead].to_vec();
    for i in 0..n {
        split.push(out[i]);
        split.push(ks[i]);
    }
    let y = cx.reshape(y, &split);
    (y, taps, ks, counts)
}

/// Sums the last dim of `v` one element after another, in `v`'s dtype (a loop, so that 16-bit
/// sums round like a sequential CPU loop).
fn sum_in_order(cx: &mut Cx, v: Value) -> Value {
    let dims = cx.dims(v);
    let r = dims.len();
    let k = dims[r - 1];
    let out = dims[..r - 1].to_vec();
    let dt = cx.dtype(v);
    let z = zeros(cx, dt, &out);
    let i0 = cx.constant_i64(0, I64);
    let res = cx.while_loop(
        &[i0, z],
        |b, a| {
            let kk = b.constant_i64(k, I64);
            b.compare(CmpDir::Lt, a[0], kk)
        },
        |b, a| {
            let zi = b.constant_i64(0, I64);
            let mut starts = vec![zi; r - 1];
            starts.push(a[0]);
            let mut sizes = out.clone();
            sizes.push(1);
            let sl = b.dynamic_slice(v, &starts, &sizes);
            let sl = b.reshape(sl, &out);
            let acc = b.add(a[1], sl);
            let one = b.constant_i64(1, I64);
            vec![b.add(a[0], one), acc]
        },
    );
    res[1]
}

/// Divides `v` (dims L + O) by the window sizes of each dim in turn (PyTorch: sum / kh / kw).
fn divide_counts(cx: &mut Cx, mut v: Value, counts: &[Vec<i64>]) -> Value {
    let dims = cx.dims(v);
    let n = counts.len();
    let lead = dims.len() - n;
    let dt = cx.dtype(v);
    for (i, c) in counts.iter().enumerate() {
        let cf: Vec<f64> = c.iter().map(|&x| x as f64).collect();
        let cv = cx.constant_array_f64(&cf, &[c.len() as i64], dt.elem());
        let cb = cx.broadcast_in_dim(cv, &dims, &[(lead + i) as i64]);
        v = cx.div(v, cb);
    }
    v
}

/// An (unbatched or batched) input of an n-d pooling op: n + 1 or n + 2 dims.
fn check_pool_rank(name: &str, dims: &[i64], n: usize) -> Result<()> {
    check!(
        dims.len() == n + 1 || dims.len() == n + 2,
        Runtime,
        "{}(): Expected {}D or {}D tensor, but got: {}",
        name,
        n + 1,
        n + 2,
        shape_str(dims)
    );
    Ok(())
}

/// The adaptive pooling backward's check that grad_output has no empty non-batch dim.
fn check_grad_nonempty(name: &str, gd: &[i64]) -> Result<()> {
    for (i, &d) in gd.iter().enumerate().skip(1) {
        check!(
            d > 0,
            Runtime,
            "{}(): Expected grad_output to have non-zero size for non-batch dimensions, but grad_output has sizes {} with dimension {} being empty",
            name,
            shape_str(gd),
            i
        );
    }
    Ok(())
}

fn adaptive_checks(cx: &Cx, x: &crate::Tensor, n: usize, out: &[i64], avg: bool) -> Result<()> {
    let dims = cx.dims(x.v);
    let name = format!("adaptive_{}_pool{}d", if avg { "avg" } else { "max" }, n);
    if avg {
        check!(out.len() == n, Runtime, "{}: output_size must be {}", name, n);
    } else {
        check!(out.len() == n, Runtime, "{}(): internal error: output_size.size() must be {}", name, n);
    }
    check_pool_rank(&name, &dims, n)?;
    for (i, &d) in dims.iter().enumerate().skip(dims.len() - n - 1) {
        check!(
            d > 0 || (avg && i == dims.len() - n - 1),
            Runtime,
            "{}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes {} with dimension {} being empty",
            name,
            shape_str(&dims),
            i
        );
    }
    check!(out.iter().all(|&o| o >= 0), Runtime, "{}: elements of output_size must be greater than or equal to 0 but received {:?}", name, out);
    let kernel = if n == 2 { name.clone() } else { format!("{}_cpu", name) };
    dtype_check(is_floating(x.dtype), &kernel, x.dtype)
}

/// _adaptive_avg_pool2d / _adaptive_avg_pool3d.
fn adaptive_avg_pool(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let out = args.ints("output_size")?;
    adaptive_checks(cx, &x, n, &out, true)?;
    let dims = cx.dims(x.v);
    let lead = dims.len() - n;
    let mut out_dims = dims[..lead].to_vec();
    out_dims.extend_from_slice(&out);
    if product(&out_dims) == 0 || product(&dims) == 0 {
        return one(zeros(cx, x.dtype, &out_dims));
    }
    if n == 3 && matches!(x.dtype, DType::BF16 | DType::F16) {
        // The 3-d CPU kernel sums 16-bit inputs in their own dtype, in window order.
        let (y, _, ks, counts) = adaptive_gather(cx, x.v, &out, true);
        let mut perm: Vec<i64> = (0..lead as i64).collect();
        perm.extend((0..n).map(|i| (lead + 2 * i) as i64));
        perm.extend((0..n).map(|i| (lead + 2 * i + 1) as i64));
        let y = cx.transpose(y, &perm);
        let mut flat = out_dims.clone();
        flat.push(product(&ks));
        let y = cx.reshape(y, &flat);
        let s = sum_in_order(cx, y);
        return one(divide_counts(cx, s, &counts));
    }
    let acc = acc_type(x.dtype);
    let xv = cx.cast(x.v, acc);
    let (y, _, _, counts) = adaptive_gather(cx, xv, &out, true);
    let kdims: Vec<i64> = (0..n).map(|i| (lead + 2 * i + 1) as i64).collect();
    let s = crate::blocks::reduce::reduce(cx, y, &kdims, crate::blocks::reduce::Red::Sum);
    let s = divide_counts(cx, s, &counts);
    one(cx.cast(s, x.dtype))
}

fn adaptive_avg_pool_backward(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let gd = cx.dims(g.v);
    let dims = cx.dims(x.v);
    let name = format!("adaptive_avg_pool{}d_backward", n);
    if n == 3 && dims.len() < 4 {
        // PyTorch's CPU kernel reads input.size(-4) first.
        check!(!dims.is_empty(), Index, "Dimension specified as -4 but tensor has no dimensions");
        bail!(Index, "Dimension out of range (expected to be in range of [-{}, {}], but got -4)", dims.len(), dims.len() - 1);
    }
    check!(
        gd.len() == dims.len() && (gd.len() == n + 1 || gd.len() == n + 2),
        Runtime,
        "{}(): Expected {}D or {}D tensor, but got {}",
        name,
        n + 1,
        n + 2,
        shape_str(&gd)
    );
    check_grad_nonempty(&name, &gd)?;
    check_grad_dtype("grad_output", x.dtype, g.dtype)?;
    let kernel = if n == 2 { "adaptive_avg_pool2d_backward_cpu".to_string() } else { "adaptive_avg_pool3d_backward_cpu".to_string() };
    dtype_check(is_floating(x.dtype), &kernel, x.dtype)?;
    let lead = dims.len() - n;
    if product(&gd) == 0 || product(&dims) == 0 {
        return one(zeros(cx, x.dtype, &dims));
    }
    let out = gd[lead..].to_vec();
    let acc = acc_type(x.dtype);
    let gv = cx.cast(g.v, acc);
    let gv = divide_counts(cx, gv, &{
        let mut c = Vec::new();
        for i in 0..n {
            c.push(adaptive_taps(dims[lead + i], out[i], None).2);
        }
        c
    });
    // Broadcast each gradient over its window's taps, then scatter the taps back.
    let mut split = gd[..lead].to_vec();
    let mut bdims: Vec<i64> = (0..lead as i64).collect();
    let mut taps = Vec::new();
    for i in 0..n {
        let input = dims[lead + i];
        let (idx, k, _) = adaptive_taps(input, out[i], Some(input));
        bdims.push(split.len() as i64);
        split.push(out[i]);
        split.push(k);
        taps.push((idx, k));
    }
    let b = cx.broadcast_in_dim(gv, &split, &bdims);
    let mut flat = gd[..lead].to_vec();
    for i in 0..n {
        flat.push(out[i] * taps[i].1);
    }
    let mut y = cx.reshape(b, &flat);
    for i in 0..n {
        y = take_transpose(cx, y, lead + i, &taps[i].0, dims[lead + i] + 1);
    }
    let r = dims.len();
    let y = cx.slice(y, &vec![0; r], &dims, &vec![1; r]);
    one(cx.cast(y, x.dtype))
}

/// adaptive_max_pool2d / adaptive_max_pool3d: maxima and flat plane indices.
fn adaptive_max_pool(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let out = args.ints("output_size")?;
    adaptive_checks(cx, &x, n, &out, false)?;
    let dims = cx.dims(x.v);
    let lead = dims.len() - n;
    let mut out_dims = dims[..lead].to_vec();
    out_dims.extend_from_slice(&out);
    if product(&out_dims) == 0 || product(&dims) == 0 {
        let v = zeros(cx, x.dtype, &out_dims);
        let i = zeros(cx, DType::I64, &out_dims);
        return Ok(vec![Out::Tensor(v), Out::Tensor(i)]);
    }
    let iota = plane_iota(cx, &dims, n);
    let (v, _, _, _) = adaptive_gather(cx, x.v, &out, false);
    let (i, _, _, _) = adaptive_gather(cx, iota, &out, false);
    let kdims: Vec<i64> = (0..n).map(|i| (lead + 2 * i + 1) as i64).collect();
    let lo = lowest(cx, x.dtype);
    let sentinel = cx.constant_i64(i64::MAX, I64);
    let res = cx.reduce(&[v, i], &[lo, sentinel], &kdims, |b, a| argmax_pair(b, a[0], a[1], a[2], a[3]));
    Ok(vec![Out::Tensor(res[0]), Out::Tensor(res[1])])
}

fn adaptive_max_pool_backward(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let idx = args.tensor("indices")?;
    let gd = cx.dims(g.v);
    let dims = cx.dims(x.v);
    let name = format!("adaptive_max_pool{}d_backward", n);
    check!(
        gd.len() == dims.len() && (gd.len() == n + 1 || gd.len() == n + 2),
        Runtime,
        "{}(): Expected {}D or {}D grad_output, but got: {}",
        name,
        n + 1,
        n + 2,
        shape_str(&gd)
    );
    check_grad_nonempty(&name, &gd)?;
    check!(
        cx.dims(idx.v) == gd,
        Runtime,
        "expected sizes={} for `indices` but got {}",
        shape_str(&gd),
        shape_str(&cx.dims(idx.v))
    );
    check_grad_dtype("gradInput", x.dtype, g.dtype)?;
    let kernel = if n == 2 { "adaptive_max_pool2d_backward".to_string() } else { "adaptive_max_pool3d_backward_cpu".to_string() };
    dtype_check(is_floating(x.dtype), &kernel, x.dtype)?;
    let gi = plane_scatter(cx, g.v, idx.v, &dims, n, acc_type(x.dtype), Combine::Add);
    one(cx.cast(gi, x.dtype))
}

// ---- fractional max pooling -------------------------------------------------------------------

/// Checks of fractional_max_pool{2,3}d and its backward; returns (kernel, output sizes).
fn fractional_checks(cx: &Cx, x: &crate::Tensor, args: &Args, n: usize) -> Result<(Vec<i64>, Vec<i64>)> {
    let name = format!("fractional_max_pool{}d", n);
    let k = args.ints("kernel_size")?;
    let out = args.ints("output_size")?;
    check!(k.len() == n, Runtime, "{}: kernel_size must either be a single Int or tuple of Ints", name);
    check!(out.len() == n, Runtime, "{}: output_size must either be a single Int or tuple of Ints", name);
    let dims = cx.dims(x.v);
    let r = dims.len();
    check_pool_rank(&name, &dims, n)?;
    for (i, &d) in dims.iter().enumerate().skip(r - n - 1) {
        check!(
            d > 0,
            Runtime,
            "{}(): Expected input to have non-zero size for non-batch dimensions, but got {} with dimension {} being empty.",
            name,
            shape_str(&dims),
            i
        );
    }
    for i in 0..n {
        let input = dims[r - n + i];
        check!(
            out[i] + k[i] - 1 <= input,
            Runtime,
            "{}(): pool size {} too large relative to input size {}",
            name,
            k[i],
            input
        );
    }
    dtype_check(is_floating(x.dtype), &name, x.dtype)?;
    Ok((k, out))
}

/// fractional_max_pool2d / 3d(self, kernel_size, output_size, random_samples): windows of
/// kernel_size starting at PyTorch's pseudo-random interval sequence (one sample per plane and
/// dim, computed in the input dtype), maxima and flat plane indices.
fn fractional_max_pool(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let samples = args.tensor("random_samples")?;
    let (k, out) = fractional_checks(cx, &x, args, n)?;
    let dims = cx.dims(x.v);
    let r = dims.len();
    let lead = dims[..r - n].to_vec();
    let planes = product(&lead);
    let sd = cx.dims(samples.v);
    check!(
        sd.len() == 3 && sd[2] == n as i64 && sd[0] * sd[1] == planes,
        Runtime,
        "fractional_max_pool{}d(): expected random_samples of shape [N, C, {}] for input {}, but got {}",
        n,
        n,
        shape_str(&dims),
        shape_str(&sd)
    );
    let mut out_dims = lead.clone();
    out_dims.extend_from_slice(&out);
    if product(&out_dims) == 0 {
        let v = zeros(cx, x.dtype, &out_dims);
        let i = zeros(cx, DType::I64, &out_dims);
        return Ok(vec![Out::Tensor(v), Out::Tensor(i)]);
    }
    let dt = x.dtype;
    let smp = cx.cast(samples.v, dt);
    let smp = cx.reshape(smp, &[planes, n as i64]);
    let in_sp = &dims[r - n..];
    // Window dims: (planes, O1, k1, O2, k2, ...).
    let mut wdims = vec![planes];
    for i in 0..n {
        wdims.push(out[i]);
        wdims.push(k[i]);
    }
    let mut flat: Option<Value> = None;
    let mut stride = 1i64;
    for i in (0..n).rev() {
        // The 2-d samples are ordered (w, h); the 3-d ones (t, h, w).
        let which = if n == 2 { 1 - i } else { i };
        let s = cx.slice(smp, &[0, which as i64], &[planes, which as i64 + 1], &[1, 1]);
        let s = cx.reshape(s, &[planes]);
        let starts = fractional_starts(cx, s, in_sp[i], out[i], k[i], dt);
        let ty = TensorType::new(I64, &[planes, out[i], k[i]]);
        let sb = cx.broadcast_in_dim(starts, &[planes, out[i], k[i]], &[0, 1]);
        let t = cx.iota(&ty, 2);
        let c = cx.add(sb, t);
        let st = cx.b.splat_i64(stride, &ty);
        let c = cx.mul(c, st);
        let cb = cx.broadcast_in_dim(c, &wdims, &[0, (1 + 2 * i) as i64, (2 + 2 * i) as i64]);
        flat = Some(match flat {
            None => cb,
            Some(f) => cx.add(f, cb),
        });
        stride *= in_sp[i];
    }
    let flat = flat.unwrap();
    let m = stride;
    let ty = TensorType::new(I64, &wdims);
    let row = cx.iota(&ty, 0);
    let mm = cx.b.splat_i64(m, &ty);
    let off = cx.mul(row, mm);
    let global = cx.add(flat, off);
    let mut gshape = wdims.clone();
    gshape.push(1);
    let global = cx.reshape(global, &gshape);
    let xf = cx.reshape(x.v, &[planes * m]);
    let dn = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: wdims.len() as i64,
        ..Default::default()
    };
    let vals = cx.gather(xf, global, &dn, &[1], false);
    let kdims: Vec<i64> = (0..n).map(|i| (2 + 2 * i) as i64).collect();
    let lo = lowest(cx, dt);
    let sentinel = cx.constant_i64(i64::MAX, I64);
    let res = cx.reduce(&[vals, flat], &[lo, sentinel], &kdims, |b, a| argmax_pair(b, a[0], a[1], a[2], a[3]));
    let v = cx.reshape(res[0], &out_dims);
    let i = cx.reshape(res[1], &out_dims);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

/// generate_intervals: window starts (planes, out) from one sample per plane, in `dt`
/// arithmetic: (int)((i + sample) * alpha) - (int)(sample * alpha), the last start in - k.
fn fractional_starts(cx: &mut Cx, sample: Value, input: i64, out: i64, k: i64, dt: DType) -> Value {
    let planes = cx.dims(sample)[0];
    let ty = TensorType::new(I64, &[planes, out]);
    let last = cx.b.splat_i64(input - k, &ty);
    if out == 1 {
        return last;
    }
    let e = dt.elem();
    // (scalar_t)(in - k) / (scalar_t)(out - 1): a float division for 16-bit types, rounded.
    let q = stablehlo::round_to((input - k) as f64, e) / stablehlo::round_to((out - 1) as f64, e);
    let q = if dt == DType::F64 { q } else { q as f32 as f64 };
    let alpha = stablehlo::round_to(q, e);
    let av = cx.full(alpha, dt, &[planes, out]);
    let sb = cx.broadcast_in_dim(sample, &[planes, out], &[0]);
    let io = cx.iota(&ty, 1);
    let iof = cx.convert(io, e);
    let ip = cx.add(iof, sb);
    let a = cx.mul(ip, av);
    let a = cx.convert(a, I64);
    let b = cx.mul(sb, av);
    let b = cx.convert(b, I64);
    let st = cx.sub(a, b);
    let ity = TensorType::new(I64, &[planes, out]);
    let pos = cx.iota(&ity, 1);
    let lastpos = cx.b.splat_i64(out - 1, &ity);
    let is_last = cx.compare(CmpDir::Eq, pos, lastpos);
    cx.select(is_last, last, st)
}

fn fractional_max_pool_backward(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let idx = args.tensor("indices")?;
    let (_, out) = fractional_checks(cx, &x, args, n)?;
    let dims = cx.dims(x.v);
    pooled_shape_check("grad_output", &cx.dims(g.v), &dims, &out)?;
    pooled_shape_check("indices", &cx.dims(idx.v), &dims, &out)?;
    let gi = plane_scatter(cx, g.v, idx.v, &dims, n, acc_type(x.dtype), Combine::Add);
    one(cx.cast(gi, x.dtype))
}

// ---- max unpooling ----------------------------------------------------------------------------

/// max_unpool2d(self, indices, output_size) / max_unpool3d(..., stride, padding): each value
/// written at its flat index in a zero plane of output_size. PyTorch raises for indices outside
/// the plane; a device program cannot, so such values are dropped.
fn max_unpool(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let idx = args.tensor("indices")?;
    let out = args.ints("output_size")?;
    let dims = cx.dims(x.v);
    let what = if n == 2 { "two elements (height, width)" } else { "three elements (depth, height, width)" };
    check!(
        idx.dtype == DType::I64,
        Runtime,
        "elements in indices should be type int64 but got: {}",
        idx.dtype.torch_name()
    );
    check!(
        out.len() == n,
        Runtime,
        "There should be exactly {} in output_size, but got {} elements.",
        what,
        out.len()
    );
    check!(
        dims.len() == n + 1 || dims.len() == n + 2,
        Runtime,
        "Input to max_unpooling{}d should be a {}d or {}d Tensor, but got a tensor with {} dimensions.",
        n,
        n + 1,
        n + 2,
        dims.len()
    );
    if n == 3 {
        let stride = args.ints("stride")?;
        let padding = args.ints("padding")?;
        check!(stride.len() == 3, Runtime, "There should be exactly {} in stride, but got: {} elements.", what, stride.len());
        check!(padding.len() == 3, Runtime, "There should be exactly {} in padding, but got: {} elements.", what, padding.len());
        check!(stride.iter().all(|&s| s > 0), Runtime, "strides should be greater than zero, but got stride: {}", shape_str(&stride));
    }
    check!(
        cx.dims(idx.v) == dims,
        Runtime,
        "Expected shape of indices to be same as that of the input tensor ({}) but got indices tensor with shape: {}",
        shape_str(&dims),
        shape_str(&cx.dims(idx.v))
    );
    for (i, &d) in dims.iter().enumerate().skip(1) {
        check!(
            d > 0,
            Runtime,
            "max_unpooling{}d_forward_out_cpu(): Expected input to have non-zero size for non-batch dimensions, but got {} with dimension {} being empty.",
            n,
            shape_str(&dims),
            i
        );
    }
    dtype_check(is_floating(x.dtype), &format!("max_unpool{}d", n), x.dtype)?;
    let mut out_dims = dims[..dims.len() - n].to_vec();
    out_dims.extend_from_slice(&out);
    // PyTorch's CPU kernel checks every index against the output plane and reports the last
    // bad one: the first of the reversed indices.
    let plane: i64 = out.iter().product();
    let all: i64 = dims.iter().product();
    let flat = cx.reshape(idx.v, &[all]);
    let last_first = cx.reverse(flat, &[0]);
    let sizes: Vec<String> = out.iter().map(|d| d.to_string()).collect();
    let msg = format!("Found an invalid max index: {{value}} (output volumes are of size {})", sizes.join("x"));
    cx.check_index(last_first, 0, plane, crate::ErrorKind::Runtime, msg);
    let y = plane_scatter(cx, x.v, idx.v, &out_dims, n, x.dtype, Combine::Replace);
    one(y)
}

// ---- upsampling -------------------------------------------------------------------------------

#[derive(Copy, Clone, PartialEq, Eq)]
enum Mode {
    Nearest,
    NearestExact,
    Linear,
    Cubic,
    LinearAa,
    CubicAa,
}

impl Mode {
    fn weighted(self) -> bool {
        !matches!(self, Mode::Nearest | Mode::NearestExact)
    }
}

/// Host arithmetic in the precision of PyTorch's `opmath_t`: every operation rounded to float32
/// (`single`), or plain float64.
#[derive(Copy, Clone)]
struct Fp {
    single: bool,
}

impl Fp {
    fn r(self, x: f64) -> f64 {
        if self.single {
            x as f32 as f64
        } else {
            x
        }
    }
    fn add(self, a: f64, b: f64) -> f64 {
        self.r(a + b)
    }
    fn sub(self, a: f64, b: f64) -> f64 {
        self.r(a - b)
    }
    fn mul(self, a: f64, b: f64) -> f64 {
        self.r(a * b)
    }
    fn div(self, a: f64, b: f64) -> f64 {
        self.r(a / b)
    }
}

/// compute_scales_value: 1/scale when a positive scale was given, else input/output.
fn scales_value(fp: Fp, scale: Option<f64>, input: i64, out: i64) -> f64 {
    match scale {
        Some(s) if s > 0.0 => fp.r(1.0 / s),
        _ => fp.div(fp.r(input as f64), fp.r(out as f64)),
    }
}

/// area_pixel_compute_scale.
fn area_scale(fp: Fp, input: i64, out: i64, align_corners: bool, scale: Option<f64>) -> f64 {
    if align_corners {
        if out > 1 {
            fp.div(fp.r((input - 1) as f64), fp.r((out - 1) as f64))
        } else {
            0.0
        }
    } else {
        scales_value(fp, scale, input, out)
    }
}

/// area_pixel_compute_source_index.
fn source_index(fp: Fp, scale: f64, o: i64, align_corners: bool, cubic: bool) -> f64 {
    if align_corners {
        fp.mul(scale, fp.r(o as f64))
    } else {
        let src = fp.sub(fp.mul(scale, fp.r(o as f64 + 0.5)), 0.5);
        if !cubic && src < 0.0 {
            0.0
        } else {
            src
        }
    }
}

/// guard_index_and_lambda: the lower input index (floorf, clamped) and the fraction past it.
fn guard(fp: Fp, src: f64, input: i64) -> (i64, f64) {
    let i = ((src as f32).floor() as i64).min(input - 1);
    let lambda = fp.sub(src, i as f64).clamp(0.0, 1.0);
    (i, lambda)
}

/// The cubic convolution coefficients of PyTorch's bicubic kernels (A = -0.75) for fraction t.
fn cubic_coeffs(fp: Fp, t: f64) -> [f64; 4] {
    let a = -0.75;
    // ((A + 2) * x - (A + 3)) * x * x + 1
    let c1 = |x: f64| fp.add(fp.mul(fp.mul(fp.sub(fp.mul(a + 2.0, x), a + 3.0), x), x), 1.0);
    // ((A * x - 5A) * x + 8A) * x - 4A
    let c2 = |x: f64| fp.sub(fp.mul(fp.add(fp.mul(fp.sub(fp.mul(a, x), 5.0 * a), x), 8.0 * a), x), 4.0 * a);
    let x2 = fp.sub(1.0, t);
    [c2(fp.add(t, 1.0)), c1(t), c1(x2), c2(fp.add(x2, 1.0))]
}

/// The taps of one upsampled dim.
fn upsample_taps(mode: Mode, fp: Fp, input: i64, out: i64, align_corners: bool, scale: Option<f64>) -> Taps {
    match mode {
        Mode::Nearest | Mode::NearestExact => {
            let idx = (0..out)
                .map(|o| {
                    if mode == Mode::Nearest && out == input {
                        o
                    } else if mode == Mode::Nearest && out == 2 * input {
                        o >> 1
                    } else {
                        // nearest_idx / nearest_exact_idx compute in float32 whatever the dtype.
                        let s = scales_value(Fp { single: true }, scale, input, out) as f32;
                        let f = if mode == Mode::Nearest {
                            (o as f32 * s).floor()
                        } else {
                            (((o as f64 + 0.5) * s as f64) as f32).floor()
                        };
                        (f as i64).min(input - 1)
                    }
                })
                .collect();
            Taps { idx: vec![idx], w: None }
        }
        Mode::Linear => {
            let ratio = area_scale(fp, input, out, align_corners, scale);
            let (mut i0, mut i1, mut w0, mut w1) = (vec![], vec![], vec![], vec![]);
            for o in 0..out {
                if out == input {
                    i0.push(o);
                    i1.push(o);
                    w0.push(1.0);
                    w1.push(0.0);
                    continue;
                }
                let src = source_index(fp, ratio, o, align_corners, false);
                let (i, l1) = guard(fp, src, input);
                i0.push(i);
                i1.push(if i < input - 1 { i + 1 } else { i });
                w0.push(fp.sub(1.0, l1));
                w1.push(l1);
            }
            Taps { idx: vec![i0, i1], w: Some(vec![w0, w1]) }
        }
        Mode::Cubic => {
            let ratio = area_scale(fp, input, out, align_corners, scale);
            let mut idx = vec![vec![]; 4];
            let mut w = vec![vec![]; 4];
            for o in 0..out {
                let src = source_index(fp, ratio, o, align_corners, true);
                let (i, t) = guard(fp, src, input);
                let c = cubic_coeffs(fp, t);
                for j in 0..4 {
                    idx[j].push((i - 1 + j as i64).clamp(0, input - 1));
                    w[j].push(c[j]);
                }
            }
            Taps { idx, w: Some(w) }
        }
        Mode::LinearAa | Mode::CubicAa => aa_taps(mode == Mode::CubicAa, fp, input, out, align_corners, scale),
    }
}

/// Antialiased taps (PyTorch's _upsample_*_aa, after Pillow): when downsampling, the filter
/// support widens with the scale; weights are normalized to sum to one.
fn aa_taps(cubic: bool, fp: Fp, input: i64, out: i64, align_corners: bool, scale: Option<f64>) -> Taps {
    let interp = if cubic { 4.0 } else { 2.0 };
    let s = area_scale(fp, input, out, align_corners, scale);
    let support = if s >= 1.0 { fp.mul(interp * 0.5, s) } else { interp * 0.5 };
    let filter = |x: f64| -> f64 {
        let x = x.abs();
        if cubic {
            let a = -0.5;
            if x < 1.0 {
                fp.add(fp.mul(fp.mul(fp.sub(fp.mul(a + 2.0, x), a + 3.0), x), x), 1.0)
            } else if x < 2.0 {
                fp.sub(fp.mul(fp.add(fp.mul(fp.sub(fp.mul(a, x), 5.0 * a), x), 8.0 * a), x), 4.0 * a)
            } else {
                0.0
            }
        } else if x < 1.0 {
            fp.sub(1.0, x)
        } else {
            0.0
        }
    };
    let max_size = (support.ceil() as i64) * 2 + 1;
    let mut rows: Vec<(i64, Vec<f64>)> = Vec::new();
    let mut width = 0usize;
    for o in 0..out {
        let center = fp.mul(s, o as f64 + 0.5);
        let invscale = if s >= 1.0 { fp.r(1.0 / s) } else { 1.0 };
        // C++: static_cast<int64_t>(center - support + 0.5), the 0.5 added in double.
        let xmin = ((fp.sub(center, support) + 0.5) as i64).max(0);
        let xsize = (((fp.add(center, support) + 0.5) as i64).min(input) - xmin).clamp(0, max_size);
        let mut ws = Vec::new();
        let mut total = 0.0;
        for j in 0..xsize {
            let wv = filter(fp.r((fp.sub((j + xmin) as f64, center) + 0.5) * invscale));
            total = fp.add(total, wv);
            ws.push(wv);
        }
        if total != 0.0 {
            for wv in ws.iter_mut() {
                *wv = fp.div(*wv, total);
            }
        }
        width = width.max(ws.len());
        rows.push((xmin, ws));
    }
    let mut idx = vec![vec![]; width];
    let mut w = vec![vec![]; width];
    for (xmin, ws) in rows {
        for j in 0..width {
            // Missing taps read the first element with weight zero.
            if j < ws.len() {
                idx[j].push(xmin + j as i64);
                w[j].push(ws[j]);
            } else {
                idx[j].push(xmin);
                w[j].push(0.0);
            }
        }
    }
    Taps { idx, w: Some(w) }
}

fn round_weights(taps: &mut Taps, dtype: DType) {
    if let Some(w) = taps.w.as_mut() {
        for row in w.iter_mut() {
            for v in row.iter_mut() {
                *v = stablehlo::round_to(*v, dtype.elem());
            }
        }
    }
}

/// Linear weights as the generic kernel stores them: lambda1 rounded, then 1 - lambda1 rounded.
fn round_linear_weights(taps: &mut Taps, dtype: DType) {
    if let Some(w) = taps.w.as_mut() {
        for o in 0..w[1].len() {
            let l1 = stablehlo::round_to(w[1][o], dtype.elem());
            w[1][o] = l1;
            w[0][o] = stablehlo::round_to((1.0 - l1) as f32 as f64, dtype.elem());
        }
    }
}

fn scale_names(n: usize) -> &'static [&'static str] {
    match n {
        1 => &["scales"],
        2 => &["scales_h", "scales_w"],
        _ => &["scales_d", "scales_h", "scales_w"],
    }
}

fn mode_kernel(mode: Mode, n: usize) -> String {
    match mode {
        Mode::Nearest | Mode::NearestExact => format!("upsample_nearest{}d", n),
        Mode::Linear if n == 1 => "upsample_linear1d".to_string(),
        Mode::Linear if n == 2 => "upsample_bilinear2d".to_string(),
        Mode::Linear => "upsample_trilinear3d".to_string(),
        Mode::Cubic => "upsample_bicubic2d".to_string(),
        Mode::LinearAa => "_upsample_bilinear2d_aa".to_string(),
        Mode::CubicAa => "_upsample_bicubic2d_aa".to_string(),
    }
}

/// The output size and per-dim scales of an upsample call: the default overload (output_size
/// and scales_*) or the .vec one (output_size or scale_factors).
fn upsample_size(args: &Args, n: usize, in_dims: &[i64]) -> Result<(Vec<i64>, Vec<Option<f64>>)> {
    if args.names.iter().any(|a| a == "scale_factors") {
        let os = args.opt_ints("output_size")?;
        let sf = match args.get("scale_factors") {
            None | Some(Arg::None) => None,
            Some(Arg::FloatList(v)) => Some(v.clone()),
            Some(Arg::IntList(v)) => Some(v.iter().map(|&x| x as f64).collect()),
            _ => bail!(Type, "{}(): expected argument 'scale_factors' to be a list of floats", args.op),
        };
        return match (os, sf) {
            (Some(o), None) => {
                check!(o.len() == n, Runtime, "It is expected output_size equals to {}, but got size {}", n, o.len());
                Ok((o, vec![None; n]))
            }
            (None, Some(s)) => {
                check!(s.len() == n, Runtime, "It is expected scale_factors equals to {}, but got size {}", n, s.len());
                check!(in_dims.len() == n + 2, Runtime, "It is expected input_size equals to {}, but got size {}", n + 2, in_dims.len());
                let o = (0..n).map(|i| (in_dims[2 + i] as f64 * s[i]) as i64).collect();
                Ok((o, s.into_iter().map(Some).collect()))
            }
            _ => bail!(Runtime, "Must specify exactly one of output_size and scale_factors"),
        };
    }
    let o = args.ints("output_size")?;
    let mut scales = Vec::new();
    for name in scale_names(n) {
        scales.push(opt_float(args, name)?);
    }
    Ok((o, scales))
}

fn upsample_common_check(n: usize, in_dims: &[i64], out: &[i64]) -> Result<()> {
    check!(out.len() == n, Runtime, "It is expected output_size equals to {}, but got size {}", n, out.len());
    check!(in_dims.len() == n + 2, Runtime, "It is expected input_size equals to {}, but got size {}", n + 2, in_dims.len());
    check!(
        in_dims[2..].iter().all(|&d| d > 0) && out.iter().all(|&d| d > 0),
        Runtime,
        "Input and output sizes should be greater than 0, but got input {} and output {}",
        shape_str(&in_dims[2..]),
        shape_str(out)
    );
    Ok(())
}

fn upsample_dtype_check(mode: Mode, n: usize, d: DType) -> Result<()> {
    match mode {
        // The antialiased kernels take float, double and uint8 only.
        Mode::LinearAa | Mode::CubicAa => {
            dtype_check(matches!(d, DType::F32 | DType::F64 | DType::U8), "compute_index_ranges_weights", d)
        }
        // uint8 linear and cubic resampling exists in 2-d only.
        Mode::Linear | Mode::Cubic if n != 2 && d == DType::U8 => {
            let kernel = if mode == Mode::Linear { "compute_indices_weights_linear" } else { "compute_indices_weights_cubic" };
            dtype_check(false, kernel, d)
        }
        _ => dtype_check(is_floating(d) || d == DType::U8, &mode_kernel(mode, n), d),
    }
}

/// The upsample family: `n` spatial dims resampled one at a time, innermost first (the order
/// of PyTorch's nested interpolation), weights applied in the accumulation dtype.
fn upsample(cx: &mut Cx, args: &Args, n: usize, mode: Mode) -> Result<Vec<Out>> {
    let x = match args.opt_tensor("self")? {
        Some(t) => t,
        None => args.tensor("input")?,
    };
    let dims = cx.dims(x.v);
    let (out, scales) = upsample_size(args, n, &dims)?;
    upsample_common_check(n, &dims, &out)?;
    check!(
        product(&dims) != 0 || dims[1] != 0,
        Runtime,
        "Non-empty {}D data tensor expected but got a tensor with sizes {}",
        n + 2,
        shape_str(&dims)
    );
    upsample_dtype_check(mode, n, x.dtype)?;
    let align_corners = args.bool_or("align_corners", false)?;
    let mut out_dims = dims[..2].to_vec();
    out_dims.extend_from_slice(&out);
    if product(&out_dims) == 0 {
        return one(zeros(cx, x.dtype, &out_dims));
    }
    if x.dtype == DType::U8 && mode.weighted() {
        return one(upsample_u8(cx, x.v, mode, &out, align_corners, &scales));
    }
    let fp = Fp { single: x.dtype != DType::F64 };
    let work = if mode.weighted() { acc_type(x.dtype) } else { x.dtype };
    let mut y = cx.cast(x.v, work);
    let aa = matches!(mode, Mode::LinearAa | Mode::CubicAa);
    for i in (0..n).rev() {
        // The antialiased kernels resample one dim at a time, skipping unchanged dims, and keep
        // the intermediate image in the input dtype.
        if aa && dims[2 + i] == out[i] {
            continue;
        }
        let mut taps = upsample_taps(mode, fp, dims[2 + i], out[i], align_corners, scales[i]);
        if matches!(x.dtype, DType::BF16 | DType::F16) {
            // PyTorch's generic CPU kernel (bicubic, linear and trilinear, and bilinear for
            // contiguous inputs with outputs above 128 rows + columns) stores the weights in the
            // input dtype; the vectorized bilinear kernel does not.
            if mode == Mode::Cubic {
                round_weights(&mut taps, x.dtype);
            } else if mode == Mode::Linear && (n != 2 || out[0] + out[1] > 128) {
                round_linear_weights(&mut taps, x.dtype);
            }
        }
        y = apply_taps(cx, y, 2 + i, &taps);
        if aa && i > 0 && x.dtype != work {
            let rounded = cx.cast(y, x.dtype);
            y = cx.cast(rounded, work);
        }
    }
    one(cx.cast(y, x.dtype))
}

/// The weights of one output position of PyTorch's uint8 resampling (in float64): the first
/// input index and one weight per input from there.
fn u8_rows(mode: Mode, input: i64, out: i64, align_corners: bool, scale: Option<f64>) -> Vec<(i64, Vec<f64>)> {
    let fp = Fp { single: false };
    if matches!(mode, Mode::LinearAa | Mode::CubicAa) {
        let t = aa_taps(mode == Mode::CubicAa, fp, input, out, align_corners, scale);
        let w = t.w.unwrap();
        return (0..out as usize)
            .map(|o| {
                let xmin = t.idx[0][o];
                let ws: Vec<f64> = (0..t.idx.len()).map(|j| w[j][o]).collect();
                (xmin, ws)
            })
            .collect();
    }
    // _compute_indices_min_size_weights: the taps of the float path, with the weights of taps
    // outside the input folded onto the border taps.
    let cubic = mode == Mode::Cubic;
    let size = if cubic { 4 } else { 2 };
    let a = -0.75;
    let filter = |x: f64| -> f64 {
        let x = x.abs();
        if cubic {
            if x < 1.0 {
                ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
            } else if x < 2.0 {
                ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
            } else {
                0.0
            }
        } else if x < 1.0 {
            1.0 - x
        } else {
            0.0
        }
    };
    let ratio = area_scale(fp, input, out, align_corners, scale);
    (0..out)
        .map(|o| {
            let src = source_index(fp, ratio, o, align_corners, cubic);
            let (index, lambda) = guard(fp, src, input);
            let support = size / 2;
            let unbound_min = index - support + 1;
            let unbound_max = index + support + 1;
            let index_min = unbound_min.max(0);
            let index_size = (unbound_max.min(input) - index_min).clamp(0, size);
            let mut w = vec![0.0; size as usize];
            let mut wi = 0i64;
            for j in 0..size {
                let v = filter((j + 1 - support) as f64 - lambda);
                if unbound_min + j <= 0 {
                    wi = 0;
                } else if unbound_min + j >= input - 1 {
                    wi = index_size - 1;
                }
                w[wi as usize] += v;
                wi += 1;
            }
            w.truncate(index_size as usize);
            (index_min, w)
        })
        .collect()
}

/// uint8 bilinear/bicubic (antialiased or not) as PyTorch's CPU kernels compute it: float64
/// weights turned into int16 fixed point, one pass per changed dim (width first), each pass
/// rounding and saturating to uint8.
fn upsample_u8(cx: &mut Cx, x: Value, mode: Mode, out: &[i64], align_corners: bool, scales: &[Option<f64>]) -> Value {
    let dims = cx.dims(x);
    let n = out.len();
    let mut y = cx.convert(x, ElemType::I32);
    for i in (0..n).rev() {
        let input = dims[2 + i];
        if input == out[i] {
            continue;
        }
        let rows = u8_rows(mode, input, out[i], align_corners, scales[i]);
        let wmax = rows.iter().flat_map(|r| r.1.iter().copied()).fold(0.0f64, f64::max);
        let mut prec = 0u32;
        while prec < 22 {
            let next = (0.5 + wmax * (1u64 << (prec + 1)) as f64) as i64;
            if next >= 1 << 15 {
                break;
            }
            prec += 1;
        }
        let k = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(1);
        let mut idx = vec![vec![]; k];
        let mut w = vec![vec![]; k];
        for (xmin, ws) in &rows {
            for j in 0..k {
                let (ix, wv) = match ws.get(j) {
                    Some(&v) => {
                        let s = v * (1u64 << prec) as f64;
                        let q = if s < 0.0 { (-0.5 + s) as i64 } else { (0.5 + s) as i64 };
                        (xmin + j as i64, q as f64)
                    }
                    None => (*xmin, 0.0),
                };
                idx[j].push(ix.min(input - 1));
                w[j].push(wv);
            }
        }
        let taps = Taps { idx, w: Some(w) };
        let v = apply_taps(cx, y, 2 + i, &taps);
        let vd = cx.dims(v);
        let ty = TensorType::new(ElemType::I32, &vd);
        let half = cx.b.splat_i64(if prec > 0 { 1 << (prec - 1) } else { 0 }, &ty);
        let v = cx.add(v, half);
        let sh = cx.b.splat_i64(prec as i64, &ty);
        let v = cx.shift_right_arithmetic(v, sh);
        let lo = cx.constant_i64(0, ElemType::I32);
        let hi = cx.constant_i64(255, ElemType::I32);
        y = cx.clamp(lo, v, hi);
    }
    cx.convert(y, ElemType::U8)
}

fn upsample_backward(cx: &mut Cx, args: &Args, n: usize, mode: Mode) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let out = args.ints("output_size")?;
    let in_dims = args.ints("input_size")?;
    upsample_common_check(n, &in_dims, &out)?;
    let gd = cx.dims(g.v);
    let mut full = in_dims[..2].to_vec();
    full.extend_from_slice(&out);
    check!(
        gd.len() == n + 2,
        Runtime,
        "Expected grad_output to be a tensor of dimension {} but got: dimension {}",
        n + 2,
        gd.len()
    );
    for i in 0..n + 2 {
        check!(
            gd[i] == full[i],
            Runtime,
            "Expected grad_output to have the same shape as output; output.size({}) = {} but got grad_output.size({}) = {}",
            i,
            full[i],
            i,
            gd[i]
        );
    }
    if matches!(mode, Mode::LinearAa | Mode::CubicAa) {
        dtype_check(matches!(g.dtype, DType::F32 | DType::F64), "compute_index_ranges_weights", g.dtype)?;
    }
    dtype_check(is_floating(g.dtype), &format!("{}_backward", mode_kernel(mode, n)), g.dtype)?;
    let mut scales = Vec::new();
    for name in scale_names(n) {
        scales.push(opt_float(args, name)?);
    }
    let align_corners = args.bool_or("align_corners", false)?;
    if product(&gd) == 0 || product(&in_dims) == 0 {
        return one(zeros(cx, g.dtype, &in_dims));
    }
    let fp = Fp { single: g.dtype != DType::F64 };
    let mut y = cx.cast(g.v, acc_type(g.dtype));
    for i in 0..n {
        let taps = upsample_taps(mode, fp, in_dims[2 + i], out[i], align_corners, scales[i]);
        y = apply_taps_transpose(cx, y, 2 + i, &taps, in_dims[2 + i]);
    }
    one(cx.cast(y, g.dtype))
}

// ---- reflection / replication padding ---------------------------------------------------------

/// The source index of padded position `o` along a dim of `input` with `left` padding.
fn pad_source(o: i64, left: i64, input: i64, reflect: bool) -> i64 {
    let i = o - left;
    if reflect {
        if i < 0 {
            -i
        } else if i >= input {
            2 * (input - 1) - i
        } else {
            i
        }
    } else {
        i.clamp(0, input - 1)
    }
}

/// The per-dim source indices of a padding op (padding pairs from the last dim backwards).
fn pad_tables(dims: &[i64], padding: &[i64], reflect: bool) -> Vec<(usize, Vec<i64>)> {
    let n = padding.len() / 2;
    let r = dims.len();
    (0..n)
        .map(|i| {
            let a = r - 1 - i;
            let (l, h) = (padding[2 * i], padding[2 * i + 1]);
            let out = dims[a] + l + h;
            (a, (0..out).map(|o| pad_source(o, l, dims[a], reflect)).collect())
        })
        .collect()
}

fn pad_name(n: usize, reflect: bool) -> String {
    format!("{}_pad{}d", if reflect { "reflection" } else { "replication" }, n)
}

/// Checks of reflection/replication padding (padding::check_valid_input and the size checks);
/// returns the output dims.
fn pad_checks(dims: &[i64], padding: &[i64], n: usize, reflect: bool) -> Result<Vec<i64>> {
    check!(
        padding.len() == 2 * n,
        Runtime,
        "padding size is expected to be {}, but got: {}",
        2 * n,
        padding.len()
    );
    let r = dims.len();
    let ok = if r == n + 2 {
        dims[1..].iter().all(|&d| d != 0)
    } else {
        r == n + 1 && dims.iter().all(|&d| d != 0)
    };
    check!(
        ok,
        Runtime,
        "Expected {}D or {}D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {}",
        n + 1,
        n + 2,
        shape_str(dims)
    );
    let mut out = dims.to_vec();
    for i in 0..n {
        let a = r - 1 - i;
        let (l, h) = (padding[2 * i], padding[2 * i + 1]);
        if reflect {
            check!(
                l < dims[a] && h < dims[a],
                Runtime,
                "Argument #{}: Padding size should be less than the corresponding input dimension, but got: padding ({}, {}) at dimension {} of input {}",
                4 + 2 * i,
                l,
                h,
                a,
                shape_str(dims)
            );
        }
        out[a] = dims[a] + l + h;
    }
    check!(
        out[r - n..].iter().all(|&o| o >= 1),
        Runtime,
        "input (sizes {}) is too small. Calculated output sizes: {}",
        shape_str(&dims[r - n..]),
        shape_str(&out[r - n..])
    );
    Ok(out)
}

/// reflection_pad{1,2,3}d / replication_pad{1,2,3}d: gathers along each padded dim.
fn pad(cx: &mut Cx, args: &Args, n: usize, reflect: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let padding = args.ints("padding")?;
    let dims = cx.dims(x.v);
    let out = pad_checks(&dims, &padding, n, reflect)?;
    dtype_check(x.dtype != DType::Bool, &pad_name(n, reflect), x.dtype)?;
    if product(&out) == 0 {
        return one(zeros(cx, x.dtype, &out));
    }
    let mut y = x.v;
    for (a, idx) in pad_tables(&dims, &padding, reflect) {
        y = take(cx, y, a, &idx);
    }
    one(y)
}

fn pad_backward(cx: &mut Cx, args: &Args, n: usize, reflect: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let padding = args.ints("padding")?;
    let dims = cx.dims(x.v);
    let out = pad_checks(&dims, &padding, n, reflect)?;
    let gd = cx.dims(g.v);
    check!(
        gd == out,
        Runtime,
        "grad_output size unexpected. Expected: {}, Got: {}",
        shape_str(&out),
        shape_str(&gd)
    );
    dtype_check(x.dtype != DType::Bool, &format!("{}_backward", pad_name(n, reflect)), x.dtype)?;
    if product(&gd) == 0 || product(&dims) == 0 {
        return one(zeros(cx, x.dtype, &dims));
    }
    let work = if x.dtype.is_float() { acc_type(x.dtype) } else { x.dtype };
    let mut y = cx.cast(g.v, work);
    for (a, idx) in pad_tables(&dims, &padding, reflect) {
        y = take_transpose(cx, y, a, &idx, dims[a]);
    }
    one(cx.cast(y, x.dtype))
}

// ---- im2col / col2im --------------------------------------------------------------------------

fn pair(args: &Args, name: &str) -> Result<(i64, i64)> {
    let v = args.ints(name)?;
    check!(v.len() == 2, Runtime, "It is expected {} equals to 2, but got size {}", name, v.len());
    Ok((v[0], v[1]))
}

/// Unfold parameters: kernel, dilation, padding, stride as (height, width) pairs.
struct Unfold {
    k: [i64; 2],
    d: [i64; 2],
    p: [i64; 2],
    s: [i64; 2],
}

fn unfold_params(args: &Args) -> Result<Unfold> {
    let k = pair(args, "kernel_size")?;
    let d = pair(args, "dilation")?;
    let p = pair(args, "padding")?;
    let s = pair(args, "stride")?;
    let u = Unfold { k: [k.0, k.1], d: [d.0, d.1], p: [p.0, p.1], s: [s.0, s.1] };
    check!(
        u.k.iter().all(|&x| x > 0),
        Runtime,
        "kernel size should be greater than zero, but got kernel_height: {} kernel_width: {}",
        u.k[0],
        u.k[1]
    );
    check!(
        u.d.iter().all(|&x| x > 0),
        Runtime,
        "dilation should be greater than zero, but got dilation_height: {} dilation_width: {}",
        u.d[0],
        u.d[1]
    );
    check!(
        u.p.iter().all(|&x| x >= 0),
        Runtime,
        "padding should be non-negative, but got pad_height: {} pad_width: {}",
        u.p[0],
        u.p[1]
    );
    check!(
        u.s.iter().all(|&x| x > 0),
        Runtime,
        "stride should be greater than zero, but got stride_height: {} stride_width: {}",
        u.s[0],
        u.s[1]
    );
    Ok(u)
}

impl Unfold {
    /// Number of blocks along spatial dim i of an image of size `size`.
    fn blocks(&self, i: usize, size: i64) -> i64 {
        div_floor(size + 2 * self.p[i] - (self.d[i] * (self.k[i] - 1) + 1), self.s[i]) + 1
    }

    /// Gather indices (into the padded image) of dim i: kernel offset major, block minor.
    fn table(&self, i: usize, blocks: i64) -> Vec<i64> {
        let mut idx = Vec::new();
        for j in 0..self.k[i] {
            for b in 0..blocks {
                idx.push(b * self.s[i] + j * self.d[i]);
            }
        }
        idx
    }
}

fn unfold_dtype_check(kernel: &str, d: DType) -> Result<()> {
    dtype_check(is_floating(d) || d == DType::Bool || d.is_complex(), kernel, d)
}

/// im2col(self, kernel_size, dilation, padding, stride): (N, C, H, W) -> (N, C*kh*kw, L).
fn im2col(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let u = unfold_params(args)?;
    let dims = cx.dims(x.v);
    let r = dims.len();
    let valid = (r == 3 && dims[0] != 0 && dims[1] != 0 && dims[2] != 0) || (r == 4 && dims[1] != 0 && dims[2] != 0 && dims[3] != 0);
    check!(
        valid,
        Runtime,
        "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {}",
        shape_str(&dims)
    );
    let (h, w) = (dims[r - 2], dims[r - 1]);
    let (oh, ow) = (u.blocks(0, h), u.blocks(1, w));
    check!(
        oh >= 1 && ow >= 1,
        Runtime,
        "Given input with spatial size ({}, {}), kernel_size=({}, {}), dilation=({}, {}), padding=({}, {}), calculated shape of the array of sliding blocks as ({}, {}), but its components must be at least one.",
        h, w, u.k[0], u.k[1], u.d[0], u.d[1], u.p[0], u.p[1], oh, ow
    );
    unfold_dtype_check("im2col_out_cpu", x.dtype)?;
    let xv = if r == 3 { cx.reshape(x.v, &[1, dims[0], h, w]) } else { x.v };
    let (nb, c) = (if r == 3 { 1 } else { dims[0] }, dims[r - 3]);
    let (kh, kw) = (u.k[0], u.k[1]);
    let mut out_dims = vec![nb, c * kh * kw, oh * ow];
    if product(&out_dims) == 0 {
        if r == 3 {
            out_dims.remove(0);
        }
        return one(zeros(cx, x.dtype, &out_dims));
    }
    let z = cx.constant_f64(0.0, x.dtype.elem());
    let xp = cx.pad(xv, z, &[0, 0, u.p[0], u.p[1]], &[0, 0, u.p[0], u.p[1]], &[0; 4]);
    let y = take(cx, xp, 2, &u.table(0, oh));
    let y = take(cx, y, 3, &u.table(1, ow));
    let y = cx.reshape(y, &[nb, c, kh, oh, kw, ow]);
    let y = cx.transpose(y, &[0, 1, 2, 4, 3, 5]);
    let y = cx.reshape(y, &out_dims);
    if r == 3 {
        out_dims.remove(0);
        return one(cx.reshape(y, &out_dims));
    }
    one(y)
}

/// col2im(self, output_size, kernel_size, dilation, padding, stride): the blocks of
/// (N, C*kh*kw, L) summed back into (N, C, H, W).
fn col2im(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let (oh_img, ow_img) = pair(args, "output_size")?;
    let u = unfold_params(args)?;
    let dims = cx.dims(x.v);
    let r = dims.len();
    let valid = (r == 2 && dims[0] != 0 && dims[1] != 0) || (r == 3 && dims[1] != 0 && dims[2] != 0);
    check!(
        valid,
        Runtime,
        "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for input, but got: {}",
        shape_str(&dims)
    );
    let planes = dims[r - 2];
    let (kh, kw) = (u.k[0], u.k[1]);
    check!(
        planes % (kh * kw) == 0,
        Runtime,
        "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)={} and kernel_size=({}, {}).",
        planes,
        kh,
        kw
    );
    let (bh, bw) = (u.blocks(0, oh_img), u.blocks(1, ow_img));
    let len = dims[r - 1];
    check!(
        len == bh * bw,
        Runtime,
        "Given output_size=({}, {}), kernel_size=({}, {}), dilation=({}, {}), padding=({}, {}), stride=({}, {}), expected size of input's dimension 2 to match the calculated number of sliding blocks {} * {} = {}, but got input.size(2)={}.",
        oh_img, ow_img, kh, kw, u.d[0], u.d[1], u.p[0], u.p[1], u.s[0], u.s[1], bh, bw, bh * bw, len
    );
    check!(
        bh >= 1 && bw >= 1,
        Runtime,
        "Given output_size=({}, {}), calculated shape of the array of sliding blocks as ({}, {}), which is too small (non-positive)",
        oh_img,
        ow_img,
        bh,
        bw
    );
    check!(
        oh_img >= 1 && ow_img >= 1,
        Runtime,
        "Expected output spatial size to be positive, but got: output_size=({}, {}).",
        oh_img,
        ow_img
    );
    unfold_dtype_check("col2im_out_cpu", x.dtype)?;
    let nb = if r == 2 { 1 } else { dims[0] };
    let c = planes / (kh * kw);
    let mut out_dims = vec![nb, c, oh_img, ow_img];
    if r == 2 {
        out_dims.remove(0);
    }
    if nb * c == 0 {
        return one(zeros(cx, x.dtype, &out_dims));
    }
    let work = if x.dtype.is_float() { acc_type(x.dtype) } else { x.dtype };
    let v = cx.cast(x.v, work);
    let v = cx.reshape(v, &[nb, c, kh, kw, bh, bw]);
    let v = cx.transpose(v, &[0, 1, 2, 4, 3, 5]);
    let v = cx.reshape(v, &[nb, c, kh * bh, kw * bw]);
    let (hp, wp) = (oh_img + 2 * u.p[0], ow_img + 2 * u.p[1]);
    let v = take_transpose(cx, v, 3, &u.table(1, bw), wp);
    let v = take_transpose(cx, v, 2, &u.table(0, bh), hp);
    let v = cx.slice(v, &[0, 0, u.p[0], u.p[1]], &[nb, c, u.p[0] + oh_img, u.p[1] + ow_img], &[1; 4]);
    let v = cx.cast(v, x.dtype);
    one(cx.reshape(v, &out_dims))
}

// ---- grid sampling ----------------------------------------------------------------------------

/// The sampling coordinates of every output point (dims G = N + output spatial dims), one per
/// spatial dim in the input's dim order (2-d: y, x; 3-d: z, y, x), in the work dtype.
struct Grid {
    c: Vec<Value>,
}

/// A sampled tap: integer coordinates (int64, G, input dim order), the weight (work dtype, G)
/// and whether the tap lies inside the image (i1, G).
struct Tap {
    idx: Vec<Value>,
    w: Value,
    inside: Value,
}

fn splat(cx: &mut Cx, x: f64, like: Value) -> Value {
    let dims = cx.dims(like);
    let dt = cx.dtype(like);
    cx.full(x, dt, &dims)
}

/// grid_sampler_unnormalize: [-1, 1] to pixel coordinates; returns the derivative too.
fn gs_unnormalize(cx: &mut Cx, c: Value, size: i64, align_corners: bool) -> (Value, f64) {
    let one = splat(cx, 1.0, c);
    let two = splat(cx, 2.0, c);
    let c1 = cx.add(c, one);
    if align_corners {
        let h = cx.div(c1, two);
        let sz = splat(cx, (size - 1) as f64, c);
        (cx.mul(h, sz), (size - 1) as f64 / 2.0)
    } else {
        let sz = splat(cx, size as f64, c);
        let m = cx.mul(c1, sz);
        let m = cx.sub(m, one);
        (cx.div(m, two), size as f64 / 2.0)
    }
}

/// clip_coordinates(_set_grad): clamps into [0, size - 1]; the derivative is 0 at and past the
/// borders.
fn gs_clip(cx: &mut Cx, c: Value, size: i64) -> (Value, Value) {
    let zero = splat(cx, 0.0, c);
    let hi = splat(cx, (size - 1) as f64, c);
    let lo_side = cx.compare(CmpDir::Le, c, zero);
    let hi_side = cx.compare(CmpDir::Ge, c, hi);
    let m = cx.max(c, zero);
    let v = cx.min(m, hi);
    let out = cx.or(lo_side, hi_side);
    let one = splat(cx, 1.0, c);
    let g = cx.select(out, zero, one);
    (v, g)
}

/// reflect_coordinates(_set_grad) between twice_low/2 and twice_high/2.
fn gs_reflect(cx: &mut Cx, c: Value, twice_low: i64, twice_high: i64) -> (Value, Value) {
    if twice_low == twice_high {
        let z = splat(cx, 0.0, c);
        return (z, z);
    }
    let min = twice_low as f64 / 2.0;
    let span = (twice_high - twice_low) as f64 / 2.0;
    let minv = splat(cx, min, c);
    let spanv = splat(cx, span, c);
    let d = cx.sub(c, minv);
    let zero = splat(cx, 0.0, c);
    let neg = cx.compare(CmpDir::Lt, d, zero);
    let a = cx.abs(d);
    let extra = cx.rem(a, spanv);
    let q = cx.div(a, spanv);
    let flips = cx.floor(q);
    let two = splat(cx, 2.0, c);
    let parity = cx.rem(flips, two);
    let even = cx.compare(CmpDir::Eq, parity, zero);
    let up = cx.add(extra, minv);
    let down = cx.sub(spanv, extra);
    let down = cx.add(down, minv);
    let v = cx.select(even, up, down);
    let one = splat(cx, 1.0, c);
    let mone = splat(cx, -1.0, c);
    let sign = cx.select(neg, mone, one);
    let flip = cx.select(even, one, mone);
    let g = cx.mul(sign, flip);
    (v, g)
}

/// compute_coordinates(_set_grad) for a padding mode: (coordinate, derivative factor).
fn gs_pad_coords(cx: &mut Cx, c: Value, size: i64, padding: i64, align_corners: bool) -> (Value, Option<Value>) {
    match padding {
        1 => {
            let (v, g) = gs_clip(cx, c, size);
            (v, Some(g))
        }
        2 => {
            let (r, gr) = if align_corners { gs_reflect(cx, c, 0, 2 * (size - 1)) } else { gs_reflect(cx, c, -1, 2 * size - 1) };
            let (v, gc) = gs_clip(cx, r, size);
            (v, Some(cx.mul(gr, gc)))
        }
        _ => (c, None),
    }
}

/// grid_sampler_compute_source_index(_set_grad): pixel coordinates and d(coordinate)/d(grid).
fn gs_source(cx: &mut Cx, c: Value, size: i64, padding: i64, align_corners: bool) -> (Value, Value) {
    let (u, mult) = gs_unnormalize(cx, c, size, align_corners);
    let (v, g) = gs_pad_coords(cx, u, size, padding, align_corners);
    let m = splat(cx, mult, c);
    let g = match g {
        Some(g) => cx.mul(g, m),
        None => m,
    };
    (v, g)
}

/// A tap at float coordinates that are whole numbers (G, work dtype; input dim order) with
/// weight `w`, in an image of spatial `sizes`.
fn gs_tap(cx: &mut Cx, coords: &[Value], w: Value, sizes: &[i64]) -> Tap {
    let mut inside: Option<Value> = None;
    let mut idx = Vec::new();
    for (&c, &size) in coords.iter().zip(sizes) {
        let zero = splat(cx, 0.0, c);
        let hi = splat(cx, (size - 1) as f64, c);
        let a = cx.compare(CmpDir::Ge, c, zero);
        let b = cx.compare(CmpDir::Le, c, hi);
        let ab = cx.and(a, b);
        inside = Some(match inside {
            None => ab,
            Some(v) => cx.and(v, ab),
        });
        // Clamp (NaN goes to 0) so that the gather stays in range; outside taps are masked.
        let cl = cx.clamp(zero, c, hi);
        idx.push(cx.convert(cl, I64));
    }
    Tap { idx, w, inside: inside.unwrap() }
}

/// The (G..., 1 + n) gather/scatter indices (batch, coordinates) of a tap.
fn gs_indices(cx: &mut Cx, t: &Tap) -> Value {
    let g = cx.dims(t.w);
    let ty = TensorType::new(I64, &g);
    let n = cx.iota(&ty, 0);
    let mut shp = g.clone();
    shp.push(1);
    let mut parts = vec![cx.reshape(n, &shp)];
    for &i in &t.idx {
        parts.push(cx.reshape(i, &shp));
    }
    cx.concatenate(&parts, g.len() as i64)
}

fn gs_gather_dims(r: usize) -> GatherDims {
    GatherDims {
        offset_dims: vec![r as i64 - 1],
        collapsed_slice_dims: (0..r as i64 - 1).collect(),
        start_index_map: (0..r as i64 - 1).collect(),
        index_vector_dim: r as i64 - 1,
        ..Default::default()
    }
}

/// Input values (channels-last layout N, S..., C) at a tap: (G..., C), zero outside the image.
fn gs_read(cx: &mut Cx, chlast: Value, t: &Tap) -> Value {
    let idx = gs_indices(cx, t);
    let d = cx.dims(chlast);
    let r = d.len();
    let mut slice = vec![1; r];
    slice[r - 1] = d[r - 1];
    let v = cx.gather(chlast, idx, &gs_gather_dims(r), &slice, false);
    let dims = cx.dims(v);
    let bd: Vec<i64> = (0..r as i64 - 1).collect();
    let m = cx.broadcast_in_dim(t.inside, &dims, &bd);
    let z = splat(cx, 0.0, v);
    cx.select(m, v, z)
}

/// Adds `upd` (G..., C) into `acc` (N, S..., C) at a tap (outside taps dropped).
fn gs_write(cx: &mut Cx, acc: Value, t: &Tap, upd: Value) -> Value {
    let idx = gs_indices(cx, t);
    let dims = cx.dims(upd);
    let r = dims.len();
    let bd: Vec<i64> = (0..r as i64 - 1).collect();
    let m = cx.broadcast_in_dim(t.inside, &dims, &bd);
    let z = splat(cx, 0.0, upd);
    let upd = cx.select(m, upd, z);
    let dn = ScatterDims {
        update_window_dims: vec![r as i64 - 1],
        inserted_window_dims: (0..r as i64 - 1).collect(),
        scatter_dims_to_operand_dims: (0..r as i64 - 1).collect(),
        index_vector_dim: r as i64 - 1,
        ..Default::default()
    };
    cx.scatter(acc, idx, upd, &dn, |b, x, y| b.add(x, y))
}

/// x * w with w (G) broadcast over the channels (last dim) of x.
fn gs_weigh(cx: &mut Cx, v: Value, w: Value) -> Value {
    let dims = cx.dims(v);
    let bd: Vec<i64> = (0..dims.len() as i64 - 1).collect();
    let wb = cx.broadcast_in_dim(w, &dims, &bd);
    cx.mul(v, wb)
}

/// The cubic coefficients (A = -0.75) for fraction t, as program values.
fn gs_cubic(cx: &mut Cx, t: Value) -> [Value; 4] {
    let a = -0.75;
    let k = |cx: &mut Cx, x: f64| splat(cx, x, t);
    let one = k(cx, 1.0);
    let cc1 = |cx: &mut Cx, x: Value| {
        // ((A + 2) * x - (A + 3)) * x * x + 1
        let c = k(cx, a + 2.0);
        let d = k(cx, a + 3.0);
        let m = cx.mul(c, x);
        let m = cx.sub(m, d);
        let m = cx.mul(m, x);
        let m = cx.mul(m, x);
        let o = k(cx, 1.0);
        cx.add(m, o)
    };
    let cc2 = |cx: &mut Cx, x: Value| {
        // ((A * x - 5A) * x + 8A) * x - 4A
        let av = k(cx, a);
        let a5 = k(cx, 5.0 * a);
        let a8 = k(cx, 8.0 * a);
        let a4 = k(cx, 4.0 * a);
        let m = cx.mul(av, x);
        let m = cx.sub(m, a5);
        let m = cx.mul(m, x);
        let m = cx.add(m, a8);
        let m = cx.mul(m, x);
        cx.sub(m, a4)
    };
    let two = k(cx, 2.0);
    let t1 = cx.add(t, one);
    let x2 = cx.sub(one, t);
    let x3 = cx.sub(two, t);
    [cc2(cx, t1), cc1(cx, t), cc1(cx, x2), cc2(cx, x3)]
}

/// The derivatives of `gs_cubic`'s coefficients with respect to t.
fn gs_cubic_grad(cx: &mut Cx, t: Value) -> [Value; 4] {
    let a = -0.75;
    let k = |cx: &mut Cx, x: f64| splat(cx, x, t);
    // c0: x = -1 - t, (-3A x - 10A) x - 8A
    let mone = k(cx, -1.0);
    let x0 = cx.sub(mone, t);
    let p = k(cx, -3.0 * a);
    let q = k(cx, 10.0 * a);
    let r8 = k(cx, 8.0 * a);
    let m = cx.mul(p, x0);
    let m = cx.sub(m, q);
    let m = cx.mul(m, x0);
    let g0 = cx.sub(m, r8);
    // c1: x = -t, (-3(A+2) x - 2(A+3)) x
    let x1 = cx.neg(t);
    let p = k(cx, -3.0 * (a + 2.0));
    let q = k(cx, 2.0 * (a + 3.0));
    let m = cx.mul(p, x1);
    let m = cx.sub(m, q);
    let g1 = cx.mul(m, x1);
    // c2: x = 1 - t, (3(A+2) x - 2(A+3)) x
    let one = k(cx, 1.0);
    let x2 = cx.sub(one, t);
    let p = k(cx, 3.0 * (a + 2.0));
    let m = cx.mul(p, x2);
    let m = cx.sub(m, q);
    let g2 = cx.mul(m, x2);
    // c3: x = 2 - t, (3A x - 10A) x + 8A
    let two = k(cx, 2.0);
    let x3 = cx.sub(two, t);
    let p = k(cx, 3.0 * a);
    let q = k(cx, 10.0 * a);
    let m = cx.mul(p, x3);
    let m = cx.sub(m, q);
    let m = cx.mul(m, x3);
    let g3 = cx.add(m, r8);
    // PyTorch's get_cubic_coefficients_grad gives these with the opposite sign and subtracts;
    // return the derivatives themselves.
    [cx.neg(g0), cx.neg(g1), cx.neg(g2), cx.neg(g3)]
}

/// What a grid sample reads: its taps; for the grid gradient, per tap the derivative of its
/// weight with respect to each pixel coordinate (input dim order), and per dim
/// d(pixel)/d(grid).
struct Sampling {
    taps: Vec<Tap>,
    dw: Vec<Vec<Value>>,
    mult: Vec<Value>,
    /// Bicubic: the y and x coefficients (16 taps, row-major); rows are summed first.
    cubic: Option<([Value; 4], [Value; 4])>,
}

fn gs_sampling(cx: &mut Cx, g: &Grid, sizes: &[i64], mode: i64, padding: i64, align_corners: bool) -> Sampling {
    let n = sizes.len();
    if mode == 2 {
        // Bicubic (2-d only): 4x4 taps around the unnormalized point, each mapped by the
        // padding mode; the weights' derivatives do not go through the padding.
        let (h, w) = (sizes[0], sizes[1]);
        let (iy, gy_mult) = gs_unnormalize(cx, g.c[0], h, align_corners);
        let (ix, gx_mult) = gs_unnormalize(cx, g.c[1], w, align_corners);
        let x0 = cx.floor(ix);
        let y0 = cx.floor(iy);
        let tx = cx.sub(ix, x0);
        let ty = cx.sub(iy, y0);
        let wx = gs_cubic(cx, tx);
        let wy = gs_cubic(cx, ty);
        let dwx = gs_cubic_grad(cx, tx);
        let dwy = gs_cubic_grad(cx, ty);
        let mult = vec![splat(cx, gy_mult, iy), splat(cx, gx_mult, ix)];
        let mut s = Sampling { taps: vec![], dw: vec![], mult, cubic: Some((wy, wx)) };
        for i in 0..4 {
            let oy = splat(cx, i as f64 - 1.0, y0);
            let yf = cx.add(y0, oy);
            let (yf, _) = gs_pad_coords(cx, yf, h, padding, align_corners);
            for j in 0..4 {
                let ox = splat(cx, j as f64 - 1.0, x0);
                let xf = cx.add(x0, ox);
                let (xf, _) = gs_pad_coords(cx, xf, w, padding, align_corners);
                let wt = cx.mul(wx[j], wy[i]);
                let tap = gs_tap(cx, &[yf, xf], wt, sizes);
                s.taps.push(tap);
                let d_y = cx.mul(wx[j], dwy[i]);
                let d_x = cx.mul(dwx[j], wy[i]);
                s.dw.push(vec![d_y, d_x]);
            }
        }
        return s;
    }
    let mut pix = Vec::new();
    let mut mult = Vec::new();
    for d in 0..n {
        let (p, m) = gs_source(cx, g.c[d], sizes[d], padding, align_corners);
        pix.push(p);
        mult.push(m);
    }
    if mode == 1 {
        let rounded: Vec<Value> = pix.iter().map(|&p| cx.round_nearest_even(p)).collect();
        let one = splat(cx, 1.0, pix[0]);
        let tap = gs_tap(cx, &rounded, one, sizes);
        let zero = splat(cx, 0.0, pix[0]);
        return Sampling { taps: vec![tap], dw: vec![vec![zero; n]], mult, cubic: None };
    }
    let mut s = Sampling { taps: vec![], dw: vec![], mult, cubic: None };
    if n == 2 {
        // Bilinear with the vectorized CPU kernel's weights: w = x - floor(x), e = 1 - w, ...
        let (iy, ix) = (pix[0], pix[1]);
        let xw = cx.floor(ix);
        let yn = cx.floor(iy);
        let wgt = cx.sub(ix, xw);
        let one = splat(cx, 1.0, ix);
        let e = cx.sub(one, wgt);
        let nn = cx.sub(iy, yn);
        let sth = cx.sub(one, nn);
        let xe = cx.add(xw, one);
        let ys = cx.add(yn, one);
        let (msth, mnn, me, mw) = (cx.neg(sth), cx.neg(nn), cx.neg(e), cx.neg(wgt));
        // (y, x, weight, d weight/dy, d weight/dx)
        let corners = [
            (yn, xw, cx.mul(sth, e), me, msth),
            (yn, xe, cx.mul(sth, wgt), mw, sth),
            (ys, xw, cx.mul(nn, e), e, mnn),
            (ys, xe, cx.mul(nn, wgt), wgt, nn),
        ];
        for (yf, xf, wt, dy, dx) in corners {
            let tap = gs_tap(cx, &[yf, xf], wt, sizes);
            s.taps.push(tap);
            s.dw.push(vec![dy, dx]);
        }
        return s;
    }
    // Trilinear with the scalar CPU kernel's weights: products of (x1 - x) or (x - x0) factors
    // taken in x, y, z order; corners z-major.
    let (iz, iy, ix) = (pix[0], pix[1], pix[2]);
    let lo: Vec<Value> = [iz, iy, ix].iter().map(|&p| cx.floor(p)).collect();
    let one = splat(cx, 1.0, ix);
    let hi: Vec<Value> = lo.iter().map(|&l| cx.add(l, one)).collect();
    let p = [iz, iy, ix];
    // factor[d][b]: the weight factor of dim d for the low (b = 0) or high (b = 1) corner.
    let mut factor = Vec::new();
    for d in 0..3 {
        let f0 = cx.sub(hi[d], p[d]);
        let f1 = cx.sub(p[d], lo[d]);
        factor.push([f0, f1]);
    }
    for bz in 0..2 {
        for by in 0..2 {
            for bx in 0..2 {
                let b = [bz, by, bx];
                let (fz, fy, fx) = (factor[0][bz], factor[1][by], factor[2][bx]);
                let fxy = cx.mul(fx, fy);
                let wt = cx.mul(fxy, fz);
                let coords: Vec<Value> = (0..3).map(|d| if b[d] == 0 { lo[d] } else { hi[d] }).collect();
                let tap = gs_tap(cx, &coords, wt, sizes);
                s.taps.push(tap);
                // d weight / d coordinate: the other two factors, signed by the corner side.
                let mut dws = Vec::new();
                for d in 0..3 {
                    let others: Vec<Value> = (0..3).filter(|&e| e != d).map(|e| factor[e][b[e]]).collect();
                    let prod = cx.mul(others[0], others[1]);
                    dws.push(if b[d] == 0 { cx.neg(prod) } else { prod });
                }
                s.dw.push(dws);
            }
        }
    }
    s
}

fn grid_checks(cx: &Cx, input: &crate::Tensor, grid: &crate::Tensor, n: usize, mode: i64) -> Result<()> {
    let id = cx.dims(input.v);
    let gd = cx.dims(grid.v);
    crate::blocks::type_names::check_scalar_type(input.dtype, grid.dtype)?;
    check!(
        id.len() == n + 2 && gd.len() == n + 2,
        Runtime,
        "grid_sampler(): expected {}D input and grid with same number of dimensions, but got input with sizes {} and grid with sizes {}",
        n + 2,
        shape_str(&id),
        shape_str(&gd)
    );
    check!(
        !(n == 3 && mode == 2),
        Runtime,
        "grid_sampler(): bicubic interpolation only supports 4D input"
    );
    check!(
        id[0] == gd[0],
        Runtime,
        "grid_sampler(): expected grid and input to have same batch size, but got input with sizes {} and grid with sizes {}",
        shape_str(&id),
        shape_str(&gd)
    );
    check!(
        gd[n + 1] == n as i64,
        Runtime,
        "grid_sampler(): expected grid to have size {} in last dimension, but got grid with sizes {}",
        n,
        shape_str(&gd)
    );
    for (i, &d) in id.iter().enumerate().skip(2) {
        check!(
            d > 0,
            Runtime,
            "grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes {} with dimension {} being empty",
            shape_str(&id),
            i
        );
    }
    let kernel = if n == 2 { "grid_sampler_2d_cpu_kernel_impl" } else { "grid_sampler3d_cpu" };
    dtype_check(is_floating(input.dtype), kernel, input.dtype)
}

/// The checked arguments of grid_sampler_{2,3}d and their backward.
struct GridCall {
    input: crate::Tensor,
    grid: crate::Tensor,
    mode: i64,
    padding: i64,
    align_corners: bool,
}

fn grid_call(cx: &Cx, args: &Args, n: usize) -> Result<GridCall> {
    let input = args.tensor("input")?;
    let grid = args.tensor("grid")?;
    let mode = args.int("interpolation_mode")?;
    let padding = args.int("padding_mode")?;
    check!((0..3).contains(&mode), Runtime, "grid_sampler(): unknown interpolation mode {}", mode);
    check!((0..3).contains(&padding), Runtime, "grid_sampler(): unknown padding mode {}", padding);
    let align_corners = args.bool("align_corners")?;
    grid_checks(cx, &input, &grid, n, mode)?;
    Ok(GridCall { input, grid, mode, padding, align_corners })
}

/// The output dims of a grid sample: (N, C) of the input, the grid's spatial dims.
fn grid_out_dims(id: &[i64], gd: &[i64], n: usize) -> Vec<i64> {
    let mut out = vec![id[0], id[1]];
    out.extend_from_slice(&gd[1..n + 1]);
    out
}

/// The grid's coordinate planes (G dims) in input dim order, in the input's dtype: PyTorch's
/// CPU kernels compute in it (their 16-bit arithmetic rounds every operation).
fn grid_planes(cx: &mut Cx, grid: Value) -> Grid {
    let gd = cx.dims(grid);
    let r = gd.len();
    let n = gd[r - 1] as usize;
    let g: Vec<i64> = gd[..r - 1].to_vec();
    let mut c = Vec::new();
    for k in (0..n).rev() {
        let mut start = vec![0; r];
        start[r - 1] = k as i64;
        let mut limit = gd.clone();
        limit[r - 1] = k as i64 + 1;
        let p = cx.slice(grid, &start, &limit, &vec![1; r]);
        c.push(cx.reshape(p, &g));
    }
    Grid { c }
}

/// Channels-last permutation of an (N, C, S...) tensor and its inverse.
fn chlast_perms(r: usize) -> (Vec<i64>, Vec<i64>) {
    let mut to: Vec<i64> = vec![0];
    to.extend(2..r as i64);
    to.push(1);
    let mut back: Vec<i64> = vec![0, r as i64 - 1];
    back.extend(1..r as i64 - 1);
    (to, back)
}

/// grid_sampler_2d / grid_sampler_3d(input, grid, interpolation_mode, padding_mode,
/// align_corners): bilinear/trilinear, nearest or (2-d) bicubic samples with zeros, border or
/// reflection padding.
fn grid_sampler(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let GridCall { input, grid, mode, padding, align_corners } = grid_call(cx, args, n)?;
    let id = cx.dims(input.v);
    let gd = cx.dims(grid.v);
    let out_dims = grid_out_dims(&id, &gd, n);
    if product(&out_dims) == 0 {
        return one(zeros(cx, input.dtype, &out_dims));
    }
    let (to, back) = chlast_perms(n + 2);
    let chl = cx.transpose(input.v, &to);
    let g = grid_planes(cx, grid.v);
    let s = gs_sampling(cx, &g, &id[2..], mode, padding, align_corners);
    let sum = |cx: &mut Cx, terms: Vec<Value>| terms.into_iter().reduce(|a, b| cx.add(a, b)).unwrap();
    let y = match s.cubic {
        // Rows interpolated along x first, then the rows along y, as the CPU kernel does.
        Some((wy, wx)) => {
            let mut rows = Vec::new();
            for i in 0..4 {
                let mut terms = Vec::new();
                for j in 0..4 {
                    let v = gs_read(cx, chl, &s.taps[4 * i + j]);
                    terms.push(gs_weigh(cx, v, wx[j]));
                }
                let row = sum(cx, terms);
                rows.push(gs_weigh(cx, row, wy[i]));
            }
            sum(cx, rows)
        }
        None => {
            let mut terms = Vec::new();
            for t in &s.taps {
                let v = gs_read(cx, chl, t);
                terms.push(gs_weigh(cx, v, t.w));
            }
            sum(cx, terms)
        }
    };
    one(cx.transpose(y, &back))
}

/// grid_sampler_{2,3}d_backward(grad_output, input, grid, ..., output_mask) -> (grad_input,
/// grad_grid). Outputs not asked for come back as zeros.
fn grid_sampler_backward(cx: &mut Cx, args: &Args, n: usize) -> Result<Vec<Out>> {
    let gout = args.tensor("grad_output")?;
    let GridCall { input, grid, mode, padding, align_corners } = grid_call(cx, args, n)?;
    let id = cx.dims(input.v);
    let gd = cx.dims(grid.v);
    let god = cx.dims(gout.v);
    let want = grid_out_dims(&id, &gd, n);
    check!(
        god == want,
        Runtime,
        "grid_sampler_{}d_backward(): expected grad_output of shape {} but got {}",
        n,
        shape_str(&want),
        shape_str(&god)
    );
    if product(&god) == 0 {
        let gi = zeros(cx, input.dtype, &id);
        let gg = zeros(cx, grid.dtype, &gd);
        return Ok(vec![Out::Tensor(gi), Out::Tensor(gg)]);
    }
    let (to, back) = chlast_perms(n + 2);
    let chl = cx.transpose(input.v, &to);
    let go = cx.cast(gout.v, input.dtype);
    let go = cx.transpose(go, &to);
    let g = grid_planes(cx, grid.v);
    let s = gs_sampling(cx, &g, &id[2..], mode, padding, align_corners);
    let chl_dims = cx.dims(chl);
    let mut gi = zeros(cx, input.dtype, &chl_dims);
    let mut gc: Vec<Option<Value>> = vec![None; n];
    let cdim = god.len() as i64 - 1;
    for (k, t) in s.taps.iter().enumerate() {
        let upd = gs_weigh(cx, go, t.w);
        gi = gs_write(cx, gi, t, upd);
        if mode == 1 {
            continue;
        }
        // Sum over channels of grad * value, times the weight's derivatives.
        let v = gs_read(cx, chl, t);
        let pv = cx.mul(v, go);
        let sv = crate::blocks::reduce::reduce(cx, pv, &[cdim], crate::blocks::reduce::Red::Sum);
        for d in 0..n {
            let a = cx.mul(sv, s.dw[k][d]);
            gc[d] = Some(match gc[d] {
                None => a,
                Some(acc) => cx.add(acc, a),
            });
        }
    }
    let gi = cx.transpose(gi, &back);
    let gg = if mode == 1 {
        zeros(cx, grid.dtype, &gd)
    } else {
        // The grid's last dim holds x, y(, z): the input dim order reversed.
        let mut shp = gd[..n + 1].to_vec();
        shp.push(1);
        let mut parts = Vec::new();
        for d in (0..n).rev() {
            let v = cx.mul(gc[d].unwrap(), s.mult[d]);
            parts.push(cx.reshape(v, &shp));
        }
        cx.concatenate(&parts, n as i64 + 1)
    };
    Ok(vec![Out::Tensor(gi), Out::Tensor(gg)])
}
