//! Reductions: sum, mean, prod, amax/amin, max/min (full and along a dim, with indices),
//! argmax/argmin, var/std (and var_mean/std_mean), any/all, logsumexp, vector norms, the
//! cumulative ops cumsum/cumprod, sorting (sort, argsort, topk), hash_tensor and
//! segment_reduce (with its backward).
//!
//! 16-bit floats are reduced in float32 and rounded once at the end, as PyTorch's CPU kernels
//! accumulate them.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::reduce::{identity, keep, opt_dtype, reduce, reduce_dims, scan, sort_with_indices, unreduce, Red};
use crate::blocks::type_names::check_out_dtype;
use crate::cx::{wrap_dim, Cx};
use crate::dtype::{promote, result_type, DType};
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use stablehlo::{Builder, CmpDir, ElemType, GatherDims, ScatterDims, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("sum", sum),
    op("mean", mean),
    op("prod", prod),
    op("amax", |cx, a| amax_amin(cx, a, true)),
    op("amin", |cx, a| amax_amin(cx, a, false)),
    op("max", |cx, a| max_min(cx, a, true)),
    op("min", |cx, a| max_min(cx, a, false)),
    op("argmax", |cx, a| argmax_argmin(cx, a, true)),
    op("argmin", |cx, a| argmax_argmin(cx, a, false)),
    op("var", |cx, a| var_std(cx, a, false, false)),
    op("std", |cx, a| var_std(cx, a, true, false)),
    op("var_mean", |cx, a| var_std(cx, a, false, true)),
    op("std_mean", |cx, a| var_std(cx, a, true, true)),
    op("any", |cx, a| any_all(cx, a, true)),
    op("all", |cx, a| any_all(cx, a, false)),
    // Routed: its composites would run several programs, rounding twice in 16-bit floats.
    op("logsumexp", logsumexp).routed(&["logsumexp", "logsumexp.out"]),
    op("linalg_vector_norm", linalg_vector_norm).specialized(),
    op("norm", norm).specialized(),
    op("cumsum", |cx, a| cumulative(cx, a, Red::Sum)),
    op("cumprod", |cx, a| cumulative(cx, a, Red::Prod)),
    op("sort", sort),
    op("argsort", argsort),
    op("topk", topk),
    op("hash_tensor", hash_tensor),
    // The size program validates lengths (negative, wrong sums) unless `unsafe`.
    op("segment_reduce", segment_reduce).sized(segment_reduce_check),
    op("_segment_reduce_backward", segment_reduce_backward),
];

// ---- shared helpers ---------------------------------------------------------------------------

/// The number of elements each output of a reduction over `dims` combines.
fn reduced_count(in_dims: &[i64], dims: &[i64]) -> i64 {
    dims.iter().map(|&d| in_dims[d as usize]).product()
}

/// PyTorch's zero_numel_check_dims: reductions without an identity over empty inputs.
fn zero_numel_check(cx: &Cx, x: &Tensor, dims: Option<&[i64]>, fname: &str) -> Result<()> {
    if cx.numel(x.v) != 0 {
        return Ok(());
    }
    let in_dims = cx.dims(x.v);
    let dims = match dims {
        Some(d) if !d.is_empty() => d,
        _ => bail!(
            Runtime,
            "{}: Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.",
            fname
        ),
    };
    for &d in dims {
        if in_dims.is_empty() {
            check!(d == 0 || d == -1, Index, "{}: Expected reduction dim -1 or 0 for scalar but got {}", fname, d);
        } else {
            let w = wrap_dim(d, in_dims.len())?;
            check!(in_dims[w] != 0, Index, "{}: Expected reduction dim {} to have non-zero size.", fname, d);
        }
    }
    Ok(())
}

/// The dtype of sum/prod/cumsum: `dtype=`, else an out= tensor's, else int64 for integral
/// inputs and the input's own.
fn sum_dtype(args: &Args, x: &Tensor, out_name: &str) -> Result<DType> {
    if let Some(d) = opt_dtype(args, "dtype")? {
        return Ok(d);
    }
    if let Some(o) = args.opt_tensor(out_name)? {
        return Ok(o.dtype);
    }
    Ok(if x.dtype.is_integral() { DType::I64 } else { x.dtype })
}

fn no_complex(x: &Tensor, op: &str) -> Result<()> {
    check!(!x.dtype.is_complex(), NotImplemented, "{}: complex tensors are not supported on tpu yet", op);
    Ok(())
}

// ---- sum, mean, prod ----------------------------------------------------------------------------

/// sum(self, dtype), sum.dim_IntList(self, dim, keepdim, dtype) and their out= forms.
fn sum(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    sum_or_prod(cx, args, Red::Sum)
}

/// What sum and prod share: the result dtype, the dims, and the reduction in the
/// accumulation type.
fn sum_or_prod(cx: &mut Cx, args: &Args, red: Red) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dt = sum_dtype(args, &x, "out")?;
    let in_dims = cx.dims(x.v);
    let dims = reduce_dims(args.opt_ints("dim")?, in_dims.len(), false)?;
    let keepdim = args.bool_or("keepdim", false)?;
    // PyTorch converts the input to the result dtype, then accumulates (16-bit floats in f32).
    let v = cx.cast(x.v, dt);
    let v = cx.cast(v, dt.opmath());
    let r = reduce(cx, v, &dims, red);
    let r = cx.cast(r, dt);
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

