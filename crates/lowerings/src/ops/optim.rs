//! What optimizers run: lerp, addcmul, addcdiv; the _foreach_* ops (each applies the
//! per-tensor lowering of its base op to every list element, in one program); the fused
//! optimizer steps _fused_adam_, _fused_adamw_, _fused_sgd_ and _fused_adagrad_; and
//! GradScaler's _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::cx::Cx;
use crate::dtype::{result_type, DType, Rank};
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op, ops};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("lerp", lerp),
    op("addcmul", addcmul),
    op("addcdiv", addcdiv),
    // List ops: one program per list instead of PyTorch's loop of one op per tensor.
    ops(FOREACH, foreach).list_op(),
    // Its base (linalg_vector_norm) decides the program's structure from `ord`.
    op("_foreach_norm", foreach).specialized().list_op(),
    op("_fused_adam", fused_adam),
    op("_fused_adamw", fused_adam),
    op("_fused_sgd", fused_sgd),
    op("_fused_adagrad", fused_adagrad),
    op("_amp_foreach_non_finite_check_and_unscale", amp_unscale),
    op("_amp_update_scale", amp_update_scale),
];

// ---- lerp, addcmul, addcdiv -----------------------------------------------------------------

/// lerp(self, end, weight): |weight| < 0.5 ? self + weight * (end - self)
///                                          : end - (end - self) * (1 - weight).
fn lerp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let end = args.tensor("end")?;
    let name = |d: DType| crate::blocks::type_names::cpp_type_name(d);
    check!(
        x.dtype == end.dtype,
        Runtime,
        "expected dtype {} for `end` but got dtype {}",
        name(x.dtype),
        name(end.dtype)
    );
    let weight = match args.get("weight") {
        Some(Arg::Tensor(w)) => {
            // A 0-d weight may have another dtype (it is a scalar to the kernel).
            check!(
                x.dtype == w.dtype || w.rank != Rank::Dim,
                Runtime,
                "expected dtype {} for `weight` but got dtype {}",
                name(x.dtype),
                name(w.dtype)
            );
            Some(*w)
        }
        _ => None,
    };
    check!(
        x.dtype.is_float() || x.dtype.is_complex(),
        NotImplemented,
        "\"{}\" not implemented for '{}'",
        if weight.is_some() { "lerp_kernel_tensor" } else { "lerp_kernel_scalar" },
        x.dtype.torch_name()
    );
    let cdt = x.dtype.opmath();
    let xv = cx.cast(x.v, cdt);
    let ev = cx.cast(end.v, cdt);
    let wv = match weight {
        Some(w) => cx.cast(w.v, cdt),
        None => {
            let s = args.scalar("weight")?.to_real(cdt)?;
            cx.scalar(s, cdt)
        }
    };
    let vs = cx.broadcast_all(&[xv, ev, wv])?;
    one(lerp_values(cx, vs[0], vs[1], vs[2], x.dtype))
}

/// PyTorch's lerp formula on broadcast values of the compute dtype, cast to `dt`.
fn lerp_values(cx: &mut Cx, x: Value, end: Value, w: Value, dt: DType) -> Value {
    let dims = cx.dims(x);
    let cdt = cx.dtype(x);
    let diff = cx.sub(end, x);
    let small_v = cx.mul(w, diff);
    let small_v = cx.add(x, small_v);
    let one_ = cx.full(1.0, cdt, &dims);
    let omw = cx.sub(one_, w);
    let big_v = cx.mul(diff, omw);
    let big_v = cx.sub(end, big_v);
    let aw = cx.abs(w);
    let half = cx.full(0.5, cx.dtype(aw), &dims);
    let small = cx.compare(CmpDir::Lt, aw, half);
    let out = cx.select(small, small_v, big_v);
    cx.cast(out, dt)
}

