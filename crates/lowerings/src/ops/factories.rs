//! Creating, filling and copying tensors: fill_, zero_, copy_, clone, _to_copy, arange, range,
//! linspace, logspace, _make_dep_token; the random fills uniform_, normal_, bernoulli_ and
//! random_ (random.rs holds the other distributions); and the factories of compiled graphs
//! (full, zeros, empty*, new_*, scalar_tensor, *_like: eager mode runs them as empty + fill_).
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::reduce::opt_dtype;
use crate::blocks::rng::uniform01;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, ElemType, RngAlgorithm, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("fill", fill).pointwise(),
    op("zero", zero).pointwise().float4(),
    op("copy", copy).host_tensors().pointwise().float4_mixes(),
    op("clone", clone).pointwise().float4(),
    op("_to_copy", to_copy).host_tensors().pointwise().float4_mixes(),
    op("arange", arange).specialized(),
    op("linspace", linspace).specialized(),
    // Routed: range.out_'s composite calls the CPU kernel range_out, which writes through data_ptr.
    op("range", range).specialized().routed(&["range.out_"]),
    op("_make_dep_token", make_dep_token),
    // Their float arguments are validated (std >= 0, 0 <= p <= 1), so their values are part of
    // the cache key: a cached program must never skip a check.
    op("uniform", uniform).specialized(),
    op("normal", normal).specialized(),
    op("bernoulli", bernoulli).specialized(),
    op("random", random),
    // Graph-only forms (eager mode runs them as empty + a fill above); normal_functional is
    // normal_ made functional by AOTAutograd.
    op("normal_functional", normal).specialized(),
    op("rand", rand),
    op("rand_like", rand),
    op("randn", randn),
    op("randn_like", randn),
    op("randint", randint),
    op("randint_like", randint),
    // The values are computed on the host from start, end and base.
    op("logspace", logspace).specialized(),
    op("full", full),
    op("empty", zeros_of_size).float4(),
    op("zeros", zeros_of_size).float4(),
    op("empty_permuted", zeros_of_size).float4(),
    op("empty_strided", zeros_of_size).float4(),
    op("new_empty", new_zeros).float4(),
    op("new_zeros", new_zeros).float4(),
    op("new_empty_strided", new_zeros).float4(),
    op("scalar_tensor", scalar_tensor),
    op("full_like", full_like),
    op("zeros_like", |cx, a| like(cx, a, 0.0)).float4(),
    op("ones_like", |cx, a| like(cx, a, 1.0)),
    op("empty_like", |cx, a| like(cx, a, 0.0)).float4(),
];

/// The tensor whose shape and dtype a filling op produces: `self`, or `out` for out= forms.
fn target(args: &Args) -> Result<Tensor> {
    args.tensor("self").or_else(|_| args.tensor("out"))
}

fn fill(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    let v = match args.get("value") {
        Some(Arg::Tensor(t)) => {
            let nd = cx.dims(t.v).len();
            check!(nd == 0, Runtime, "fill_ only supports 0-dimension value tensor but got tensor with {} dimensions.", nd);
            cx.cast(t.v, x.dtype)
        }
        _ => {
            let s = args.scalar("value")?.to_real(x.dtype)?;
            cx.scalar(s, x.dtype)
        }
    };
    one(cx.broadcast_in_dim(v, &dims, &[]))
}

fn zero(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    one(cx.full(0.0, x.dtype, &cx.dims(x.v)))
}

/// copy_(self, src): src converted to self's dtype and broadcast to its shape.
fn copy(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let src = args.tensor("src")?;
    let dims = cx.dims(x.v);
    let sdims = cx.dims(src.v);
    let b = crate::broadcast_shapes(&[dims.clone(), sdims.clone()]);
    check!(
        b.as_deref() == Ok(&dims[..]),
        Runtime,
        "output with shape {:?} doesn't match the broadcast shape {:?}",
        dims,
        b.unwrap_or(sdims)
    );
    crate::float4::check_same("copy_", src.dtype, x.dtype)?;
    let v = cx.cast(src.v, x.dtype);
    one(cx.broadcast_to(v, &dims))
}

