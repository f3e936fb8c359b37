//! Order statistics and the remaining reductions and scans: nansum, median/nanmedian (all
//! elements and along a dim), kthvalue, mode, aminmax, cummax/cummin (_cummax_helper,
//! _cummin_helper), logcumsumexp (_logcumsumexp) and renorm.
//!
//! Selections sort once (stable, NaN last) and pick positions, which reproduces PyTorch's
//! index choices: nth_element on (value, index) pairs for median, the last of equal values
//! for mode (whose CPU kernel sorts stably for up to 16 elements).
use crate::args::{Args, Tensor};
use crate::blocks::reduce::{keep, opt_dtype, reduce, reduce_dims, sort_with_indices, unreduce, Red};
use crate::blocks::type_names::check_out_dtype;
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("nansum", nansum),
    op("median", |cx, a| median(cx, a, false)),
    op("nanmedian", |cx, a| median(cx, a, true)),
    op("kthvalue", kthvalue),
    op("mode", mode),
    op("aminmax", aminmax),
    // The older names (_aminmax(self) and _aminmax.dim(self, dim, keepdim)) compute the same.
    op("_aminmax", aminmax),
    op("_cummax_helper", |cx, a| cummax_cummin(cx, a, true)),
    op("_cummin_helper", |cx, a| cummax_cummin(cx, a, false)),
    // The functional forms (compiled graphs keep them; eager goes through the helpers).
    op("cummax", |cx, a| cummax_cummin(cx, a, true)),
    op("cummin", |cx, a| cummax_cummin(cx, a, false)),
    op("_logcumsumexp", logcumsumexp),
    op("logcumsumexp", logcumsumexp),
    // p and maxnorm are validated, and p decides the norm's form.
    op("renorm", renorm).specialized(),
];

// ---- helpers ----------------------------------------------------------------------------------

fn no_complex(x: &Tensor, op: &str) -> Result<()> {
    check!(!x.dtype.is_complex(), NotImplemented, "{}: complex tensors are not supported on tpu yet", op);
    Ok(())
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
    let v = cx.cast(v, dt.opmath());
    let v = if cx.elem(v).is_float() {
        let nan = cx.compare(CmpDir::Ne, v, v);
        let z = cx.full(0.0, dt.opmath(), &in_dims);
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
    for name in ["min", "max"] {
        if let Some(o) = args.opt_tensor(name)? {
            check_out_dtype(x.dtype, o.dtype)?;
        }
    }
    let in_dims = cx.dims(x.v);
    let keepdim = args.bool_or("keepdim", false)?;
    let dims = match args.opt_int("dim")? {
        Some(dim) => {
            // CPU's reduction kernels index dims with a 64-bit mask.
            check!(in_dims.len() <= 64, Runtime, "only tensors with up to 64 dims are supported");
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
    let acc = if x.dtype == DType::F32 { DType::F64 } else { x.dtype.opmath() };
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
    let p = args.scalar("p")?.to_f64();
    let maxnorm = args.scalar("maxnorm")?.to_f64();
    check!(p > 0.0, Runtime, "renorm: non-positive-norm not supported");
    check!(maxnorm >= 0.0, Runtime, "renorm: expected maxnorm to be >= 0 but got {}", maxnorm);
    let rank = cx.dims(x.v).len();
    check!(rank > 1, Runtime, "renorm: input needs at least 2 dimensions, got {} dimensions", rank);
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
    let acc = x.dtype.opmath();
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