/// The (self, tensor1, tensor2) of addcmul/addcdiv promoted and broadcast together, and
/// `value` in the compute dtype; returns (values, result dtype).
fn addc_operands(cx: &mut Cx, args: &Args, kernel: &str) -> Result<(Vec<Value>, Value, DType)> {
    let x = args.tensor("self")?;
    let t1 = args.tensor("tensor1")?;
    let t2 = args.tensor("tensor2")?;
    let dt = result_type(&[(x.dtype, x.rank), (t1.dtype, t1.rank), (t2.dtype, t2.rank)]).unwrap();
    check!(dt != DType::Bool, NotImplemented, "\"{}\" not implemented for 'Bool'", kernel);
    let cdt = dt.opmath();
    let vals: Vec<Value> = [x, t1, t2].iter().map(|t| cx.cast(t.v, cdt)).collect();
    let vs = cx.broadcast_all(&vals)?;
    let dims = cx.dims(vs[0]);
    let value = args.opt_scalar("value")?.unwrap_or(Scalar::Int(1));
    let value = cx.scalar_like(value, cdt, &dims);
    Ok((vs, value, dt))
}

/// addcmul(self, tensor1, tensor2, value): self + value * tensor1 * tensor2.
fn addcmul(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (vs, value, dt) = addc_operands(cx, args, "addcmul_cpu_out")?;
    let p = cx.mul(value, vs[1]);
    let p = cx.mul(p, vs[2]);
    let out = if dt == DType::Bool { cx.or(vs[0], p) } else { cx.add(vs[0], p) };
    one(cx.cast(out, dt))
}

/// addcdiv(self, tensor1, tensor2, value): self + value * tensor1 / tensor2 (floats only).
fn addcdiv(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let t1 = args.tensor("tensor1")?;
    let t2 = args.tensor("tensor2")?;
    check!(
        !(t1.dtype.is_integral() && t2.dtype.is_integral()),
        Runtime,
        "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a true \
         division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + value * \
         torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / \
         tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: (input + value \
         * tensor1 / tensor2), for all dtypes."
    );
    let (vs, value, dt) = addc_operands(cx, args, "addcdiv_cpu_out")?;
    let p = cx.mul(value, vs[1]);
    let p = cx.div(p, vs[2]);
    let out = cx.add(vs[0], p);
    one(cx.cast(out, dt))
}

// ---- _foreach_* ------------------------------------------------------------------------------

const FOREACH: &[&str] = &[
    "_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_clamp_min", "_foreach_clamp_max",
    "_foreach_maximum", "_foreach_minimum", "_foreach_pow", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp",
    "_foreach_copy", "_foreach_zero", "_foreach_max", "_foreach_abs", "_foreach_acos", "_foreach_asin",
    "_foreach_atan", "_foreach_ceil", "_foreach_cos", "_foreach_cosh", "_foreach_erf", "_foreach_erfc",
    "_foreach_exp", "_foreach_expm1", "_foreach_floor", "_foreach_frac", "_foreach_lgamma", "_foreach_log",
    "_foreach_log10", "_foreach_log1p", "_foreach_log2", "_foreach_neg", "_foreach_reciprocal", "_foreach_round",
    "_foreach_rsqrt", "_foreach_sigmoid", "_foreach_sign", "_foreach_sin", "_foreach_sinh", "_foreach_sqrt",
    "_foreach_tan", "_foreach_tanh", "_foreach_trunc",
];

/// The base op of a foreach op and the names its arguments take there. `scalar_arg` says
/// whether the op's second operand is a number (Scalar / ScalarList overloads).
fn foreach_base(op: &str, scalar_arg: bool) -> (&str, Vec<(&'static str, &'static str)>) {
    let short = op.strip_prefix("_foreach_").unwrap_or(op);
    match short {
        "add" | "sub" | "mul" | "div" => (short, vec![("scalar", "other"), ("scalars", "other")]),
        "clamp_min" => (short, vec![("scalar", "min"), ("scalars", "min"), ("other", "min")]),
        "clamp_max" => (short, vec![("scalar", "max"), ("scalars", "max"), ("other", "max")]),
        // maximum/minimum take no numbers: the number overloads are clamps.
        "maximum" if scalar_arg => ("clamp_min", vec![("scalar", "min"), ("scalars", "min")]),
        "minimum" if scalar_arg => ("clamp_max", vec![("scalar", "max"), ("scalars", "max")]),
        "addcmul" | "addcdiv" => (short, vec![("scalars", "value")]),
        "lerp" => (short, vec![("tensors1", "end"), ("weights", "weight")]),
        "norm" => ("linalg_vector_norm", vec![]),
        _ => (short, vec![]),
    }
}