fn clone(_cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    one(args.tensor("self")?.v)
}

/// _to_copy(self, dtype, ...): the device move itself is the engine's business.
fn to_copy(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dt = args.dtype("dtype")?.unwrap_or(x.dtype);
    crate::float4::check_same("copy_kernel", x.dtype, dt)?;
    one(cx.cast(x.v, dt))
}

/// The dtype of a factory's result: its out= tensor (eager), else `dtype=`, else PyTorch's
/// inference from the numbers (int64 when all are integers, else the default float).
fn factory_dtype(args: &Args, numbers: &[Option<Scalar>]) -> Result<DType> {
    if let Ok(out) = args.tensor("out") {
        return Ok(out.dtype);
    }
    if let Some(d) = args.dtype("dtype")? {
        return Ok(d);
    }
    let all_int = numbers.iter().flatten().all(|s| matches!(s, Scalar::Int(_) | Scalar::Bool(_)));
    Ok(if all_int { DType::I64 } else { DType::F32 })
}

/// arange.start_out(start, end, step, out) (eager) or arange.start_step (graphs):
/// values start + i * step.
fn arange(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (s0, s1, s2) = (args.opt_scalar("start")?, args.opt_scalar("end")?, args.opt_scalar("step")?);
    let dtype = factory_dtype(args, &[s0, s1, s2])?;
    let start = s0.map(Scalar::to_f64).unwrap_or(0.0);
    let end = args.scalar("end")?.to_f64();
    let step = s2.map(Scalar::to_f64).unwrap_or(1.0);
    check!(step != 0.0, Runtime, "step must be nonzero");
    check!(start.is_finite() && end.is_finite(), Runtime, "unsupported range: {} -> {}", start, end);
    check!(
        (step > 0.0 && end >= start) || (step < 0.0 && end <= start),
        Runtime,
        "upper bound and larger bound inconsistent with step sign"
    );
    let n = ((end - start) / step).ceil() as i64;
    linear_values(cx, dtype, n, start, step)
}

/// start + i * step for i in 0..n, computed in the output dtype's arithmetic (i64 for integer
/// outputs, f32 for 16-bit floats like PyTorch's accumulate type, else the dtype itself).
fn linear_values(cx: &mut Cx, dtype: DType, n: i64, start: f64, step: f64) -> Result<Vec<Out>> {
    let acc = match dtype {
        d if d.is_integral() => DType::I64,
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let i = cx.iota(&TensorType { elem: acc.elem(), dims: vec![n] }, 0);
    let st = cx.full(step, acc, &[n]);
    let s0 = cx.full(start, acc, &[n]);
    let v = cx.mul(i, st);
    let v = cx.add(v, s0);
    one(cx.cast(v, dtype))
}

/// range.out(start, end, step, out) (every overload ends there): like arange with the end
/// included. PyTorch's CPU kernel converts the numbers to the output's accumulate type first
/// (integer outputs truncate them: range(0.5, 3.7, dtype=long) is 0..=3) and sizes the result
/// as trunc((end - start) / step) + 1; an out= tensor with that many elements keeps its shape.
fn range(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let out = args.tensor("out").ok();
    let dtype = match out {
        Some(o) => o.dtype,
        None => args.dtype("dtype")?.unwrap_or(DType::F32),
    };
    check!(
        dtype != DType::Bool && !dtype.is_complex(),
        NotImplemented,
        "\"range_cpu\" not implemented for '{}'",
        dtype.torch_name()
    );
    let conv = |s: Scalar| -> f64 {
        let v = s.to_f64();
        match dtype {
            d if d.is_integral() => v.trunc(),
            DType::F16 | DType::BF16 => v as f32 as f64,
            _ => v,
        }
    };
    let start = conv(args.scalar("start")?);
    let end = conv(args.scalar("end")?);
    let step = conv(args.opt_scalar("step")?.unwrap_or(Scalar::Int(1)));
    check!(step != 0.0, Runtime, "step must be nonzero");
    check!(start.is_finite() && end.is_finite(), Runtime, "unsupported range: {} -> {}", fmt_num(start), fmt_num(end));
    check!(
        (step > 0.0 && end >= start) || (step < 0.0 && end <= start),
        Runtime,
        "upper bound and lower bound inconsistent with step sign"
    );
    let n = match dtype {
        d if d.is_integral() => (end as i64 - start as i64) / step as i64 + 1,
        DType::F16 | DType::BF16 => ((end as f32 - start as f32) / step as f32 + 1.0) as i64,
        _ => ((end - start) / step + 1.0) as i64,
    };
    let r = linear_values(cx, dtype, n, start, step)?;
    match (out, &r[..]) {
        (Some(o), [Out::Tensor(v)]) if cx.numel(o.v) == n && cx.dims(o.v) != [n] => {
            let dims = cx.dims(o.v);
            one(cx.reshape(*v, &dims))
        }
        _ => Ok(r),
    }
}

/// _make_dep_token(dtype, ...): the token _functional_assert_async threads through a graph,
/// a 0-d tensor (its value is never read).
fn make_dep_token(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let dt = args.dtype("dtype")?.unwrap_or(DType::F32);
    one(cx.full(0.0, dt, &[]))
}

/// A number as PyTorch prints it in messages (integral values without a fraction).
fn fmt_num(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{}", v)
    }
}

