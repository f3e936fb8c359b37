//! Order statistics and the remaining reductions and scans: nansum, median/nanmedian (all
//! elements and along a dim), kthvalue, mode, aminmax, cummax/cummin (_cummax_helper,
//! _cummin_helper), logcumsumexp (_logcumsumexp), renorm; the factory logspace; and histograms
//! (histogram, _histogramdd_bin_edges, _histogramdd_from_bin_cts/_tensors).
//!
//! Selections sort once (stable, NaN last) and pick positions, which reproduces PyTorch's
//! index choices: nth_element on (value, index) pairs for median, the last of equal values
//! for mode (whose CPU kernel sorts stably for up to 16 elements).
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::reduce::{acc_type, keep, opt_dtype, reduce, reduce_dims, sort_with_indices, unreduce, Red};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, Registry};
use stablehlo::{Builder, CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("nansum", nansum);
    r.add("median", |cx, a| median(cx, a, false));
    r.add("nanmedian", |cx, a| median(cx, a, true));
    r.add("kthvalue", kthvalue);
    r.add("mode", mode);
    r.add("aminmax", aminmax);
    // The older names (_aminmax(self) and _aminmax.dim(self, dim, keepdim)) compute the same.
    r.add("_aminmax", aminmax);
    r.add("_cummax_helper", |cx, a| cummax_cummin(cx, a, true));
    r.add("_cummin_helper", |cx, a| cummax_cummin(cx, a, false));
    // The functional forms (compiled graphs keep them; eager goes through the helpers).
    r.add("cummax", |cx, a| cummax_cummin(cx, a, true));
    r.add("cummin", |cx, a| cummax_cummin(cx, a, false));
    r.add("_logcumsumexp", logcumsumexp);
    r.add("logcumsumexp", logcumsumexp);
    // p and maxnorm are validated, and p decides the norm's form.
    r.add_specialized("renorm", renorm);
    // The values are computed on the host from start, end and base.
    r.add_specialized("logspace", logspace);
    // Without a range, the bin edges come from the data: the size programs check it is finite.
    r.add_sized("histogram", |cx, a| histogram_check(cx, a, true), histogram);
    r.add_sized("_histogramdd_bin_edges", |cx, a| histogram_check(cx, a, false), histogramdd_bin_edges);
    r.add_sized("_histogramdd_from_bin_cts", |cx, a| histogram_check(cx, a, false), histogramdd_from_bin_cts);
    r.add("_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors);
}

// ---- helpers ----------------------------------------------------------------------------------

fn no_complex(x: &Tensor, op: &str) -> Result<()> {
    check!(!x.dtype.is_complex(), NotImplemented, "{}: complex tensors are not supported on tpu yet", op);
    Ok(())
}

fn scalar_f64(s: Scalar) -> f64 {
    match s {
        Scalar::Int(i) => i as f64,
        Scalar::Bool(b) => b as i64 as f64,
        Scalar::Float(f) => f.value,
    }
}

/// PyTorch's zero_numel_check_dims for one reduced dim: an empty reduced dim has no identity.
fn nonempty_dim(dims: &[i64], dim: i64, op: &str) -> Result<()> {
    if dims.is_empty() {
        check!(dim == 0 || dim == -1, Index, "{}: Expected reduction dim -1 or 0 for scalar but got {}", op, dim);
        return Ok(());
    }
    let d = wrap_dim(dim, dims.len())?;
    check!(dims[d] != 0, Index, "{}: Expected reduction dim {} to have non-zero size.", op, d);
    Ok(())
}

/// The element at position `pos` (int64, dims of `v` without `dim`) along `dim` of each row.
fn pick_along(cx: &mut Cx, v: Value, dim: usize, pos: Value) -> Value {
    let dims = cx.dims(v);
    let idx = cx.iota(&TensorType::new(ElemType::I64, &dims), dim as i64);
    let kept: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != dim as i64).collect();
    let p = cx.broadcast_in_dim(pos, &dims, &kept);
    let hit = cx.compare(CmpDir::Eq, idx, p);
    let f = cx.constant_bool(false);
    let e = cx.elem(v);
    let z = cx.constant_i64(0, e);
    let r = cx.reduce(&[hit, v], &[f, z], &[dim as i64], |b, a| {
        // (hit, value) pairs: keep the one that is hit.
        let v = b.select(a[0], a[1], a[3]);
        let h = b.or(a[0], a[2]);
        vec![h, v]
    });
    r[1]
}

