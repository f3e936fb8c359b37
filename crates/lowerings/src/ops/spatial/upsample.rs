//! Interpolation: upsample_nearest1d/2d/3d (and the _exact forms), upsample_linear1d,
//! upsample_bilinear2d, upsample_trilinear3d, upsample_bicubic2d and the antialiased
//! _upsample_bilinear2d_aa/_upsample_bicubic2d_aa/_upsample_lanczos2d_aa, with their backward ops.
use crate::args::{Arg, Args};
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use super::{apply_taps, apply_taps_transpose, dtype_check, is_floating, opt_float, product, zeros, Taps};
use std::f64::consts::PI;
use stablehlo::{ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    // Upsampling: the scales decide the index tables, so float arguments are compiled in.
    op("upsample_nearest1d", |cx, a| upsample(cx, a, 1, Mode::Nearest)).specialized(),
    op("upsample_nearest2d", |cx, a| upsample(cx, a, 2, Mode::Nearest)).specialized(),
    op("upsample_nearest3d", |cx, a| upsample(cx, a, 3, Mode::Nearest)).specialized(),
    op("_upsample_nearest_exact1d", |cx, a| upsample(cx, a, 1, Mode::NearestExact)).specialized(),
    op("_upsample_nearest_exact2d", |cx, a| upsample(cx, a, 2, Mode::NearestExact)).specialized(),
    op("_upsample_nearest_exact3d", |cx, a| upsample(cx, a, 3, Mode::NearestExact)).specialized(),
    op("upsample_linear1d", |cx, a| upsample(cx, a, 1, Mode::Linear)).specialized(),
    op("upsample_bilinear2d", |cx, a| upsample(cx, a, 2, Mode::Linear)).specialized(),
    op("upsample_trilinear3d", |cx, a| upsample(cx, a, 3, Mode::Linear)).specialized(),
    op("upsample_bicubic2d", |cx, a| upsample(cx, a, 2, Mode::Cubic)).specialized(),
    op("_upsample_bilinear2d_aa", |cx, a| upsample(cx, a, 2, Mode::LinearAa)).specialized(),
    op("_upsample_bicubic2d_aa", |cx, a| upsample(cx, a, 2, Mode::CubicAa)).specialized(),
    op("_upsample_lanczos2d_aa", |cx, a| upsample(cx, a, 2, Mode::LanczosAa)).specialized(),
    op("upsample_nearest1d_backward", |cx, a| upsample_backward(cx, a, 1, Mode::Nearest)).specialized(),
    op("upsample_nearest2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::Nearest)).specialized(),
    op("upsample_nearest3d_backward", |cx, a| upsample_backward(cx, a, 3, Mode::Nearest)).specialized(),
    op("_upsample_nearest_exact1d_backward", |cx, a| upsample_backward(cx, a, 1, Mode::NearestExact)).specialized(),
    op("_upsample_nearest_exact2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::NearestExact)).specialized(),
    op("_upsample_nearest_exact3d_backward", |cx, a| upsample_backward(cx, a, 3, Mode::NearestExact)).specialized(),
    op("upsample_linear1d_backward", |cx, a| upsample_backward(cx, a, 1, Mode::Linear)).specialized(),
    op("upsample_bilinear2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::Linear)).specialized(),
    op("upsample_trilinear3d_backward", |cx, a| upsample_backward(cx, a, 3, Mode::Linear)).specialized(),
    op("upsample_bicubic2d_backward", |cx, a| upsample_backward(cx, a, 2, Mode::Cubic)).specialized(),
    op("_upsample_bilinear2d_aa_backward", |cx, a| upsample_backward(cx, a, 2, Mode::LinearAa)).specialized(),
    op("_upsample_bicubic2d_aa_backward", |cx, a| upsample_backward(cx, a, 2, Mode::CubicAa)).specialized(),
    op("_upsample_lanczos2d_aa_backward", |cx, a| upsample_backward(cx, a, 2, Mode::LanczosAa)).specialized(),
];

// ---- upsampling -------------------------------------------------------------------------------

#[derive(Copy, Clone, PartialEq, Eq)]
enum Mode {
    Nearest,
    NearestExact,
    Linear,
    Cubic,
    LinearAa,
    CubicAa,
    LanczosAa,
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
        Mode::LinearAa | Mode::CubicAa | Mode::LanczosAa => aa_taps(mode, fp, input, out, align_corners, scale),
    }
}

/// Antialiased taps (PyTorch's _upsample_*_aa, after Pillow): when downsampling, the filter
/// support widens with the scale; weights are normalized to sum to one.
fn aa_taps(mode: Mode, fp: Fp, input: i64, out: i64, align_corners: bool, scale: Option<f64>) -> Taps {
    let interp = match mode {
        Mode::LinearAa => 2.0,
        Mode::CubicAa => 4.0,
        _ => 6.0,
    };
    let s = area_scale(fp, input, out, align_corners, scale);
    let support = if s >= 1.0 { fp.mul(interp * 0.5, s) } else { interp * 0.5 };
    let filter = |x: f64| -> f64 {
        let x = x.abs();
        if mode == Mode::LanczosAa {
            // sinc(x) * sinc(x / 3) inside [-3, 3].
            let sinc = |t: f64| if t == 0.0 { 1.0 } else { fp.div(fp.r(fp.mul(PI, t).sin()), fp.mul(PI, t)) };
            if x < 3.0 {
                fp.mul(sinc(x), sinc(fp.div(x, 3.0)))
            } else {
                0.0
            }
        } else if mode == Mode::CubicAa {
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
        Mode::LanczosAa => "_upsample_lanczos2d_aa".to_string(),
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
        Mode::LinearAa | Mode::CubicAa | Mode::LanczosAa => {
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
    let work = if mode.weighted() { x.dtype.opmath() } else { x.dtype };
    let mut y = cx.cast(x.v, work);
    let aa = matches!(mode, Mode::LinearAa | Mode::CubicAa | Mode::LanczosAa);
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
    if matches!(mode, Mode::LinearAa | Mode::CubicAa | Mode::LanczosAa) {
        let t = aa_taps(mode, fp, input, out, align_corners, scale);
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
    if matches!(mode, Mode::LinearAa | Mode::CubicAa | Mode::LanczosAa) {
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
    let mut y = cx.cast(g.v, g.dtype.opmath());
    for i in 0..n {
        let taps = upsample_taps(mode, fp, in_dims[2 + i], out[i], align_corners, scales[i]);
        y = apply_taps_transpose(cx, y, 2 + i, &taps, in_dims[2 + i]);
    }
    one(cx.cast(y, g.dtype))
}
