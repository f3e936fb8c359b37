//! Matrix and vector products: mm, bmm, addmm, baddbmm, addbmm, dot, vdot, mv, addmv, trace,
//! and the cross product linalg_cross. matmul, linear, einsum and friends are composites over
//! these.
//!
//! Each product is one dot_general; 16-bit floats accumulate in f32 (PyTorch's CPU kernels do
//! the same) and f32 asks for HIGHEST precision so that GPUs and TPUs do not drop to TF32/bf16
//! passes.
use crate::args::{Args, Scalar, Tensor};
use crate::blocks::contract::contract;
use crate::blocks::type_names::{check_scalar_type, cpp_type_name};
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use super::numel;
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("mm", mm),
    op("bmm", bmm),
    op("dot", dot),
    op("vdot", vdot),
    op("mv", mv),
    op("trace", trace),
    // beta/alpha are compiled in: beta == 0 must ignore `self` (NaN included), like PyTorch.
    op("addmm", addmm).specialized(),
    op("baddbmm", baddbmm).specialized(),
    op("addbmm", addbmm).specialized(),
    op("addmv", addmv).specialized(),
    op("linalg_cross", linalg_cross),
];

// ---- helpers ---------------------------------------------------------------------------------

fn dims_str(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// `self` expanded to `target` like Tensor.expand, with its error messages.
pub(crate) fn expand_to(cx: &mut Cx, t: &Tensor, target: &[i64]) -> Result<Value> {
    let dims = cx.dims(t.v);
    check!(
        dims.len() <= target.len(),
        Runtime,
        "expand(torch.{}Tensor{{{}}}, size={}): the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})",
        t.dtype.torch_name(),
        dims_str(&dims),
        dims_str(target),
        target.len(),
        dims.len()
    );
    let off = target.len() - dims.len();
    for (i, &d) in dims.iter().enumerate() {
        check!(
            d == 1 || d == target[off + i],
            Runtime,
            "The expanded size of the tensor ({}) must match the existing size ({}) at non-singleton dimension {}.  Target sizes: {}.  Tensor sizes: {}",
            target[off + i],
            d,
            off + i,
            dims_str(target),
            dims_str(&dims)
        );
    }
    Ok(cx.broadcast_to(t.v, target))
}

/// A beta/alpha Scalar as PyTorch's kernels see it for `dtype`: integral kernels convert
/// floats by truncation.
fn coef(s: Scalar, dtype: DType) -> Result<Scalar> {
    Ok(match s.to_real(dtype)? {
        Scalar::Float(f) if dtype.is_integral() => Scalar::Int(f.value as i64),
        Scalar::Bool(b) => Scalar::Int(b as i64),
        s => s,
    })
}

fn is_zero(s: Scalar) -> bool {
    match s {
        Scalar::Int(i) => i == 0,
        Scalar::Bool(b) => !b,
        Scalar::Float(f) => f.slot.is_none() && f.value == 0.0,
        Scalar::Complex(re, im) => re == 0.0 && im == 0.0,
    }
}

fn is_one(s: Scalar) -> bool {
    match s {
        Scalar::Int(i) => i == 1,
        Scalar::Bool(b) => b,
        Scalar::Float(f) => f.slot.is_none() && f.value == 1.0,
        Scalar::Complex(re, im) => re == 1.0 && im == 0.0,
    }
}

/// beta * bias + alpha * prod, in prod's (accumulation) dtype, then cast to `dtype`.
/// `bias` is already expanded to prod's dims; beta == 0 ignores it entirely.
fn combine(cx: &mut Cx, args: &Args, prod: Value, bias: Option<Value>, dtype: DType) -> Result<Value> {
    let beta = coef(args.opt_scalar("beta")?.unwrap_or(Scalar::Int(1)), dtype)?;
    let alpha = coef(args.opt_scalar("alpha")?.unwrap_or(Scalar::Int(1)), dtype)?;
    let acc = cx.dtype(prod);
    let dims = cx.dims(prod);
    let mut out = prod;
    if !is_one(alpha) {
        let a = cx.scalar_like(alpha, acc, &dims);
        out = cx.mul(out, a);
    }
    if let Some(bias) = bias {
        if !is_zero(beta) {
            let mut bv = cx.cast(bias, acc);
            if !is_one(beta) {
                let bb = cx.scalar_like(beta, acc, &dims);
                bv = cx.mul(bv, bb);
            }
            out = cx.add(bv, out);
        }
    }
    Ok(cx.cast(out, dtype))
}

/// The `out_dtype` of the `.dtype` overloads (CUDA's rule: same dtype, or f32 from 16-bit).
fn out_dtype(args: &Args, input: DType) -> Result<DType> {
    match args.dtype("out_dtype")? {
        None => Ok(input),
        Some(d) => {
            check!(
                d == input || (d == DType::F32 && matches!(input, DType::F16 | DType::BF16)),
                Runtime,
                "out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs"
            );
            Ok(d)
        }
    }
}

fn not_bool(d: DType, kernel: &str) -> Result<()> {
    check!(d != DType::Bool, NotImplemented, "\"{}\" not implemented for 'Bool'", kernel);
    Ok(())
}

/// addmm/addbmm's dtype checks: `self` (None to skip it) and mat1 against mat2.
fn check_addmm_dtypes(s: Option<DType>, a: DType, b: DType) -> Result<()> {
    if let Some(s) = s {
        check!(
            s == b,
            Runtime,
            "self and mat2 must have the same dtype, but got {} and {}",
            s.torch_name(),
            b.torch_name()
        );
    }
    check!(
        a == b,
        Runtime,
        "mat1 and mat2 must have the same dtype, but got {} and {}",
        a.torch_name(),
        b.torch_name()
    );
    Ok(())
}

// ---- matrix-matrix ---------------------------------------------------------------------------

/// Checks of mm/addmm's two matrices; returns (n, p).
fn check_mm_shapes(cx: &Cx, a: &Tensor, b: &Tensor) -> Result<(i64, i64)> {
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(
        ad[1] == bd[0],
        Runtime,
        "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
        ad[0],
        ad[1],
        bd[0],
        bd[1]
    );
    Ok((ad[0], bd[1]))
}

fn mm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    check!(cx.dims(a.v).len() == 2, Runtime, "self must be a matrix");
    check!(cx.dims(b.v).len() == 2, Runtime, "mat2 must be a matrix");
    check!(
        a.dtype == b.dtype,
        Runtime,
        "expected m1 and m2 to have the same dtype, but got: {} != {}",
        cpp_type_name(a.dtype),
        cpp_type_name(b.dtype)
    );
    check_mm_shapes(cx, &a, &b)?;
    not_bool(a.dtype, "addmm_impl_cpu_")?;
    let dt = out_dtype(args, a.dtype)?;
    let p = contract(cx, a.v, b.v, (&[], &[]), (&[1], &[0]));
    one(cx.cast(p, dt))
}