/// Non-NaN count along `dim` as int64 (dims of `v` without `dim`).
fn count_not_nan(cx: &mut Cx, v: Value, dim: usize) -> Value {
    let ok = if cx.elem(v).is_float() { cx.compare(CmpDir::Eq, v, v) } else { cx.full(1.0, DType::Bool, &cx.dims(v)) };
    let c = cx.convert(ok, ElemType::I64);
    reduce(cx, c, &[dim as i64], Red::Sum)
}

// ---- nansum -----------------------------------------------------------------------------------

/// nansum(self, dim, keepdim, dtype): sum with NaN counted as zero.
fn nansum(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, "nansum")?;
    let dt = match opt_dtype(args, "dtype")? {
        Some(d) => d,
        None => match args.opt_tensor("out")? {
            Some(o) => o.dtype,
            None if x.dtype.is_integral() => DType::I64,
            None => x.dtype,
        },
    };
    let in_dims = cx.dims(x.v);
    let dims = reduce_dims(args.opt_ints("dim")?, in_dims.len(), false)?;
    let keepdim = args.bool_or("keepdim", false)?;
    let v = cx.cast(x.v, dt);
    let v = cx.cast(v, acc_type(dt));
    let v = if cx.elem(v).is_float() {
        let nan = cx.compare(CmpDir::Ne, v, v);
        let z = cx.full(0.0, acc_type(dt), &in_dims);
        cx.select(nan, z, v)
    } else {
        v
    };
    let r = reduce(cx, v, &dims, Red::Sum);
    let r = cx.cast(r, dt);
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

// ---- median, nanmedian, kthvalue ----------------------------------------------------------------

fn median_dtype_check(x: &Tensor, kernel: &str) -> Result<()> {
    no_complex(x, kernel)?;
    check!(x.dtype != DType::Bool, NotImplemented, "\"{}\" not implemented for 'Bool'", kernel);
    Ok(())
}

/// median/nanmedian: over all elements (the lower median; NaN if any NaN for median, of the
/// non-NaN values for nanmedian, NaN for empty inputs) or along `dim` with indices.
fn median(cx: &mut Cx, args: &Args, ignore_nan: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let name = if ignore_nan { "nanmedian" } else { "median" };
    median_dtype_check(&x, if ignore_nan { "nanmedian_cpu" } else { "median_cpu" })?;
    let in_dims = cx.dims(x.v);
    let Some(dim) = args.opt_int("dim")? else {
        let n = cx.numel(x.v);
        if n == 0 {
            let v = match x.dtype {
                d if d.is_float() => cx.full(f64::NAN, d, &[]),
                DType::I64 => cx.constant_i64(i64::MIN, ElemType::I64),
                DType::I32 => cx.constant_i64(i32::MIN as i64, ElemType::I32),
                d => cx.full(0.0, d, &[]),
            };
            return one(v);
        }
        let flat = cx.reshape(x.v, &[n]);
        let (s, _) = sort_with_indices(cx, flat, 0, false);
        let count = count_not_nan(cx, s, 0);
        let pos = median_position(cx, count, n, ignore_nan);
        return one(pick_along(cx, s, 0, pos));
    };
    nonempty_dim(&in_dims, dim, &format!("{}()", name))?;
    let keepdim = args.bool_or("keepdim", false)?;
    if in_dims.is_empty() {
        wrap_dim(dim, 0)?;
        let z = cx.constant_i64(0, ElemType::I64);
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(z)]);
    }
    let d = wrap_dim(dim, in_dims.len())?;
    let n = in_dims[d];
    let (s, i) = sort_with_indices(cx, x.v, d, false);
    let count = count_not_nan(cx, s, d);
    let pos = median_position(cx, count, n, ignore_nan);
    let v = pick_along(cx, s, d, pos);
    let mut i = pick_along(cx, i, d, pos);
    if ignore_nan {
        // All-NaN rows: every element is equivalent to nth_element, whose shuffling then
        // decides the index (it depends on the length only).
        let rd = cx.dims(count);
        let z = cx.full(0.0, DType::I64, &rd);
        let all_nan = cx.compare(CmpDir::Eq, count, z);
        let at = cx.full(nth_element_all_equivalent(n) as f64, DType::I64, &rd);
        i = cx.select(all_nan, at, i);
    }
    let v = keep(cx, v, &in_dims, &[d as i64], keepdim);
    let i = keep(cx, i, &in_dims, &[d as i64], keepdim);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