/// linspace.out(start, end, steps, out): PyTorch fills the first half from start and the
/// second half from end so both ends are exact.
fn linspace(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let dtype = factory_dtype(args, &[Some(Scalar::Float(crate::FloatArg { value: 0.0, slot: None }))])?;
    let start = args.scalar("start")?.to_f64();
    let end = args.scalar("end")?.to_f64();
    let steps = args.int("steps")?;
    check!(steps >= 0, Runtime, "number of steps must be non-negative");
    let acc = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    if steps <= 1 {
        let v = cx.full(start, acc, &[steps]);
        return one(cx.cast(v, dtype));
    }
    let step = (end - start) / (steps - 1) as f64;
    let n = steps;
    let i = cx.iota(&TensorType { elem: acc.elem(), dims: vec![n] }, 0);
    let stepv = cx.full(step, acc, &[n]);
    let s0 = cx.full(start, acc, &[n]);
    let e0 = cx.full(end, acc, &[n]);
    let last = cx.full((n - 1) as f64, acc, &[n]);
    let lo = cx.mul(i, stepv);
    let lo = cx.add(lo, s0);
    let back = cx.sub(last, i);
    let hi = cx.mul(back, stepv);
    let hi = cx.sub(e0, hi);
    let half = cx.full((n / 2) as f64, acc, &[n]);
    let first = cx.compare(CmpDir::Lt, i, half);
    let v = cx.select(first, lo, hi);
    if dtype.is_integral() {
        // Integer linspace truncates like a C cast.
        let z = cx.full(0.0, acc, &[n]);
        let neg = cx.compare(CmpDir::Lt, v, z);
        let c = cx.ceil(v);
        let f = cx.floor(v);
        let t = cx.select(neg, c, f);
        return one(cx.cast(t, dtype));
    }
    one(cx.cast(v, dtype))
}

// ---- random ------------------------------------------------------------------------------------

fn uniform(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let dims = cx.dims(x.v);
    let from = args.opt_scalar("from")?.unwrap_or(Scalar::Int(0));
    let to = args.opt_scalar("to")?.unwrap_or(Scalar::Int(1));
    uniform_values(cx, args, x.dtype, &dims, from, to)
}