/// mean(self, dtype), mean.dim(self, dim, keepdim, dtype), mean.out, mean.dtype_out.
fn mean(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dt = match opt_dtype(args, "dtype")? {
        Some(d) => {
            check!(
                d.is_float() || d.is_complex(),
                Runtime,
                "mean(): could not infer output dtype. Optional dtype must be either a floating point or complex dtype. Got: {}",
                d.torch_name()
            );
            d
        }
        None => {
            check!(
                x.dtype.is_float() || x.dtype.is_complex(),
                Runtime,
                "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {}",
                x.dtype.torch_name()
            );
            x.dtype
        }
    };
    let in_dims = cx.dims(x.v);
    let dims = reduce_dims(args.opt_ints("dim")?, in_dims.len(), false)?;
    let keepdim = args.bool_or("keepdim", false)?;
    let r = mean_values(cx, x.v, &in_dims, &dims, dt.opmath());
    let r = cx.cast(r, dt);
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

/// The mean of `v` over `dims`, computed in `acc` (empty reductions give NaN).
fn mean_values(cx: &mut Cx, v: Value, in_dims: &[i64], dims: &[i64], acc: DType) -> Value {
    let v = cx.cast(v, acc);
    let s = reduce(cx, v, dims, Red::Sum);
    let n = cx.full(reduced_count(in_dims, dims) as f64, acc, &cx.dims(s));
    cx.div(s, n)
}

/// prod(self, dtype), prod.dim_int(self, dim, keepdim, dtype), prod.int_out, prod.out.
fn prod(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    sum_or_prod(cx, args, Red::Prod)
}

// ---- extremes -----------------------------------------------------------------------------------

/// amax/amin(self, dim=[], keepdim): NaN propagates; no identity, so empty reductions fail.
fn amax_amin(cx: &mut Cx, args: &Args, is_max: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let name = if is_max { "amax()" } else { "amin()" };
    no_complex(&x, name)?;
    if let Some(o) = args.opt_tensor("out")? {
        check!(
            o.dtype == x.dtype,
            Runtime,
            "Expected the dtype for input and out to match, but got {} for input's dtype and {} for out's dtype.",
            x.dtype.torch_name(),
            o.dtype.torch_name()
        );
    }
    let raw = args.opt_ints("dim")?.unwrap_or_default();
    zero_numel_check(cx, &x, Some(&raw), name)?;
    let in_dims = cx.dims(x.v);
    // CPU's reduction kernels index dims with a 64-bit mask.
    check!(raw.is_empty() || in_dims.len() <= 64, Runtime, "only tensors with up to 64 dims are supported");
    let dims = reduce_dims(Some(raw), in_dims.len(), false)?;
    let keepdim = args.bool_or("keepdim", false)?;
    let r = reduce(cx, x.v, &dims, if is_max { Red::Max } else { Red::Min });
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

/// max/min: the full reduction max(self) (and max.unary_out), the reduction along one dim
/// max.dim(self, dim, keepdim) -> (values, indices), and the binary max.out(self, other).
fn max_min(cx: &mut Cx, args: &Args, is_max: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let name = if is_max { "max()" } else { "min()" };
    if args.has("other") {
        let y = args.tensor("other")?;
        let dt = result_type(&[(x.dtype, x.rank), (y.dtype, y.rank)]).unwrap();
        check!(!dt.is_complex(), Runtime, "{} not implemented for complex tensors.", if is_max { "maximum" } else { "minimum" });
        let a = cx.cast(x.v, dt);
        let b = cx.cast(y.v, dt);
        let vs = cx.broadcast_all(&[a, b])?;
        return one(crate::blocks::nan::nan_min_max(cx, vs[0], vs[1], is_max));
    }
    no_complex(&x, name)?;
    let in_dims = cx.dims(x.v);
    let Some(dim) = args.opt_int("dim")? else {
        zero_numel_check(cx, &x, None, name)?;
        let all: Vec<i64> = (0..in_dims.len() as i64).collect();
        return one(reduce(cx, x.v, &all, if is_max { Red::Max } else { Red::Min }));
    };
    // max.dim_max names its outputs (max, max_values), min.dim_min (min, min_indices).
    let (vname, iname) = if is_max { ("max", "max_values") } else { ("min", "min_indices") };
    if let Some(o) = args.opt_tensor(vname)? {
        check_out_dtype(x.dtype, o.dtype)?;
    }
    if let Some(o) = args.opt_tensor(iname)? {
        check_out_dtype(DType::I64, o.dtype)?;
    }
    zero_numel_check(cx, &x, Some(&[dim]), name)?;
    let keepdim = args.bool_or("keepdim", false)?;
    let d = wrap_dim(dim, in_dims.len())?;
    let (v, i) = arg_reduce(cx, x.v, d, is_max);
    let dims: Vec<i64> = if in_dims.is_empty() { vec![] } else { vec![d as i64] };
    let v = keep(cx, v, &in_dims, &dims, keepdim);
    let i = keep(cx, i, &in_dims, &dims, keepdim);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

/// The extreme value along `dim` and its first index (int64); NaN counts as the extreme.
/// A 0-d input gives itself and index 0.
fn arg_reduce(cx: &mut Cx, v: Value, dim: usize, is_max: bool) -> (Value, Value) {
    let in_dims = cx.dims(v);
    if in_dims.is_empty() {
        let z = cx.constant_i64(0, ElemType::I64);
        return (v, z);
    }
    let elem = cx.elem(v);
    let idx = cx.iota(&TensorType::new(ElemType::I64, &in_dims), dim as i64);
    let init_v = identity(cx, if is_max { Red::Max } else { Red::Min }, elem);
    let init_i = cx.constant_i64(i64::MAX, ElemType::I64);
    let r = cx.reduce(&[v, idx], &[init_v, init_i], &[dim as i64], move |b, a| {
        let (av, bv, ai, bi) = (a[0], a[2], a[1], a[3]);
        let better = b.compare(if is_max { CmpDir::Gt } else { CmpDir::Lt }, av, bv);
        let mut eq = b.compare(CmpDir::Eq, av, bv);
        let mut better = better;
        if elem.is_float() {
            let an = b.compare(CmpDir::Ne, av, av);
            let bn = b.compare(CmpDir::Ne, bv, bv);
            let nbn = b.not(bn);
            let a_nan_only = b.and(an, nbn);
            better = b.or(better, a_nan_only);
            let both = b.and(an, bn);
            eq = b.or(eq, both);
        }
        let first = b.compare(CmpDir::Lt, ai, bi);
        let tie = b.and(eq, first);
        let pick = b.or(better, tie);
        let v = b.select(pick, av, bv);
        let i = b.select(pick, ai, bi);
        vec![v, i]
    });
    (r[0], r[1])
}

/// argmax/argmin(self, dim=None, keepdim): dim=None looks at the flattened input.
fn argmax_argmin(cx: &mut Cx, args: &Args, is_max: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let name = if is_max { "argmax()" } else { "argmin()" };
    check!(x.dtype != DType::Bool, Runtime, "{}: does not support bool input", if is_max { "argmax" } else { "argmin" });
    no_complex(&x, name)?;
    let in_dims = cx.dims(x.v);
    let keepdim = args.bool_or("keepdim", false)?;
    match args.opt_int("dim")? {
        None => {
            check!(
                cx.numel(x.v) != 0,
                Index,
                "{}: Expected reduction dim to be specified for input.numel() == 0.",
                name
            );
            let n = cx.numel(x.v);
            let flat = cx.reshape(x.v, &[n]);
            let (_, i) = arg_reduce(cx, flat, 0, is_max);
            if keepdim {
                let ones = vec![1; in_dims.len()];
                return one(cx.reshape(i, &ones));
            }
            one(i)
        }
        Some(dim) => {
            zero_numel_check(cx, &x, Some(&[dim]), name)?;
            let d = wrap_dim(dim, in_dims.len())?;
            let (_, i) = arg_reduce(cx, x.v, d, is_max);
            let dims: Vec<i64> = if in_dims.is_empty() { vec![] } else { vec![d as i64] };
            one(keep(cx, i, &in_dims, &dims, keepdim))
        }
    }
}

// ---- var, std -----------------------------------------------------------------------------------

/// var/std (and var_mean/std_mean) in their unbiased= and correction= forms.
fn var_std(cx: &mut Cx, args: &Args, take_sqrt: bool, with_mean: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(
        x.dtype.is_float() || x.dtype.is_complex(),
        Runtime,
        "std and var only support floating point and complex dtypes"
    );
    no_complex(&x, if take_sqrt { "std" } else { "var" })?;
    let correction = match args.opt_scalar("correction")? {
        Some(c) => c,
        None => Scalar::Int(args.bool_or("unbiased", true)? as i64),
    };
    let in_dims = cx.dims(x.v);
    let dims = reduce_dims(args.opt_ints("dim")?, in_dims.len(), false)?;
    let keepdim = args.bool_or("keepdim", false)?;
    let acc = x.dtype.opmath();
    let v = cx.cast(x.v, acc);
    let m = mean_values(cx, v, &in_dims, &dims, acc);
    let mb = unreduce(cx, m, &in_dims, &dims);
    let d = cx.sub(v, mb);
    let d2 = cx.mul(d, d);
    let m2 = reduce(cx, d2, &dims, Red::Sum);
    // divisor = max(N - correction, 0); the correction may be a runtime float.
    let rd = cx.dims(m2);
    let n = cx.full(reduced_count(&in_dims, &dims) as f64, acc, &rd);
    let c = cx.scalar_like(correction, acc, &rd);
    let div = cx.sub(n, c);
    let zero = cx.full(0.0, acc, &rd);
    let div = cx.max(div, zero);
    let mut r = cx.div(m2, div);
    if take_sqrt {
        r = cx.sqrt(r);
    }
    let r = cx.cast(r, x.dtype);
    let r = keep(cx, r, &in_dims, &dims, keepdim);
    if with_mean {
        let m = cx.cast(m, x.dtype);
        let m = keep(cx, m, &in_dims, &dims, keepdim);
        return Ok(vec![Out::Tensor(r), Out::Tensor(m)]);
    }
    one(r)
}

// ---- any, all -----------------------------------------------------------------------------------

/// any/all: all dims (any, any.all_out), one dim (any.dim, any.out) or a list (any.dims,
/// where an empty list reduces nothing). uint8 inputs give uint8, everything else bool.
fn any_all(cx: &mut Cx, args: &Args, is_any: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    if let Some(o) = args.opt_tensor("out")? {
        check!(
            o.dtype == DType::Bool || o.dtype == DType::U8,
            Runtime,
            "{} only supports bool tensor for result, got: {}",
            if is_any { "any" } else { "all" },
            o.dtype.torch_name()
        );
    }
    let in_dims = cx.dims(x.v);
    let dims = match args.get("dim") {
        None | Some(Arg::None) => reduce_dims(None, in_dims.len(), true)?,
        Some(Arg::Int(d)) => reduce_dims(Some(vec![*d]), in_dims.len(), true)?,
        _ => reduce_dims(args.opt_ints("dim")?, in_dims.len(), true)?,
    };
    let keepdim = args.bool_or("keepdim", false)?;
    let b = cx.cast(x.v, DType::Bool);
    let r = reduce(cx, b, &dims, if is_any { Red::Or } else { Red::And });
    let r = keep(cx, r, &in_dims, &dims, keepdim);
    let out = if x.dtype == DType::U8 { DType::U8 } else { DType::Bool };
    one(cx.cast(r, out))
}

// ---- logsumexp ------------------------------------------------------------------------------------

/// logsumexp(self, dim, keepdim) = log(sum(exp(x - m))) + m with m the max (infinite maxima
/// replaced by 0, as PyTorch does).
fn logsumexp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    no_complex(&x, "logsumexp")?;
    let dt = if x.dtype.is_float() { x.dtype } else { DType::F32 };
    let in_dims = cx.dims(x.v);
    let raw = args.opt_ints("dim")?.unwrap_or_default();
    let keepdim = args.bool_or("keepdim", false)?;
    if raw.is_empty() && !keepdim && !in_dims.is_empty() {
        // PyTorch sums over every dim but keeps the max's dims, and fails writing the result.
        bail!(Runtime, "output with shape [] doesn't match the broadcast shape {:?}", vec![1; in_dims.len()]);
    }
    let dims = reduce_dims(Some(raw), in_dims.len(), false)?;
    let acc = dt.opmath();
    let v = cx.cast(x.v, acc);
    let m = reduce(cx, v, &dims, Red::ShiftMax);
    let rd = cx.dims(m);
    let am = cx.abs(m);
    let inf = cx.full(f64::INFINITY, acc, &rd);
    let is_inf = cx.compare(CmpDir::Eq, am, inf);
    let zero = cx.full(0.0, acc, &rd);
    let m = cx.select(is_inf, zero, m);
    let mb = unreduce(cx, m, &in_dims, &dims);
    let e = cx.sub(v, mb);
    let e = cx.exp(e);
    let s = reduce(cx, e, &dims, Red::Sum);
    let l = cx.log(s);
    let r = cx.add(l, m);
    let r = cx.cast(r, dt);
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

// ---- norms -------------------------------------------------------------------------------------------

/// A norm order as PyTorch prints a Scalar: `2`, `-1`, `inf`, `0.5`.
fn ord_text(p: f64) -> String {
    if p.is_infinite() {
        if p > 0.0 { "inf".into() } else { "-inf".into() }
    } else if p == p.trunc() {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// The p-norm of `v` (already in the accumulation dtype) over `dims`.
fn vector_norm_values(cx: &mut Cx, v: Value, dims: &[i64], p: f64) -> Value {
    let a = cx.abs(v);
    let acc = cx.dtype(a);
    if p == f64::INFINITY {
        return reduce(cx, a, dims, Red::Max);
    }
    if p == f64::NEG_INFINITY {
        return reduce(cx, a, dims, Red::Min);
    }
    if p == 0.0 {
        let zero = cx.full(0.0, acc, &cx.dims(a));
        let nz = cx.compare(CmpDir::Ne, a, zero);
        let nz = cx.cast(nz, acc);
        return reduce(cx, nz, dims, Red::Sum);
    }
    if p == 1.0 {
        return reduce(cx, a, dims, Red::Sum);
    }
    if p == 2.0 {
        let sq = cx.mul(a, a);
        let s = reduce(cx, sq, dims, Red::Sum);
        return cx.sqrt(s);
    }
    let pv = cx.full(p, acc, &cx.dims(a));
    let ap = cx.pow(a, pv);
    let s = reduce(cx, ap, dims, Red::Sum);
    let inv = cx.full(1.0 / p, acc, &cx.dims(s));
    cx.pow(s, inv)
}

/// linalg_vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None).
fn linalg_vector_norm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(
        x.dtype.is_float() || x.dtype.is_complex(),
        Runtime,
        "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
        x.dtype.torch_name()
    );
    let p = args.opt_scalar("ord")?.map(Scalar::to_f64).unwrap_or(2.0);
    let dtype = opt_dtype(args, "dtype")?;
    if let Some(d) = dtype {
        check!(
            d.is_float() || d.is_complex(),
            Runtime,
            "linalg.vector_norm: dtype should be floating point or complex, but got {}",
            d.torch_name()
        );
        check!(
            promote(x.dtype, d) == d,
            Runtime,
            "linalg.vector_norm: the dtype of the input ({}) should be convertible without narrowing to the specified dtype ({})",
            x.dtype.torch_name(),
            d.torch_name()
        );
    }
    let in_dims = cx.dims(x.v);
    let raw = args.opt_ints("dim")?;
    if cx.numel(x.v) == 0 && (p < 0.0 || p == f64::INFINITY) {
        match raw.as_deref() {
            None | Some([]) => bail!(
                Runtime,
                "linalg.vector_norm cannot compute the {} norm on an empty tensor because the operation does not have an identity",
                ord_text(p)
            ),
            Some(ds) => {
                for &d in ds {
                    let w = wrap_dim(d, in_dims.len())?;
                    check!(
                        in_dims.is_empty() || in_dims[w] != 0,
                        Runtime,
                        "linalg.vector_norm cannot compute the {} norm on the dimension {}because this dimension is empty and the operation does not have an identity",
                        ord_text(p),
                        d
                    );
                }
            }
        }
    }
    no_complex(&x, "linalg.vector_norm")?;
    norm_over(cx, args, &x, p, dtype, raw)
}

/// The p-norm of x over `dim` (None: every dim) as norm and linalg_vector_norm give it: x
/// converted to `dtype`, summed in its accumulation type, returned in its real type.
fn norm_over(cx: &mut Cx, args: &Args, x: &Tensor, p: f64, dtype: Option<DType>, dim: Option<Vec<i64>>) -> Result<Vec<Out>> {
    let in_dims = cx.dims(x.v);
    let dims = reduce_dims(dim, in_dims.len(), false)?;
    let keepdim = args.bool_or("keepdim", false)?;
    let dt = dtype.unwrap_or(x.dtype).to_real();
    let v = cx.cast(x.v, dtype.unwrap_or(x.dtype));
    let v = cx.cast(v, dt.opmath());
    let r = vector_norm_values(cx, v, &dims, p);
    let r = cx.cast(r, dt);
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

/// The older norm(self, p, dim, keepdim, dtype) overloads: p=None is 2, dim=[] every dim.
fn norm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(
        x.dtype.is_float() || x.dtype.is_complex(),
        Runtime,
        "norm(): input dtype should be either floating point or complex. Got {} instead.",
        x.dtype.torch_name()
    );
    no_complex(&x, "norm")?;
    let p = args.opt_scalar("p")?.map(Scalar::to_f64).unwrap_or(2.0);
    let dtype = opt_dtype(args, "dtype")?;
    norm_over(cx, args, &x, p, dtype, args.opt_ints("dim")?)
}

// ---- cumulative ops --------------------------------------------------------------------------------

/// cumsum/cumprod(self, dim, dtype) and their out= forms.
fn cumulative(cx: &mut Cx, args: &Args, red: Red) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dt = sum_dtype(args, &x, "out")?;
    let in_dims = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, in_dims.len())?;
    let v = cx.cast(x.v, dt);
    if in_dims.is_empty() {
        return one(v);
    }
    let v = cx.cast(v, dt.opmath());
    let r = scan(cx, v, d, red);
    one(cx.cast(r, dt))
}

// ---- sorting -----------------------------------------------------------------------------------------

fn sort_dtype_check(x: &Tensor, op: &str) -> Result<()> {
    no_complex(x, op)
}

/// sort(self, dim, descending) and sort.stable / sort.values_stable (always stable here).
fn sort(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    sort_dtype_check(&x, "sort")?;
    let d = wrap_dim(args.int_or("dim", -1)?, cx.dims(x.v).len())?;
    let descending = args.bool_or("descending", false)?;
    let (v, i) = sort_with_indices(cx, x.v, d, descending);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

/// argsort(self, dim, descending) and argsort.stable(_out).
fn argsort(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    sort_dtype_check(&x, "argsort")?;
    let d = wrap_dim(args.int_or("dim", -1)?, cx.dims(x.v).len())?;
    let descending = args.bool_or("descending", false)?;
    let (_, i) = sort_with_indices(cx, x.v, d, descending);
    one(i)
}

/// topk(self, k, dim, largest, sorted): the k largest (smallest) along dim, sorted.
fn topk(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    sort_dtype_check(&x, "topk")?;
    check!(x.dtype != DType::Bool, Runtime, "topk does not support bool dtypes on CPU");
    let in_dims = cx.dims(x.v);
    let d = wrap_dim(args.int_or("dim", -1)?, in_dims.len())?;
    let k = args.int("k")?;
    let size = if in_dims.is_empty() { 1 } else { in_dims[d] };
    check!(k >= 0 && k <= size, Runtime, "selected index k out of range");
    let largest = args.bool_or("largest", true)?;
    if in_dims.is_empty() {
        let z = cx.constant_i64(0, ElemType::I64);
        return Ok(vec![Out::Tensor(x.v), Out::Tensor(z)]);
    }
    let (v, i) = sort_with_indices(cx, x.v, d, largest);
    let mut limit = in_dims.clone();
    limit[d] = k;
    let start = vec![0; in_dims.len()];
    let strides = vec![1; in_dims.len()];
    let v = cx.slice(v, &start, &limit, &strides);
    let i = cx.slice(i, &start, &limit, &strides);
    Ok(vec![Out::Tensor(v), Out::Tensor(i)])
}

// ---- hash_tensor -------------------------------------------------------------------------------------

/// hash_tensor(self, dim=[], keepdim, mode=0): mode 0 is the xor of the elements' bit patterns as
/// uint64, floats widened to double first and integers sign-extended (PyTorch's xor_sum kernel).
/// The result is uint64; an empty reduction gives 0.
fn hash_tensor(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let mode = args.int_or("mode", 0)?;
    if let Some(o) = args.opt_tensor("out")? {
        check!(o.dtype == DType::U64, Runtime, "Expected result to be of dtype uint64, but got {}", o.dtype.torch_name());
    }
    use DType::*;
    check!(
        matches!(x.dtype, U8 | I8 | I16 | I32 | I64 | F16 | BF16 | F32 | F64 | Bool),
        NotImplemented,
        "\"xor_sum_cpu\" not implemented for '{}'",
        x.dtype.torch_name()
    );
    let in_dims = cx.dims(x.v);
    let dim_arg = args.opt_ints("dim")?;
    let dims = reduce_dims(dim_arg.clone(), in_dims.len(), false)?;
    zero_numel_check(cx, &x, dim_arg.as_deref(), "hash_tensor")?;
    let keepdim = args.bool_or("keepdim", false)?;
    check!(mode == 0, Runtime, "Unknown hash_tensor mode: {}", mode);
    let bits = if x.dtype.is_float() {
        let d = cx.convert(x.v, ElemType::F64);
        cx.bitcast_convert(d, ElemType::U64)
    } else if x.dtype == Bool || x.dtype.is_unsigned() {
        cx.convert(x.v, ElemType::U64)
    } else {
        let w = cx.convert(x.v, ElemType::I64);
        cx.bitcast_convert(w, ElemType::U64)
    };
    let r = if dims.is_empty() {
        bits
    } else {
        let zero = cx.constant_i64(0, ElemType::U64);
        cx.reduce(&[bits], &[zero], &dims, |b, a| vec![b.xor(a[0], a[1])])[0]
    };
    one(keep(cx, r, &in_dims, &dims, keepdim))
}

// ---- segment_reduce ----------------------------------------------------------------------------------

/// The reduction of segment_reduce (PyTorch's get_reduction_enum).
#[derive(Copy, Clone, PartialEq, Eq)]
enum SegRed {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

fn seg_reduction(args: &Args) -> Result<SegRed> {
    let r = args.str("reduce")?.unwrap_or("");
    Ok(match r {
        "sum" => SegRed::Sum,
        "mean" => SegRed::Mean,
        "max" | "amax" => SegRed::Max,
        "min" | "amin" => SegRed::Min,
        "prod" => SegRed::Prod,
        _ => bail!(Runtime, "reduce argument must be either sum, prod, mean, amax or amin, got {}", r),
    })
}

/// A segment_reduce call viewed as data [O, N, I] (N along `axis`) and per-row segment bounds
/// starts/ends [O, S] (int64) from lengths or offsets.
struct Segments {
    out_dims: Vec<i64>,
    o: i64,
    n: i64,
    i: i64,
    s: i64,
    starts: Value,
    ends: Value,
}

/// Checks the arguments like segment_reduce_kernel and reads the segment bounds.
fn segments(cx: &mut Cx, args: &Args, data: &Tensor, forward: bool) -> Result<Segments> {
    let dd = cx.dims(data.v);
    let axis = wrap_dim(args.int_or("axis", 0)?, dd.len())?;
    if forward {
        check!(!args.has("indices"), Runtime, "segment_reduce(): indices based reduction is not supported yet.");
    }
    let lengths = args.opt_tensor("lengths")?;
    let offsets = args.opt_tensor("offsets")?;
    check!(lengths.is_some() || offsets.is_some(), Runtime, "segment_reduce(): Either lengths or offsets must be defined.");
    seg_reduction(args)?;
    let (t, name) = match offsets {
        Some(o) => (o, "offsets"),
        None => (lengths.unwrap(), "lengths"),
    };
    let ld = cx.dims(t.v);
    check!(
        dd.len() >= ld.len(),
        Runtime,
        "Expected data.dim() >= {}_value.dim() to be true, but got false.",
        name
    );
    check!(
        !ld.is_empty() && axis == ld.len() - 1,
        Runtime,
        "segment_reduce(): Expected axis to be the last dimension of {} but got {}.",
        name,
        axis
    );
    check!(
        ld[..axis] == dd[..axis],
        Runtime,
        "segment_reduce(): Expected the leading dims of {} {:?} to match those of data {:?}",
        name,
        &ld[..axis],
        &dd[..axis]
    );
    check!(
        matches!(t.dtype, DType::I32 | DType::I64),
        NotImplemented,
        "\"_segment_reduce_{}_cpu_kernel1\" not implemented for '{}'",
        name,
        t.dtype.torch_name()
    );
    check!(
        matches!(data.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16),
        NotImplemented,
        "\"_segment_reduce_cpu\" not implemented for '{}'",
        data.dtype.torch_name()
    );
    let o: i64 = dd[..axis].iter().product();
    let n = dd[axis];
    let i: i64 = dd[axis + 1..].iter().product();
    let last = ld[axis];
    let s = if offsets.is_some() { (last - 1).max(0) } else { last };
    let v = cx.convert(t.v, ElemType::I64);
    let v = cx.reshape(v, &[o, last]);
    let (starts, ends) = if offsets.is_some() {
        check!(last >= 1, Runtime, "segment_reduce(): offsets must have at least one element along axis");
        let st = cx.slice(v, &[0, 0], &[o, last - 1], &[1, 1]);
        let en = cx.slice(v, &[0, 1], &[o, last], &[1, 1]);
        (st, en)
    } else {
        let en = scan(cx, v, 1, Red::Sum);
        let st = cx.sub(en, v);
        (st, en)
    };
    let mut out_dims = dd.clone();
    out_dims[axis] = s;
    Ok(Segments { out_dims, o, n, i, s, starts, ends })
}

/// For each position k < N of each row: its segment (the number of segment ends at or before
/// k), or S (a spare slot) when it lies before the first start or after the last end. [O, N].
fn segment_ids(cx: &mut Cx, sg: &Segments) -> Value {
    let (o, n, s) = (sg.o, sg.n, sg.s);
    if s == 0 || n == 0 {
        return cx.full(s as f64, DType::I64, &[o, n]);
    }
    let zero = cx.full(0.0, DType::I64, &[o, s]);
    let top = cx.full(n as f64, DType::I64, &[o, s]);
    let ends = cx.clamp(zero, sg.ends, top);
    let rows = cx.iota(&TensorType::new(ElemType::I64, &[o, s]), 0);
    let rows = cx.reshape(rows, &[o, s, 1]);
    let ends3 = cx.reshape(ends, &[o, s, 1]);
    let idx = cx.concatenate(&[rows, ends3], 2);
    let marks = cx.full(0.0, DType::I64, &[o, n + 1]);
    let ones = cx.full(1.0, DType::I64, &[o, s]);
    let dn = ScatterDims {
        inserted_window_dims: vec![0, 1],
        scatter_dims_to_operand_dims: vec![0, 1],
        index_vector_dim: 2,
        ..Default::default()
    };
    let marks = cx.scatter(marks, idx, ones, &dn, |b, x, y| b.add(x, y));
    let marks = cx.slice(marks, &[0, 0], &[o, n], &[1, 1]);
    let seg = scan(cx, marks, 1, Red::Sum);
    // Before the first start: no segment.
    let first = cx.slice(sg.starts, &[0, 0], &[o, 1], &[1, 1]);
    let first = cx.reshape(first, &[o]);
    let first = cx.broadcast_in_dim(first, &[o, n], &[0]);
    let k = cx.iota(&TensorType::new(ElemType::I64, &[o, n]), 1);
    let before = cx.compare(CmpDir::Lt, k, first);
    let spare = cx.full(s as f64, DType::I64, &[o, n]);
    let seg = cx.select(before, spare, seg);
    cx.min(seg, spare)
}

/// (row, segment) index pairs [O, N, 2] for scatters and gathers over [O, S + 1, I].
fn segment_index(cx: &mut Cx, seg: Value, o: i64, n: i64) -> Value {
    let rows = cx.iota(&TensorType::new(ElemType::I64, &[o, n, 1]), 0);
    let seg = cx.reshape(seg, &[o, n, 1]);
    cx.concatenate(&[rows, seg], 2)
}

/// NaN-propagating max/min (PyTorch's `isnan(v) ? v : max(acc, v)` keeps an earlier NaN too).
fn nan_extreme(b: &mut Builder, x: Value, y: Value, is_max: bool) -> Value {
    let m = if is_max { b.max(x, y) } else { b.min(x, y) };
    let y_nan = b.compare(CmpDir::Ne, y, y);
    let m = b.select(y_nan, y, m);
    let x_nan = b.compare(CmpDir::Ne, x, x);
    b.select(x_nan, x, m)
}

/// Per-segment sums (or other combinations) of `vals` [O, N, I] into [O, S, I] starting from
/// `init` [O, S + 1, I].
fn segment_scatter(cx: &mut Cx, init: Value, idx: Value, vals: Value, red: SegRed) -> Value {
    let dn = ScatterDims {
        update_window_dims: vec![2],
        inserted_window_dims: vec![0, 1],
        scatter_dims_to_operand_dims: vec![0, 1],
        index_vector_dim: 2,
        ..Default::default()
    };
    let d = cx.dims(init);
    let r = cx.scatter(init, idx, vals, &dn, move |b, x, y| match red {
        SegRed::Sum | SegRed::Mean => b.add(x, y),
        SegRed::Prod => b.mul(x, y),
        SegRed::Max => nan_extreme(b, x, y, true),
        SegRed::Min => nan_extreme(b, x, y, false),
    });
    cx.slice(r, &[0, 0, 0], &[d[0], d[1] - 1, d[2]], &[1, 1, 1])
}

/// The value per (row, segment, inner) of `v` [O, S, I] at each element [O, N, I] (0 outside
/// every segment).
fn segment_gather(cx: &mut Cx, v: Value, idx: Value) -> Value {
    let d = cx.dims(v);
    let e = cx.elem(v);
    let zero = cx.constant_f64(0.0, e);
    let padded = cx.pad(v, zero, &[0, 0, 0], &[0, 1, 0], &[0, 0, 0]);
    let dn = GatherDims {
        offset_dims: vec![2],
        collapsed_slice_dims: vec![0, 1],
        start_index_map: vec![0, 1],
        index_vector_dim: 2,
        ..Default::default()
    };
    cx.gather(padded, idx, &dn, &[1, 1, d[2]], false)
}

/// The segment lengths [O, S] as `dtype` (PyTorch divides by the length converted to scalar_t).
fn segment_lengths(cx: &mut Cx, sg: &Segments, dtype: DType) -> Value {
    let l = cx.sub(sg.ends, sg.starts);
    cx.convert(l, dtype.elem())
}

/// The size program of segment_reduce: 0, or 1 for a negative length, or 2 for rows of lengths
/// that do not sum to data.size(axis) (checked unless `unsafe` or for offsets).
fn segment_reduce_check(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let data = args.tensor("data")?;
    let unsafe_ = args.bool_or("unsafe", false)?;
    let lengths = args.opt_tensor("lengths")?;
    let z = cx.constant_i64(0, ElemType::I64);
    if lengths.is_none() || unsafe_ || args.has("offsets") {
        return one(z);
    }
    let sg = segments(cx, args, &data, true)?;
    let lv = cx.sub(sg.ends, sg.starts);
    let dims = cx.dims(lv);
    let zeros = cx.full(0.0, DType::I64, &dims);
    let neg = cx.compare(CmpDir::Lt, lv, zeros);
    let f = cx.constant_bool(false);
    let any_neg = cx.reduce(&[neg], &[f], &[0, 1], |b, a| vec![b.or(a[0], a[1])])[0];
    let total = reduce(cx, lv, &[1], Red::Sum);
    let n = cx.full(sg.n as f64, DType::I64, &[sg.o]);
    let bad = cx.compare(CmpDir::Ne, total, n);
    let f = cx.constant_bool(false);
    let any_bad = cx.reduce(&[bad], &[f], &[0], |b, a| vec![b.or(a[0], a[1])])[0];
    let one_ = cx.constant_i64(1, ElemType::I64);
    let two = cx.constant_i64(2, ElemType::I64);
    let c = cx.select(any_bad, two, z);
    one(cx.select(any_neg, one_, c))
}

/// segment_reduce(data, reduce, lengths, indices, offsets, axis, unsafe, initial): reduces each
/// segment of `data` along `axis` (segments given by lengths, or by offsets [.., S + 1]) with
/// sum, mean, max, min (NaN propagating) or prod, starting from `initial` (or the identity;
/// an empty mean without initial is NaN). Segments of each row are independent.
fn segment_reduce(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let data = args.tensor("data")?;
    let red = seg_reduction(args)?;
    let sg = segments(cx, args, &data, true)?;
    // Compiled graphs run without the size program: no data-dependent check there.
    match args.int_or("__size", 0)? {
        0 => {}
        1 => bail!(Runtime, "lengths contains negative value!"),
        _ => bail!(
            Runtime,
            "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) when !unsafe."
        ),
    }
    let dt = data.dtype;
    let (o, n, i, s) = (sg.o, sg.n, sg.i, sg.s);
    let initial = args.opt_scalar("initial")?;
    let init = match initial {
        Some(v) => cx.scalar_like(v, dt, &[o, s + 1, i]),
        None => {
            let x = match red {
                SegRed::Sum | SegRed::Mean => 0.0,
                SegRed::Prod => 1.0,
                SegRed::Max => f64::NEG_INFINITY,
                SegRed::Min => f64::INFINITY,
            };
            cx.full(x, dt, &[o, s + 1, i])
        }
    };
    let out = if n == 0 || o == 0 || i == 0 {
        cx.slice(init, &[0, 0, 0], &[o, s, i], &[1, 1, 1])
    } else {
        let seg = segment_ids(cx, &sg);
        let idx = segment_index(cx, seg, o, n);
        let vals = cx.reshape(data.v, &[o, n, i]);
        segment_scatter(cx, init, idx, vals, red)
    };
    let out = if red == SegRed::Mean {
        let len = segment_lengths(cx, &sg, dt);
        let len = cx.broadcast_in_dim(len, &[o, s, i], &[0, 1]);
        let q = cx.div(out, len);
        let z = cx.full(0.0, dt, &[o, s, i]);
        let nonempty = cx.compare(CmpDir::Gt, len, z);
        let not_nan = cx.compare(CmpDir::Eq, out, out);
        let divide = cx.and(nonempty, not_nan);
        let r = cx.select(divide, q, out);
        if initial.is_none() {
            let nan = cx.full(f64::NAN, dt, &[o, s, i]);
            cx.select(nonempty, r, nan)
        } else {
            r
        }
    } else {
        out
    };
    one(cx.reshape(out, &sg.out_dims))
}

/// _segment_reduce_backward(grad, output, data, reduce, lengths, offsets, axis, initial): the
/// CPU kernel's gradient: sum copies grad, mean divides it by the length, max/min give it to
/// every element equal to the result (or NaN), positive shares split evenly when several tie,
/// prod gives grad * output / x, or grad times the product of the others (and initial) for
/// zeros and NaNs.
fn segment_reduce_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let grad = args.tensor("grad")?;
    let output = args.tensor("output")?;
    let data = args.tensor("data")?;
    let red = seg_reduction(args)?;
    let sg = segments(cx, args, &data, false)?;
    let dt = grad.dtype;
    let (o, n, i, s) = (sg.o, sg.n, sg.i, sg.s);
    let dd = cx.dims(data.v);
    if o == 0 || n == 0 || i == 0 || s == 0 {
        return one(cx.full(0.0, dt, &dd));
    }
    let d3 = [o, n, i];
    let seg = segment_ids(cx, &sg);
    let idx = segment_index(cx, seg, o, n);
    let g = cx.reshape(grad.v, &[o, s, i]);
    let g = cx.cast(g, dt);
    let x = cx.reshape(data.v, &d3);
    let x = cx.cast(x, dt);
    let ge = segment_gather(cx, g, idx);
    let zero = cx.full(0.0, dt, &d3);
    let r = match red {
        SegRed::Sum => ge,
        SegRed::Mean => {
            let len = segment_lengths(cx, &sg, dt);
            let len = cx.broadcast_in_dim(len, &[o, s, i], &[0, 1]);
            let le = segment_gather(cx, len, idx);
            cx.div(ge, le)
        }
        SegRed::Max | SegRed::Min => {
            let out = cx.reshape(output.v, &[o, s, i]);
            let out = cx.cast(out, dt);
            let oe = segment_gather(cx, out, idx);
            let nan = cx.compare(CmpDir::Ne, x, x);
            let eq = cx.compare(CmpDir::Eq, x, oe);
            let hit = cx.or(nan, eq);
            let hits = cx.convert(hit, dt.elem());
            let zinit = cx.full(0.0, dt, &[o, s + 1, i]);
            let count = segment_scatter(cx, zinit, idx, hits, SegRed::Sum);
            let ce = segment_gather(cx, count, idx);
            let gh = cx.select(hit, ge, zero);
            let q = cx.div(gh, ce);
            let two = cx.full(2.0, dt, &d3);
            let tied = cx.compare(CmpDir::Ge, ce, two);
            let pos = cx.compare(CmpDir::Gt, gh, zero);
            let split = cx.and(tied, pos);
            cx.select(split, q, gh)
        }
        SegRed::Prod => {
            let out = cx.reshape(output.v, &[o, s, i]);
            let out = cx.cast(out, dt);
            let oe = segment_gather(cx, out, idx);
            let gv = cx.mul(ge, oe);
            let regular = cx.div(gv, x);
            let nan = cx.compare(CmpDir::Ne, x, x);
            let is_zero = cx.compare(CmpDir::Eq, x, zero);
            let special = cx.or(nan, is_zero);
            // Product of the regular elements, and counts of zeros and NaNs, per segment.
            let ones = cx.full(1.0, dt, &d3);
            let reg_vals = cx.select(special, ones, x);
            let oinit = cx.full(1.0, dt, &[o, s + 1, i]);
            let p = segment_scatter(cx, oinit, idx, reg_vals, SegRed::Prod);
            let zinit = cx.full(0.0, dt, &[o, s + 1, i]);
            let nz = cx.convert(is_zero, dt.elem());
            let nn = cx.convert(nan, dt.elem());
            let zeros_c = segment_scatter(cx, zinit, idx, nz, SegRed::Sum);
            let nans_c = segment_scatter(cx, zinit, idx, nn, SegRed::Sum);
            let pe = segment_gather(cx, p, idx);
            let ze = segment_gather(cx, zeros_c, idx);
            let ne = segment_gather(cx, nans_c, idx);
            let other_zeros = cx.sub(ze, nz);
            let other_nans = cx.sub(ne, nn);
            let init = match args.opt_scalar("initial")? {
                Some(v) => cx.scalar_like(v, dt, &d3),
                None => cx.full(1.0, dt, &d3),
            };
            let ex = cx.mul(init, pe);
            let has_zero = cx.compare(CmpDir::Gt, other_zeros, zero);
            let ex0 = cx.mul(ex, zero);
            let ex = cx.select(has_zero, ex0, ex);
            let has_nan = cx.compare(CmpDir::Gt, other_nans, zero);
            let nanv = cx.full(f64::NAN, dt, &d3);
            let ex = cx.select(has_nan, nanv, ex);
            let sp = cx.mul(ge, ex);
            cx.select(special, sp, regular)
        }
    };
    // Elements outside every segment get no gradient.
    let spare = cx.full(s as f64, DType::I64, &[o, n]);
    let inside = cx.compare(CmpDir::Lt, seg, spare);
    let inside = cx.broadcast_in_dim(inside, &d3, &[0, 1]);
    let r = cx.select(inside, r, zero);
    one(cx.reshape(r, &dd))
}