/// The sorted position of the median of rows with `count` non-NaN values out of `n`: the first
/// NaN (median with NaNs), (n - 1) / 2, or (count - 1) / 2 truncated toward zero (nanmedian).
fn median_position(cx: &mut Cx, count: Value, n: i64, ignore_nan: bool) -> Value {
    let dims = cx.dims(count);
    let one_ = cx.full(1.0, DType::I64, &dims);
    let two = cx.full(2.0, DType::I64, &dims);
    if ignore_nan {
        let c = cx.sub(count, one_);
        return cx.div(c, two);
    }
    let mid = cx.full(((n - 1) / 2) as f64, DType::I64, &dims);
    let nn = cx.full(n as f64, DType::I64, &dims);
    let has_nan = cx.compare(CmpDir::Lt, count, nn);
    cx.select(has_nan, count, mid)
}

/// The original position libstdc++'s std::nth_element(first, first, last) leaves at `first`
/// when no element compares below another (introselect: median-of-three pivot swaps and
/// Hoare partitions shrinking the range, then an insertion sort that moves nothing).
fn nth_element_all_equivalent(n: i64) -> i64 {
    let mut idx: Vec<i64> = (0..n).collect();
    let (first, mut last) = (0usize, n.max(0) as usize);
    let mut depth = if n > 0 { 2 * (63 - (n as u64).leading_zeros() as i64) } else { 0 };
    while last - first > 3 {
        if depth == 0 {
            // Heap selection of one element moves nothing either.
            break;
        }
        depth -= 1;
        let mid = first + (last - first) / 2;
        idx.swap(first, mid);
        let (mut f, mut l) = (first + 1, last);
        let cut = loop {
            l -= 1;
            if f >= l {
                break f;
            }
            idx.swap(f, l);
            f += 1;
        };
        // nth (= first) lies below the cut.
        last = cut;
    }
    idx.first().copied().unwrap_or(0)
}

/// kthvalue(self, k, dim, keepdim): the k-th smallest (NaN largest) and its index.
fn kthvalue(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, "kthvalue")?;
    let in_dims = cx.dims(x.v);
    let dim = args.int_or("dim", -1)?;
    let kk = args.int("k")?;
    let d = wrap_dim(dim, in_dims.len())?;
    nonempty_dim(&in_dims, dim, "kthvalue()")?;
    let size = if in_dims.is_empty() { 1 } else { in_dims[d] };
    check!(kk >= 1 && kk <= size, Runtime, "kthvalue(): selected number k out of range for dimension {}", d);
    let keepdim = args.bool_or("keepdim", false)?;
    if in_dims.is_empty() {
        // PyTorch answers a single element before looking at its dtype.
        let z = cx.constant_i64(0, ElemType::I64);
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(z)]);
    }
    median_dtype_check(&x, "kthvalue_cpu")?;
    let (s, i) = sort_with_indices(cx, x.v, d, false);
    let r = in_dims.len();
    let mut start = vec![0; r];
    start[d] = kk - 1;
    let mut limit = in_dims.clone();
    limit[d] = kk;
    let strides = vec![1; r];
    let v = cx.slice(s, &start, &limit, &strides);
    let i = cx.slice(i, &start, &limit, &strides);
    let out = crate::blocks::reduce::reduced_shape(&in_dims, &[d as i64], keepdim);
    let v = cx.reshape(v, &out);
    let i = cx.reshape(i, &out);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

// ---- mode -----------------------------------------------------------------------------------------