/// Uniform floats in [from, to) of `dtype` and `dims` from the call's generator.
fn uniform_values(cx: &mut Cx, args: &Args, dtype: DType, dims: &[i64], from: Scalar, to: Scalar) -> Result<Vec<Out>> {
    check!(dtype.is_float(), NotImplemented, "\"uniform_cpu\" not implemented for '{}'", dtype.torch_name());
    check!(
        from.to_f64() <= to.to_f64(),
        Runtime,
        "uniform_ expects to return a [from, to) range, but found from={} > to={}",
        from.to_f64(),
        to.to_f64()
    );
    let double = dtype == DType::F64;
    let acc = if double { DType::F64 } else { DType::F32 };
    let u = uniform01(cx, args, dims, double)?;
    let lo = cx.scalar_like(from, acc, dims);
    let hi = cx.scalar_like(to, acc, dims);
    let range = cx.sub(hi, lo);
    let v = cx.mul(u, range);
    let v = cx.add(v, lo);
    one(cx.cast(v, dtype))
}

/// The shape and dtype of a graph factory: `size` and `dtype` (the graph gives the default
/// dtype explicitly), or those of `self` for the _like forms.
fn made_like(cx: &Cx, args: &Args, default: DType) -> Result<(DType, Vec<i64>)> {
    match args.opt_tensor("self")? {
        Some(x) => Ok((args.dtype("dtype")?.unwrap_or(x.dtype), cx.dims(x.v))),
        None => Ok((args.dtype("dtype")?.unwrap_or(default), args.ints("size")?)),
    }
}

/// rand(size) and rand_like(self): uniform in [0, 1).
fn rand(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (dtype, dims) = made_like(cx, args, DType::F32)?;
    uniform_values(cx, args, dtype, &dims, Scalar::Int(0), Scalar::Int(1))
}

/// randn(size) and randn_like(self): standard normal draws.
fn randn(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (dtype, dims) = made_like(cx, args, DType::F32)?;
    if dtype.is_complex() {
        return normal_complex(cx, args, dtype, &dims, None, None);
    }
    check!(dtype.is_float(), NotImplemented, "\"normal_kernel_cpu\" not implemented for '{}'", dtype.torch_name());
    let acc = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let z = standard_normal(cx, args, &dims, acc)?;
    one(cx.cast(z, dtype))
}

/// randint(high, size), randint.low(low, high, size) and randint_like's forms: integers in
/// [low, high).
fn randint(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (dtype, dims) = made_like(cx, args, DType::I64)?;
    check!(
        !matches!(args.get("high"), Some(Arg::Tensor(_))),
        NotImplemented,
        "torchtpu.compile: randint_like with a tensor bound"
    );
    let low = args.opt_int("low")?.unwrap_or(0);
    let high = args.int("high")?;
    random_values(cx, args, dtype, &dims, low, high)
}

