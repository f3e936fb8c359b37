//! Pooling: max_pool2d/3d_with_indices, avg_pool2d/3d, adaptive average and max pooling,
//! fractional max pooling and max_unpool2d/3d, with their backward ops.
use crate::args::Args;
use crate::blocks::gather::Combine;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use super::{argmax_pair, check_grad_dtype, div_floor, dtype_check, ints_const, is_floating, lowest, plane_iota, plane_scatter, product, take, take_transpose, zeros, I64};
use stablehlo::{CmpDir, GatherDims, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("max_pool2d_with_indices", |cx, a| max_pool(cx, a, 2)),
    op("max_pool3d_with_indices", |cx, a| max_pool(cx, a, 3)),
    op("max_pool2d_with_indices_backward", |cx, a| max_pool_backward(cx, a, 2)),
    op("max_pool3d_with_indices_backward", |cx, a| max_pool_backward(cx, a, 3)),
    op("avg_pool2d", |cx, a| avg_pool(cx, a, 2)),
    op("avg_pool3d", |cx, a| avg_pool(cx, a, 3)),
    op("avg_pool2d_backward", |cx, a| avg_pool_backward(cx, a, 2)),
    op("avg_pool3d_backward", |cx, a| avg_pool_backward(cx, a, 3)),
    op("_adaptive_avg_pool2d", |cx, a| adaptive_avg_pool(cx, a, 2)),
    op("_adaptive_avg_pool3d", |cx, a| adaptive_avg_pool(cx, a, 3)),
    // The out= forms (their functional forms are composites calling the underscored ops).
    op("adaptive_avg_pool2d", |cx, a| adaptive_avg_pool(cx, a, 2)),
    op("adaptive_avg_pool3d", |cx, a| adaptive_avg_pool(cx, a, 3)),
    op("adaptive_avg_pool3d_backward", |cx, a| adaptive_avg_pool_backward(cx, a, 3)),
    op("_adaptive_avg_pool2d_backward", |cx, a| adaptive_avg_pool_backward(cx, a, 2)),
    op("_adaptive_avg_pool3d_backward", |cx, a| adaptive_avg_pool_backward(cx, a, 3)),
    op("adaptive_max_pool2d", |cx, a| adaptive_max_pool(cx, a, 2)),
    op("adaptive_max_pool3d", |cx, a| adaptive_max_pool(cx, a, 3)),
    op("adaptive_max_pool2d_backward", |cx, a| adaptive_max_pool_backward(cx, a, 2)),
    op("adaptive_max_pool3d_backward", |cx, a| adaptive_max_pool_backward(cx, a, 3)),
    op("fractional_max_pool2d", |cx, a| fractional_max_pool(cx, a, 2)),
    op("fractional_max_pool3d", |cx, a| fractional_max_pool(cx, a, 3)),
    op("fractional_max_pool2d_backward", |cx, a| fractional_max_pool_backward(cx, a, 2)),
    op("fractional_max_pool3d_backward", |cx, a| fractional_max_pool_backward(cx, a, 3)),
    op("max_unpool2d", |cx, a| max_unpool(cx, a, 2)),
    op("max_unpool3d", |cx, a| max_unpool(cx, a, 3)),
];

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
fn pool_rank_check(dims: &[i64], n: usize) -> Result<()> {
    let rank = dims.len();
    check!(rank == n + 1 || rank == n + 2, Runtime, "non-empty {}D or {}D (batch mode) tensor expected for input", n + 1, n + 2);
    Ok(())
}

/// The output spatial sizes of a pooling call, with PyTorch's checks (pool2d_shape_check /
/// pool3d_shape_check).
fn pool_out(dims: &[i64], n: usize, w: &Window, op: &str, check_input_size: bool) -> Result<Vec<i64>> {
    pool_rank_check(dims, n)?;
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
    pool_rank_check(&dims, n)?;
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
    let gi = plane_scatter(cx, g.v, idx.v, &dims, n, x.dtype.opmath(), Combine::Add);
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
    pool_rank_check(&dims, n)?;
    let out = pool_out(&dims, n, &w, op, n == 3)?;
    avg_dtype_check(n, x.dtype)?;
    let mut out_dims = dims[..dims.len() - n].to_vec();
    out_dims.extend_from_slice(&out);
    if product(&out_dims) == 0 {
        return one(zeros(cx, x.dtype, &out_dims));
    }
    let acc = x.dtype.opmath();
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
    let acc = x.dtype.opmath();
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
    if avg {
        check!(out.iter().all(|&o| o >= 0), Runtime, "{}: elements of output_size must be greater than or equal to 0 but received {:?}", name, out);
    } else if let Some(&negative) = out.iter().find(|&&o| o < 0) {
        // CPU's max variants meet it when they allocate their output.
        let shape: Vec<i64> = dims[..dims.len() - n].iter().chain(out.iter()).copied().collect();
        check!(false, Runtime, "Trying to create tensor with negative dimension {}: {:?}", negative, shape);
    }
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
    let acc = x.dtype.opmath();
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
    let acc = x.dtype.opmath();
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
    let gi = plane_scatter(cx, g.v, idx.v, &dims, n, x.dtype.opmath(), Combine::Add);
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
    let gi = plane_scatter(cx, g.v, idx.v, &dims, n, x.dtype.opmath(), Combine::Add);
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