fn is_number(a: &Arg) -> bool {
    matches!(a, Arg::Int(_) | Arg::Float(_) | Arg::Bool(_) | Arg::Complex(..))
}

/// Applies the base op to each element of the list arguments; one program for the whole list.
fn foreach(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    // The element count comes from the tensor lists; number lists must match it.
    let mut n: Option<usize> = None;
    for a in args.values {
        if let Arg::List(items) = a {
            if items.iter().any(is_number) {
                continue;
            }
            match n {
                None => {
                    check!(!items.is_empty(), Runtime, "Tensor list must have at least one tensor.");
                    n = Some(items.len());
                }
                Some(m) => check!(
                    m == items.len(),
                    Runtime,
                    "Tensor lists must have the same number of tensors, got {} and {}",
                    m,
                    items.len()
                ),
            }
        }
    }
    let n = match n {
        Some(n) => n,
        None => bail!(Runtime, "Tensor list must have at least one tensor."),
    };
    let scalar_arg = args.names.iter().zip(args.values).any(|(name, a)| {
        name != "self"
            && (is_number(a) || matches!(a, Arg::List(items) if !items.is_empty() && items.iter().all(is_number)))
    });
    for a in args.values {
        if let Arg::List(items) = a {
            if !items.is_empty() && items.iter().all(is_number) {
                check!(items.len() == n, Runtime, "Tensor list must have same number of elements as scalar list.");
            }
        }
    }
    // A foreach op's 0-d "Tensor other" is a scalar tensor.
    if let Some(Arg::Tensor(t)) = args.get("other") {
        let nd = cx.dims(t.v).len();
        check!(
            nd == 0,
            Runtime,
            "scalar tensor expected to be 0 dim but it has {} dimensions and {} elements.",
            nd,
            cx.numel(t.v)
        );
    }
    let (base, renames) = foreach_base(args.op, scalar_arg);
    let lowering = match crate::registry().get(base).copied() {
        Some(l) => l,
        None => bail!(
            NotImplemented,
            "The operator 'aten::{}' is not currently implemented for the tpu device (needed by {}).",
            base,
            args.op
        ),
    };
    let mut names: Vec<String> = Vec::new();
    for nm in args.names {
        let renamed = renames.iter().find(|(from, _)| from == nm).map_or(nm.as_str(), |(_, to)| to);
        names.push(renamed.to_string());
    }
    if base == "linalg_vector_norm" {
        names.push("dim".into());
        names.push("keepdim".into());
    }
    let mut outs = Vec::with_capacity(n);
    for i in 0..n {
        let mut values: Vec<Arg> = args
            .values
            .iter()
            .map(|a| match a {
                Arg::List(items) => items[i].clone(),
                a => a.clone(),
            })
            .collect();
        if base == "linalg_vector_norm" {
            values.push(Arg::None);
            values.push(Arg::Bool(false));
        }
        if !lowering.specialize_floats || values.iter().all(|v| !matches!(v, Arg::Float(f) if f.slot.is_some())) {
            let r = (lowering.f)(cx, &Args { op: base, names: &names, values: &values, strides: &[] })?;
            match r.into_iter().next() {
                Some(Out::Tensor(v)) => outs.push(v),
                _ => bail!(Runtime, "torchtpu: {} gave no tensor for {}", base, args.op),
            }
        } else {
            bail!(Runtime, "torchtpu: {} must be registered specialized like {}", args.op, base);
        }
    }
    Ok(vec![Out::List(outs)])
}