/// mode(self, dim, keepdim): the most frequent value along dim (the smallest among equally
/// frequent ones) and the index of its last occurrence.
fn mode(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, "mode")?;
    let in_dims = cx.dims(x.v);
    let dim = args.int_or("dim", -1)?;
    let keepdim = args.bool_or("keepdim", false)?;
    nonempty_dim(&in_dims, dim, "mode()")?;
    if in_dims.is_empty() {
        wrap_dim(dim, 0)?;
        let z = cx.constant_i64(0, ElemType::I64);
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(z)]);
    }
    let d = wrap_dim(dim, in_dims.len())?;
    let n = in_dims[d];
    let out_shape = crate::blocks::reduce::reduced_shape(&in_dims, &[d as i64], keepdim);
    if cx.numel(x.v) == 0 {
        let v = cx.full(0.0, x.dtype, &out_shape);
        let i = cx.full(0.0, DType::I64, &out_shape);
        return Ok(vec![Out::Tensor(v), Out::Tensor(i)]);
    }
    let (s, si) = sort_with_indices(cx, x.v, d, false);
    let r = in_dims.len();
    let zeros = vec![0; r];
    let strides = vec![1; r];
    // next[i] = s[i + 1] (s[n - 1] for the last), prev[i] = s[i - 1] (s[0] for the first).
    let mut lim = in_dims.clone();
    lim[d] = n;
    let mut st = zeros.clone();
    st[d] = 1;
    let tail = cx.slice(s, &st, &lim, &strides);
    let mut lim0 = in_dims.clone();
    lim0[d] = 1;
    let first = cx.slice(s, &zeros, &lim0, &strides);
    let mut st_last = zeros.clone();
    st_last[d] = n - 1;
    let last = cx.slice(s, &st_last, &in_dims, &strides);
    let next = cx.concatenate(&[tail, last], d as i64);
    let mut lim_head = in_dims.clone();
    lim_head[d] = n - 1;
    let head = cx.slice(s, &zeros, &lim_head, &strides);
    let prev = cx.concatenate(&[first, head], d as i64);
    let pos = cx.iota(&TensorType::new(ElemType::I64, &in_dims), d as i64);
    let last_pos = cx.full((n - 1) as f64, DType::I64, &in_dims);
    let zero_pos = cx.full(0.0, DType::I64, &in_dims);
    let is_last = cx.compare(CmpDir::Eq, pos, last_pos);
    let is_first = cx.compare(CmpDir::Eq, pos, zero_pos);
    let differs_next = cx.compare(CmpDir::Ne, s, next);
    let differs_prev = cx.compare(CmpDir::Ne, s, prev);
    let run_end = cx.or(is_last, differs_next);
    let run_start = cx.or(is_first, differs_prev);
    // Start of each element's run: a running max of the start positions.
    let starts = cx.select(run_start, pos, zero_pos);
    let starts = crate::blocks::reduce::scan(cx, starts, d, Red::Max);
    let one_ = cx.full(1.0, DType::I64, &in_dims);
    let len = cx.sub(pos, starts);
    let len = cx.add(len, one_);
    let freq = cx.select(run_end, len, zero_pos);
    // The first position of the largest frequency.
    let init_f = cx.constant_i64(-1, ElemType::I64);
    let init_p = cx.constant_i64(i64::MAX, ElemType::I64);
    let best = cx.reduce(&[freq, pos], &[init_f, init_p], &[d as i64], |b, a| {
        let (fa, pa, fb, pb) = (a[0], a[1], a[2], a[3]);
        let gt = b.compare(CmpDir::Gt, fa, fb);
        let eq = b.compare(CmpDir::Eq, fa, fb);
        let lt = b.compare(CmpDir::Lt, pa, pb);
        let tie = b.and(eq, lt);
        let pick = b.or(gt, tie);
        let f = b.select(pick, fa, fb);
        let p = b.select(pick, pa, pb);
        vec![f, p]
    });
    let at = best[1];
    let v = pick_along(cx, s, d, at);
    let i = pick_along(cx, si, d, at);
    let v = keep(cx, v, &in_dims, &[d as i64], keepdim);
    let i = keep(cx, i, &in_dims, &[d as i64], keepdim);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

// ---- aminmax ---------------------------------------------------------------------------------------