fn normal(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    // normal_(self, mean, std) fills self; normal.Tensor_Tensor / Tensor_float / float_Tensor
    // (and their out= forms) draw one value per element of the broadcast mean and std.
    let mean_t = args.opt_tensor("mean").ok().flatten();
    let std_t = args.opt_tensor("std").ok().flatten();
    let (dtype, dims) = match target(args) {
        Ok(x) if mean_t.is_none() && std_t.is_none() => (x.dtype, cx.dims(x.v)),
        _ => {
            let tensors: Vec<Tensor> = mean_t.iter().chain(std_t.iter()).copied().collect();
            check!(!tensors.is_empty(), Runtime, "normal: expected a tensor mean or std");
            let shapes: Vec<Vec<i64>> = tensors.iter().map(|t| cx.dims(t.v)).collect();
            let dims = crate::broadcast_shapes(&shapes)?;
            let dtype = match args.tensor("out") {
                Ok(o) => o.dtype,
                Err(_) => tensors[0].dtype,
            };
            (dtype, dims)
        }
    };
    if dtype.is_complex() {
        return normal_complex(cx, args, dtype, &dims, mean_t, std_t);
    }
    check!(dtype.is_float(), NotImplemented, "\"normal_kernel_cpu\" not implemented for '{}'", dtype.torch_name());
    let double = dtype == DType::F64;
    let acc = if double { DType::F64 } else { DType::F32 };
    let operand = |cx: &mut Cx, t: Option<Tensor>, name: &str, default: i64| -> Result<Value> {
        Ok(match t {
            Some(t) => {
                let v = cx.cast(t.v, acc);
                cx.broadcast_to(v, &dims)
            }
            None => {
                let s = args.opt_scalar(name)?.unwrap_or(Scalar::Int(default));
                match s {
                    Scalar::Float(f) => check!(name != "std" || f.value >= 0.0, Runtime, "normal expects std >= 0.0, but found std {}", f.value),
                    Scalar::Int(i) => check!(name != "std" || i >= 0, Runtime, "normal expects std >= 0.0, but found std {}", i),
                    Scalar::Bool(_) | Scalar::Complex(..) => {}
                }
                cx.scalar_like(s, acc, &dims)
            }
        })
    };
    let mu = operand(cx, mean_t, "mean", 0)?;
    let sd = operand(cx, std_t, "std", 1)?;
    let z = standard_normal(cx, args, &dims, acc)?;
    let v = cx.mul(z, sd);
    let v = cx.add(v, mu);
    one(cx.cast(v, dtype))
}

/// Standard normal draws of `dims` in `acc` (f32 or f64): Box-Muller on two independent
/// uniform draws (one doubled-size draw split in halves).
fn standard_normal(cx: &mut Cx, args: &Args, dims: &[i64], acc: DType) -> Result<Value> {
    let n: i64 = dims.iter().product();
    let u = uniform01(cx, args, &[2, n], acc == DType::F64)?;
    let u1 = cx.slice(u, &[0, 0], &[1, n], &[1, 1]);
    let u2 = cx.slice(u, &[1, 0], &[2, n], &[1, 1]);
    let one_ = cx.full(1.0, acc, &[1, n]);
    let u1 = cx.sub(one_, u1); // (0, 1]
    let l = cx.log(u1);
    let m2 = cx.full(-2.0, acc, &[1, n]);
    let r = cx.mul(l, m2);
    let r = cx.sqrt(r);
    let tau = cx.full(std::f64::consts::TAU, acc, &[1, n]);
    let th = cx.mul(u2, tau);
    let c = cx.cos(th);
    let z = cx.mul(r, c);
    Ok(cx.reshape(z, dims))
}