// ---- fused optimizers ---------------------------------------------------------------------------

/// A float argument, or a 0-d tensor (the tensor_lr overloads), as a 0-d value of `dt`.
fn float_or_tensor(cx: &mut Cx, args: &Args, name: &str, dt: DType) -> Result<Value> {
    match args.get(name) {
        Some(Arg::Tensor(t)) => {
            let v = cx.cast(t.v, dt);
            let n = cx.numel(v);
            check!(n == 1, Runtime, "{}: `{}` must hold one element, got {}", args.op, name, n);
            Ok(cx.reshape(v, &[]))
        }
        _ => {
            let s = args.scalar(name)?;
            Ok(cx.scalar(s, dt))
        }
    }
}

fn same_len(args: &Args, lists: &[(&str, &[Tensor])], n: usize) -> Result<()> {
    for (name, l) in lists {
        check!(
            l.len() == n,
            Runtime,
            "{}: expected {} tensors in {}, got {}",
            args.op,
            n,
            name,
            l.len()
        );
    }
    Ok(())
}

/// The gradient scaling of the fused ops: grad / grad_scale (when given), and whether the
/// step is skipped (found_inf == 1), as 0-d values.
fn scale_and_skip(cx: &mut Cx, args: &Args) -> Result<(Option<Value>, Option<Value>)> {
    let scale = match args.opt_tensor("grad_scale")? {
        Some(t) => {
            let v = cx.cast(t.v, DType::F32);
            Some(cx.reshape(v, &[]))
        }
        None => None,
    };
    let skip = match args.opt_tensor("found_inf")? {
        Some(t) => {
            let v = cx.cast(t.v, DType::F32);
            let v = cx.reshape(v, &[]);
            let one_ = cx.full(1.0, DType::F32, &[]);
            Some(cx.compare(CmpDir::Eq, v, one_))
        }
        None => None,
    };
    Ok((scale, skip))
}

/// Broadcast 0-d `s` to `like`'s dims.
fn bc(cx: &mut Cx, s: Value, like: Value) -> Value {
    let dims = cx.dims(like);
    cx.broadcast_in_dim(s, &dims, &[])
}

/// `new` unless the step is skipped, then `old`.
fn keep_if_skipped(cx: &mut Cx, skip: Option<Value>, old: Value, new: Value) -> Value {
    match skip {
        None => new,
        Some(s) => {
            let s = bc(cx, s, new);
            let old = cx.cast(old, cx.dtype(new));
            cx.select(s, old, new)
        }
    }
}

/// The parameter and gradient lists every fused step takes, checked to be of one length.
fn params_and_grads(args: &Args) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let params = args.tensors("self")?;
    let grads = args.tensors("grads")?;
    same_len(args, &[("grads", &grads)], params.len())?;
    Ok((params, grads))
}

/// The numbers every fused step takes, as 0-d f32 values: the gradient scaling (see
/// `scale_and_skip`), lr, weight_decay and whether weight decay is on (wd != 0).
struct FusedScalars {
    scale: Option<Value>,
    skip: Option<Value>,
    lr: Value,
    wd: Value,
    wd_on: Value,
}

fn fused_scalars(cx: &mut Cx, args: &Args) -> Result<FusedScalars> {
    let (scale, skip) = scale_and_skip(cx, args)?;
    let lr = float_or_tensor(cx, args, "lr", DType::F32)?;
    let wd = float_or_tensor(cx, args, "weight_decay", DType::F32)?;
    let zero = cx.full(0.0, DType::F32, &[]);
    let wd_on = cx.compare(CmpDir::Ne, wd, zero);
    Ok(FusedScalars { scale, skip, lr, wd, wd_on })
}