/// aminmax(self, dim=None, keepdim) -> (min, max), NaN propagating.
fn aminmax(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, "aminmax")?;
    let in_dims = cx.dims(x.v);
    let keepdim = args.bool_or("keepdim", false)?;
    let dims = match args.opt_int("dim")? {
        Some(dim) => {
            nonempty_dim(&in_dims, dim, "aminmax")?;
            let d = wrap_dim(dim, in_dims.len())?;
            if in_dims.is_empty() { vec![] } else { vec![d as i64] }
        }
        None => {
            check!(
                cx.numel(x.v) != 0,
                Runtime,
                "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity."
            );
            (0..in_dims.len() as i64).collect()
        }
    };
    let lo = reduce(cx, x.v, &dims, Red::Min);
    let hi = reduce(cx, x.v, &dims, Red::Max);
    let (lo, hi) = if args.opt_int("dim")?.is_none() && keepdim {
        let ones = vec![1; in_dims.len()];
        (cx.reshape(lo, &ones), cx.reshape(hi, &ones))
    } else {
        (keep(cx, lo, &in_dims, &dims, keepdim), keep(cx, hi, &in_dims, &dims, keepdim))
    };
    Ok(vec![Out::Tensor(lo), Out::Tensor(hi)])
}

// ---- scans: cummax, cummin, logcumsumexp -----------------------------------------------------------

/// Inclusive scan of several values along `dim` with `combine(earlier, later)`, in log2(n)
/// shifted combines; `ids` are 0-d identities (an identity never beats a real element).
fn scan_with(
    cx: &mut Cx,
    vals: &[Value],
    dim: usize,
    ids: &[Value],
    combine: impl Fn(&mut Builder, &[Value], &[Value]) -> Vec<Value>,
) -> Vec<Value> {
    let dims = cx.dims(vals[0]);
    let n = dims[dim];
    let r = dims.len();
    let mut cur = vals.to_vec();
    let mut k = 1;
    while k < n {
        let mut limit = dims.clone();
        limit[dim] = n - k;
        let mut low = vec![0; r];
        low[dim] = k;
        let shifted: Vec<Value> = cur
            .iter()
            .zip(ids)
            .map(|(&v, &id)| {
                let head = cx.slice(v, &vec![0; r], &limit, &vec![1; r]);
                cx.pad(head, id, &low, &vec![0; r], &vec![0; r])
            })
            .collect();
        cur = combine(&mut cx.b, &shifted, &cur);
        k *= 2;
    }
    cur
}

/// _cummax_helper/_cummin_helper(self, values, indices, dim): running extremes and their
/// indices; ties take the later index and NaN, once seen, stays (with the latest NaN's index).
fn cummax_cummin(cx: &mut Cx, args: &Args, is_max: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, if is_max { "cummax" } else { "cummin" })?;
    let in_dims = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, in_dims.len())?;
    if in_dims.is_empty() {
        let z = cx.constant_i64(0, ElemType::I64);
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(z)]);
    }
    let idx = cx.iota(&TensorType::new(ElemType::I64, &in_dims), d as i64);
    if cx.numel(x.v) == 0 {
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(idx)]);
    }
    // Bools scan as uint8.
    let v = if x.dtype == DType::Bool { cx.convert(x.v, ElemType::U8) } else { x.v };
    let elem = cx.elem(v);
    let float = elem.is_float();
    let id_v = if float {
        cx.constant_f64(if is_max { f64::NEG_INFINITY } else { f64::INFINITY }, elem)
    } else {
        let (lo, hi) = int_range(elem);
        cx.constant_i64(if is_max { lo } else { hi }, elem)
    };
    let id_i = cx.constant_i64(-1, ElemType::I64);
    let r = scan_with(cx, &[v, idx], d, &[id_v, id_i], move |b, early, late| {
        let (a, ai, bv, bi) = (early[0], early[1], late[0], late[1]);
        // The later element wins when it is NaN, or when neither is NaN and it is >= (<=).
        let better = b.compare(if is_max { CmpDir::Ge } else { CmpDir::Le }, bv, a);
        let pick = if float {
            let b_nan = b.compare(CmpDir::Ne, bv, bv);
            let a_nan = b.compare(CmpDir::Ne, a, a);
            let a_ok = b.not(a_nan);
            let t = b.and(a_ok, better);
            b.or(b_nan, t)
        } else {
            better
        };
        // An earlier identity (index -1) always loses.
        let z = b.constant_i64(0, ElemType::I64);
        let z = b.broadcast_in_dim(z, &b.dims(ai).to_vec(), &[]);
        let early_id = b.compare(CmpDir::Lt, ai, z);
        let pick = b.or(pick, early_id);
        let v = b.select(pick, bv, a);
        let i = b.select(pick, bi, ai);
        vec![v, i]
    });
    let vals = if x.dtype == DType::Bool { cx.cast(r[0], DType::Bool) } else { r[0] };
    Ok(vec![Out::Tensor(vals), Out::Tensor(r[1])])
}