/// Complex normal draws as PyTorch makes them: real and imaginary parts independent normals
/// of standard deviation std/sqrt(2). normal_(self, mean, std) fills view_as_real(self), so a
/// float mean goes to both parts; the tensor forms add the mean as a complex number (a float
/// mean to the real part) after scaling unit draws by a real std.
fn normal_complex(cx: &mut Cx, args: &Args, dtype: DType, dims: &[i64], mean_t: Option<Tensor>, std_t: Option<Tensor>) -> Result<Vec<Out>> {
    let part = dtype.to_real();
    let double = part == DType::F64;
    if let Some(s) = std_t {
        check!(!s.dtype.is_complex(), Runtime, "normal expects standard deviation to be non-complex");
    }
    let fill = mean_t.is_none() && std_t.is_none();
    let n: i64 = dims.iter().product();
    // Box-Muller on 2n uniform pairs: one normal per part of each element.
    let u = uniform01(cx, args, &[2, 2 * n], double)?;
    let u1 = cx.slice(u, &[0, 0], &[1, 2 * n], &[1, 1]);
    let u2 = cx.slice(u, &[1, 0], &[2, 2 * n], &[1, 1]);
    let one_ = cx.full(1.0, part, &[1, 2 * n]);
    let u1 = cx.sub(one_, u1);
    let l = cx.log(u1);
    let m2 = cx.full(-2.0, part, &[1, 2 * n]);
    let r = cx.mul(l, m2);
    let r = cx.sqrt(r);
    let tau = cx.full(std::f64::consts::TAU, part, &[1, 2 * n]);
    let th = cx.mul(u2, tau);
    let c = cx.cos(th);
    let z = cx.mul(r, c);
    let mut pdims = dims.to_vec();
    pdims.push(2);
    let z = cx.reshape(z, &pdims);
    let mut lo = vec![0i64; dims.len() + 1];
    let mut hi = pdims.clone();
    let strides = vec![1i64; dims.len() + 1];
    hi[dims.len()] = 1;
    let re = cx.slice(z, &lo, &hi, &strides);
    lo[dims.len()] = 1;
    hi[dims.len()] = 2;
    let im = cx.slice(z, &lo, &hi, &strides);
    let re = cx.reshape(re, dims);
    let im = cx.reshape(im, dims);
    let sd = match std_t {
        Some(t) => {
            let v = cx.cast(t.v, part);
            cx.broadcast_to(v, dims)
        }
        None => {
            let s = args.opt_scalar("std")?.unwrap_or(Scalar::Int(1));
            check!(s.to_f64() >= 0.0, Runtime, "normal expects std >= 0.0, but found std {}", s.to_f64());
            cx.scalar_like(s, part, dims)
        }
    };
    let k = cx.full(std::f64::consts::FRAC_1_SQRT_2, part, dims);
    let sd = cx.mul(sd, k);
    let re = cx.mul(re, sd);
    let im = cx.mul(im, sd);
    let (mre, mim) = match mean_t {
        Some(t) if t.dtype.is_complex() => {
            let v = cx.broadcast_to(t.v, dims);
            let r = cx.real(v);
            let i = cx.imag(v);
            (cx.cast(r, part), cx.cast(i, part))
        }
        Some(t) => {
            let v = cx.cast(t.v, part);
            (cx.broadcast_to(v, dims), cx.full(0.0, part, dims))
        }
        None => {
            let s = args.opt_scalar("mean")?.unwrap_or(Scalar::Int(0));
            let m = cx.scalar_like(s, part, dims);
            (m, if fill { m } else { cx.full(0.0, part, dims) })
        }
    };
    let re = cx.add(re, mre);
    let im = cx.add(im, mim);
    one(cx.complex(re, im))
}

/// bernoulli_(self, p) with p a float or a tensor, and bernoulli(self) drawing with
/// probabilities `self`.
fn bernoulli(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let dims = cx.dims(x.v);
    let u = uniform01(cx, args, &dims, false)?;
    let p = match args.get("p") {
        Some(Arg::Tensor(t)) => {
            let p = cx.cast(t.v, DType::F32);
            cx.broadcast_to(p, &dims)
        }
        Some(Arg::None) | None => {
            check!(x.dtype.is_float(), NotImplemented, "\"bernoulli_tensor_cpu_self_\" not implemented for '{}'", x.dtype.torch_name());
            cx.cast(x.v, DType::F32)
        }
        _ => {
            let s = args.scalar("p")?;
            if let Scalar::Float(f) = s {
                check!((0.0..=1.0).contains(&f.value), Runtime, "bernoulli_ expects p to be in [0, 1], but got p={}", f.value);
            }
            cx.scalar_like(s, DType::F32, &dims)
        }
    };
    let hit = cx.compare(CmpDir::Lt, u, p);
    one(cx.cast(hit, x.dtype))
}

/// random_(self, from, to): integers uniform in [from, to); without bounds, [0, 2^mantissa]
/// for floats and the dtype's range for integers, like PyTorch.
fn random(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let dims = cx.dims(x.v);
    let from = args.opt_int("from")?.unwrap_or(0);
    let to = match args.opt_int("to")? {
        Some(t) => t,
        None => match x.dtype {
            DType::Bool => 2,
            DType::U8 => 256,
            DType::I8 => 128,
            DType::I16 => 1 << 15,
            DType::I32 => 1 << 31,
            DType::F16 => (1 << 11) + 1,
            DType::BF16 => (1 << 8) + 1,
            DType::F32 => (1 << 24) + 1,
            DType::F64 => (1i64 << 53) + 1,
            _ => i64::MAX,
        },
    };
    random_values(cx, args, x.dtype, &dims, from, to)
}