/// One parameter of a fused step in f32 and its gradient, divided by grad_scale and negated
/// for `maximize`; also the unscaled gradient as it is written back (before the negation).
fn param_and_grad(cx: &mut Cx, args: &Args, fs: &FusedScalars, pt: Tensor, grad: Tensor, maximize: bool) -> Result<(Value, Value, Value)> {
    check!(pt.dtype.is_float(), Runtime, "{}: parameters must be floating point, got {}", args.op, pt.dtype.torch_name());
    let f = DType::F32;
    let p = cx.cast(pt.v, f);
    let mut g = cx.cast(grad.v, f);
    if let Some(s) = fs.scale {
        let s = bc(cx, s, g);
        g = cx.div(g, s);
    }
    let g_out = g;
    if maximize {
        g = cx.neg(g);
    }
    Ok((p, g, g_out))
}

/// L2 weight decay folded into the gradient, g + weight_decay * p, through a select so that a
/// zero weight decay is exact.
fn l2_decay(cx: &mut Cx, fs: &FusedScalars, g: Value, p: Value) -> Value {
    let wdb = bc(cx, fs.wd, p);
    let on = bc(cx, fs.wd_on, p);
    let t = cx.mul(p, wdb);
    let gd = cx.add(g, t);
    cx.select(on, gd, g)
}

/// A state tensor's new value in its own dtype (the old one where the step is skipped).
fn state_out(cx: &mut Cx, fs: &FusedScalars, old: Tensor, new: Value) -> Value {
    let v = keep_if_skipped(cx, fs.skip, old.v, new);
    cx.cast(v, old.dtype)
}

/// What is written back to a gradient: the unscaled one when grad_scale is given (unless the
/// whole step is skipped), else the gradient as it was.
fn grad_out(cx: &mut Cx, fs: &FusedScalars, grad: Tensor, unscaled: Value) -> Value {
    if fs.scale.is_none() {
        return grad.v;
    }
    let g = keep_if_skipped(cx, fs.skip, grad.v, unscaled);
    cx.cast(g, grad.dtype)
}