fn addmm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let s = args.tensor("self")?;
    let a = args.tensor("mat1")?;
    let b = args.tensor("mat2")?;
    check!(cx.dims(a.v).len() == 2, Runtime, "mat1 must be a matrix, got {}-D tensor", cx.dims(a.v).len());
    check!(cx.dims(b.v).len() == 2, Runtime, "mat2 must be a matrix, got {}-D tensor", cx.dims(b.v).len());
    // The out_dtype overload lets self differ.
    check_addmm_dtypes(if args.has("out_dtype") { None } else { Some(s.dtype) }, a.dtype, b.dtype)?;
    let (n, p) = check_mm_shapes(cx, &a, &b)?;
    let bias = expand_to(cx, &s, &[n, p])?;
    not_bool(a.dtype, "addmm_impl_cpu_")?;
    let dt = out_dtype(args, a.dtype)?;
    let prod = contract(cx, a.v, b.v, (&[], &[]), (&[1], &[0]));
    one(combine(cx, args, prod, Some(bias), dt)?)
}

// ---- batched ---------------------------------------------------------------------------------

/// bmm/baddbmm's checks; returns the result dims [b, n, p].
fn check_bmm(cx: &Cx, b1: &Tensor, b2: &Tensor) -> Result<Vec<i64>> {
    check!(cx.dims(b1.v).len() == 3, Runtime, "batch1 must be a 3D tensor");
    check!(cx.dims(b2.v).len() == 3, Runtime, "batch2 must be a 3D tensor");
    let (d1, d2) = (cx.dims(b1.v), cx.dims(b2.v));
    check!(
        d2[0] == d1[0] && d2[1] == d1[2],
        Runtime,
        "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: [{}, {}].",
        d1[0],
        d1[2],
        d2[0],
        d2[1]
    );
    Ok(vec![d1[0], d1[1], d2[2]])
}

fn bmm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    check_bmm(cx, &a, &b)?;
    check_scalar_type(a.dtype, b.dtype)?;
    not_bool(a.dtype, "bmm")?;
    let dt = out_dtype(args, a.dtype)?;
    let p = contract(cx, a.v, b.v, (&[0], &[0]), (&[2], &[1]));
    one(cx.cast(p, dt))
}

