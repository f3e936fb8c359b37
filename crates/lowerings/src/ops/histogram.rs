//! Histograms and counts: bincount, histc, histogram and the histogramdd pieces
//! (_histogramdd_bin_edges, _histogramdd_from_bin_cts, _histogramdd_from_bin_tensors).
use crate::args::{Arg, Args, Tensor};
use crate::blocks::consts::I64;
use crate::blocks::gather::{numel, scatter_along, size, Combine};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use stablehlo::{Builder, CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("bincount", bincount).sized(bincount_size),
    op("histc", histc).specialized(),
    // Without a range, the bin edges come from the data: the size programs check it is finite.
    op("histogram", histogram).sized(|cx, a| histogram_check(cx, a, true)),
    op("_histogramdd_bin_edges", histogramdd_bin_edges).sized(|cx, a| histogram_check(cx, a, false)),
    op("_histogramdd_from_bin_cts", histogramdd_from_bin_cts).sized(|cx, a| histogram_check(cx, a, false)),
    op("_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors),
];

// ---- bincount -----------------------------------------------------------------------------------

fn bincount_args(cx: &Cx, args: &Args) -> Result<(Tensor, Option<Tensor>, i64)> {
    let x = args.tensor("self")?;
    let w = args.opt_tensor("weights")?;
    let minlength = args.int_or("minlength", 0)?;
    check!(minlength >= 0, Runtime, "minlength should be >= 0");
    check!(
        cx.rank(x.v) == 1 && x.dtype.is_integral() && x.dtype != DType::Bool,
        Runtime,
        "bincount only supports 1-d non-negative integral inputs."
    );
    if let Some(w) = &w {
        check!(
            cx.rank(w.v) == 1 && cx.dims(w.v) == cx.dims(x.v),
            Runtime,
            "weights should be 1-d and have the same length as input"
        );
    }
    Ok((x, w, minlength))
}

fn bincount_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, _, minlength) = bincount_args(cx, args)?;
    let n = numel(&cx.dims(x.v));
    let ml = cx.constant_i64(minlength, ElemType::I64);
    if n == 0 {
        return one(ml);
    }
    let v = cx.convert(x.v, ElemType::I64);
    let lo = cx.constant_i64(-1, ElemType::I64);
    let m = cx.reduce(&[v], &[lo], &[0], |b, a| vec![b.max(a[0], a[1])])[0];
    let one_ = cx.constant_i64(1, ElemType::I64);
    let m1 = cx.add(m, one_);
    one(cx.max(m1, ml))
}

/// bincount(self, weights=None, minlength=0): counts (or summed weights) of each value.
fn bincount(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, w, _) = bincount_args(cx, args)?;
    let bins = size(args)?;
    let n = numel(&cx.dims(x.v));
    let dt = match &w {
        None => I64,
        Some(w) if w.dtype == DType::F32 => DType::F32,
        Some(_) => DType::F64,
    };
    let zeros = cx.full(0.0, dt, &[bins]);
    if n == 0 || bins == 0 {
        return one(zeros);
    }
    let upd = match &w {
        None => cx.full(1.0, dt, &[n]),
        Some(w) => cx.cast(w.v, dt),
    };
    one(scatter_along(cx, zeros, 0, x.v, upd, Combine::Add))
}

// ---- histc --------------------------------------------------------------------------------------