/// _fused_adam_ / _fused_adamw_: the Adam(W) step of PyTorch's fused kernels, in f32 for
/// 16-bit tensors; state_steps were already incremented. Floats stay runtime inputs: weight
/// decay is applied through a select so that a zero weight decay is exact.
fn fused_adam(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let adamw = args.op == "_fused_adamw";
    let (params, grads) = params_and_grads(args)?;
    let exp_avgs = args.tensors("exp_avgs")?;
    let exp_avg_sqs = args.tensors("exp_avg_sqs")?;
    let max_sqs = args.tensors("max_exp_avg_sqs")?;
    let steps = args.tensors("state_steps")?;
    let amsgrad = args.bool("amsgrad")?;
    let maximize = args.bool("maximize")?;
    let n = params.len();
    same_len(args, &[("exp_avgs", &exp_avgs), ("exp_avg_sqs", &exp_avg_sqs), ("state_steps", &steps)], n)?;
    if amsgrad {
        same_len(args, &[("max_exp_avg_sqs", &max_sqs)], n)?;
    }
    let fs = fused_scalars(cx, args)?;
    let f = DType::F32;
    let (lr, wd) = (fs.lr, fs.wd);
    let beta1 = float_or_tensor(cx, args, "beta1", f)?;
    let beta2 = float_or_tensor(cx, args, "beta2", f)?;
    let eps = float_or_tensor(cx, args, "eps", f)?;
    let one_ = cx.full(1.0, f, &[]);
    let (mut o_p, mut o_g, mut o_m, mut o_v, mut o_mx) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let pt = params[i];
        let (p, mut g, g_out) = param_and_grad(cx, args, &fs, pt, grads[i], maximize)?;
        let m = cx.cast(exp_avgs[i].v, f);
        let v = cx.cast(exp_avg_sqs[i].v, f);
        // Bias corrections from the (already incremented) step.
        let step = cx.cast(steps[i].v, f);
        let step = cx.reshape(step, &[]);
        let b1s = cx.pow(beta1, step);
        let bc1 = cx.sub(one_, b1s);
        let b2s = cx.pow(beta2, step);
        let bc2 = cx.sub(one_, b2s);
        let bc2_sqrt = cx.sqrt(bc2);
        let mut p_new = p;
        if adamw {
            // param -= lr * weight_decay * param
            let on = bc(cx, fs.wd_on, p);
            let lr_wd = cx.mul(lr, wd);
            let lr_wd = bc(cx, lr_wd, p);
            let t = cx.mul(lr_wd, p);
            let decayed = cx.sub(p, t);
            p_new = cx.select(on, decayed, p);
        } else {
            g = l2_decay(cx, &fs, g, p);
        }
        // exp_avg += (grad - exp_avg) * (1 - beta1)
        let c1 = cx.sub(one_, beta1);
        let c1 = bc(cx, c1, m);
        let d = cx.sub(g, m);
        let d = cx.mul(d, c1);
        let m_new = cx.add(m, d);
        // exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
        let b2 = bc(cx, beta2, v);
        let c2 = cx.sub(one_, beta2);
        let c2 = bc(cx, c2, v);
        let vv = cx.mul(v, b2);
        let gg = cx.mul(c2, g);
        let gg = cx.mul(gg, g);
        let v_new = cx.add(vv, gg);
        let step_size = cx.div(lr, bc1);
        let step_size = bc(cx, step_size, p);
        let bc2s = bc(cx, bc2_sqrt, p);
        let epsb = bc(cx, eps, p);
        let sq_src = if amsgrad {
            let mx = cx.cast(max_sqs[i].v, f);
            let mx_new = crate::blocks::nan::nan_min_max(cx, mx, v_new, true);
            let mx_new = keep_if_skipped(cx, fs.skip, max_sqs[i].v, mx_new);
            o_mx.push(cx.cast(mx_new, max_sqs[i].dtype));
            mx_new
        } else {
            v_new
        };
        let denom = cx.sqrt(sq_src);
        let denom = cx.div(denom, bc2s);
        let denom = cx.add(denom, epsb);
        let upd = cx.mul(step_size, m_new);
        let upd = cx.div(upd, denom);
        let p_new = cx.sub(p_new, upd);
        o_p.push(state_out(cx, &fs, pt, p_new));
        o_g.push(grad_out(cx, &fs, grads[i], g_out));
        o_m.push(state_out(cx, &fs, exp_avgs[i], m_new));
        o_v.push(state_out(cx, &fs, exp_avg_sqs[i], v_new));
    }
    if !amsgrad {
        o_mx = max_sqs.iter().map(|t| t.v).collect();
    }
    Ok(vec![Out::List(o_p), Out::List(o_g), Out::List(o_m), Out::List(o_v), Out::List(o_mx)])
}

/// A GradScaler state tensor: one element of a float (or, for the growth tracker, int32) dtype.
fn amp_state(args: &Args, name: &str, float: bool) -> Result<crate::args::Tensor> {
    let t = args.tensor(name)?;
    let ok = if float { t.dtype == DType::F32 } else { t.dtype == DType::I32 };
    check!(ok, Runtime, "{name} must be a {} tensor.", if float { "float" } else { "int" });
    Ok(t)
}