/// The smallest and largest values of an integer element type (as i64 bit patterns).
fn int_range(e: ElemType) -> (i64, i64) {
    use ElemType::*;
    match e {
        I8 => (i8::MIN as i64, i8::MAX as i64),
        I16 => (i16::MIN as i64, i16::MAX as i64),
        I32 => (i32::MIN as i64, i32::MAX as i64),
        I64 => (i64::MIN, i64::MAX),
        U8 => (0, u8::MAX as i64),
        U16 => (0, u16::MAX as i64),
        U32 => (0, u32::MAX as i64),
        _ => (0, -1),
    }
}

/// _logcumsumexp(self, dim): running log(sum(exp)), combining pairs as PyTorch's kernel does
/// (log1p(exp(min - max)) + max; equal infinities give themselves), float32 in double as the
/// CPU kernel accumulates it (its backward divides by exp of these values). Floats only.
fn logcumsumexp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, "logcumsumexp")?;
    check!(
        x.dtype.is_float(),
        NotImplemented,
        "\"logcumsumexp_out_cpu\" not implemented for '{}'",
        x.dtype.torch_name()
    );
    let in_dims = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, in_dims.len())?;
    if in_dims.is_empty() || cx.numel(x.v) == 0 {
        return one(x.v);
    }
    // PyTorch's CPU kernel accumulates in at::acc_type<T, /*is_cuda=*/false>: double for
    // float, float for the 16-bit types.
    let acc = if x.dtype == DType::F32 { DType::F64 } else { acc_type(x.dtype) };
    let v = cx.cast(x.v, acc);
    let id = cx.constant_f64(f64::NEG_INFINITY, acc.elem());
    let r = scan_with(cx, &[v], d, &[id], |b, early, late| {
        let (x, y) = (early[0], late[0]);
        let y_nan = b.compare(CmpDir::Ne, y, y);
        let mn = b.min(x, y);
        let mx = b.max(x, y);
        let mn = b.select(y_nan, y, mn);
        let mx = b.select(y_nan, y, mx);
        let x_nan = b.compare(CmpDir::Ne, x, x);
        let mn = b.select(x_nan, x, mn);
        let mx = b.select(x_nan, x, mx);
        let diff = b.sub(mn, mx);
        let e = b.exp(diff);
        let l = b.log1p(e);
        let s = b.add(l, mx);
        let ne = b.compare(CmpDir::Ne, mn, mx);
        let fin = b.is_finite(mn);
        let regular = b.or(ne, fin);
        vec![b.select(regular, s, x)]
    });
    one(cx.cast(r[0], x.dtype))
}

// ---- renorm -----------------------------------------------------------------------------------------