/// histc(self, bins=100, min=0, max=0): equal-width histogram; min == max uses the data's range.
fn histc(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    // Integer inputs as on CUDA (PyTorch's CPU kernel has floats only; models use ints on
    // accelerators).
    check!(
        x.dtype.is_float() || x.dtype.is_int(),
        NotImplemented,
        "\"histogram_tpu\" not implemented for '{}'",
        x.dtype.torch_name()
    );
    let bins = args.int_or("bins", 100)?;
    check!(bins > 0, Runtime, "torch.histc(): bins must be > 0, but got {} for dimension 0", bins);
    let float = |name: &str| -> Result<f64> {
        match args.get(name) {
            Some(Arg::Float(f)) => Ok(f.value),
            None | Some(Arg::None) => Ok(0.0),
            _ => Ok(args.int(name)? as f64),
        }
    };
    let (mn, mx) = (float("min")?, float("max")?);
    let ordered = mn <= mx;
    check!(ordered, Runtime, "torch.histc(): max must be larger than min");
    check!(mn.is_finite() && mx.is_finite(), Runtime, "torch.histc(): range of [{}, {}] is not finite", mn, mx);
    let dt = x.dtype;
    let n = numel(&cx.dims(x.v));
    if n == 0 {
        return one(cx.full(0.0, dt, &[bins]));
    }
    let flat = cx.reshape(x.v, &[n]);
    if dt.is_int() {
        return one(histc_int(cx, flat, bins, mn, mx));
    }
    let e = dt.elem();
    let (lo, hi) = if mn == mx {
        // The data's own range (NaNs ignored), widened by 1 when it is a single point.
        let nan = cx.compare(CmpDir::Ne, flat, flat);
        let inf = cx.full(f64::INFINITY, dt, &[n]);
        let ninf = cx.full(f64::NEG_INFINITY, dt, &[n]);
        let a = cx.select(nan, inf, flat);
        let b = cx.select(nan, ninf, flat);
        let i0 = cx.constant_f64(f64::INFINITY, e);
        let i1 = cx.constant_f64(f64::NEG_INFINITY, e);
        let lo = cx.reduce(&[a], &[i0], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
        let hi = cx.reduce(&[b], &[i1], &[0], |b, v| vec![b.max(v[0], v[1])])[0];
        let same = cx.compare(CmpDir::Eq, lo, hi);
        let one_ = cx.constant_f64(1.0, e);
        let lo1 = cx.sub(lo, one_);
        let hi1 = cx.add(hi, one_);
        let fixed_lo = cx.constant_f64(mn - 1.0, e);
        let fixed_hi = cx.constant_f64(mx + 1.0, e);
        // all-NaN (or empty) data: PyTorch falls back to the given (equal) bounds
        let empty = cx.compare(CmpDir::Gt, lo, hi);
        let lo = cx.select(same, lo1, lo);
        let hi = cx.select(same, hi1, hi);
        let lo = cx.select(empty, fixed_lo, lo);
        let hi = cx.select(empty, fixed_hi, hi);
        (lo, hi)
    } else {
        (cx.constant_f64(mn, e), cx.constant_f64(mx, e))
    };
    let lob = cx.broadcast_in_dim(lo, &[n], &[]);
    let hib = cx.broadcast_in_dim(hi, &[n], &[]);
    // pos = (x - lo) * bins / (hi - lo), then one step of local search against the bin edges
    let d = cx.sub(flat, lob);
    let w = cx.sub(hib, lob);
    let nb = cx.full(bins as f64, dt, &[n]);
    let scaled = cx.mul(d, nb);
    let q = cx.div(scaled, w);
    let pos = cx.convert(q, ElemType::I64);
    let lastb = cx.full((bins - 1) as f64, I64, &[n]);
    let zero = cx.full(0.0, I64, &[n]);
    let pos = cx.min(pos, lastb);
    let pos = cx.max(pos, zero);
    // edge(i) = lo + i * (hi - lo) / bins, as linspace computes it
    let edge = |cx: &mut Cx, i: Value| {
        let f = cx.convert(i, e);
        let step = cx.div(w, nb);
        let t = cx.mul(f, step);
        cx.add(lob, t)
    };
    let e0 = edge(cx, pos);
    let one_i = cx.full(1.0, I64, &[n]);
    let next = cx.add(pos, one_i);
    let e1 = edge(cx, next);
    let below = cx.compare(CmpDir::Lt, flat, e0);
    let above = cx.compare(CmpDir::Ge, flat, e1);
    let not_last = cx.compare(CmpDir::Lt, pos, lastb);
    let above = cx.and(above, not_last);
    let down = cx.sub(pos, one_i);
    let pos = cx.select(below, down, pos);
    let pos = cx.select(above, next, pos);
    // only elements inside [lo, hi] count
    let ge = cx.compare(CmpDir::Ge, flat, lob);
    let le = cx.compare(CmpDir::Le, flat, hib);
    let inside = cx.and(ge, le);
    let trash = cx.full(bins as f64, I64, &[n]);
    let pos = cx.select(inside, pos, trash);
    let zeros = cx.full(0.0, dt, &[bins + 1]);
    let ones = cx.full(1.0, dt, &[n]);
    let h = scatter_along(cx, zeros, 0, pos, ones, Combine::Add);
    one(cx.slice(h, &[0], &[bins], &[1]))
}

/// histc on integers (CUDA's rule): bin = (x - lo) * bins / (hi - lo) in integer arithmetic,
/// x == hi in the last bin, values outside [lo, hi] dropped; counts in the input dtype.
fn histc_int(cx: &mut Cx, flat: Value, bins: i64, mn: f64, mx: f64) -> Value {
    let dt = cx.dtype(flat);
    let n = cx.dims(flat)[0];
    let x = cx.convert(flat, ElemType::I64);
    let (mut lo, mut hi) = (cx.constant_i64(mn as i64, ElemType::I64), cx.constant_i64(mx as i64, ElemType::I64));
    if mn as i64 == mx as i64 {
        let i0 = cx.constant_i64(i64::MAX, ElemType::I64);
        let i1 = cx.constant_i64(i64::MIN, ElemType::I64);
        lo = cx.reduce(&[x], &[i0], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
        hi = cx.reduce(&[x], &[i1], &[0], |b, v| vec![b.max(v[0], v[1])])[0];
    }
    let same = cx.compare(CmpDir::Eq, lo, hi);
    let one_ = cx.constant_i64(1, ElemType::I64);
    let lo1 = cx.sub(lo, one_);
    let hi1 = cx.add(hi, one_);
    let lo = cx.select(same, lo1, lo);
    let hi = cx.select(same, hi1, hi);
    let lob = cx.broadcast_in_dim(lo, &[n], &[]);
    let hib = cx.broadcast_in_dim(hi, &[n], &[]);
    let d = cx.sub(x, lob);
    let nb = cx.full(bins as f64, I64, &[n]);
    let scaled = cx.mul(d, nb);
    let w = cx.sub(hib, lob);
    let pos = cx.div(scaled, w);
    let lastb = cx.full((bins - 1) as f64, I64, &[n]);
    let pos = cx.min(pos, lastb);
    let ge = cx.compare(CmpDir::Ge, x, lob);
    let le = cx.compare(CmpDir::Le, x, hib);
    let inside = cx.and(ge, le);
    let trash = cx.full(bins as f64, I64, &[n]);
    let pos = cx.select(inside, pos, trash);
    let zeros = cx.full(0.0, dt, &[bins + 1]);
    let ones = cx.full(1.0, dt, &[n]);
    let h = scatter_along(cx, zeros, 0, pos, ones, Combine::Add);
    cx.slice(h, &[0], &[bins], &[1])
}

// ---- histograms -------------------------------------------------------------------------------------

/// A double as C++'s ostream prints it (6 significant digits, like %g).
fn cpp_double(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let e = format!("{:.5e}", x);
    let (mant, exp) = e.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let strip = |t: &str| -> String {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        }
    };
    if (-4..6).contains(&exp) {
        strip(&format!("{:.*}", (5 - exp).max(0) as usize, x))
    } else {
        format!("{}e{}{:02}", strip(mant), if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// `range` (float[]?) as doubles.
fn float_list(args: &Args, name: &str) -> Result<Option<Vec<f64>>> {
    Ok(match args.get(name) {
        None | Some(Arg::None) => None,
        Some(Arg::FloatList(v)) => Some(v.clone()),
        Some(Arg::IntList(v)) => Some(v.iter().map(|&i| i as f64).collect()),
        Some(Arg::List(items)) => Some(
            items
                .iter()
                .map(|a| match a {
                    Arg::Float(f) => Ok(f.value),
                    Arg::Int(i) => Ok(*i as f64),
                    _ => Err(crate::error::TorchError::new(crate::error::ErrorKind::Type, format!("{}(): expected '{}' to be a list of floats", args.op, name))),
                })
                .collect::<Result<Vec<f64>>>()?,
        ),
        _ => bail!(Type, "{}(): expected argument '{}' to be a list of floats", args.op, name),
    })
}

fn hist_dtype_check(x: &Tensor) -> Result<()> {
    check!(
        matches!(x.dtype, DType::F32 | DType::F64),
        NotImplemented,
        "\"histogramdd\" not implemented for '{}'",
        x.dtype.torch_name()
    );
    Ok(())
}

/// The input as points [M, N] (histogram: every element is a 1-d point).
fn hist_points(cx: &mut Cx, x: &Tensor, one_d: bool) -> Result<(Value, i64, i64)> {
    let d = cx.dims(x.v);
    if one_d {
        let m: i64 = d.iter().product();
        return Ok((cx.reshape(x.v, &[m, 1]), m, 1));
    }
    check!(d.len() >= 2, Runtime, "torch.histogramdd: input tensor should have at least 2 dimensions");
    let n = d[d.len() - 1];
    let m: i64 = d[..d.len() - 1].iter().product();
    Ok((cx.reshape(x.v, &[m, n]), m, n))
}

/// The weight checked like histogramdd_check_inputs, as [M] (histogram flattens it first).
fn hist_weight(cx: &mut Cx, args: &Args, x: &Tensor, m: i64, one_d: bool) -> Result<Option<Value>> {
    let Some(w) = args.opt_tensor("weight")? else { return Ok(None) };
    check!(
        w.dtype == x.dtype,
        Runtime,
        "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should have the same dtype, but got input({}), and weight({})",
        crate::blocks::type_names::cpp_type_name(x.dtype),
        crate::blocks::type_names::cpp_type_name(w.dtype)
    );
    let wd = cx.dims(w.v);
    let xd = cx.dims(x.v);
    let ok = if one_d {
        wd.iter().product::<i64>() == m
    } else {
        let want = &xd[..xd.len() - 1];
        let got: Vec<i64> = if wd.is_empty() { vec![1] } else { wd.clone() };
        got == want
    };
    let shape = |d: &[i64]| format!("[{}]", d.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "));
    check!(
        ok,
        Runtime,
        "torch.histogramdd: if weight tensor is provided it should have the same shape as the input tensor excluding its innermost dimension, but got input with shape {} and weight with shape {}",
        if one_d { shape(&[m, 1]) } else { shape(&xd) },
        if one_d { shape(&[wd.iter().product()]) } else { shape(&wd) }
    );
    Ok(Some(cx.reshape(w.v, &[m])))
}

/// The `bins` int[] of histogramdd (one count per dim), checked.
fn hist_bin_cts(args: &Args, n: i64) -> Result<Vec<i64>> {
    let bins = args.ints("bins")?;
    check!(
        bins.len() as i64 == n,
        Runtime,
        "histogramdd: The size of bins must be equal to the innermost dimension of the input."
    );
    Ok(bins)
}

/// The leftmost and rightmost edges of each dim as 0-d values of the input dtype: from `range`
/// (checked here), or the data's min and max (NaN propagating; [0, 1] for no data), widened by
/// 0.5 each way when equal. Non-finite data ranges are caught by the size program.
fn outer_edges(cx: &mut Cx, pts: Value, m: i64, n: i64, range: &Option<Vec<f64>>, dt: DType) -> Result<Vec<(Value, Value)>> {
    let e = dt.elem();
    let mut out = Vec::new();
    if let Some(r) = range {
        check!(
            r.len() as i64 == 2 * n,
            Runtime,
            "torch.histogramdd: for a {}-dimensional histogram range should have {} elements, but got {}",
            n,
            2 * n,
            r.len()
        );
        for d in 0..n as usize {
            let (mut lo, mut hi) = (r[2 * d], r[2 * d + 1]);
            check!(
                lo.is_finite() && hi.is_finite(),
                Runtime,
                "torch.histogramdd: dimension {}'s range [{}, {}] is not finite",
                d,
                cpp_double(lo),
                cpp_double(hi)
            );
            check!(
                lo <= hi,
                Runtime,
                "torch.histogramdd: min should not exceed max, but got min {} max {} for dimension {}",
                cpp_double(lo),
                cpp_double(hi),
                d
            );
            if lo == hi {
                lo -= 0.5;
                hi += 0.5;
            }
            out.push((cx.constant_f64(lo, e), cx.constant_f64(hi, e)));
        }
        return Ok(out);
    }
    if m == 0 {
        for _ in 0..n {
            out.push((cx.constant_f64(0.0, e), cx.constant_f64(1.0, e)));
        }
        return Ok(out);
    }
    let (lo, hi) = data_range(cx, pts, m, n);
    for d in 0..n {
        let l = cx.slice(lo, &[d], &[d + 1], &[1]);
        let l = cx.reshape(l, &[]);
        let h = cx.slice(hi, &[d], &[d + 1], &[1]);
        let h = cx.reshape(h, &[]);
        let same = cx.compare(CmpDir::Eq, l, h);
        let half = cx.constant_f64(0.5, e);
        let l2 = cx.sub(l, half);
        let h2 = cx.add(h, half);
        let l = cx.select(same, l2, l);
        let h = cx.select(same, h2, h);
        out.push((l, h));
    }
    Ok(out)
}

/// Per-dim min and max [N] of points [M, N] (M > 0), NaN propagating like aminmax.
fn data_range(cx: &mut Cx, pts: Value, _m: i64, _n: i64) -> (Value, Value) {
    let e = cx.elem(pts);
    let lo0 = cx.constant_f64(f64::INFINITY, e);
    let hi0 = cx.constant_f64(f64::NEG_INFINITY, e);
    let lo = cx.reduce(&[pts], &[lo0], &[0], |b, a| vec![nan_min_max(b, a[0], a[1], false)])[0];
    let hi = cx.reduce(&[pts], &[hi0], &[0], |b, a| vec![nan_min_max(b, a[0], a[1], true)])[0];
    (lo, hi)
}

fn nan_min_max(b: &mut Builder, x: Value, y: Value, is_max: bool) -> Value {
    let m = if is_max { b.max(x, y) } else { b.min(x, y) };
    let y_nan = b.compare(CmpDir::Ne, y, y);
    let m = b.select(y_nan, y, m);
    let x_nan = b.compare(CmpDir::Ne, x, x);
    b.select(x_nan, x, m)
}

/// linspace(lo, hi, steps) in the dtype of the 0-d lo/hi, as PyTorch's kernel: the first half
/// from lo (lo + step * i), the second from hi (hi - step * (steps - 1 - i)).
fn linspace_values(cx: &mut Cx, lo: Value, hi: Value, steps: i64) -> Value {
    let e = cx.elem(lo);
    if steps == 1 {
        return cx.reshape(lo, &[1]);
    }
    let w = cx.sub(hi, lo);
    let den = cx.constant_f64((steps - 1) as f64, e);
    let step = cx.div(w, den);
    let i = cx.iota(&TensorType::new(e, &[steps]), 0);
    let stepv = cx.broadcast_in_dim(step, &[steps], &[]);
    let lov = cx.broadcast_in_dim(lo, &[steps], &[]);
    let hiv = cx.broadcast_in_dim(hi, &[steps], &[]);
    let a = cx.mul(stepv, i);
    let first = cx.add(lov, a);
    let last = cx.b.splat_f64((steps - 1) as f64, &TensorType::new(e, &[steps]));
    let back = cx.sub(last, i);
    let bb = cx.mul(stepv, back);
    let second = cx.sub(hiv, bb);
    let half = cx.b.splat_f64((steps / 2) as f64, &TensorType::new(e, &[steps]));
    let lower = cx.compare(CmpDir::Lt, i, half);
    cx.select(lower, first, second)
}

/// v[idx] for a 1-d `v` and int64 indices of any shape.
fn take1d(cx: &mut Cx, v: Value, idx: Value) -> Value {
    let d = cx.dims(idx);
    let mut d1 = d.clone();
    d1.push(1);
    let i = cx.reshape(idx, &d1);
    let dn = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: d.len() as i64,
        ..Default::default()
    };
    cx.gather(v, i, &dn, &[1], false)
}

/// std::upper_bound over edges[first .. first + len) for each element (libstdc++'s halving
/// search, so that unsorted edges give the same answer as PyTorch's CPU kernel).
fn upper_bound(cx: &mut Cx, edges: Value, x: Value, first: Value, len: Value, max_len: i64) -> Value {
    let d = cx.dims(x);
    let ne = cx.dims(edges)[0];
    let (mut first, mut len) = (first, len);
    let zero = cx.full(0.0, DType::I64, &d);
    let one_ = cx.full(1.0, DType::I64, &d);
    let top = cx.full((ne - 1).max(0) as f64, DType::I64, &d);
    let mut steps = 0;
    let mut l = max_len;
    while l > 0 {
        steps += 1;
        l >>= 1;
    }
    for _ in 0..steps {
        let half = cx.shift_right_arithmetic(len, one_);
        let mid = cx.add(first, half);
        let midc = cx.clamp(zero, mid, top);
        let v = take1d(cx, edges, midc);
        let go_left = cx.compare(CmpDir::Lt, x, v);
        let active = cx.compare(CmpDir::Gt, len, zero);
        let right_first = cx.add(mid, one_);
        let right_len = cx.sub(len, half);
        let right_len = cx.sub(right_len, one_);
        let nf = cx.select(go_left, first, right_first);
        let nl = cx.select(go_left, half, right_len);
        first = cx.select(active, nf, first);
        len = cx.select(active, nl, len);
    }
    first
}

/// PyTorch's histogramdd CPU kernel over points [M, N] with edges per dim (1-d, the input
/// dtype): a point outside some dim's [first edge, last edge] (or NaN) is dropped; its bin is
/// found by binary search over the edges, or (`linear`) by interpolation and a local search of
/// the neighbours; the last bin includes its right edge. Counts (or weights) are summed in the
/// input dtype; `density` divides by the total and by each bin's widths.
fn histogramdd_core(cx: &mut Cx, pts: Value, m: i64, edges: &[Value], weight: Option<Value>, density: bool, linear: bool) -> Value {
    let e = cx.elem(pts);
    let dt = DType::from_elem(e);
    let counts: Vec<i64> = edges.iter().map(|&v| cx.dims(v)[0] - 1).collect();
    let total: i64 = counts.iter().product();
    let mut flat = cx.full(0.0, DType::I64, &[m]);
    let mut keep = cx.full(1.0, DType::Bool, &[m]);
    let mut stride = total;
    for (d, &ed) in edges.iter().enumerate() {
        let nbe = counts[d] + 1;
        stride /= counts[d];
        let x = cx.slice(pts, &[0, d as i64], &[m, d as i64 + 1], &[1, 1]);
        let x = cx.reshape(x, &[m]);
        let left = cx.slice(ed, &[0], &[1], &[1]);
        let left = cx.reshape(left, &[]);
        let right = cx.slice(ed, &[nbe - 1], &[nbe], &[1]);
        let right = cx.reshape(right, &[]);
        let lv = cx.broadcast_in_dim(left, &[m], &[]);
        let rv = cx.broadcast_in_dim(right, &[m], &[]);
        let ge = cx.compare(CmpDir::Ge, x, lv);
        let le = cx.compare(CmpDir::Le, x, rv);
        let inside = cx.and(ge, le);
        keep = cx.and(keep, inside);
        let pos = if linear {
            let off = cx.sub(x, lv);
            let nb = cx.full((nbe - 1) as f64, dt, &[m]);
            let sc = cx.mul(off, nb);
            let w = cx.sub(rv, lv);
            let q = cx.div(sc, w);
            // Truncation toward zero (outside points are dropped anyway; keep the index sane).
            let lim = cx.full(nbe as f64, dt, &[m]);
            let zf = cx.full(0.0, dt, &[m]);
            let q = cx.clamp(zf, q, lim);
            let q_nan = cx.compare(CmpDir::Ne, q, q);
            let q = cx.select(q_nan, zf, q);
            let pos = cx.convert(q, ElemType::I64);
            let one_ = cx.full(1.0, DType::I64, &[m]);
            let zero = cx.full(0.0, DType::I64, &[m]);
            let pm1 = cx.sub(pos, one_);
            let pos_min = cx.max(zero, pm1);
            let two = cx.full(2.0, DType::I64, &[m]);
            let pp2 = cx.add(pos, two);
            let nbev = cx.full(nbe as f64, DType::I64, &[m]);
            let pos_max = cx.min(pp2, nbev);
            let len = cx.sub(pos_max, pos_min);
            let len = cx.max(len, zero);
            let ub = upper_bound(cx, ed, x, pos_min, len, 3);
            cx.sub(ub, one_)
        } else {
            let zero = cx.full(0.0, DType::I64, &[m]);
            let len = cx.full(nbe as f64, DType::I64, &[m]);
            let ub = upper_bound(cx, ed, x, zero, len, nbe);
            let one_ = cx.full(1.0, DType::I64, &[m]);
            cx.sub(ub, one_)
        };
        let last = cx.full((nbe - 1) as f64, DType::I64, &[m]);
        let at_last = cx.compare(CmpDir::Eq, pos, last);
        let one_ = cx.full(1.0, DType::I64, &[m]);
        let back = cx.sub(pos, one_);
        let pos = cx.select(at_last, back, pos);
        let st = cx.full(stride as f64, DType::I64, &[m]);
        let t = cx.mul(pos, st);
        flat = cx.add(flat, t);
    }
    // Dropped points (and any index out of range) go to a spare slot.
    let zero = cx.full(0.0, DType::I64, &[m]);
    let spare = cx.full(total as f64, DType::I64, &[m]);
    let ge0 = cx.compare(CmpDir::Ge, flat, zero);
    let lt = cx.compare(CmpDir::Lt, flat, spare);
    let valid = cx.and(ge0, lt);
    let keep = cx.and(keep, valid);
    let flat = cx.select(keep, flat, spare);
    let w = match weight {
        Some(w) => w,
        None => cx.full(1.0, dt, &[m]),
    };
    let hist = cx.full(0.0, dt, &[total + 1]);
    let idx = cx.reshape(flat, &[m, 1]);
    let dn = ScatterDims { inserted_window_dims: vec![0], scatter_dims_to_operand_dims: vec![0], index_vector_dim: 1, ..Default::default() };
    let hist = cx.scatter(hist, idx, w, &dn, |b, a, c| b.add(a, c));
    let hist = cx.slice(hist, &[0], &[total], &[1]);
    let mut hist = cx.reshape(hist, &counts);
    if density {
        let z = cx.constant_f64(0.0, e);
        let s = cx.reduce(&[hist], &[z], &(0..counts.len() as i64).collect::<Vec<_>>(), |b, a| vec![b.add(a[0], a[1])])[0];
        let sv = cx.broadcast_in_dim(s, &counts, &[]);
        hist = cx.div(hist, sv);
        for (d, &ed) in edges.iter().enumerate() {
            let nb = counts[d];
            let hi = cx.slice(ed, &[1], &[nb + 1], &[1]);
            let lo = cx.slice(ed, &[0], &[nb], &[1]);
            let wd = cx.sub(hi, lo);
            let wv = cx.broadcast_in_dim(wd, &counts, &[d as i64]);
            hist = cx.div(hist, wv);
        }
    }
    hist
}

/// Bin edges [bins + 1] per dim for bin counts: linspace over the outer edges.
fn linear_edges(cx: &mut Cx, pts: Value, m: i64, n: i64, bins: &[i64], range: &Option<Vec<f64>>, dt: DType) -> Result<Vec<Value>> {
    for (d, &b) in bins.iter().enumerate() {
        check!(b > 0, Runtime, "torch.histogram(): bins must be > 0, but got {} for dimension {}", b, d);
    }
    let outer = outer_edges(cx, pts, m, n, range, dt)?;
    Ok(outer.iter().zip(bins).map(|(&(lo, hi), &b)| linspace_values(cx, lo, hi, b + 1)).collect())
}

/// The size program of the histograms with bin counts: 0 when the range is given or the data's
/// is finite; else, for one dim, the float32 bits of its (min, max) packed as min << 32 | max,
/// and for several dims 1 + the first dim whose range is not finite.
fn histogram_check(cx: &mut Cx, args: &Args, one_d: bool) -> Result<Vec<Out>> {
    let z = cx.constant_i64(0, ElemType::I64);
    let x = args.tensor("self")?;
    let tensor_bins = matches!(args.get("bins"), Some(Arg::Tensor(_)));
    if tensor_bins || float_list(args, "range")?.is_some() || !matches!(x.dtype, DType::F32 | DType::F64) {
        return one(z);
    }
    let (pts, m, n) = hist_points(cx, &x, one_d)?;
    if m == 0 || n == 0 {
        return one(z);
    }
    let (lo, hi) = data_range(cx, pts, m, n);
    let fl = cx.is_finite(lo);
    let fh = cx.is_finite(hi);
    let ok = cx.and(fl, fh);
    if n == 1 {
        let l = cx.convert(lo, ElemType::F32);
        let h = cx.convert(hi, ElemType::F32);
        let lb = cx.bitcast_convert(l, ElemType::U32);
        let hb = cx.bitcast_convert(h, ElemType::U32);
        let lb = cx.convert(lb, ElemType::I64);
        let hb = cx.convert(hb, ElemType::I64);
        let sh = cx.full(32.0, DType::I64, &[1]);
        let lb = cx.shift_left(lb, sh);
        let code = cx.or(lb, hb);
        let zz = cx.full(0.0, DType::I64, &[1]);
        let code = cx.select(ok, zz, code);
        return one(cx.reshape(code, &[]));
    }
    let idx = cx.iota(&TensorType::new(ElemType::I64, &[n]), 0);
    let one_ = cx.full(1.0, DType::I64, &[n]);
    let code = cx.add(idx, one_);
    let big = cx.full(i64::MAX as f64, DType::I64, &[n]);
    let code = cx.select(ok, big, code);
    let mx = cx.constant_i64(i64::MAX, ElemType::I64);
    let first = cx.reduce(&[code], &[mx], &[0], |b, a| vec![b.min(a[0], a[1])])[0];
    let none = cx.compare(CmpDir::Eq, first, mx);
    one(cx.select(none, z, first))
}

/// The size program's verdict (absent in compiled graphs, which do not check).
fn range_error(code: i64, n: i64) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    if n == 1 {
        let bits = code as u64;
        let lo = f32::from_bits((bits >> 32) as u32) as f64;
        let hi = f32::from_bits(bits as u32) as f64;
        bail!(Runtime, "torch.histogramdd: dimension 0's range [{}, {}] is not finite", cpp_double(lo), cpp_double(hi));
    }
    bail!(Runtime, "torch.histogramdd: dimension {}'s range is not finite", code - 1)
}

/// histogram.bin_ct(self, bins, range, weight, density) and histogram.bins_tensor(self, bins,
/// weight, density) -> (hist, bin_edges): a 1-d histogram of every element.
fn histogram(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dt = x.dtype;
    let (pts, m, _) = hist_points(cx, &x, true)?;
    if let Some(Arg::Tensor(bins)) = args.get("bins") {
        let bd = cx.dims(bins.v);
        check!(
            bd.len() == 1,
            Runtime,
            "torch.histogramdd: bins tensor should have one dimension, but got {} dimensions in the bins tensor for dimension 0",
            bd.len()
        );
        check!(bd[0] - 1 > 0, Runtime, "torch.histogram(): bins must be > 0, but got {} for dimension 0", bd[0] - 1);
        check!(
            bins.dtype == dt,
            Runtime,
            "torch.histogramdd: input tensor and bins tensors should have the same dtype, but got input with dtype {} and bins for dimension 0 with dtype {}",
            crate::blocks::type_names::cpp_type_name(dt),
            crate::blocks::type_names::cpp_type_name(bins.dtype)
        );
        let weight = hist_weight(cx, args, &x, m, true)?;
        hist_dtype_check(&x)?;
        let h = histogramdd_core(cx, pts, m, &[bins.v], weight, args.bool_or("density", false)?, false);
        return Ok(vec![Out::Tensor(h), Out::Tensor(bins.v)]);
    }
    let bins = args.int_or("bins", 100)?;
    let range = float_list(args, "range")?;
    check!(bins > 0, Runtime, "torch.histogram(): bins must be > 0, but got {} for dimension 0", bins);
    hist_dtype_check(&x)?;
    range_error(args.int_or("__size", 0)?, 1)?;
    let edges = linear_edges(cx, pts, m, 1, &[bins], &range, dt)?;
    let weight = hist_weight(cx, args, &x, m, true)?;
    let h = histogramdd_core(cx, pts, m, &edges, weight, args.bool_or("density", false)?, true);
    Ok(vec![Out::Tensor(h), Out::Tensor(edges[0])])
}

/// The checked input of the bin-count histogramdd ops and its evenly spaced edges: (self,
/// its points [M, N], M, the edges of each dim).
fn histogramdd_linear_edges(cx: &mut Cx, args: &Args) -> Result<(Tensor, Value, i64, Vec<Value>)> {
    let x = args.tensor("self")?;
    let (pts, m, n) = hist_points(cx, &x, false)?;
    let range = float_list(args, "range")?;
    let bins = hist_bin_cts(args, n)?;
    hist_dtype_check(&x)?;
    range_error(args.int_or("__size", 0)?, n)?;
    let edges = linear_edges(cx, pts, m, n, &bins, &range, x.dtype)?;
    Ok((x, pts, m, edges))
}

/// _histogramdd_bin_edges(self, bins, range, weight, density) -> the edges of each dim.
fn histogramdd_bin_edges(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (_, _, _, edges) = histogramdd_linear_edges(cx, args)?;
    Ok(vec![Out::List(edges)])
}

/// _histogramdd_from_bin_cts(self, bins, range, weight, density) -> hist.
fn histogramdd_from_bin_cts(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (x, pts, m, edges) = histogramdd_linear_edges(cx, args)?;
    let weight = hist_weight(cx, args, &x, m, false)?;
    one(histogramdd_core(cx, pts, m, &edges, weight, args.bool_or("density", false)?, true))
}

/// _histogramdd_from_bin_tensors(self, bins, weight, density) -> hist, with the given edges.
fn histogramdd_from_bin_tensors(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let (pts, m, n) = hist_points(cx, &x, false)?;
    let bins = args.tensors("bins")?;
    check!(
        bins.len() as i64 == n,
        Runtime,
        "torch.histogramdd: expected {} sequences of bin edges for a {}-dimensional histogram but got {}",
        n,
        n,
        bins.len()
    );
    for (d, b) in bins.iter().enumerate() {
        check!(
            b.dtype == x.dtype,
            Runtime,
            "torch.histogramdd: input tensor and bins tensors should have the same dtype, but got input with dtype {} and bins for dimension {} with dtype {}",
            crate::blocks::type_names::cpp_type_name(x.dtype),
            d,
            crate::blocks::type_names::cpp_type_name(b.dtype)
        );
        let bd = cx.dims(b.v);
        check!(
            bd.len() == 1,
            Runtime,
            "torch.histogramdd: bins tensor should have one dimension, but got {} dimensions in the bins tensor for dimension {}",
            bd.len(),
            d
        );
        check!(
            bd[0] > 0,
            Runtime,
            "torch.histogramdd: bins tensor should have at least 1 element, but got {} elements in the bins tensor for dimension {}",
            bd[0],
            d
        );
    }
    let weight = hist_weight(cx, args, &x, m, false)?;
    for (d, b) in bins.iter().enumerate() {
        let c = cx.dims(b.v)[0] - 1;
        check!(c > 0, Runtime, "torch.histogram(): bins must be > 0, but got {} for dimension {}", c, d);
    }
    hist_dtype_check(&x)?;
    let edges: Vec<Value> = bins.iter().map(|b| b.v).collect();
    one(histogramdd_core(cx, pts, m, &edges, weight, args.bool_or("density", false)?, false))
}