/// _amp_foreach_non_finite_check_and_unscale_ (GradScaler.unscale_): every gradient times
/// inv_scale; found_inf becomes 1 when any gradient holds an inf or a NaN, else keeps its value.
fn amp_unscale(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let grads = args.tensors("self")?;
    let found = amp_state(args, "found_inf", true)?;
    let inv = amp_state(args, "inv_scale", true)?;
    check!(cx.numel(found.v) == 1, Runtime, "found_inf must be a 1-element tensor.");
    check!(cx.numel(inv.v) == 1, Runtime, "inv_scale must be a 1-element tensor.");
    let f = DType::F32;
    let inv_s = cx.reshape(inv.v, &[]);
    let mut any_bad = cx.b.constant_bool(false);
    let mut out = Vec::with_capacity(grads.len());
    for g in &grads {
        check!(g.dtype.is_float(), Runtime, "_amp_foreach_non_finite_check_and_unscale_: expected floating-point gradients, got {}", g.dtype.torch_name());
        let gf = cx.cast(g.v, f);
        let finite = cx.is_finite(gf);
        let all: Vec<i64> = (0..cx.dims(gf).len() as i64).collect();
        let all_finite = crate::blocks::reduce::reduce(cx, finite, &all, crate::blocks::reduce::Red::And);
        let bad = cx.not(all_finite);
        any_bad = cx.or(any_bad, bad);
        let s = bc(cx, inv_s, gf);
        let scaled = cx.mul(gf, s);
        out.push(cx.cast(scaled, g.dtype));
    }
    let one_ = cx.full(1.0, f, &cx.dims(found.v));
    let bad = bc(cx, any_bad, found.v);
    let new_found = cx.select(bad, one_, found.v);
    Ok(vec![Out::List(out), Out::Tensor(new_found)])
}

/// _amp_update_scale_ (GradScaler.update): after an overflow the scale backs off and the
/// growth tracker restarts; after `growth_interval` clean steps in a row the scale grows
/// (unless that overflows float32).
fn amp_update_scale(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let scale = amp_state(args, "self", true)?;
    let tracker = amp_state(args, "growth_tracker", false)?;
    let found = amp_state(args, "found_inf", true)?;
    for t in [&scale, &tracker, &found] {
        check!(cx.numel(t.v) == 1, Runtime, "current_scale, growth_tracker and found_inf must be 1-element tensors.");
    }
    let f = DType::F32;
    let growth = float_or_tensor(cx, args, "scale_growth_factor", f)?;
    let backoff = float_or_tensor(cx, args, "scale_backoff_factor", f)?;
    let interval = args.int("growth_interval")?;
    let s = cx.reshape(scale.v, &[]);
    let t = cx.reshape(tracker.v, &[]);
    let fi = cx.reshape(found.v, &[]);
    let zero_f = cx.full(0.0, f, &[]);
    let overflow = cx.compare(CmpDir::Ne, fi, zero_f);
    let backed = cx.mul(s, backoff);
    let one_i = cx.full(1.0, DType::I32, &[]);
    let zero_i = cx.full(0.0, DType::I32, &[]);
    let succ = cx.add(t, one_i);
    let target = cx.full(interval as f64, DType::I32, &[]);
    let reached = cx.compare(CmpDir::Eq, succ, target);
    let grown = cx.mul(s, growth);
    let grown_ok = cx.is_finite(grown);
    let grown = cx.select(grown_ok, grown, s);
    let kept = cx.select(reached, grown, s);
    let new_s = cx.select(overflow, backed, kept);
    let counted = cx.select(reached, zero_i, succ);
    let new_t = cx.select(overflow, zero_i, counted);
    let (sd, td) = (cx.dims(scale.v), cx.dims(tracker.v));
    let new_s = cx.reshape(new_s, &sd);
    let new_t = cx.reshape(new_t, &td);
    Ok(vec![Out::Tensor(new_s), Out::Tensor(new_t)])
}