fn baddbmm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let s = args.tensor("self")?;
    let a = args.tensor("batch1")?;
    let b = args.tensor("batch2")?;
    // A 2-d batch fails on its size(2) before anything else, as in PyTorch.
    for t in [&a, &b] {
        let nd = cx.dims(t.v).len();
        if nd < 3 {
            crate::cx::wrap_dim(2, nd)?;
        }
    }
    check!(
        args.has("out_dtype") || s.dtype == a.dtype,
        Runtime,
        "Input dtypes must be the same, got: input {}, batch1: {}, batch2: {}",
        cpp_type_name(s.dtype),
        cpp_type_name(a.dtype),
        cpp_type_name(b.dtype)
    );
    let (d1, d2) = (cx.dims(a.v), cx.dims(b.v));
    let target = [d1[0], d1[1], d2[2]];
    let bias = expand_to(cx, &s, &target)?;
    check_bmm(cx, &a, &b)?;
    check_scalar_type(a.dtype, b.dtype)?;
    not_bool(a.dtype, "baddbmm")?;
    let dt = out_dtype(args, a.dtype)?;
    let prod = contract(cx, a.v, b.v, (&[0], &[0]), (&[2], &[1]));
    one(combine(cx, args, prod, Some(bias), dt)?)
}

/// addbmm: beta * self + alpha * sum_i batch1[i] @ batch2[i], one contraction over the batch
/// and inner dims.
fn addbmm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let s = args.tensor("self")?;
    let a = args.tensor("batch1")?;
    let b = args.tensor("batch2")?;
    for (name, t) in [("batch1", &a), ("batch2", &b)] {
        let nd = cx.dims(t.v).len();
        if nd < 3 {
            crate::cx::wrap_dim(2, nd)?;
        }
        check!(nd == 3, Runtime, "{} must be a 3D tensor", name);
    }
    let (d1, d2) = (cx.dims(a.v), cx.dims(b.v));
    check!(
        d1[0] == d2[0],
        Runtime,
        "batch1 and batch2 must have same number of batches, got {} and {}",
        d1[0],
        d2[0]
    );
    check!(
        d1[2] == d2[1],
        Runtime,
        "Incompatible matrix sizes for bmm ({}x{} and {}x{})",
        d1[1],
        d1[2],
        d2[1],
        d2[2]
    );
    check_addmm_dtypes(Some(s.dtype), a.dtype, b.dtype)?;
    let bias = expand_to(cx, &s, &[d1[1], d2[2]])?;
    not_bool(a.dtype, "addmm_impl_cpu_")?;
    let prod = contract(cx, a.v, b.v, (&[], &[]), (&[0, 2], &[0, 1]));
    one(combine(cx, args, prod, Some(bias), a.dtype)?)
}

// ---- vectors ---------------------------------------------------------------------------------

fn dot_common(cx: &mut Cx, a: &Tensor, b: &Tensor) -> Result<Value> {
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(
        ad.len() == 1 && bd.len() == 1,
        Runtime,
        "1D tensors expected, but got {}D and {}D tensors",
        ad.len(),
        bd.len()
    );
    check!(
        a.dtype == b.dtype,
        Runtime,
        "dot : expected both vectors to have same dtype, but found {} and {}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    check!(
        ad[0] == bd[0],
        Runtime,
        "inconsistent tensor size, expected tensor [{}] and src [{}] to have the same number of elements, but got {} and {} elements respectively",
        ad[0],
        bd[0],
        ad[0],
        bd[0]
    );
    not_bool(a.dtype, "dot")?;
    let p = contract(cx, a.v, b.v, (&[], &[]), (&[0], &[0]));
    Ok(cx.cast(p, a.dtype))
}

fn dot(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("tensor")?;
    one(dot_common(cx, &a, &b)?)
}

fn vdot(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("other")?;
    if a.dtype.is_complex() {
        bail!(NotImplemented, "vdot of complex tensors is not supported on tpu yet");
    }
    one(dot_common(cx, &a, &b)?)
}

/// addmv/mv's checks; returns n.
fn check_mv(cx: &Cx, s: Option<&Tensor>, m: &Tensor, v: &Tensor) -> Result<i64> {
    let (md, vd) = (cx.dims(m.v), cx.dims(v.v));
    let sd = s.map(|s| cx.dims(s.v));
    let s_rank = sd.as_ref().map_or(1, |d| d.len());
    check!(
        (s_rank == 1 || s_rank == 0) && md.len() == 2 && vd.len() == 1,
        Runtime,
        "vector + matrix @ vector expected, got {}, {}, {}",
        s_rank,
        md.len(),
        vd.len()
    );
    let n = md[0];
    let s_ok = sd.as_ref().is_none_or(|d| d.is_empty() || d[0] == n || d[0] == 1);
    check!(
        md[1] == vd[0] && s_ok,
        Runtime,
        "size mismatch, got input ({}), mat ({}x{}), vec ({})",
        sd.as_ref().map_or(n, |d| if d.is_empty() { 1 } else { d[0] }),
        md[0],
        md[1],
        vd[0]
    );
    if crate::torch_version::addmv_names_all_dtypes() {
        // mv's result (the "input" here) takes the vector's dtype.
        let sdt = s.map_or(v.dtype, |s| s.dtype);
        check!(
            sdt == m.dtype && m.dtype == v.dtype,
            Runtime,
            "addmv input tensors must have the same dtype, but got {}, {}, and {}",
            sdt.torch_name(),
            m.dtype.torch_name(),
            v.dtype.torch_name()
        );
    } else {
        check_scalar_type(m.dtype, v.dtype)?;
    }
    not_bool(m.dtype, "addmv_impl_cpu")?;
    Ok(n)
}