/// renorm(self, p, dim, maxnorm): each slice along `dim` whose p-norm exceeds maxnorm is scaled
/// by maxnorm / (norm + 1e-7); the norm is taken in float32 for 16-bit floats.
fn renorm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let p = scalar_f64(args.scalar("p")?);
    let maxnorm = scalar_f64(args.scalar("maxnorm")?);
    check!(p > 0.0, Runtime, "renorm: non-positive-norm not supported");
    check!(maxnorm >= 0.0, Runtime, "renorm: expected maxnorm to be >= 0 but got {}", maxnorm);
    check!(
        x.dtype.is_float() || x.dtype.is_complex(),
        Runtime,
        "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
        x.dtype.torch_name()
    );
    no_complex(&x, "renorm")?;
    let in_dims = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, in_dims.len())?;
    let others: Vec<i64> = (0..in_dims.len() as i64).filter(|&i| i != d as i64).collect();
    let acc = acc_type(x.dtype);
    let v = cx.cast(x.v, acc);
    let a = cx.abs(v);
    let norm = if p == f64::INFINITY {
        reduce(cx, a, &others, Red::Max)
    } else if p == 1.0 {
        reduce(cx, a, &others, Red::Sum)
    } else if p == 2.0 {
        let sq = cx.mul(a, a);
        let s = reduce(cx, sq, &others, Red::Sum);
        cx.sqrt(s)
    } else {
        let pv = cx.full(p, acc, &in_dims);
        let ap = cx.pow(a, pv);
        let s = reduce(cx, ap, &others, Red::Sum);
        let inv = cx.full(1.0 / p, acc, &cx.dims(s));
        cx.pow(s, inv)
    };
    let nd = cx.dims(norm);
    let mx = cx.full(maxnorm, acc, &nd);
    let eps = cx.full(1e-7, acc, &nd);
    let den = cx.add(norm, eps);
    let scale = cx.div(mx, den);
    let over = cx.compare(CmpDir::Gt, norm, mx);
    let one_ = cx.full(1.0, acc, &nd);
    let factor = cx.select(over, scale, one_);
    // PyTorch keeps the factor in the input's dtype and multiplies there.
    let factor = cx.cast(factor, x.dtype);
    let fb = unreduce(cx, factor, &in_dims, &others);
    one(cx.mul(x.v, fb))
}

// ---- factories: logspace -------------------------------------------------------------------------

/// The dtype of a factory's result: its out= tensor, else `dtype=`, else the default float.
fn factory_dtype(args: &Args) -> Result<DType> {
    if let Ok(out) = args.tensor("out") {
        return Ok(out.dtype);
    }
    Ok(opt_dtype(args, "dtype")?.unwrap_or(DType::F32))
}

/// `x` converted to `d` on the host the way a C++ cast does (rounded floats, truncated ints).
fn host_cast(x: f64, d: DType) -> f64 {
    match d {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        d if d.is_float() => stablehlo::round_to(x as f32 as f64, d.elem()),
        DType::Bool => (x != 0.0) as i64 as f64,
        _ => x.trunc(),
    }
}

/// logspace.out(start, end, steps, base, out): base^(start + i * step) computed on the host in
/// double like PyTorch's CPU kernel (the first half from start, the second from end).
fn logspace(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let dtype = factory_dtype(args)?;
    check!(!dtype.is_complex(), NotImplemented, "logspace: complex results are not supported on tpu yet");
    let steps = args.int("steps")?;
    check!(steps >= 0, Runtime, "number of steps must be non-negative");
    let start = scalar_f64(args.scalar("start")?);
    let end = scalar_f64(args.scalar("end")?);
    let base = match args.get("base") {
        Some(crate::Arg::Float(f)) => f.value,
        _ => args.opt_scalar("base")?.map(scalar_f64).unwrap_or(10.0),
    };
    let values: Vec<f64> = if steps == 1 {
        vec![base.powf(start)]
    } else {
        let s0 = host_cast(start, dtype);
        let s1 = host_cast(end, dtype);
        let step = host_cast(s1 - s0, dtype) / (steps - 1) as f64;
        let half = steps / 2;
        (0..steps)
            .map(|i| if i < half { base.powf(s0 + step * i as f64) } else { base.powf(s1 - step * (steps - i - 1) as f64) })
            .collect()
    };
    let elem = dtype.elem();
    let v = if dtype.is_float() {
        cx.constant_array_f64(&values, &[steps], elem)
    } else if dtype == DType::Bool {
        let ints: Vec<i64> = values.iter().map(|&x| (x != 0.0) as i64).collect();
        let v = cx.constant_array_i64(&ints, &[steps], ElemType::I64);
        cx.cast(v, DType::Bool)
    } else {
        let ints: Vec<i64> = values.iter().map(|&x| x as i64).collect();
        cx.constant_array_i64(&ints, &[steps], elem)
    };
    one(v)
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