/// Integers uniform in [from, to) as `dtype`, from the call's generator.
fn random_values(cx: &mut Cx, args: &Args, dtype: DType, dims: &[i64], from: i64, to: i64) -> Result<Vec<Out>> {
    check!(from < to, Runtime, "random_ expects 'from' to be less than 'to', but got from={} >= to={}", from, to);
    check!(!dtype.is_complex(), NotImplemented, "random_ is not implemented for complex tensors on tpu");
    let range = to.wrapping_sub(from) as u64;
    let state = args.generator("generator")?;
    let ty = TensorType { elem: ElemType::U64, dims: dims.to_vec() };
    let (_, bits) = cx.rng_bit_generator(RngAlgorithm::ThreeFry, state, &ty);
    let r = cx.b.splat_i64(range as i64, &ty);
    let v = cx.rem(bits, r);
    let v = cx.convert(v, ElemType::I64);
    let f = cx.b.splat_i64(from, &TensorType { elem: ElemType::I64, dims: dims.to_vec() });
    let v = cx.add(v, f);
    one(cx.cast(v, dtype))
}

// ---- logspace -------------------------------------------------------------------------------------

/// logspace's result dtype: its out= tensor, else `dtype=`, else the default float.
fn logspace_dtype(args: &Args) -> Result<DType> {
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
    let dtype = logspace_dtype(args)?;
    check!(!dtype.is_complex(), NotImplemented, "logspace: complex results are not supported on tpu yet");
    let steps = args.int("steps")?;
    check!(steps >= 0, Runtime, "number of steps must be non-negative");
    let start = args.scalar("start")?.to_f64();
    let end = args.scalar("end")?.to_f64();
    let base = match args.get("base") {
        Some(crate::Arg::Float(f)) => f.value,
        _ => args.opt_scalar("base")?.map(Scalar::to_f64).unwrap_or(10.0),
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

// ---- factories of compiled graphs -------------------------------------------------------------

fn full(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let size = args.ints("size")?;
    let value = args.scalar("fill_value")?;
    let dtype = match args.dtype("dtype")? {
        Some(d) => d,
        None => match value {
            crate::Scalar::Int(_) => DType::I64,
            crate::Scalar::Bool(_) => DType::Bool,
            crate::Scalar::Float(_) => DType::F32,
            crate::Scalar::Complex(..) => DType::C64,
        },
    };
    one(cx.scalar_like(value.to_real(dtype)?, dtype, &size))
}

fn zeros_of_size(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let size = args.ints("size")?;
    let dtype = args.dtype("dtype")?.unwrap_or(DType::F32);
    one(cx.full(0.0, dtype, &size))
}

/// new_zeros / new_empty(self, size, dtype): a fresh tensor of `self`'s dtype by default.
fn new_zeros(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let size = args.ints("size")?;
    let dtype = args.dtype("dtype")?.unwrap_or(x.dtype);
    one(cx.full(0.0, dtype, &size))
}

fn scalar_tensor(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let s = args.scalar("s")?;
    let dtype = args.dtype("dtype")?.unwrap_or(DType::F32);
    one(cx.scalar(s.to_real(dtype)?, dtype))
}

fn full_like(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dtype = args.dtype("dtype")?.unwrap_or(x.dtype);
    let value = args.scalar("fill_value")?.to_real(dtype)?;
    let dims = cx.dims(x.v);
    one(cx.scalar_like(value, dtype, &dims))
}

fn like(cx: &mut Cx, args: &Args, value: f64) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dtype = args.dtype("dtype")?.unwrap_or(x.dtype);
    let dims = cx.dims(x.v);
    one(cx.full(value, dtype, &dims))
}