fn mv(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let m = args.tensor("self")?;
    let v = args.tensor("vec")?;
    check_mv(cx, None, &m, &v)?;
    let p = contract(cx, m.v, v.v, (&[], &[]), (&[1], &[0]));
    one(cx.cast(p, m.dtype))
}

fn addmv(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let s = args.tensor("self")?;
    let m = args.tensor("mat")?;
    let v = args.tensor("vec")?;
    let n = check_mv(cx, Some(&s), &m, &v)?;
    let bias = cx.broadcast_to(s.v, &[n]);
    let prod = contract(cx, m.v, v.v, (&[], &[]), (&[1], &[0]));
    one(combine(cx, args, prod, Some(bias), m.dtype)?)
}

/// trace(self): the sum of the main diagonal of a matrix; integers sum as Long.
fn trace(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    check!(dims.len() == 2, Runtime, "trace: expected a matrix, but got tensor with dim {}", dims.len());
    let half = matches!(x.dtype, DType::BF16 | DType::F16);
    check!(
        x.dtype != DType::Bool && (!half || crate::torch_version::trace_has_16_bit_floats()),
        NotImplemented,
        "\"trace\" not implemented for '{}'",
        x.dtype.torch_name()
    );
    // 16-bit floats add up in float32 and round once, as CPU's kernel accumulates.
    let dt = if x.dtype.is_integral() { DType::I64 } else if half { DType::F32 } else { x.dtype };
    let v = cx.cast(x.v, dt);
    let ty = TensorType::new(ElemType::I64, &dims);
    let rows = cx.iota(&ty, 0);
    let cols = cx.iota(&ty, 1);
    let diag = cx.compare(CmpDir::Eq, rows, cols);
    let zeros = cx.full(0.0, dt, &dims);
    let v = cx.select(diag, v, zeros);
    let zero = cx.b.constant_f64(0.0, dt.elem());
    let r = cx.reduce(&[v], &[zero], &[0, 1], |b, a| vec![b.add(a[0], a[1])]);
    one(if half { cx.cast(r[0], x.dtype) } else { r[0] })
}

// ---- cross product ---------------------------------------------------------------------------

/// linalg_cross(self, other, dim): the cross product of 3-vectors along `dim`, broadcast.
fn linalg_cross(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("other")?;
    let (da, db) = (cx.dims(a.v), cx.dims(b.v));
    check!(da.len() == db.len(), Runtime, "linalg.cross: inputs must have the same number of dimensions.");
    check!(
        a.dtype == b.dtype,
        Runtime,
        "expected scalar type {} but found {}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    let shape = crate::broadcast_shapes(&[da.clone(), db.clone()])?;
    let given = args.int_or("dim", -1)?;
    let dim = wrap_dim(given, shape.len())?;
    check!(
        da[dim] == 3 && db[dim] == 3,
        Runtime,
        "linalg.cross: inputs dimension {} must have length 3. Got {} and {}",
        given,
        da[dim],
        db[dim]
    );
    let x = cx.broadcast_to(a.v, &shape);
    let y = cx.broadcast_to(b.v, &shape);
    if numel(&shape) == 0 {
        return one(x);
    }
    let r = shape.len();
    let comp = |cx: &mut Cx, v: Value, i: i64| {
        let mut s = vec![0; r];
        let mut l = shape.clone();
        s[dim] = i;
        l[dim] = i + 1;
        cx.slice(v, &s, &l, &vec![1; r])
    };
    let xs: Vec<Value> = (0..3).map(|i| comp(cx, x, i)).collect();
    let ys: Vec<Value> = (0..3).map(|i| comp(cx, y, i)).collect();
    let mut parts = Vec::new();
    for (i, j) in [(1, 2), (2, 0), (0, 1)] {
        let p = cx.mul(xs[i], ys[j]);
        let q = cx.mul(xs[j], ys[i]);
        parts.push(cx.sub(p, q));
    }
    one(cx.concatenate(&parts, dim as i64))
}
