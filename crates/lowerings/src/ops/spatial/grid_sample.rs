//! Grid sampling: grid_sampler_2d/3d (bilinear, nearest and bicubic; zeros, border and
//! reflection padding) and their backward ops.
use crate::args::Args;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{dtype_check, is_floating, product, zeros, I64};
use stablehlo::{CmpDir, GatherDims, ScatterDims, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("grid_sampler_2d", |cx, a| grid_sampler(cx, a, 2)),
    op("grid_sampler_3d", |cx, a| grid_sampler(cx, a, 3)),
    op("grid_sampler_2d_backward", |cx, a| grid_sampler_backward(cx, a, 2)),
    op("grid_sampler_3d_backward", |cx, a| grid_sampler_backward(cx, a, 3)),
];

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