/// _fused_adagrad_: PyTorch's fused Adagrad step (state_steps already incremented), in f32
/// for 16-bit tensors: sum += g^2; param -= lr / (1 + (step - 1) * lr_decay) * g / (sqrt(sum) + eps).
fn fused_adagrad(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (params, grads) = params_and_grads(args)?;
    let sums = args.tensors("state_sums")?;
    let steps = args.tensors("state_steps")?;
    let maximize = args.bool("maximize")?;
    let n = params.len();
    same_len(args, &[("state_sums", &sums), ("state_steps", &steps)], n)?;
    let fs = fused_scalars(cx, args)?;
    let f = DType::F32;
    let lr_decay = float_or_tensor(cx, args, "lr_decay", f)?;
    let eps = float_or_tensor(cx, args, "eps", f)?;
    let one_ = cx.full(1.0, f, &[]);
    let (mut o_p, mut o_g, mut o_s) = (vec![], vec![], vec![]);
    for i in 0..n {
        let pt = params[i];
        let (p, g, g_out) = param_and_grad(cx, args, &fs, pt, grads[i], maximize)?;
        let g = l2_decay(cx, &fs, g, p);
        let step = cx.cast(steps[i].v, f);
        let step = cx.reshape(step, &[]);
        let prev = cx.sub(step, one_);
        let decay = cx.mul(prev, lr_decay);
        let decay = cx.add(one_, decay);
        let clr = cx.div(fs.lr, decay);
        let sum = cx.cast(sums[i].v, f);
        let gg = cx.mul(g, g);
        let sum_new = cx.add(sum, gg);
        let std = cx.sqrt(sum_new);
        let epsb = bc(cx, eps, p);
        let std = cx.add(std, epsb);
        let clr = bc(cx, clr, p);
        let upd = cx.mul(clr, g);
        let upd = cx.div(upd, std);
        let p_new = cx.sub(p, upd);
        o_p.push(state_out(cx, &fs, pt, p_new));
        o_g.push(grad_out(cx, &fs, grads[i], g_out));
        o_s.push(state_out(cx, &fs, sums[i], sum_new));
    }
    let o_steps = steps.iter().map(|t| t.v).collect();
    Ok(vec![Out::List(o_p), Out::List(o_g), Out::List(o_s), Out::List(o_steps)])
}

/// _fused_sgd_: SGD with momentum / nesterov / weight decay as PyTorch's fused kernels do it.
/// An empty momentum_buffer_list means momentum == 0.
fn fused_sgd(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (params, grads) = params_and_grads(args)?;
    let bufs = args.tensors("momentum_buffer_list")?;
    let nesterov = args.bool("nesterov")?;
    let maximize = args.bool("maximize")?;
    let first = args.bool("is_first_step")?;
    let n = params.len();
    let use_momentum = !bufs.is_empty();
    if use_momentum {
        same_len(args, &[("momentum_buffer_list", &bufs)], n)?;
    }
    let fs = fused_scalars(cx, args)?;
    let f = DType::F32;
    let momentum = float_or_tensor(cx, args, "momentum", f)?;
    let dampening = float_or_tensor(cx, args, "dampening", f)?;
    let one_ = cx.full(1.0, f, &[]);
    let (mut o_p, mut o_g, mut o_b) = (vec![], vec![], vec![]);
    for i in 0..n {
        let pt = params[i];
        let (p, g, g_out) = param_and_grad(cx, args, &fs, pt, grads[i], maximize)?;
        let mut g = l2_decay(cx, &fs, g, p);
        if use_momentum {
            let buf_new = if first {
                g
            } else {
                let b = cx.cast(bufs[i].v, f);
                let mom = bc(cx, momentum, b);
                let omd = cx.sub(one_, dampening);
                let omd = bc(cx, omd, b);
                let bm = cx.mul(b, mom);
                let gd = cx.mul(omd, g);
                cx.add(bm, gd)
            };
            g = if nesterov {
                let mom = bc(cx, momentum, buf_new);
                let t = cx.mul(mom, buf_new);
                cx.add(g, t)
            } else {
                buf_new
            };
            o_b.push(state_out(cx, &fs, bufs[i], buf_new));
        }
        let lrb = bc(cx, fs.lr, p);
        let upd = cx.mul(lrb, g);
        let p_new = cx.sub(p, upd);
        o_p.push(state_out(cx, &fs, pt, p_new));
        o_g.push(grad_out(cx, &fs, grads[i], g_out));
    }
    Ok(vec![Out::List(o_p), Out::List(o_g), Out::List(o_b)])
}
