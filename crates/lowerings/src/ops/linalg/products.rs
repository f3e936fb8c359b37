//! Matrix products: mm, bmm, addmm, baddbmm, addbmm, dot, vdot, mv, addmv. Each is one
//! dot_general; 16-bit floats accumulate in f32 (PyTorch's CPU kernels do the same) and f32
//! asks for HIGHEST precision so that GPUs and TPUs do not drop to TF32/bf16 passes.
//! matmul, linear, einsum and friends are composites over these.
//!
//! Also the factorizations whose LAPACK results PyTorch returns as they are, reproduced step for
//! step: LDL^T with Bunch-Kaufman pivoting (sytrf/hetrf and sytrs/hetrs), and the real
//! nonsymmetric eigenproblem (geev: balancing, Hessenberg reduction, Francis double-shift QR,
//! eigenvectors of the Schur form, LAPACK's normalization), whose eigenvalue order and
//! eigenvector phases only the same sequence of steps reproduces.
// cabs1 is LAPACK's name for decomp's pivot magnitude, |re| + |im|.
use crate::ops::linalg::{
    any_over, bcast as bc, check_float_or_complex, check_lapack_dtype, check_square, conj as conj_of, first_argmax, iota as idx,
    max as max_over, pivot_magnitude as cabs1, splat as spl, sum as sum_over, to_elem as as_elem,
};
use crate::args::{Args, Scalar, Tensor};
use crate::blocks::contract::contract;
use crate::blocks::loops::select_all;
use crate::blocks::type_names::{check_scalar_type, cpp_type_name};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, Registry};
use stablehlo::{Builder, CmpDir, ElemType, Precision, TensorType, Value};

pub fn register(r: &mut Registry) {
    r.add("mm", mm);
    r.add("bmm", bmm);
    r.add("dot", dot);
    r.add("vdot", vdot);
    r.add("mv", mv);
    r.add("trace", trace);
    // beta/alpha are compiled in: beta == 0 must ignore `self` (NaN included), like PyTorch.
    r.add_specialized("addmm", addmm);
    r.add_specialized("baddbmm", baddbmm);
    r.add_specialized("addbmm", addbmm);
    r.add_specialized("addmv", addmv);
    // With check_errors, the size program finds the first failed factorization.
    r.add_sized("linalg_ldl_factor_ex", ldl_factor_failure, linalg_ldl_factor_ex);
    r.add("linalg_ldl_solve", linalg_ldl_solve);
    // linalg.eig raises for non-finite input: its size program checks.
    r.add_sized("linalg_eig", eig_nonfinite, linalg_eig);
    r.add("_linalg_eigvals", linalg_eigvals);
}

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
fn coef(s: Scalar, dtype: DType) -> Scalar {
    match s {
        Scalar::Float(f) if dtype.is_integral() => Scalar::Int(f.value as i64),
        Scalar::Bool(b) => Scalar::Int(b as i64),
        s => s,
    }
}

fn is_zero(s: Scalar) -> bool {
    match s {
        Scalar::Int(i) => i == 0,
        Scalar::Bool(b) => !b,
        Scalar::Float(f) => f.slot.is_none() && f.value == 0.0,
    }
}

fn is_one(s: Scalar) -> bool {
    match s {
        Scalar::Int(i) => i == 1,
        Scalar::Bool(b) => b,
        Scalar::Float(f) => f.slot.is_none() && f.value == 1.0,
    }
}

/// beta * bias + alpha * prod, in prod's (accumulation) dtype, then cast to `dtype`.
/// `bias` is already expanded to prod's dims; beta == 0 ignores it entirely.
fn combine(cx: &mut Cx, args: &Args, prod: Value, bias: Option<Value>, dtype: DType) -> Result<Value> {
    let beta = coef(args.opt_scalar("beta")?.unwrap_or(Scalar::Int(1)), dtype);
    let alpha = coef(args.opt_scalar("alpha")?.unwrap_or(Scalar::Int(1)), dtype);
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

// ---- batches of matrices: small builders --------------------------------------------------------

const I64E: ElemType = ElemType::I64;

/// An int64 splat (loop counters and indices, one per batch element).
fn ispl(b: &mut Builder, x: i64, dims: &[i64]) -> Value {
    b.splat_i64(x, &TensorType::new(I64E, dims))
}

/// A complex splat x + x i of the real type `re` (complex zeros, or NaN + NaN i).
fn cspl(b: &mut Builder, x: f64, re: ElemType, dims: &[i64]) -> Value {
    let v = spl(b, x, re, dims);
    b.complex(v, v)
}

/// The real part as the same element type (the diagonal of a Hermitian matrix).
fn real_as_is(b: &mut Builder, x: Value) -> Value {
    let e = b.elem(x);
    if !e.is_complex() {
        return x;
    }
    let re = b.real(x);
    as_elem(b, re, e)
}

/// The entries of `v` at index `at` along `axis`, that axis dropped, read by a masked sum (0
/// when out of range). `at` is 0-d, or holds one index per batch element (v's dim 0).
/// pick/pick_col/pick_row/pick1 and swap_lines all read lines this way.
fn take_at(b: &mut Builder, v: Value, at: Value, axis: usize) -> Value {
    let d = b.dims(v).to_vec();
    let at_dims: &[i64] = if b.dims(at).is_empty() { &[] } else { &[0] };
    let pos = idx(b, &d, axis);
    let a = bc(b, at, &d, at_dims);
    let on = b.compare(CmpDir::Eq, pos, a);
    let z = spl(b, 0.0, b.elem(v), &d);
    let m = b.select(on, v, z);
    sum_over(b, m, &[axis as i64])
}

/// v[b, idx_b] of v [B, n] (idx [B], int64; 0 when out of range).
fn pick(b: &mut Builder, v: Value, at: Value) -> Value {
    take_at(b, v, at, 1)
}

/// Column idx_b of each matrix of m [B, n, n] as [B, n].
fn pick_col(b: &mut Builder, m: Value, at: Value) -> Value {
    take_at(b, m, at, 2)
}

/// Row idx_b of each matrix of m [B, n, k] as [B, k].
fn pick_row(b: &mut Builder, m: Value, at: Value) -> Value {
    take_at(b, m, at, 1)
}

/// v[idx] of a 1-d v (idx a 0-d int64).
fn pick1(b: &mut Builder, v: Value, at: Value) -> Value {
    take_at(b, v, at, 0)
}

/// `m` with its lines i1 and i2 along `axis` exchanged: rows (0) or columns (1) of one matrix
/// with 0-d indices, or rows (1) or columns (2) of each matrix of a batch [B, r, c] with
/// indices [B]. Callers mask the result where only part of the matrix may change.
fn swap_lines(b: &mut Builder, m: Value, i1: Value, i2: Value, axis: usize) -> Value {
    let d = b.dims(m).to_vec();
    let at_dims: &[i64] = if b.dims(i1).is_empty() { &[] } else { &[0] };
    let rest: Vec<i64> = (0..d.len() as i64).filter(|&k| k != axis as i64).collect();
    let pos = idx(b, &d, axis);
    let a1 = bc(b, i1, &d, at_dims);
    let a2 = bc(b, i2, &d, at_dims);
    let l1 = take_at(b, m, i1, axis);
    let l2 = take_at(b, m, i2, axis);
    let l1 = bc(b, l1, &d, &rest);
    let l2 = bc(b, l2, &d, &rest);
    let is1 = b.compare(CmpDir::Eq, pos, a1);
    let is2 = b.compare(CmpDir::Eq, pos, a2);
    let y = b.select(is1, l2, m);
    b.select(is2, l1, y)
}

/// The full symmetric (Hermitian: conjugated, real diagonal) matrix whose lower triangle is
/// that of m [B, n, n].
fn from_lower(b: &mut Builder, m: Value, hermitian: bool) -> Value {
    let d = b.dims(m).to_vec();
    let r = idx(b, &d, 1);
    let c = idx(b, &d, 2);
    let t = b.transpose(m, &[0, 2, 1]);
    let t = if hermitian { conj_of(b, t) } else { t };
    let below = b.compare(CmpDir::Ge, r, c);
    let full = b.select(below, m, t);
    if hermitian {
        let on = b.compare(CmpDir::Eq, r, c);
        let re = real_as_is(b, full);
        b.select(on, re, full)
    } else {
        full
    }
}

/// Leading batch dims flattened: ([B, r, c] value, batch dims).
fn flat_batch(cx: &mut Cx, v: Value) -> (Value, Vec<i64>) {
    let d = cx.dims(v);
    let r = d.len();
    let batch = d[..r - 2].to_vec();
    let bs: i64 = batch.iter().product();
    (cx.reshape(v, &[bs, d[r - 2], d[r - 1]]), batch)
}

fn with_batch(cx: &mut Cx, v: Value, batch: &[i64]) -> Value {
    let d = cx.dims(v);
    let mut out = batch.to_vec();
    out.extend_from_slice(&d[1..]);
    cx.reshape(v, &out)
}


// ---- LDL^T (Bunch-Kaufman) ------------------------------------------------------------------------

/// Bunch-Kaufman's alpha = (1 + sqrt(17)) / 8 in the working precision.
fn bk_alpha(e: ElemType) -> f64 {
    if e.real_type() == ElemType::F64 {
        (1.0 + 17f64.sqrt()) / 8.0
    } else {
        ((1.0f32 + 17f32.sqrt()) / 8.0f32) as f64
    }
}

/// Where both the row and the column of [B, n, n] compare `dir` to k3 (k per batch element,
/// broadcast to `d3`): the trailing matrix a step of sytf2 swaps or updates.
fn trailing_mask(b: &mut Builder, d3: &[i64], k3: Value, dir: CmpDir) -> Value {
    let r3 = idx(b, d3, 1);
    let c3 = idx(b, d3, 2);
    let rk = b.compare(dir, r3, k3);
    let ck = b.compare(dir, c3, k3);
    b.and(rk, ck)
}

/// 1 / d for the 1x1 pivots d [B]; a Hermitian D has a real diagonal, so only the real part is
/// inverted (sytf2/hetf2 scale by it, sytrs/hetrs divide by it).
fn recip_pivot(b: &mut Builder, d: Value, hermitian: bool) -> Value {
    let e = b.elem(d);
    let dims = b.dims(d).to_vec();
    if hermitian {
        let r = b.real(d);
        let one = spl(b, 1.0, e.real_type(), &dims);
        let q = b.div(one, r);
        as_elem(b, q, e)
    } else {
        let one = spl(b, 1.0, e, &dims);
        b.div(one, d)
    }
}

/// LAPACK's ?sytf2 / ?hetf2 with uplo = 'L' on a batch [B, n, n] (read from the lower triangle):
/// each step picks a 1x1 or 2x2 pivot by Bunch-Kaufman's test, swaps it into place within the
/// trailing matrix and updates that matrix. Returns (LD with L's multipliers and D below and on
/// the diagonal, zeros above; LAPACK's pivots [B, n] (int32, 1-based, negative for 2x2 blocks);
/// info [B] (int32: the first zero pivot column)). Each batch element advances its own column.
fn ldl_factor(b: &mut Builder, a: Value, hermitian: bool) -> (Value, Value, Value) {
    let d3 = b.dims(a).to_vec();
    let (bs, n) = (d3[0], d3[1]);
    let e = b.elem(a);
    let re = e.real_type();
    let hermitian = hermitian && e.is_complex();
    let s0 = from_lower(b, a, hermitian);
    let piv0 = b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs, n]));
    let info0 = b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs]));
    let k0 = ispl(b, 0, &[bs]);
    let alpha = bk_alpha(e);
    // The magnitude Bunch-Kaufman compares a diagonal entry by (a Hermitian diagonal is real).
    let diag_mag = |b: &mut Builder, x: Value| -> Value {
        if hermitian {
            let r = b.real(x);
            b.abs(r)
        } else {
            cabs1(b, x)
        }
    };
    let out = b.while_loop(
        &[k0, s0, piv0, info0],
        |b, v| {
            let nn = ispl(b, n, &[bs]);
            let lt = b.compare(CmpDir::Lt, v[0], nn);
            any_over(b, lt, &[0])
        },
        |b, v| {
            let (k, s, piv, info) = (v[0], v[1], v[2], v[3]);
            let d2 = [bs, n];
            let one = ispl(b, 1, &[bs]);
            let nm1 = ispl(b, n - 1, &[bs]);
            let nn = ispl(b, n, &[bs]);
            let active = b.compare(CmpDir::Lt, k, nn);
            let kc = b.min(k, nm1);
            let rows2 = idx(b, &d2, 1);
            let k2 = bc(b, kc, &d2, &[0]);
            let neg = spl(b, -1.0, re, &d2);
            // Column k, its diagonal and the largest entry below it.
            let colk = pick_col(b, s, kc);
            let akk = pick(b, colk, kc);
            let absakk = diag_mag(b, akk);
            let below_k = b.compare(CmpDir::Gt, rows2, k2);
            let mags = cabs1(b, colk);
            let mags = b.select(below_k, mags, neg);
            let (imax, colmax) = first_argmax(b, mags, 1, -1.0);
            let zr = spl(b, 0.0, re, &[bs]);
            let colmax = b.max(colmax, zr);
            let imax = b.min(imax, nm1);
            // The largest off-diagonal entry of row/column imax in the trailing matrix.
            let rowi = pick_row(b, s, imax);
            let i2 = bc(b, imax, &d2, &[0]);
            let ge_k = b.compare(CmpDir::Ge, rows2, k2);
            let ne_i = b.compare(CmpDir::Ne, rows2, i2);
            let off = b.and(ge_k, ne_i);
            let rmag = cabs1(b, rowi);
            let rmag = b.select(off, rmag, neg);
            let rowmax = max_over(b, rmag, &[1]);
            let aii = pick(b, rowi, imax);
            let absaii = diag_mag(b, aii);
            // Bunch-Kaufman's choice.
            let mx = b.max(absakk, colmax);
            let is_zero = b.compare(CmpDir::Eq, mx, zr);
            let nan = b.compare(CmpDir::Ne, absakk, absakk);
            let zero_col = b.or(is_zero, nan);
            let al = spl(b, alpha, re, &[bs]);
            let acol = b.mul(al, colmax);
            let case_a = b.compare(CmpDir::Ge, absakk, acol);
            let ratio = b.div(colmax, rowmax);
            let t = b.mul(acol, ratio);
            let case_b = b.compare(CmpDir::Ge, absakk, t);
            let arow = b.mul(al, rowmax);
            let case_c = b.compare(CmpDir::Ge, absaii, arow);
            let keep_k = b.or(case_a, case_b);
            let keep_k = b.or(keep_k, zero_col);
            let one_by_one = b.or(keep_k, case_c);
            let kp = b.select(keep_k, kc, imax);
            let two = ispl(b, 2, &[bs]);
            let kstep = b.select(one_by_one, one, two);
            let kk = b.add(kc, kstep);
            let kk = b.sub(kk, one);
            // Symmetric interchange of kk and kp within the trailing matrix (rows, cols >= k).
            let swap = b.compare(CmpDir::Ne, kp, kk);
            let swap = b.and(swap, active);
            let s = {
                let d3 = [bs, n, n];
                let p = swap_lines(b, s, kk, kp, 1);
                let p = swap_lines(b, p, kk, kp, 2);
                let k3 = bc(b, kc, &d3, &[0]);
                let trailing = trailing_mask(b, &d3, k3, CmpDir::Ge);
                let sw3 = bc(b, swap, &d3, &[0]);
                let use_p = b.and(trailing, sw3);
                b.select(use_p, p, s)
            };
            // The update of the trailing matrix.
            let d3 = [bs, n, n];
            let r3 = idx(b, &d3, 1);
            let c3 = idx(b, &d3, 2);
            let k3 = bc(b, kc, &d3, &[0]);
            let colk = pick_col(b, s, kc);
            let colk1 = {
                let kc1 = b.add(kc, one);
                let kc1 = b.min(kc1, nm1);
                pick_col(b, s, kc1)
            };
            let dkk = pick(b, colk, kc);
            let upd1 = {
                // 1x1: A(i, j) += x_i * (-1/d * x_j) for i, j > k; column k scaled by 1/d.
                let dinv = recip_pivot(b, dkk, hermitian);
                let z2 = spl(b, 0.0, e, &d2);
                let x = b.select(below_k, colk, z2);
                let xj = if hermitian { conj_of(b, x) } else { x };
                let ndinv = b.neg(dinv);
                let nd2 = bc(b, ndinv, &d2, &[0]);
                let temp = b.mul(nd2, xj);
                let xi3 = bc(b, x, &d3, &[0, 1]);
                let t3 = bc(b, temp, &d3, &[0, 2]);
                let prod = b.mul(xi3, t3);
                let upd = b.add(s, prod);
                let trailing = trailing_mask(b, &d3, k3, CmpDir::Gt);
                let upd = b.select(trailing, upd, s);
                let d2b = bc(b, dinv, &d2, &[0]);
                let scaled = b.mul(x, d2b);
                let scaled3 = bc(b, scaled, &d3, &[0, 1]);
                let at_k = b.compare(CmpDir::Eq, c3, k3);
                let below3 = b.compare(CmpDir::Gt, r3, k3);
                let store = b.and(at_k, below3);
                b.select(store, scaled3, upd)
            };
            let upd2 = {
                // 2x2: with d21 = A(k+1, k), W = (x y) D^-1 for the columns x, y below k + 1.
                let kc1 = b.add(kc, one);
                let kc1 = b.min(kc1, nm1);
                let d21 = pick(b, colk, kc1);
                let dk1k1 = pick(b, colk1, kc1);
                let k1 = b.add(kc, one);
                let k12 = bc(b, k1, &d2, &[0]);
                let below_k1 = b.compare(CmpDir::Gt, rows2, k12);
                let z2 = spl(b, 0.0, e, &d2);
                let x = b.select(below_k1, colk, z2);
                let y = b.select(below_k1, colk1, z2);
                let (wk, wkp1) = if hermitian {
                    let dd = b.abs(d21);
                    let r11 = b.real(dk1k1);
                    let r22 = b.real(dkk);
                    let d11 = b.div(r11, dd);
                    let d22 = b.div(r22, dd);
                    let onev = spl(b, 1.0, re, &[bs]);
                    let pr = b.mul(d11, d22);
                    let pr = b.sub(pr, onev);
                    let tt = b.div(onev, pr);
                    let dd2 = as_elem(b, dd, e);
                    let d21n = b.div(d21, dd2);
                    let dscale = b.div(tt, dd);
                    let dscale = as_elem(b, dscale, e);
                    let d11e = as_elem(b, d11, e);
                    let d22e = as_elem(b, d22, e);
                    let d11v = bc(b, d11e, &d2, &[0]);
                    let d22v = bc(b, d22e, &d2, &[0]);
                    let d21v = bc(b, d21n, &d2, &[0]);
                    let d21c = conj_of(b, d21n);
                    let d21cv = bc(b, d21c, &d2, &[0]);
                    let ds = bc(b, dscale, &d2, &[0]);
                    let a1 = b.mul(d11v, x);
                    let a2 = b.mul(d21v, y);
                    let w = b.sub(a1, a2);
                    let wk = b.mul(ds, w);
                    let b1 = b.mul(d22v, y);
                    let b2 = b.mul(d21cv, x);
                    let w1 = b.sub(b1, b2);
                    let wkp1 = b.mul(ds, w1);
                    (wk, wkp1)
                } else {
                    let d11 = b.div(dk1k1, d21);
                    let d22 = b.div(dkk, d21);
                    let onev = spl(b, 1.0, e, &[bs]);
                    let pr = b.mul(d11, d22);
                    let pr = b.sub(pr, onev);
                    let t = b.div(onev, pr);
                    let dsc = b.div(t, d21);
                    let d11v = bc(b, d11, &d2, &[0]);
                    let d22v = bc(b, d22, &d2, &[0]);
                    let ds = bc(b, dsc, &d2, &[0]);
                    let a1 = b.mul(d11v, x);
                    let w = b.sub(a1, y);
                    let wk = b.mul(ds, w);
                    let b1 = b.mul(d22v, y);
                    let w1 = b.sub(b1, x);
                    let wkp1 = b.mul(ds, w1);
                    (wk, wkp1)
                };
                let (wkj, wkp1j) = if hermitian { (conj_of(b, wk), conj_of(b, wkp1)) } else { (wk, wkp1) };
                let xi3 = bc(b, x, &d3, &[0, 1]);
                let yi3 = bc(b, y, &d3, &[0, 1]);
                let wk3 = bc(b, wkj, &d3, &[0, 2]);
                let wkp13 = bc(b, wkp1j, &d3, &[0, 2]);
                let p1 = b.mul(xi3, wk3);
                let p2 = b.mul(yi3, wkp13);
                let u = b.sub(s, p1);
                let u = b.sub(u, p2);
                let k13 = bc(b, k1, &d3, &[0]);
                let trailing = trailing_mask(b, &d3, k13, CmpDir::Gt);
                let u = b.select(trailing, u, s);
                let below3 = b.compare(CmpDir::Gt, r3, k13);
                let at_k = b.compare(CmpDir::Eq, c3, k3);
                let at_k1 = b.compare(CmpDir::Eq, c3, k13);
                let st0 = b.and(at_k, below3);
                let st1 = b.and(at_k1, below3);
                let wk3c = bc(b, wk, &d3, &[0, 1]);
                let wkp13c = bc(b, wkp1, &d3, &[0, 1]);
                let u = b.select(st0, wk3c, u);
                b.select(st1, wkp13c, u)
            };
            let ob3 = bc(b, one_by_one, &d3, &[0]);
            let upd = b.select(ob3, upd1, upd2);
            let skip = b.not(active);
            let skip = b.or(skip, zero_col);
            let skip3 = bc(b, skip, &d3, &[0]);
            let s_new = b.select(skip3, s, upd);
            // Re-symmetrize from the lower triangle (the products above are not symmetric
            // bit for bit).
            let s_new = from_lower(b, s_new, hermitian);
            // Pivots and info.
            let kp1 = b.add(kp, one);
            let kp1 = b.convert(kp1, ElemType::I32);
            let nkp1 = b.neg(kp1);
            let pv = b.select(one_by_one, kp1, nkp1);
            let pv2 = bc(b, pv, &d2, &[0]);
            let at_k = b.compare(CmpDir::Eq, rows2, k2);
            let k1 = b.add(kc, one);
            let k12 = bc(b, k1, &d2, &[0]);
            let at_k1 = b.compare(CmpDir::Eq, rows2, k12);
            let ob2 = bc(b, one_by_one, &d2, &[0]);
            let tb2 = b.not(ob2);
            let at_k1 = b.and(at_k1, tb2);
            let set = b.or(at_k, at_k1);
            let act2 = bc(b, active, &d2, &[0]);
            let set = b.and(set, act2);
            let piv = b.select(set, pv2, piv);
            let zi = b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs]));
            let first = b.compare(CmpDir::Eq, info, zi);
            let first = b.and(first, zero_col);
            let first = b.and(first, active);
            let kinfo = b.add(kc, one);
            let kinfo = b.convert(kinfo, ElemType::I32);
            let info = b.select(first, kinfo, info);
            let k_next = b.add(k, kstep);
            let k_next = b.select(active, k_next, k);
            vec![k_next, s_new, piv, info]
        },
    );
    let ld = {
        let s = out[1];
        let d = b.dims(s).to_vec();
        let r = idx(b, &d, 1);
        let c = idx(b, &d, 2);
        let low = b.compare(CmpDir::Ge, r, c);
        let z = spl(b, 0.0, e, &d);
        b.select(low, s, z)
    };
    (ld, out[2], out[3])
}

/// linalg_ldl_factor_ex(self, hermitian, check_errors) -> (LD, pivots, info): LAPACK's sytrf
/// (hetrf for complex Hermitian) with uplo = 'L', as PyTorch returns it (LD has zeros above the
/// diagonal; info > 0 marks a singular D).
fn linalg_ldl_factor_ex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let api = "torch.linalg.ldl_factor_ex";
    check_square(cx, &a, api)?;
    check_float_or_complex(&a, api)?;
    check_lapack_dtype(a.dtype, "ldl_factor_cpu")?;
    let hermitian = args.bool_or("hermitian", false)?;
    let d = cx.dims(a.v);
    let n = d[d.len() - 1];
    let (m, batch) = flat_batch(cx, a.v);
    let bs: i64 = batch.iter().product();
    if bs == 0 || n == 0 {
        let piv = cx.b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs, n]));
        let info = cx.b.splat_i64(0, &TensorType::new(ElemType::I32, &[bs]));
        let piv = cx.reshape(piv, &d[..d.len() - 1]);
        let info = cx.reshape(info, &batch);
        return Ok(vec![Out::Tensor(a.v), Out::Tensor(piv), Out::Tensor(info)]);
    }
    let (ld, piv, info) = ldl_factor(cx, m, hermitian);
    let ld = with_batch(cx, ld, &batch);
    let piv = cx.reshape(piv, &d[..d.len() - 1]);
    let info = cx.reshape(info, &batch);
    let code = args.int_or("__size", 0)?;
    if code != 0 {
        // PyTorch's _linalg_check_errors has no message for sytrf's info (an internal assert).
        let (bi, order) = (code / (n + 1), code % (n + 1));
        let batch_str = if d.len() > 2 { format!(": (Batch element {bi})") } else { String::new() };
        bail!(Runtime, "{}{}: Unknown error code: {}.", api, batch_str, order);
    }
    Ok(vec![Out::Tensor(ld), Out::Tensor(piv), Out::Tensor(info)])
}

/// The size program of linalg_ldl_factor_ex: 0 unless check_errors is set and some matrix has
/// info > 0; then bi * (n + 1) + info of the first such batch element bi.
fn ldl_factor_failure(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let z = cx.b.constant_i64(0, I64E);
    let a = args.tensor("self")?;
    let d = cx.dims(a.v);
    if !args.bool_or("check_errors", false)? || d.len() < 2 || d[d.len() - 1] != d[d.len() - 2] || !matches!(a.dtype, DType::F32 | DType::F64 | DType::C64 | DType::C128) {
        return one(z);
    }
    let n = d[d.len() - 1];
    let (m, batch) = flat_batch(cx, a.v);
    let bs: i64 = batch.iter().product();
    if bs == 0 || n == 0 {
        return one(z);
    }
    let (_, _, info) = ldl_factor(cx, m, args.bool_or("hermitian", false)?);
    let info = cx.convert(info, I64E);
    let i = cx.b.iota(&TensorType::new(I64E, &[bs]), 0);
    let np1 = ispl(cx, n + 1, &[bs]);
    let code = cx.mul(i, np1);
    let code = cx.add(code, info);
    let zero = ispl(cx, 0, &[bs]);
    let failed = cx.compare(CmpDir::Ne, info, zero);
    let big = ispl(cx, i64::MAX, &[bs]);
    let code = cx.select(failed, code, big);
    let mx = cx.b.constant_i64(i64::MAX, I64E);
    let first = cx.reduce(&[code], &[mx], &[0], |b, v| vec![b.min(v[0], v[1])])[0];
    let none = cx.compare(CmpDir::Eq, first, mx);
    one(cx.select(none, z, first))
}

/// LAPACK's ?sytrs / ?hetrs with uplo = 'L': solves A X = B for A = L D L^T (L D L^H) given by
/// sytrf's LD and pivots, on batches LD [B, n, n], piv [B, n] (int64), rhs [B, n, k]. A forward
/// sweep applies each interchange, eliminates below the (1x1 or 2x2) block and divides by it;
/// a backward sweep applies L^T and the interchanges in reverse.
fn ldl_solve_core(b: &mut Builder, ld: Value, piv: Value, rhs: Value, hermitian: bool) -> Value {
    let d = b.dims(rhs).to_vec();
    let (bs, n, nr) = (d[0], d[1], d[2]);
    let e = b.elem(rhs);
    let hermitian = hermitian && e.is_complex();
    let d2 = [bs, n];
    let d3 = [bs, n, nr];
    let sc = |b: &mut Builder, x: i64| ispl(b, x, &[bs]);
    // Swap rows r1 and r2 (per batch) of x [B, n, nr] where `on`.
    let swap_rows = |b: &mut Builder, x: Value, r1: Value, r2: Value, on: Value| -> Value {
        let y = swap_lines(b, x, r1, r2, 1);
        let on3 = bc(b, on, &d3, &[0]);
        b.select(on3, y, x)
    };
    // Forward: L D X = B.
    let k0 = sc(b, 0);
    let fwd = b.while_loop(
        &[k0, rhs],
        |b, v| {
            let nn = sc(b, n);
            let lt = b.compare(CmpDir::Lt, v[0], nn);
            any_over(b, lt, &[0])
        },
        |b, v| {
            let (k, x) = (v[0], v[1]);
            let one = sc(b, 1);
            let nn = sc(b, n);
            let nm1 = sc(b, n - 1);
            let active = b.compare(CmpDir::Lt, k, nn);
            let kc = b.min(k, nm1);
            let k1 = b.add(kc, one);
            let k1c = b.min(k1, nm1);
            let p = pick(b, piv, kc);
            let zero = sc(b, 0);
            let one_by_one = b.compare(CmpDir::Gt, p, zero);
            let ap = b.abs(p);
            let kp = b.sub(ap, one);
            // Interchange rows k (or k + 1) and kp.
            let target = b.select(one_by_one, kc, k1c);
            let x = swap_rows(b, x, target, kp, active);
            let colk = pick_col(b, ld, kc);
            let colk1 = pick_col(b, ld, k1c);
            let rows2 = idx(b, &d2, 1);
            let k2 = bc(b, kc, &d2, &[0]);
            let k12 = bc(b, k1c, &d2, &[0]);
            let z2 = spl(b, 0.0, e, &d2);
            let rows3 = idx(b, &d3, 1);
            let bk = pick_row(b, x, kc);
            let bk1 = pick_row(b, x, k1c);
            // 1x1: B(i) -= L(i, k) B(k) for i > k, then B(k) /= D(k).
            let x1 = {
                let below = b.compare(CmpDir::Gt, rows2, k2);
                let l = b.select(below, colk, z2);
                let l3 = bc(b, l, &d3, &[0, 1]);
                let bk3 = bc(b, bk, &d3, &[0, 2]);
                let pr = b.mul(l3, bk3);
                let y = b.sub(x, pr);
                let dk = pick(b, colk, kc);
                let s1 = recip_pivot(b, dk, hermitian);
                let s2 = bc(b, s1, &[bs, nr], &[0]);
                let nb = b.mul(bk, s2);
                let nb3 = bc(b, nb, &d3, &[0, 2]);
                let k3 = bc(b, kc, &d3, &[0]);
                let at = b.compare(CmpDir::Eq, rows3, k3);
                b.select(at, nb3, y)
            };
            // 2x2: eliminate with both columns below k + 1, then solve the 2x2 block.
            let x2 = {
                let below = b.compare(CmpDir::Gt, rows2, k12);
                let l0 = b.select(below, colk, z2);
                let l1 = b.select(below, colk1, z2);
                let l03 = bc(b, l0, &d3, &[0, 1]);
                let l13 = bc(b, l1, &d3, &[0, 1]);
                let bk3 = bc(b, bk, &d3, &[0, 2]);
                let bk13 = bc(b, bk1, &d3, &[0, 2]);
                let p0 = b.mul(l03, bk3);
                let y = b.sub(x, p0);
                let p1 = b.mul(l13, bk13);
                let y = b.sub(y, p1);
                let akm1k = pick(b, colk, k1c);
                let akk = pick(b, colk, kc);
                let ak1 = pick(b, colk1, k1c);
                let (akm1, ak, dk_first) = if hermitian {
                    let c = conj_of(b, akm1k);
                    (b.div(akk, c), b.div(ak1, akm1k), c)
                } else {
                    (b.div(akk, akm1k), b.div(ak1, akm1k), akm1k)
                };
                let onev = spl(b, 1.0, e, &[bs]);
                let denom = b.mul(akm1, ak);
                let denom = b.sub(denom, onev);
                let dr = [bs, nr];
                let c1 = bc(b, dk_first, &dr, &[0]);
                let c2 = bc(b, akm1k, &dr, &[0]);
                let bkm1 = b.div(bk, c1);
                let bkk = b.div(bk1, c2);
                let akv = bc(b, ak, &dr, &[0]);
                let akm1v = bc(b, akm1, &dr, &[0]);
                let den = bc(b, denom, &dr, &[0]);
                let t0 = b.mul(akv, bkm1);
                let t0 = b.sub(t0, bkk);
                let n0 = b.div(t0, den);
                let t1 = b.mul(akm1v, bkk);
                let t1 = b.sub(t1, bkm1);
                let n1 = b.div(t1, den);
                let k3 = bc(b, kc, &d3, &[0]);
                let k13 = bc(b, k1c, &d3, &[0]);
                let at0 = b.compare(CmpDir::Eq, rows3, k3);
                let at1 = b.compare(CmpDir::Eq, rows3, k13);
                let n03 = bc(b, n0, &d3, &[0, 2]);
                let n13 = bc(b, n1, &d3, &[0, 2]);
                let y = b.select(at0, n03, y);
                b.select(at1, n13, y)
            };
            let ob3 = bc(b, one_by_one, &d3, &[0]);
            let y = b.select(ob3, x1, x2);
            let act3 = bc(b, active, &d3, &[0]);
            let y = b.select(act3, y, x);
            let two = sc(b, 2);
            let step = b.select(one_by_one, one, two);
            let kn = b.add(k, step);
            let kn = b.select(active, kn, k);
            vec![kn, y]
        },
    );
    // Backward: L^T X = B, from the last row up.
    let kl = sc(b, n - 1);
    let bwd = b.while_loop(
        &[kl, fwd[1]],
        |b, v| {
            let z = sc(b, 0);
            let ge = b.compare(CmpDir::Ge, v[0], z);
            any_over(b, ge, &[0])
        },
        |b, v| {
            let (k, x) = (v[0], v[1]);
            let one = sc(b, 1);
            let zero = sc(b, 0);
            let active = b.compare(CmpDir::Ge, k, zero);
            let kc = b.max(k, zero);
            let km1 = b.sub(kc, one);
            let km1c = b.max(km1, zero);
            let p = pick(b, piv, kc);
            let one_by_one = b.compare(CmpDir::Gt, p, zero);
            let ap = b.abs(p);
            let kp = b.sub(ap, one);
            let rows2 = idx(b, &d2, 1);
            let k2 = bc(b, kc, &d2, &[0]);
            let below = b.compare(CmpDir::Gt, rows2, k2);
            let z2 = spl(b, 0.0, e, &d2);
            let rows3 = idx(b, &d3, 1);
            let k3 = bc(b, kc, &d3, &[0]);
            let below3 = b.compare(CmpDir::Gt, rows3, k3);
            let zero3 = spl(b, 0.0, e, &d3);
            let xb = b.select(below3, x, zero3);
            // B(k) -= sum_{i > k} L(i, k) B(i) (conjugated L for Hermitian).
            let dot = |b: &mut Builder, col: Value| -> Value {
                let l = b.select(below, col, z2);
                let l = if hermitian { conj_of(b, l) } else { l };
                let l3 = bc(b, l, &d3, &[0, 1]);
                let pr = b.mul(l3, xb);
                sum_over(b, pr, &[1])
            };
            let colk = pick_col(b, ld, kc);
            let colkm1 = pick_col(b, ld, km1c);
            let s0 = dot(b, colk);
            let bk = pick_row(b, x, kc);
            let nbk = b.sub(bk, s0);
            let nbk3 = bc(b, nbk, &d3, &[0, 2]);
            let atk = b.compare(CmpDir::Eq, rows3, k3);
            let y = b.select(atk, nbk3, x);
            // 2x2 block (k - 1, k): also row k - 1 with column k - 1.
            let s1 = dot(b, colkm1);
            let bkm1 = pick_row(b, x, km1c);
            let nbkm1 = b.sub(bkm1, s1);
            let nbkm13 = bc(b, nbkm1, &d3, &[0, 2]);
            let km13 = bc(b, km1c, &d3, &[0]);
            let atkm1 = b.compare(CmpDir::Eq, rows3, km13);
            let ob3 = bc(b, one_by_one, &d3, &[0]);
            let two_by_two = b.not(ob3);
            let w = b.and(atkm1, two_by_two);
            let y = b.select(w, nbkm13, y);
            let y = swap_rows(b, y, kc, kp, active);
            let act3 = bc(b, active, &d3, &[0]);
            let y = b.select(act3, y, x);
            let two = sc(b, 2);
            let step = b.select(one_by_one, one, two);
            let kn = b.sub(k, step);
            let kn = b.select(active, kn, k);
            vec![kn, y]
        },
    );
    bwd[1]
}

/// linalg_ldl_solve(LD, pivots, B, hermitian): A X = B for the A that ldl_factor factored,
/// broadcasting the batch dims of LD (and pivots) and B.
fn linalg_ldl_solve(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let ld = args.tensor("LD")?;
    let piv = args.tensor("pivots")?;
    let rhs = args.tensor("B")?;
    let api = "torch.linalg.ldl_solve";
    check_square(cx, &ld, api)?;
    check_float_or_complex(&ld, api)?;
    let ldd = cx.dims(ld.v);
    let bd = cx.dims(rhs.v);
    check!(
        rhs.dtype == ld.dtype,
        Runtime,
        "Expected b and A to have the same dtype, but found b of type {} and A of type {} instead.",
        rhs.dtype.torch_name(),
        ld.dtype.torch_name()
    );
    check!(
        bd.len() >= 2,
        Index,
        "Dimension out of range (expected to be in range of [{}, {}], but got -2)",
        -(bd.len().max(1) as i64),
        bd.len().max(1) as i64 - 1
    );
    check!(
        ldd[ldd.len() - 1] == bd[bd.len() - 2],
        Runtime,
        "Incompatible matrix sizes for {}: each A matrix is {} by {} but each b matrix is {} by {}",
        api,
        ldd[ldd.len() - 2],
        ldd[ldd.len() - 1],
        if bd.len() >= 2 { bd[bd.len() - 2] } else { 0 },
        bd.last().copied().unwrap_or(0)
    );
    let pd = cx.dims(piv.v);
    check!(
        pd[..] == ldd[..ldd.len() - 1],
        Runtime,
        "torch.linalg.ldl_solve: Expected LD.shape[:-1] and pivots.shape to be the same, but got pivots with shape [{}] instead",
        pd.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
    );
    check!(
        piv.dtype.is_int(),
        Runtime,
        "torch.linalg.ldl_solve: Expected pivots to be integers. Got {}",
        piv.dtype.torch_name()
    );
    check_lapack_dtype(ld.dtype, "ldl_solve_cpu")?;
    let batch = crate::broadcast_shapes(&[ldd[..ldd.len() - 2].to_vec(), bd[..bd.len() - 2].to_vec()])?;
    let n = ldd[ldd.len() - 1];
    let nr = bd[bd.len() - 1];
    let mut out_dims = batch.clone();
    out_dims.extend_from_slice(&[n, nr]);
    let bs: i64 = batch.iter().product();
    let bx = cx.broadcast_to(rhs.v, &out_dims);
    if bs == 0 || n == 0 || nr == 0 {
        return one(bx);
    }
    let mut ld_dims = batch.clone();
    ld_dims.extend_from_slice(&[n, n]);
    let l = cx.broadcast_to(ld.v, &ld_dims);
    let mut p_dims = batch.clone();
    p_dims.push(n);
    let p = cx.convert(piv.v, I64E);
    let p = cx.broadcast_to(p, &p_dims);
    let l = cx.reshape(l, &[bs, n, n]);
    let p = cx.reshape(p, &[bs, n]);
    let x = cx.reshape(bx, &[bs, n, nr]);
    let hermitian = args.bool_or("hermitian", false)?;
    let r = ldl_solve_core(cx, l, p, x, hermitian);
    one(cx.reshape(r, &out_dims))
}

// ---- the real nonsymmetric eigenproblem (LAPACK's ?geev, one matrix at a time) ------------------

/// Scalar helpers for one matrix: 0-d constants of the working type and element access.
struct Ev {
    e: ElemType,
    n: i64,
}

impl Ev {
    fn c(&self, b: &mut Builder, x: f64) -> Value {
        b.constant_f64(x, self.e)
    }
    fn i(&self, b: &mut Builder, x: i64) -> Value {
        b.constant_i64(x, I64E)
    }
    /// m[i, j] as a 0-d value.
    fn at(&self, b: &mut Builder, m: Value, i: Value, j: Value) -> Value {
        let v = b.dynamic_slice(m, &[i, j], &[1, 1]);
        b.reshape(v, &[])
    }
    fn set(&self, b: &mut Builder, m: Value, i: Value, j: Value, v: Value) -> Value {
        let v = b.reshape(v, &[1, 1]);
        b.dynamic_update_slice(m, v, &[i, j])
    }
    fn vat(&self, b: &mut Builder, v: Value, i: Value) -> Value {
        let x = b.dynamic_slice(v, &[i], &[1]);
        b.reshape(x, &[])
    }
    fn vset(&self, b: &mut Builder, v: Value, i: Value, x: Value) -> Value {
        let x = b.reshape(x, &[1]);
        b.dynamic_update_slice(v, x, &[i])
    }
    fn ulp(&self) -> f64 {
        if self.e == ElemType::F64 { f64::EPSILON } else { f32::EPSILON as f64 }
    }
    fn safmin(&self) -> f64 {
        if self.e == ElemType::F64 { f64::MIN_POSITIVE } else { f32::MIN_POSITIVE as f64 }
    }
}

/// Fortran's SIGN(a, s) elementwise: |a| with the sign of s (s >= 0 counts as positive).
fn fsign(b: &mut Builder, a: Value, s: Value) -> Value {
    let d = b.dims(a).to_vec();
    let aa = b.abs(a);
    let na = b.neg(aa);
    let z = spl(b, 0.0, b.elem(a), &d);
    let neg = b.compare(CmpDir::Lt, s, z);
    b.select(neg, na, aa)
}

/// LAPACK's dlapy2 elementwise: sqrt(x^2 + y^2) without overflow.
fn lapy2(b: &mut Builder, x: Value, y: Value) -> Value {
    let (d, e) = (b.dims(x).to_vec(), b.elem(x));
    let xa = b.abs(x);
    let ya = b.abs(y);
    let w = b.max(xa, ya);
    let z = b.min(xa, ya);
    let q = b.div(z, w);
    let q2 = b.mul(q, q);
    let one = spl(b, 1.0, e, &d);
    let t = b.add(one, q2);
    let t = b.sqrt(t);
    let r = b.mul(w, t);
    let zero = spl(b, 0.0, e, &d);
    let z0 = b.compare(CmpDir::Eq, z, zero);
    b.select(z0, w, r)
}

/// The plane rotation (x, y) -> (cs x + sn y, cs y - sn x), elementwise (cs, sn of x's dims).
fn plane_rot(b: &mut Builder, x: Value, y: Value, cs: Value, sn: Value) -> (Value, Value) {
    let a1 = b.mul(cs, x);
    let a2 = b.mul(sn, y);
    let nx = b.add(a1, a2);
    let b1 = b.mul(cs, y);
    let b2 = b.mul(sn, x);
    let ny = b.sub(b1, b2);
    (nx, ny)
}

/// dlahqr's 3-row reflector I - t1 [1 v2 v3]^T [1 v2 v3] on three lines x (rows or columns):
/// x_j - t_j (x0 + v2 x1 + v3 x2) with t = [t1, t1 v2, t1 v3] (0-d values); the third line is
/// left as it is unless `three` (the sweep's last step has only two rows).
fn reflect3(b: &mut Builder, x: &[Value], v: [Value; 2], t: [Value; 3], three: Value) -> Vec<Value> {
    let d = b.dims(x[0]).to_vec();
    let v2 = b.broadcast_in_dim(v[0], &d, &[]);
    let v3 = b.broadcast_in_dim(v[1], &d, &[]);
    let x1 = b.mul(v2, x[1]);
    let x2 = b.mul(v3, x[2]);
    let sm = b.add(x[0], x1);
    let sm = b.add(sm, x2);
    let mut out = Vec::with_capacity(3);
    for j in 0..3 {
        let tj = b.broadcast_in_dim(t[j], &d, &[]);
        let y = b.mul(sm, tj);
        out.push(b.sub(x[j], y));
    }
    let three = b.broadcast_in_dim(three, &d, &[]);
    out[2] = b.select(three, out[2], x[2]);
    out
}

/// Row i of a matrix m [r, c] as [c] (i 0-d).
fn row_at(b: &mut Builder, m: Value, i: Value) -> Value {
    let c = b.dims(m)[1];
    let z = b.constant_i64(0, I64E);
    let x = b.dynamic_slice(m, &[i, z], &[1, c]);
    b.reshape(x, &[c])
}

/// Column j of a matrix m [r, c] as [r] (j 0-d).
fn col_at(b: &mut Builder, m: Value, j: Value) -> Value {
    let r = b.dims(m)[0];
    let z = b.constant_i64(0, I64E);
    let x = b.dynamic_slice(m, &[z, j], &[r, 1]);
    b.reshape(x, &[r])
}

/// m [r, c] with row i replaced by x [c].
fn put_row(b: &mut Builder, m: Value, i: Value, x: Value) -> Value {
    let c = b.dims(m)[1];
    let z = b.constant_i64(0, I64E);
    let x = b.reshape(x, &[1, c]);
    b.dynamic_update_slice(m, x, &[i, z])
}

/// m [r, c] with column j replaced by x [r].
fn put_col(b: &mut Builder, m: Value, j: Value, x: Value) -> Value {
    let r = b.dims(m)[0];
    let z = b.constant_i64(0, I64E);
    let x = b.reshape(x, &[r, 1]);
    b.dynamic_update_slice(m, x, &[z, j])
}

/// The slices of `m` along `axis`, that axis dropped: the rows or columns of a thin block (or
/// the entries of a short vector), for the 2- and 3-line updates of the QR sweep.
fn unstack(b: &mut Builder, m: Value, axis: usize) -> Vec<Value> {
    let d = b.dims(m).to_vec();
    let mut line = d.clone();
    line.remove(axis);
    (0..d[axis])
        .map(|j| {
            let mut lo = vec![0; d.len()];
            lo[axis] = j;
            let mut hi = d.clone();
            hi[axis] = j + 1;
            let x = b.slice(m, &lo, &hi, &vec![1; d.len()]);
            b.reshape(x, &line)
        })
        .collect()
}

/// The inverse of `unstack`: equal lines joined along a new `axis`.
fn stack(b: &mut Builder, lines: &[Value], axis: usize) -> Value {
    let mut d = b.dims(lines[0]).to_vec();
    d.insert(axis, 1);
    let parts: Vec<Value> = lines.iter().map(|&x| b.reshape(x, &d)).collect();
    b.concatenate(&parts, axis as i64)
}

/// x shifted one place back along `axis`: x[.., k + 1, ..] at k, zeros filling the end.
fn next_along(b: &mut Builder, x: Value, axis: usize) -> Value {
    let d = b.dims(x).to_vec();
    let zeros = vec![0; d.len()];
    let mut lo = zeros.clone();
    lo[axis] = 1;
    let s = b.slice(x, &lo, &d, &vec![1; d.len()]);
    let z = b.constant_f64(0.0, b.elem(x));
    b.pad(s, z, &zeros, &lo, &zeros)
}

/// x shifted one place on along `axis`: x[.., k - 1, ..] at k, zeros filling the start.
fn prev_along(b: &mut Builder, x: Value, axis: usize) -> Value {
    let d = b.dims(x).to_vec();
    let zeros = vec![0; d.len()];
    let mut hi = d.clone();
    hi[axis] -= 1;
    let s = b.slice(x, &zeros, &hi, &vec![1; d.len()]);
    let mut low = zeros.clone();
    low[axis] = 1;
    let z = b.constant_f64(0.0, b.elem(x));
    b.pad(s, z, &low, &zeros, &zeros)
}

/// The diagonal m[k, k - off] of a square m, one entry per row k (0 where k - off is out of
/// range): off 0 the diagonal, 1 the subdiagonal, -1 the superdiagonal.
fn band(b: &mut Builder, m: Value, off: i64) -> Value {
    let d = b.dims(m).to_vec();
    let r = idx(b, &d, 0);
    let c = idx(b, &d, 1);
    let c = if off == 0 {
        c
    } else {
        let o = ispl(b, off, &d);
        b.add(c, o)
    };
    let on = b.compare(CmpDir::Eq, r, c);
    let z = spl(b, 0.0, b.elem(m), &d);
    let sel = b.select(on, m, z);
    sum_over(b, sel, &[1])
}

/// m with the entries below its subdiagonal zeroed (its upper Hessenberg part).
fn hessenberg_part(b: &mut Builder, m: Value) -> Value {
    let d = b.dims(m).to_vec();
    let r = idx(b, &d, 0);
    let c = idx(b, &d, 1);
    let one = ispl(b, 1, &d);
    let c1 = b.add(c, one);
    let keep = b.compare(CmpDir::Le, r, c1);
    let z = spl(b, 0.0, b.elem(m), &d);
    b.select(keep, m, z)
}

/// The largest position (`pos`, an iota over cand's one dim) where `cand` holds; -1 when none.
fn last_where(b: &mut Builder, cand: Value, pos: Value) -> Value {
    let d = b.dims(pos).to_vec();
    let m1 = ispl(b, -1, &d);
    let ci = b.select(cand, pos, m1);
    let mn = b.constant_i64(-1, I64E);
    b.reduce(&[ci], &[mn], &[0], |b, x| vec![b.max(x[0], x[1])])[0]
}

/// m - tau v (v^T m): the Householder reflector I - tau v v^T applied to m [r, c] from the left.
fn reflect_left(b: &mut Builder, m: Value, v: Value, tau: Value) -> Value {
    let d = b.dims(m).to_vec();
    let vb = b.broadcast_in_dim(v, &d, &[0]);
    let p = b.mul(m, vb);
    let u = sum_over(b, p, &[0]);
    let tv = b.broadcast_in_dim(tau, &[d[1]], &[]);
    let u = b.mul(u, tv);
    let ub = b.broadcast_in_dim(u, &d, &[1]);
    let upd = b.mul(vb, ub);
    b.sub(m, upd)
}

/// m - tau (m v) v^T: the same reflector applied from the right.
fn reflect_right(b: &mut Builder, m: Value, v: Value, tau: Value) -> Value {
    let d = b.dims(m).to_vec();
    let vb = b.broadcast_in_dim(v, &d, &[1]);
    let p = b.mul(m, vb);
    let mv = sum_over(b, p, &[1]);
    let tv = b.broadcast_in_dim(tau, &[d[0]], &[]);
    let w = b.mul(mv, tv);
    let wb = b.broadcast_in_dim(w, &d, &[0]);
    let upd = b.mul(wb, vb);
    b.sub(m, upd)
}

/// LAPACK's dgebal(job = 'B'): permutations isolating eigenvalues (rows pushed down, then
/// columns pushed left), then power-of-two scaling of rows and columns ilo..ihi until the row
/// and column 2-norms are balanced. Returns (A, ilo, ihi, scale) with 0-based ilo/ihi.
fn ev_gebal(b: &mut Builder, ev: &Ev, a: Value) -> (Value, Value, Value, Value) {
    let n = ev.n;
    let e = ev.e;
    let d2 = [n, n];
    let scale0 = spl(b, 1.0, e, &[n]);
    let l0 = ev.i(b, n - 1);
    let t = b.constant_bool(true);
    let f = b.constant_bool(false);
    // Rows with no off-diagonal entry in columns 0..l: swap to l, shrink l.
    let p1 = b.while_loop(
        &[a, scale0, l0, t, f],
        |_, v| v[3],
        |b, v| {
            let (a, scale, l, _, iso) = (v[0], v[1], v[2], v[3], v[4]);
            let r = idx(b, &d2, 0);
            let c = idx(b, &d2, 1);
            let lb = b.broadcast_in_dim(l, &d2, &[]);
            let z = spl(b, 0.0, e, &d2);
            let nz = b.compare(CmpDir::Ne, a, z);
            let in_l = b.compare(CmpDir::Le, c, lb);
            let off = b.compare(CmpDir::Ne, c, r);
            let bad = b.and(nz, in_l);
            let bad = b.and(bad, off);
            let row_bad = any_over(b, bad, &[1]);
            let rv = idx(b, &[n], 0);
            let lv = b.broadcast_in_dim(l, &[n], &[]);
            let le = b.compare(CmpDir::Le, rv, lv);
            let ok = b.not(row_bad);
            let cand = b.and(ok, le);
            let j = last_where(b, cand, rv);
            let zero_i = ev.i(b, 0);
            let found = b.compare(CmpDir::Ge, j, zero_i);
            let jf = b.convert(j, e);
            let scale_n = ev.vset(b, scale, l, jf);
            let rows_le = b.compare(CmpDir::Le, r, lb);
            let sw = swap_lines(b, a, j, l, 1);
            let a1 = b.select(rows_le, sw, a);
            let a2 = swap_lines(b, a1, j, l, 0);
            let at0 = b.compare(CmpDir::Eq, l, zero_i);
            let one_i = ev.i(b, 1);
            let l_n = b.sub(l, one_i);
            let a = b.select(found, a2, a);
            let scale = b.select(found, scale_n, scale);
            let iso_n = b.and(found, at0);
            let iso = b.or(iso, iso_n);
            let l_dec = b.not(at0);
            let l_dec = b.and(found, l_dec);
            let l = b.select(l_dec, l_n, l);
            let go = b.and(found, l_dec);
            vec![a, scale, l, go, iso]
        },
    );
    let (a, scale, l, iso) = (p1[0], p1[1], p1[2], p1[4]);
    // Columns with no off-diagonal entry in rows k..l: swap to k, grow k.
    let k0 = ev.i(b, 0);
    let go0 = b.not(iso);
    let p2 = b.while_loop(
        &[a, scale, k0, go0],
        |_, v| v[3],
        |b, v| {
            let (a, scale, k) = (v[0], v[1], v[2]);
            let r = idx(b, &d2, 0);
            let c = idx(b, &d2, 1);
            let kb = b.broadcast_in_dim(k, &d2, &[]);
            let lb = b.broadcast_in_dim(l, &d2, &[]);
            let z = spl(b, 0.0, e, &d2);
            let nz = b.compare(CmpDir::Ne, a, z);
            let r_ge = b.compare(CmpDir::Ge, r, kb);
            let r_le = b.compare(CmpDir::Le, r, lb);
            let off = b.compare(CmpDir::Ne, c, r);
            let bad = b.and(nz, r_ge);
            let bad = b.and(bad, r_le);
            let bad = b.and(bad, off);
            let col_bad = any_over(b, bad, &[0]);
            let cv = idx(b, &[n], 0);
            let kv = b.broadcast_in_dim(k, &[n], &[]);
            let lv = b.broadcast_in_dim(l, &[n], &[]);
            let ge = b.compare(CmpDir::Ge, cv, kv);
            let le = b.compare(CmpDir::Le, cv, lv);
            let ok = b.not(col_bad);
            let cand = b.and(ok, ge);
            let cand = b.and(cand, le);
            let big = ispl(b, n, &[n]);
            let ci = b.select(cand, cv, big);
            let mx = b.constant_i64(n, I64E);
            let j = b.reduce(&[ci], &[mx], &[0], |b, x| vec![b.min(x[0], x[1])])[0];
            let nn = ev.i(b, n);
            let found = b.compare(CmpDir::Lt, j, nn);
            let jc = b.min(j, l);
            let jf = b.convert(jc, e);
            let scale_n = ev.vset(b, scale, k, jf);
            let rows_le = b.compare(CmpDir::Le, r, lb);
            let sw = swap_lines(b, a, jc, k, 1);
            let a1 = b.select(rows_le, sw, a);
            let cols_ge = b.compare(CmpDir::Ge, c, kb);
            let sw = swap_lines(b, a1, jc, k, 0);
            let a2 = b.select(cols_ge, sw, a1);
            let one_i = ev.i(b, 1);
            let k_n = b.add(k, one_i);
            let a = b.select(found, a2, a);
            let scale = b.select(found, scale_n, scale);
            let k = b.select(found, k_n, k);
            vec![a, scale, k, found]
        },
    );
    let (a, scale, k) = (p2[0], p2[1], p2[2]);
    // Scaling (skipped when everything was isolated).
    let sfmin1 = ev.safmin() / ev.ulp();
    let sfmax1 = 1.0 / sfmin1;
    let sfmin2 = sfmin1 * 2.0;
    let sfmax2 = 1.0 / sfmin2;
    let kx = k;
    let fl = b.constant_bool(false);
    let not_iso = b.not(iso);
    let p3 = b.while_loop(
        &[a, scale, kx, fl, not_iso],
        |_, v| v[4],
        |b, v| {
            let (a, scale, i, noconv) = (v[0], v[1], v[2], v[3]);
            // Past the last column: another sweep if anything changed, else done.
            let past = b.compare(CmpDir::Gt, i, l);
            let ic = b.min(i, l);
            let col = col_at(b, a, ic);
            let row = row_at(b, a, ic);
            let pos = idx(b, &[n], 0);
            let kv = b.broadcast_in_dim(k, &[n], &[]);
            let lv = b.broadcast_in_dim(l, &[n], &[]);
            let ge_k = b.compare(CmpDir::Ge, pos, kv);
            let le_l = b.compare(CmpDir::Le, pos, lv);
            let in_kl = b.and(ge_k, le_l);
            // The 2-norm of x over rows/columns k..l, and its largest magnitude where `amax_on`.
            let norm_and_amax = |b: &mut Builder, x: Value, amax_on: Value| -> (Value, Value) {
                let zv = spl(b, 0.0, e, &[n]);
                let sq = b.mul(x, x);
                let sq = b.select(in_kl, sq, zv);
                let nrm = sum_over(b, sq, &[0]);
                let ax = b.abs(x);
                let ax = b.select(amax_on, ax, zv);
                (b.sqrt(nrm), max_over(b, ax, &[0]))
            };
            let (cn, ca) = norm_and_amax(b, col, le_l);
            let (rn, ra) = norm_and_amax(b, row, ge_k);
            let zero = ev.c(b, 0.0);
            let two = ev.c(b, 2.0);
            let one = ev.c(b, 1.0);
            let g0 = b.div(rn, two);
            let smax2 = ev.c(b, sfmax2);
            let smin2 = ev.c(b, sfmin2);
            // Grow f while c < g (and nothing over/underflows).
            let up = b.while_loop(
                &[one, cn, ca, rn, g0, ra],
                |b, v| {
                    let (f, c, ca, r, g, ra) = (v[0], v[1], v[2], v[3], v[4], v[5]);
                    let s1 = b.compare(CmpDir::Ge, c, g);
                    let m1 = b.max(f, c);
                    let m1 = b.max(m1, ca);
                    let s2 = b.compare(CmpDir::Ge, m1, smax2);
                    let m2 = b.min(r, g);
                    let m2 = b.min(m2, ra);
                    let s3 = b.compare(CmpDir::Le, m2, smin2);
                    let stop = b.or(s1, s2);
                    let stop = b.or(stop, s3);
                    let nan = b.compare(CmpDir::Ne, c, c);
                    let stop = b.or(stop, nan);
                    b.not(stop)
                },
                |b, v| {
                    let two = b.constant_f64(2.0, e);
                    vec![b.mul(v[0], two), b.mul(v[1], two), b.mul(v[2], two), b.div(v[3], two), b.div(v[4], two), b.div(v[5], two)]
                },
            );
            let g1 = b.div(up[1], two);
            let down = b.while_loop(
                &[up[0], up[1], up[2], up[3], g1, up[5]],
                |b, v| {
                    let (f, c, ca, r, g, ra) = (v[0], v[1], v[2], v[3], v[4], v[5]);
                    let s1 = b.compare(CmpDir::Lt, g, r);
                    let m1 = b.max(r, ra);
                    let s2 = b.compare(CmpDir::Ge, m1, smax2);
                    let m2 = b.min(f, c);
                    let m2 = b.min(m2, g);
                    let m2 = b.min(m2, ca);
                    let s3 = b.compare(CmpDir::Le, m2, smin2);
                    let stop = b.or(s1, s2);
                    let stop = b.or(stop, s3);
                    let nan = b.compare(CmpDir::Ne, r, r);
                    let stop = b.or(stop, nan);
                    b.not(stop)
                },
                |b, v| {
                    let two = b.constant_f64(2.0, e);
                    vec![b.div(v[0], two), b.div(v[1], two), b.div(v[2], two), b.mul(v[3], two), b.div(v[4], two), b.mul(v[5], two)]
                },
            );
            let (fv, c2, r2) = (down[0], down[1], down[3]);
            let s = b.add(cn, rn);
            let cr = b.add(c2, r2);
            let fac = ev.c(b, 0.95);
            let fs = b.mul(fac, s);
            let balanced = b.compare(CmpDir::Ge, cr, fs);
            let sc_i = ev.vat(b, scale, ic);
            let f_lt1 = b.compare(CmpDir::Lt, fv, one);
            let s_lt1 = b.compare(CmpDir::Lt, sc_i, one);
            let fsi = b.mul(fv, sc_i);
            let smin1 = ev.c(b, sfmin1);
            let tiny = b.compare(CmpDir::Le, fsi, smin1);
            let skip1 = b.and(f_lt1, s_lt1);
            let skip1 = b.and(skip1, tiny);
            let f_gt1 = b.compare(CmpDir::Gt, fv, one);
            let s_gt1 = b.compare(CmpDir::Gt, sc_i, one);
            let smax1 = ev.c(b, sfmax1);
            let lim = b.div(smax1, fv);
            let huge = b.compare(CmpDir::Ge, sc_i, lim);
            let skip2 = b.and(f_gt1, s_gt1);
            let skip2 = b.and(skip2, huge);
            let cz = b.compare(CmpDir::Eq, cn, zero);
            let rz = b.compare(CmpDir::Eq, rn, zero);
            let skip = b.or(cz, rz);
            let skip = b.or(skip, balanced);
            let skip = b.or(skip, skip1);
            let skip = b.or(skip, skip2);
            let skip = b.or(skip, past);
            let apply = b.not(skip);
            let g = b.div(one, fv);
            let nsc = b.mul(sc_i, fv);
            let scale_n = ev.vset(b, scale, ic, nsc);
            let scale = b.select(apply, scale_n, scale);
            // Row i (columns >= k) times g, then column i (rows <= l) times f.
            let gv = b.broadcast_in_dim(g, &[n], &[]);
            let row_s = b.mul(row, gv);
            let row_n = b.select(ge_k, row_s, row);
            let a1 = put_row(b, a, ic, row_n);
            let col1 = col_at(b, a1, ic);
            let fvv = b.broadcast_in_dim(fv, &[n], &[]);
            let col_s = b.mul(col1, fvv);
            let col_n = b.select(le_l, col_s, col1);
            let a2 = put_col(b, a1, ic, col_n);
            let a = b.select(apply, a2, a);
            let noconv = b.or(noconv, apply);
            // Next column, or a new sweep.
            let one_i = ev.i(b, 1);
            let i_next = b.add(i, one_i);
            let f = b.constant_bool(false);
            let i = b.select(past, k, i_next);
            let go_on = b.not(past);
            let go = b.or(go_on, noconv);
            let noconv = b.select(past, f, noconv);
            vec![a, scale, i, noconv, go]
        },
    );
    let (ilo, ihi) = {
        let z = ev.i(b, 0);
        (b.select(iso, z, k), b.select(iso, z, l))
    };
    (p3[0], ilo, ihi, p3[1])
}

/// A Householder reflector H = I - tau v v^T (v[0] = 1) with H [alpha; x] = [beta; 0], as
/// LAPACK's dlarfg: returns (beta, tau, x scaled into v's tail). `x` may hold zeros to ignore.
fn ev_larfg(b: &mut Builder, ev: &Ev, alpha: Value, x: Value) -> (Value, Value, Value) {
    let d = b.dims(x).to_vec();
    let sq = b.mul(x, x);
    let xn = sum_over(b, sq, &[0]);
    let xnorm = b.sqrt(xn);
    let zero = ev.c(b, 0.0);
    let none = b.compare(CmpDir::Eq, xnorm, zero);
    let h = lapy2(b, alpha, xnorm);
    let beta = fsign(b, h, alpha);
    let beta = b.neg(beta);
    let bma = b.sub(beta, alpha);
    let tau = b.div(bma, beta);
    let amb = b.sub(alpha, beta);
    let one = ev.c(b, 1.0);
    let scal = b.div(one, amb);
    let sv = b.broadcast_in_dim(scal, &d, &[]);
    let v = b.mul(x, sv);
    let beta = b.select(none, alpha, beta);
    let tau = b.select(none, zero, tau);
    let zv = spl(b, 0.0, ev.e, &d);
    let nb = b.broadcast_in_dim(none, &d, &[]);
    let v = b.select(nb, zv, v);
    (beta, tau, v)
}

/// LAPACK's dgehd2 + dorghr: A = Q H Q^T with H upper Hessenberg (reflectors for columns
/// ilo .. ihi - 2 acting on rows i + 1 .. ihi). Returns (H with zeros below the subdiagonal, Q).
fn ev_hessenberg(b: &mut Builder, ev: &Ev, a: Value, ilo: Value, ihi: Value) -> (Value, Value) {
    let n = ev.n;
    let e = ev.e;
    let d2 = [n, n];
    let vs0 = spl(b, 0.0, e, &d2);
    let taus0 = spl(b, 0.0, e, &[n]);
    let out = b.while_loop(
        &[ilo, a, vs0, taus0],
        |b, v| {
            let one = b.constant_i64(1, I64E);
            let last = b.sub(ihi, one);
            b.compare(CmpDir::Lt, v[0], last)
        },
        |b, v| {
            let (i, a, vs, taus) = (v[0], v[1], v[2], v[3]);
            let one_i = ev.i(b, 1);
            let pos = idx(b, &[n], 0);
            let col = col_at(b, a, i);
            let i1 = b.add(i, one_i);
            let i1v = b.broadcast_in_dim(i1, &[n], &[]);
            let hv = b.broadcast_in_dim(ihi, &[n], &[]);
            let below = b.compare(CmpDir::Gt, pos, i1v);
            let le_h = b.compare(CmpDir::Le, pos, hv);
            let tail = b.and(below, le_h);
            let zv = spl(b, 0.0, e, &[n]);
            let x = b.select(tail, col, zv);
            let alpha = ev.vat(b, col, i1);
            let (beta, tau, xs) = ev_larfg(b, ev, alpha, x);
            // v: 1 at i + 1, the scaled tail below, zeros elsewhere.
            let at1 = b.compare(CmpDir::Eq, pos, i1v);
            let onev = spl(b, 1.0, e, &[n]);
            let vv = b.select(at1, onev, xs);
            // Right: A[0..ihi, :] -= tau (A v) v^T.
            let a_r = reflect_right(b, a, vv, tau);
            let r = idx(b, &d2, 0);
            let c = idx(b, &d2, 1);
            let hb = b.broadcast_in_dim(ihi, &d2, &[]);
            let rows_ok = b.compare(CmpDir::Le, r, hb);
            let a = b.select(rows_ok, a_r, a);
            // Left: A[:, i+1..] -= tau v (v^T A).
            let a_l = reflect_left(b, a, vv, tau);
            let i1b = b.broadcast_in_dim(i1, &d2, &[]);
            let cols_ok = b.compare(CmpDir::Ge, c, i1b);
            let a = b.select(cols_ok, a_l, a);
            // Column i: beta at i + 1, zeros below (the reflector is kept apart).
            let colf = col_at(b, a, i);
            let betav = b.broadcast_in_dim(beta, &[n], &[]);
            let colf = b.select(at1, betav, colf);
            let colf = b.select(tail, zv, colf);
            let a = put_col(b, a, i, colf);
            let vs = put_col(b, vs, i, vv);
            let taus = ev.vset(b, taus, i, tau);
            vec![i1, a, vs, taus]
        },
    );
    let (h, vs, taus) = (out[1], out[2], out[3]);
    // Q = H(ilo) ... H(ihi - 2), applied to the identity from the last reflector back.
    let q0 = {
        let r = idx(b, &d2, 0);
        let c = idx(b, &d2, 1);
        let on = b.compare(CmpDir::Eq, r, c);
        let one = spl(b, 1.0, e, &d2);
        let z = spl(b, 0.0, e, &d2);
        b.select(on, one, z)
    };
    let two = ev.i(b, 2);
    let start = b.sub(ihi, two);
    let q = b.while_loop(
        &[start, q0],
        |b, v| b.compare(CmpDir::Ge, v[0], ilo),
        |b, v| {
            let (i, q) = (v[0], v[1]);
            let vv = col_at(b, vs, i);
            let tau = ev.vat(b, taus, i);
            let q = reflect_left(b, q, vv, tau);
            let one_i = ev.i(b, 1);
            vec![b.sub(i, one_i), q]
        },
    );
    (hessenberg_part(b, h), q[1])
}

/// LAPACK's dlanv2: the Schur factorization of a real 2x2 block in standard form (a 2x2
/// complex block gets equal diagonals and off-diagonals of opposite signs). Returns
/// ([a, b, c, d], [rt1r, rt1i, rt2r, rt2i], cs, sn).
fn ev_lanv2(b: &mut Builder, ev: &Ev, a: Value, bb: Value, c: Value, d: Value) -> ([Value; 4], [Value; 4], Value, Value) {
    let zero = ev.c(b, 0.0);
    let one = ev.c(b, 1.0);
    let half = ev.c(b, 0.5);
    let eps = ev.c(b, 4.0 * ev.ulp());
    let c_zero = b.compare(CmpDir::Eq, c, zero);
    let b_zero = b.compare(CmpDir::Eq, bb, zero);
    let amd = b.sub(a, d);
    let amd0 = b.compare(CmpDir::Eq, amd, zero);
    let bneg = b.compare(CmpDir::Lt, bb, zero);
    let cneg = b.compare(CmpDir::Lt, c, zero);
    let diff_sign = b.xor(bneg, cneg);
    let case3 = b.and(amd0, diff_sign);
    // General case.
    let temp = amd;
    let p = b.mul(half, temp);
    let ab = b.abs(bb);
    let ac = b.abs(c);
    let bcmax = b.max(ab, ac);
    let bcmis0 = b.min(ab, ac);
    let sb = fsign(b, one, bb);
    let sc = fsign(b, one, c);
    let bcmis = b.mul(bcmis0, sb);
    let bcmis = b.mul(bcmis, sc);
    let pa = b.abs(p);
    let scale = b.max(pa, bcmax);
    let q1 = b.div(p, scale);
    let q1 = b.mul(q1, p);
    let q2 = b.div(bcmax, scale);
    let q2 = b.mul(q2, bcmis);
    let z = b.add(q1, q2);
    let real = b.compare(CmpDir::Ge, z, eps);
    // Real eigenvalues.
    let (ra, rd, rb, rcs, rsn) = {
        let s1 = b.sqrt(scale);
        let s2 = b.sqrt(z);
        let s12 = b.mul(s1, s2);
        let sg = fsign(b, s12, p);
        let zz = b.add(p, sg);
        let na = b.add(d, zz);
        let t = b.div(bcmax, zz);
        let t = b.mul(t, bcmis);
        let nd = b.sub(d, t);
        let tau = lapy2(b, c, zz);
        let cs = b.div(zz, tau);
        let sn = b.div(c, tau);
        let nb = b.sub(bb, c);
        (na, nd, nb, cs, sn)
    };
    // Complex (or nearly equal real) eigenvalues: equal diagonals.
    let (ca, cb, cc, cd, ccs, csn) = {
        let sigma = b.add(bb, c);
        let tau = lapy2(b, sigma, temp);
        let sa = b.abs(sigma);
        let q = b.div(sa, tau);
        let q = b.add(one, q);
        let q = b.mul(half, q);
        let cs = b.sqrt(q);
        let tc = b.mul(tau, cs);
        let pq = b.div(p, tc);
        let ss = fsign(b, one, sigma);
        let sn = b.mul(pq, ss);
        let sn = b.neg(sn);
        // [aa bb; cc dd] = [a b; c d] [cs -sn; sn cs]
        let (aa, bbb) = plane_rot(b, a, bb, cs, sn);
        let (cc, dd) = plane_rot(b, c, d, cs, sn);
        // [a b; c d] = [cs sn; -sn cs] [aa bb; cc dd]
        let (na, nc) = plane_rot(b, aa, cc, cs, sn);
        let (nb, nd) = plane_rot(b, bbb, dd, cs, sn);
        let s = b.add(na, nd);
        let tm = b.mul(half, s);
        // c != 0 and b != 0 with equal signs: real after all, triangularize.
        let nc_zero = b.compare(CmpDir::Eq, nc, zero);
        let nb_zero = b.compare(CmpDir::Eq, nb, zero);
        let nbneg = b.compare(CmpDir::Lt, nb, zero);
        let ncneg = b.compare(CmpDir::Lt, nc, zero);
        let same = b.xor(nbneg, ncneg);
        let same = b.not(same);
        let nc_nz = b.not(nc_zero);
        let nb_nz = b.not(nb_zero);
        let tri = b.and(nc_nz, nb_nz);
        let tri = b.and(tri, same);
        let sab = b.abs(nb);
        let sab = b.sqrt(sab);
        let sac = b.abs(nc);
        let sac = b.sqrt(sac);
        let sp = b.mul(sab, sac);
        let pp = fsign(b, sp, nc);
        let bc = b.add(nb, nc);
        let bc = b.abs(bc);
        let bc = b.sqrt(bc);
        let tau2 = b.div(one, bc);
        let ta = b.add(tm, pp);
        let td = b.sub(tm, pp);
        let tb = b.sub(nb, nc);
        let cs1 = b.mul(sab, tau2);
        let sn1 = b.mul(sac, tau2);
        let t1 = b.mul(cs, cs1);
        let t2 = b.mul(sn, sn1);
        let tcs = b.sub(t1, t2);
        let t1 = b.mul(cs, sn1);
        let t2 = b.mul(sn, cs1);
        let tsn = b.add(t1, t2);
        // b == 0 (c != 0): swap to upper triangular.
        let swp = b.and(nc_nz, nb_zero);
        let sb2 = b.neg(nc);
        let scs = b.neg(sn);
        let ra = b.select(tri, ta, tm);
        let rd = b.select(tri, td, tm);
        let rb = b.select(tri, tb, nb);
        let rb = b.select(swp, sb2, rb);
        let rc = b.select(tri, zero, nc);
        let rc = b.select(swp, zero, rc);
        let rcs = b.select(tri, tcs, cs);
        let rcs = b.select(swp, scs, rcs);
        let rsn = b.select(tri, tsn, sn);
        let rsn = b.select(swp, cs, rsn);
        (ra, rb, rc, rd, rcs, rsn)
    };
    // (a, b, c, d, cs, sn) of the general case, then the special cases over it (c == 0 first).
    let g = select_all(b, real, &[ra, rb, zero, rd, rcs, rsn], &[ca, cb, cc, cd, ccs, csn]);
    let nbc = b.neg(c);
    let f = select_all(b, case3, &[a, bb, c, d, one, zero], &g);
    let f = select_all(b, b_zero, &[d, nbc, zero, a, zero, one], &f);
    let f = select_all(b, c_zero, &[a, bb, c, d, one, zero], &f);
    let (fa, fb, fc, fd, fcs, fsn) = (f[0], f[1], f[2], f[3], f[4], f[5]);
    let fc0 = b.compare(CmpDir::Eq, fc, zero);
    let sbv = b.abs(fb);
    let sbv = b.sqrt(sbv);
    let scv = b.abs(fc);
    let scv = b.sqrt(scv);
    let im = b.mul(sbv, scv);
    let im = b.select(fc0, zero, im);
    let nim = b.neg(im);
    ([fa, fb, fc, fd], [fa, im, fd, nim], fcs, fsn)
}

/// LAPACK's dlahqr with wantt and wantz: the Schur form T = Z^T H Z of an upper Hessenberg H by
/// Francis double-shift QR sweeps on the active block (deflating from the bottom, with the
/// Ahues-Kressner test and exceptional shifts), each 2x2 block standardized by dlanv2. H and Z
/// are kept padded by one row and column (zeros) so that 3-row reflectors never leave them.
/// Returns (T, Z, wr, wi).
fn ev_lahqr(b: &mut Builder, ev: &Ev, h: Value, z: Value, ilo: Value, ihi: Value) -> (Value, Value, Value, Value) {
    let n = ev.n;
    let e = ev.e;
    let np = (n + 1).max(3);
    let zero_e = b.constant_f64(0.0, e);
    let h = b.pad(h, zero_e, &[0, 0], &[np - n, np - n], &[0, 0]);
    let z = b.pad(z, zero_e, &[0, 0], &[0, np - n], &[0, 0]);
    // Eigenvalues isolated by the balancing are the diagonal.
    let diag0 = {
        let dg = band(b, h, 0);
        b.slice(dg, &[0], &[n], &[1])
    };
    let wi0 = spl(b, 0.0, e, &[n]);
    // The active block's size ihi - ilo + 1.
    let nh = {
        let d = b.sub(ihi, ilo);
        let one = ev.i(b, 1);
        b.add(d, one)
    };
    let ulp = ev.ulp();
    let smlnum = {
        let u = ev.c(b, ulp);
        let nhf = b.convert(nh, e);
        let q = b.div(nhf, u);
        let s = ev.c(b, ev.safmin());
        b.mul(s, q)
    };
    let itmax = {
        let ten = ev.i(b, 10);
        let m = b.max(nh, ten);
        let t = ev.i(b, 30);
        b.mul(m, t)
    };
    // Clear below the subdiagonal (the "trash").
    let h = hessenberg_part(b, h);
    let zero_i = ev.i(b, 0);
    let fl = b.constant_bool(false);
    // State: H, Z, wr, wi, i, l, its, kdefl, failed.
    let out = b.while_loop(
        &[h, z, diag0, wi0, ihi, ilo, zero_i, zero_i, fl],
        |b, v| {
            let ge = b.compare(CmpDir::Ge, v[4], ilo);
            let ok = b.not(v[8]);
            b.and(ge, ok)
        },
        |b, v| {
            let (h, z, wr, wi, i, l, its, kdefl) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            let one_i = ev.i(b, 1);
            let two_i = ev.i(b, 2);
            let zero_i = ev.i(b, 0);
            let zero = ev.c(b, 0.0);
            // Diagonals of H: d[k] = H[k, k], sub[k] = H[k, k-1], sup[k] = H[k, k+1].
            let (dg, sub, sup) = (band(b, h, 0), band(b, h, 1), band(b, h, -1));
            let kpos = idx(b, &[np], 0);
            // Shifted copies: prev[k] = x[k-1], next[k] = x[k+1] (zeros past the ends).
            let prev = |b: &mut Builder, x: Value| prev_along(b, x, 0);
            let next = |b: &mut Builder, x: Value| next_along(b, x, 0);
            // Deflation: the largest k in (l, i] whose subdiagonal is negligible.
            let l_new = {
                let hk = b.abs(sub);
                let dprev = prev(b, dg);
                let adp = b.abs(dprev);
                let ad = b.abs(dg);
                let tst = b.add(adp, ad);
                let zvv = spl(b, 0.0, e, &[np]);
                let tz = b.compare(CmpDir::Eq, tst, zvv);
                let subp = prev(b, sub);
                let asubp = b.abs(subp);
                let subn = next(b, sub);
                let asubn = b.abs(subn);
                let km2 = {
                    let t = ispl(b, 2, &[np]);
                    b.sub(kpos, t)
                };
                let ilov = b.broadcast_in_dim(ilo, &[np], &[]);
                let ihiv = b.broadcast_in_dim(ihi, &[np], &[]);
                let c1 = b.compare(CmpDir::Ge, km2, ilov);
                let kp1 = {
                    let t = ispl(b, 1, &[np]);
                    b.add(kpos, t)
                };
                let c2 = b.compare(CmpDir::Le, kp1, ihiv);
                let zv = spl(b, 0.0, e, &[np]);
                let add1 = b.select(c1, asubp, zv);
                let add2 = b.select(c2, asubn, zv);
                let t2 = b.add(tst, add1);
                let t2 = b.add(t2, add2);
                let tst = b.select(tz, t2, tst);
                let smv = b.broadcast_in_dim(smlnum, &[np], &[]);
                let tiny = b.compare(CmpDir::Le, hk, smv);
                let uv = spl(b, ulp, e, &[np]);
                let ut = b.mul(uv, tst);
                let small = b.compare(CmpDir::Le, hk, ut);
                let asupp = {
                    let sp = prev(b, sup);
                    b.abs(sp)
                };
                let ab = b.max(hk, asupp);
                let ba = b.min(hk, asupp);
                let dd = b.sub(dprev, dg);
                let add_ = b.abs(dd);
                let aa = b.max(ad, add_);
                let bbv = b.min(ad, add_);
                let s = b.add(aa, ab);
                let q = b.div(ab, s);
                let lhs = b.mul(ba, q);
                let q2 = b.div(aa, s);
                let q2 = b.mul(bbv, q2);
                let rhs = b.mul(uv, q2);
                let rhs = b.max(smv, rhs);
                let ak = b.compare(CmpDir::Le, lhs, rhs);
                let ak = b.and(small, ak);
                let neg = b.or(tiny, ak);
                let lv = b.broadcast_in_dim(l, &[np], &[]);
                let iv = b.broadcast_in_dim(i, &[np], &[]);
                let gt_l = b.compare(CmpDir::Gt, kpos, lv);
                let le_i = b.compare(CmpDir::Le, kpos, iv);
                let cand = b.and(neg, gt_l);
                let cand = b.and(cand, le_i);
                let k = last_where(b, cand, kpos);
                b.max(k, l)
            };
            // H[l, l-1] = 0 when l > ilo.
            let h = {
                let gt = b.compare(CmpDir::Gt, l_new, ilo);
                let lm1 = b.sub(l_new, one_i);
                let lm1 = b.max(lm1, zero_i);
                let cur = ev.at(b, h, l_new, lm1);
                let nv = b.select(gt, zero, cur);
                ev.set(b, h, l_new, lm1, nv)
            };
            let im1 = b.sub(i, one_i);
            let deflated = b.compare(CmpDir::Ge, l_new, im1);
            // ---- a QR sweep (when not deflated) ----
            let kdefl1 = b.add(kdefl, one_i);
            let (rt1r, rt1i, rt2r, rt2i) = {
                let im1c = b.max(im1, zero_i);
                let im2 = b.sub(i, two_i);
                let im2c = b.max(im2, zero_i);
                let h11 = ev.at(b, h, im1c, im1c);
                let h21 = ev.at(b, h, i, im1c);
                let h12 = ev.at(b, h, im1c, i);
                let h22 = ev.at(b, h, i, i);
                let dat1 = ev.c(b, 0.75);
                let dat2 = ev.c(b, -0.4375);
                // Exceptional shifts every 10 (from the top) and 20 (from the bottom) iterations.
                let h_i_im1 = b.abs(h21);
                let h_im1_im2 = ev.at(b, h, im1c, im2c);
                let h_im1_im2 = b.abs(h_im1_im2);
                let s_bot = b.add(h_i_im1, h_im1_im2);
                let l1 = b.add(l_new, one_i);
                let l2 = b.add(l_new, two_i);
                let npm = ev.i(b, np - 1);
                let l1c = b.min(l1, npm);
                let l2c = b.min(l2, npm);
                let hl1l = ev.at(b, h, l1c, l_new);
                let hl1l = b.abs(hl1l);
                let hl2l1 = ev.at(b, h, l2c, l1c);
                let hl2l1 = b.abs(hl2l1);
                let s_top = b.add(hl1l, hl2l1);
                let twenty = ev.i(b, 20);
                let ten = ev.i(b, 10);
                let r20 = b.rem(kdefl1, twenty);
                let ex_bot = b.compare(CmpDir::Eq, r20, zero_i);
                let r10 = b.rem(kdefl1, ten);
                let ex_top = b.compare(CmpDir::Eq, r10, zero_i);
                let not_bot = b.not(ex_bot);
                let ex_top = b.and(ex_top, not_bot);
                let hll = ev.at(b, h, l_new, l_new);
                let t = b.mul(dat1, s_bot);
                let eb11 = b.add(t, h22);
                let eb12 = b.mul(dat2, s_bot);
                let t = b.mul(dat1, s_top);
                let et11 = b.add(t, hll);
                let et12 = b.mul(dat2, s_top);
                let hs = select_all(b, ex_bot, &[eb11, eb12, s_bot, eb11], &[h11, h12, h21, h22]);
                let hs = select_all(b, ex_top, &[et11, et12, s_top, et11], &hs);
                let (h11, h12, h21, h22) = (hs[0], hs[1], hs[2], hs[3]);
                let a11 = b.abs(h11);
                let a12 = b.abs(h12);
                let a21 = b.abs(h21);
                let a22 = b.abs(h22);
                let s = b.add(a11, a12);
                let s = b.add(s, a21);
                let s = b.add(s, a22);
                let s_zero = b.compare(CmpDir::Eq, s, zero);
                let h11 = b.div(h11, s);
                let h21 = b.div(h21, s);
                let h12 = b.div(h12, s);
                let h22 = b.div(h22, s);
                let two = ev.c(b, 2.0);
                let tr = b.add(h11, h22);
                let tr = b.div(tr, two);
                let x1 = b.sub(h11, tr);
                let x2 = b.sub(h22, tr);
                let det = b.mul(x1, x2);
                let hh = b.mul(h12, h21);
                let det = b.sub(det, hh);
                let adet = b.abs(det);
                let rtdisc = b.sqrt(adet);
                let cplx = b.compare(CmpDir::Ge, det, zero);
                let c1r = b.mul(tr, s);
                let c1i = b.mul(rtdisc, s);
                let c2i = b.neg(c1i);
                let r1 = b.add(tr, rtdisc);
                let r2 = b.sub(tr, rtdisc);
                let d1 = b.sub(r1, h22);
                let d1 = b.abs(d1);
                let d2v = b.sub(r2, h22);
                let d2v = b.abs(d2v);
                let use1 = b.compare(CmpDir::Le, d1, d2v);
                let r1s = b.mul(r1, s);
                let r2s = b.mul(r2, s);
                let rr = b.select(use1, r1s, r2s);
                let rt1r = b.select(cplx, c1r, rr);
                let rt2r = rt1r;
                let rt1i = b.select(cplx, c1i, zero);
                let rt2i = b.select(cplx, c2i, zero);
                let rt = select_all(b, s_zero, &[zero; 4], &[rt1r, rt1i, rt2r, rt2i]);
                (rt[0], rt[1], rt[2], rt[3])
            };
            // Where to start the sweep: the lowest m in [l, i-2] (searching up from i-2) whose
            // bulge would make H[m, m-1] negligible; its first reflector vector.
            let (m, v0) = {
                let hmm = dg;
                let hm1m = next(b, sub); // H[m+1, m]
                let hmm1 = sup; // H[m, m+1]
                let hm1m1 = next(b, dg); // H[m+1, m+1]
                let hm2m1 = next(b, hm1m); // H[m+2, m+1]
                let hmmm1 = sub; // H[m, m-1]
                let hm1m1p = prev(b, dg); // H[m-1, m-1]
                let rv = |b: &mut Builder, x: Value| b.broadcast_in_dim(x, &[np], &[]);
                let r1r = rv(b, rt1r);
                let r1i = rv(b, rt1i);
                let r2r = rv(b, rt2r);
                let r2i = rv(b, rt2i);
                let t = b.sub(hmm, r2r);
                let t = b.abs(t);
                let a2i = b.abs(r2i);
                let ah = b.abs(hm1m);
                let s = b.add(t, a2i);
                let s = b.add(s, ah);
                let h21s = b.div(hm1m, s);
                let x = b.mul(h21s, hmm1);
                let y1 = b.sub(hmm, r1r);
                let y2 = b.sub(hmm, r2r);
                let y2 = b.div(y2, s);
                let y = b.mul(y1, y2);
                let w = b.div(r2i, s);
                let w = b.mul(r1i, w);
                let v1 = b.add(x, y);
                let v1 = b.sub(v1, w);
                let t = b.add(hmm, hm1m1);
                let t = b.sub(t, r1r);
                let t = b.sub(t, r2r);
                let v2 = b.mul(h21s, t);
                let v3 = b.mul(h21s, hm2m1);
                let a1 = b.abs(v1);
                let a2 = b.abs(v2);
                let a3 = b.abs(v3);
                let s = b.add(a1, a2);
                let s = b.add(s, a3);
                let v1 = b.div(v1, s);
                let v2 = b.div(v2, s);
                let v3 = b.div(v3, s);
                let a2 = b.abs(v2);
                let a3 = b.abs(v3);
                let t = b.add(a2, a3);
                let hm = b.abs(hmmm1);
                let h00 = b.mul(hm, t);
                let a1 = b.abs(v1);
                let uv = spl(b, ulp, e, &[np]);
                let u1 = b.mul(uv, a1);
                let p1 = b.abs(hm1m1p);
                let p2 = b.abs(hmm);
                let p3 = b.abs(hm1m1);
                let ps = b.add(p1, p2);
                let ps = b.add(ps, p3);
                let h01 = b.mul(u1, ps);
                let stop = b.compare(CmpDir::Le, h00, h01);
                let lv = b.broadcast_in_dim(l_new, &[np], &[]);
                let at_l = b.compare(CmpDir::Eq, kpos, lv);
                let stop = b.or(stop, at_l);
                let ge_l = b.compare(CmpDir::Ge, kpos, lv);
                let im2 = b.sub(i, two_i);
                let im2v = b.broadcast_in_dim(im2, &[np], &[]);
                let le = b.compare(CmpDir::Le, kpos, im2v);
                let cand = b.and(stop, ge_l);
                let cand = b.and(cand, le);
                let m = last_where(b, cand, kpos);
                let m = b.max(m, l_new);
                let v1m = pick1(b, v1, m);
                let v2m = pick1(b, v2, m);
                let v3m = pick1(b, v3, m);
                (m, [v1m, v2m, v3m])
            };
            // The sweep: k = m .. i-1 (none when deflated).
            let k_end = b.select(deflated, m, i);
            let sw = b.while_loop(
                &[m, h, z, v0[0], v0[1], v0[2]],
                |b, v| b.compare(CmpDir::Lt, v[0], k_end),
                |b, v| {
                    let (k, h, z) = (v[0], v[1], v[2]);
                    let one_i = b.constant_i64(1, I64E);
                    let zero_i = b.constant_i64(0, I64E);
                    let zero = b.constant_f64(0.0, e);
                    let one = b.constant_f64(1.0, e);
                    let three = b.constant_i64(3, I64E);
                    let ik = b.sub(i, k);
                    let ik1 = b.add(ik, one_i);
                    let nr = b.min(three, ik1);
                    let nr3 = b.compare(CmpDir::Eq, nr, three);
                    let after = b.compare(CmpDir::Gt, k, m);
                    // Vector: from column k-1 below the diagonal after the first step.
                    let km1 = b.sub(k, one_i);
                    let km1c = b.max(km1, zero_i);
                    let colv = b.dynamic_slice(h, &[k, km1c], &[3, 1]);
                    let colv = b.reshape(colv, &[3]);
                    let cv = unstack(b, colv, 0);
                    let va = b.select(after, cv[0], v[3]);
                    let vb = b.select(after, cv[1], v[4]);
                    let vc = b.select(after, cv[2], v[5]);
                    let vc = b.select(nr3, vc, zero);
                    let xs = stack(b, &[vb, vc], 0);
                    let (beta, t1, xv) = ev_larfg(b, ev, va, xs);
                    let xv = unstack(b, xv, 0);
                    let v2 = xv[0];
                    let v3 = b.select(nr3, xv[1], zero);
                    // Column k-1 after the first step: beta, then zeros.
                    let h = {
                        let cur = ev.at(b, h, k, km1c);
                        let m_gt_l = b.compare(CmpDir::Gt, m, l_new);
                        let t = b.sub(one, t1);
                        let scaled = b.mul(cur, t);
                        let first = b.select(m_gt_l, scaled, cur);
                        let nv = b.select(after, beta, first);
                        let h = ev.set(b, h, k, km1c, nv);
                        let k1 = b.add(k, one_i);
                        let cur1 = ev.at(b, h, k1, km1c);
                        let nv1 = b.select(after, zero, cur1);
                        let h = ev.set(b, h, k1, km1c, nv1);
                        let two = b.constant_i64(2, I64E);
                        let k2 = b.add(k, two);
                        let cur2 = ev.at(b, h, k2, km1c);
                        let im1 = b.sub(i, one_i);
                        let lt = b.compare(CmpDir::Lt, k, im1);
                        let z2 = b.and(after, lt);
                        let nv2 = b.select(z2, zero, cur2);
                        ev.set(b, h, k2, km1c, nv2)
                    };
                    let t2 = b.mul(t1, v2);
                    let t3 = b.mul(t1, v3);
                    let t = [t1, t2, t3];
                    // From the left: rows k..k+2, columns k..n-1.
                    let rows = b.dynamic_slice(h, &[k, zero_i], &[3, np]);
                    let r = unstack(b, rows, 0);
                    let nw = reflect3(b, &r, [v2, v3], t, nr3);
                    let kv = b.broadcast_in_dim(k, &[np], &[]);
                    let cols_ok = b.compare(CmpDir::Ge, kpos, kv);
                    let nn = ispl(b, n, &[np]);
                    let in_n = b.compare(CmpDir::Lt, kpos, nn);
                    let cols_ok = b.and(cols_ok, in_n);
                    let nw = select_all(b, cols_ok, &nw, &r);
                    let rows = stack(b, &nw, 0);
                    let h = b.dynamic_update_slice(h, rows, &[k, zero_i]);
                    // From the right: columns k..k+2, rows 0..min(k+3, i).
                    let apply_right = |b: &mut Builder, m: Value, rows_n: i64, limit: Option<Value>| -> Value {
                        let cols = b.dynamic_slice(m, &[zero_i, k], &[rows_n, 3]);
                        let c = unstack(b, cols, 1);
                        let nw = reflect3(b, &c, [v2, v3], t, nr3);
                        let nw = match limit {
                            Some(lim) => {
                                let pos = idx(b, &[rows_n], 0);
                                let lv = b.broadcast_in_dim(lim, &[rows_n], &[]);
                                let ok = b.compare(CmpDir::Le, pos, lv);
                                select_all(b, ok, &nw, &c)
                            }
                            None => nw,
                        };
                        let cols = stack(b, &nw, 1);
                        b.dynamic_update_slice(m, cols, &[zero_i, k])
                    };
                    let k3 = b.add(k, three);
                    let lim = b.min(k3, i);
                    let h = apply_right(b, h, np, Some(lim));
                    let z = apply_right(b, z, n, None);
                    let k1 = b.add(k, one_i);
                    vec![k1, h, z, va, v2, v3]
                },
            );
            let (h_sw, z_sw) = (sw[1], sw[2]);
            // ---- deflation: one eigenvalue, or a standardized 2x2 block ----
            let (h_df, z_df, wr_df, wi_df) = {
                let one_blk = b.compare(CmpDir::Eq, l_new, i);
                let im1c = b.max(im1, zero_i);
                let a = ev.at(b, h, im1c, im1c);
                let bb = ev.at(b, h, im1c, i);
                let c = ev.at(b, h, i, im1c);
                let d = ev.at(b, h, i, i);
                let ([na, nb, nc, nd], [r1r, r1i, r2r, r2i], cs, sn) = ev_lanv2(b, ev, a, bb, c, d);
                let h2 = ev.set(b, h, im1c, im1c, na);
                let h2 = ev.set(b, h2, im1c, i, nb);
                let h2 = ev.set(b, h2, i, im1c, nc);
                let h2 = ev.set(b, h2, i, i, nd);
                // Rotate rows i-1, i (columns > i) and columns i-1, i (rows < i-1), and Z.
                // rotate_pair: lines i-1 and i of m along `axis` (rows 0, columns 1) rotated by
                // (cs, sn), changed only where `keep` holds along them.
                let rotate_pair = |b: &mut Builder, m: Value, axis: usize, keep: Option<Value>| -> Value {
                    let len = b.dims(m)[1 - axis];
                    let (start, size) = if axis == 0 { ([im1c, zero_i], [2, len]) } else { ([zero_i, im1c], [len, 2]) };
                    let blk = b.dynamic_slice(m, &start, &size);
                    let xy = unstack(b, blk, axis);
                    let csv = b.broadcast_in_dim(cs, &[len], &[]);
                    let snv = b.broadcast_in_dim(sn, &[len], &[]);
                    let (nx, ny) = plane_rot(b, xy[0], xy[1], csv, snv);
                    let nw = match keep {
                        Some(k) => select_all(b, k, &[nx, ny], &xy),
                        None => vec![nx, ny],
                    };
                    let blk = stack(b, &nw, axis);
                    b.dynamic_update_slice(m, blk, &start)
                };
                let iv = b.broadcast_in_dim(i, &[np], &[]);
                let gt = b.compare(CmpDir::Gt, kpos, iv);
                let h2 = rotate_pair(b, h2, 0, Some(gt));
                let im1v = b.broadcast_in_dim(im1c, &[np], &[]);
                let lt = b.compare(CmpDir::Lt, kpos, im1v);
                let h2 = rotate_pair(b, h2, 1, Some(lt));
                let z2 = rotate_pair(b, z, 1, None);
                let wr2 = ev.vset(b, wr, im1c, r1r);
                let wr2 = ev.vset(b, wr2, i, r2r);
                let wi2 = ev.vset(b, wi, im1c, r1i);
                let wi2 = ev.vset(b, wi2, i, r2i);
                let hii = ev.at(b, h, i, i);
                let wr1 = ev.vset(b, wr, i, hii);
                let wi1 = ev.vset(b, wi, i, zero);
                (
                    b.select(one_blk, h, h2),
                    b.select(one_blk, z, z2),
                    b.select(one_blk, wr1, wr2),
                    b.select(one_blk, wi1, wi2),
                )
            };
            let h = b.select(deflated, h_df, h_sw);
            let z = b.select(deflated, z_df, z_sw);
            let wr = b.select(deflated, wr_df, wr);
            let wi = b.select(deflated, wi_df, wi);
            let lm1 = b.sub(l_new, one_i);
            let i_n = b.select(deflated, lm1, i);
            let l_n = b.select(deflated, ilo, l_new);
            let its1 = b.add(its, one_i);
            let its_n = b.select(deflated, zero_i, its1);
            let kd_n = b.select(deflated, zero_i, kdefl1);
            let failed = b.compare(CmpDir::Gt, its_n, itmax);
            vec![h, z, wr, wi, i_n, l_n, its_n, kd_n, failed]
        },
    );
    let t = b.slice(out[0], &[0, 0], &[n, n], &[1, 1]);
    let zf = b.slice(out[1], &[0, 0], &[n, n], &[1, 1]);
    // A failed iteration leaves NaN eigenvalues (LAPACK reports info > 0).
    let nanv = spl(b, f64::NAN, e, &[n]);
    let failed = b.broadcast_in_dim(out[8], &[n], &[]);
    let wr = b.select(failed, nanv, out[2]);
    let wi = b.select(failed, nanv, out[3]);
    (t, zf, wr, wi)
}

/// A real value as a complex one (zero imaginary part).
fn cplx(b: &mut Builder, re: Value) -> Value {
    let d = b.dims(re).to_vec();
    let z = spl(b, 0.0, b.elem(re), &d);
    b.complex(re, z)
}

/// Right eigenvectors of the standardized quasi-triangular T (LAPACK's dtrevc3, back-transformed
/// by Z), the balancing undone (dgebak), each normalized as dgeev does: unit 2-norm; for a
/// complex pair, the largest component made real by a plane rotation (dlartg: LAPACK 3.10's
/// sign convention for float, the older one for double, as MKL's sgeev/dgeev). Returns the
/// complex eigenvector matrix [n, n] (a pair's second column the conjugate of the first).
fn ev_vectors(b: &mut Builder, ev: &Ev, t: Value, z: Value, scale: Value, ilo: Value, ihi: Value) -> Value {
    let n = ev.n;
    let e = ev.e;
    let ce = e.complex_of().unwrap();
    let d2 = [n, n];
    let zero = ev.c(b, 0.0);
    let ulp = ev.ulp();
    let smlnum = ev.safmin() * (n as f64 / ulp);
    // Subdiagonal and diagonal of T.
    let r = idx(b, &d2, 0);
    let c = idx(b, &d2, 1);
    let dg = band(b, t, 0);
    let sub = band(b, t, 1); // sub[k] = T[k, k-1]
    let sup = band(b, t, -1); // sup[k] = T[k, k+1]
    let sub_next = next_along(b, sub, 0); // T[k+1, k]
    let zv = spl(b, 0.0, e, &[n]);
    let second = b.compare(CmpDir::Ne, sub, zv);
    let first = b.compare(CmpDir::Ne, sub_next, zv);
    // Eigenvalue of each column: a pair's first column takes wr + i wi (wi > 0).
    let dg_next = next_along(b, dg, 0);
    let wi = {
        let a = b.abs(sub_next);
        let a = b.sqrt(a);
        let c = b.abs(sup);
        let c = b.sqrt(c);
        b.mul(a, c)
    };
    let wr = b.select(first, dg_next, dg);
    let wi = b.select(first, wi, zv);
    let lam = b.complex(wr, wi);
    let smin = {
        let a = b.abs(wr);
        let w = b.abs(wi);
        let s = b.add(a, w);
        let u = spl(b, ulp, e, &[n]);
        let s = b.mul(u, s);
        let sm = spl(b, smlnum, e, &[n]);
        b.max(s, sm)
    };
    // Initial vectors: 1 at the real eigenvalue; for a pair (k, k+1), LAPACK's choice.
    let x0 = {
        let onev = spl(b, 1.0, e, &[n]);
        let big = {
            let a = b.abs(sup);
            let c = b.abs(sub_next);
            b.compare(CmpDir::Ge, a, c)
        };
        let w_t12 = b.div(wi, sup);
        let w_t21 = b.div(wi, sub_next);
        let nw_t21 = b.neg(w_t21);
        // first component (row c) and second (row c + 1, imaginary) of a pair's column c
        let p1 = b.select(big, onev, nw_t21);
        let p2 = b.select(big, w_t12, onev);
        let diag_val = b.select(first, p1, onev);
        let diag_val = cplx(b, diag_val);
        let below = b.complex(zv, p2);
        let cz = cspl(b, 0.0, e, &d2);
        let on = b.compare(CmpDir::Eq, r, c);
        let dv = b.broadcast_in_dim(diag_val, &d2, &[1]);
        let x = b.select(on, dv, cz);
        let one2 = ispl(b, 1, &d2);
        let c1 = b.add(c, one2);
        let onb = b.compare(CmpDir::Eq, r, c1);
        let fb = b.broadcast_in_dim(first, &d2, &[1]);
        let onb = b.and(onb, fb);
        let bv = b.broadcast_in_dim(below, &d2, &[1]);
        let x = b.select(onb, bv, x);
        // Second columns of pairs are rebuilt from the first.
        let sb = b.broadcast_in_dim(second, &d2, &[1]);
        b.select(sb, cz, x)
    };
    let tc = cplx(b, t);
    b.set_precision(Some(Precision::Highest));
    let tx = b.dot_general(tc, x0, &[], &[], &[1], &[0], ce);
    let rhs0 = b.neg(tx);
    // Rows below each column's start are solved; the start is the column itself.
    let cz = cspl(b, 0.0, e, &d2);
    let above = b.compare(CmpDir::Lt, r, c);
    let rhs0 = b.select(above, rhs0, cz);
    let nm1 = ev.i(b, n - 1);
    let sol = b.while_loop(
        &[nm1, rhs0, cz],
        |b, v| {
            let z = b.constant_i64(0, I64E);
            b.compare(CmpDir::Ge, v[0], z)
        },
        |b, v| {
            let (j, rhs, x) = (v[0], v[1], v[2]);
            let one_i = b.constant_i64(1, I64E);
            let zero_i = b.constant_i64(0, I64E);
            let jm1 = b.sub(j, one_i);
            let jm1c = b.max(jm1, zero_i);
            let s_j = pick1(b, sub, j);
            let has = b.compare(CmpDir::Ne, s_j, zero);
            let jpos = b.compare(CmpDir::Ge, j, one_i);
            let two = b.and(has, jpos);
            let cols = idx(b, &[n], 0);
            let jv = b.broadcast_in_dim(j, &[n], &[]);
            let act1 = b.compare(CmpDir::Gt, cols, jv);
            let act2 = b.compare(CmpDir::Gt, cols, jv);
            let not_second = b.not(second);
            let act1 = b.and(act1, not_second);
            let act2 = b.and(act2, not_second);
            let rj = row_at(b, rhs, j);
            let rjm1 = row_at(b, rhs, jm1c);
            let tjj = ev.at(b, t, j, j);
            let tjj = b.broadcast_in_dim(tjj, &[n], &[]);
            let tjj = cplx(b, tjj);
            // 1x1: x = r / (T[j,j] - lambda), the divisor kept off zero by smin.
            let den = b.sub(tjj, lam);
            let dre = b.real(den);
            let dim = b.imag(den);
            let a1 = b.abs(dre);
            let a2 = b.abs(dim);
            let cn = b.add(a1, a2);
            let tiny = b.compare(CmpDir::Lt, cn, smin);
            let sminc = cplx(b, smin);
            let den = b.select(tiny, sminc, den);
            let x1 = b.div(rj, den);
            // 2x2 block (j-1, j) by Cramer's rule.
            let a = ev.at(b, t, jm1c, jm1c);
            let bb = ev.at(b, t, jm1c, j);
            let cc = ev.at(b, t, j, jm1c);
            let d = ev.at(b, t, j, j);
            let bc = |b: &mut Builder, x: Value| -> Value {
                let v = b.broadcast_in_dim(x, &[n], &[]);
                cplx(b, v)
            };
            let (a, bb, cc, d) = (bc(b, a), bc(b, bb), bc(b, cc), bc(b, d));
            let al = b.sub(a, lam);
            let dl = b.sub(d, lam);
            let p = b.mul(al, dl);
            let q = b.mul(bb, cc);
            let det = b.sub(p, q);
            let t1 = b.mul(dl, rjm1);
            let t2 = b.mul(bb, rj);
            let u1 = b.sub(t1, t2);
            let y1 = b.div(u1, det);
            let t1 = b.mul(al, rj);
            let t2 = b.mul(cc, rjm1);
            let u2 = b.sub(t1, t2);
            let y2 = b.div(u2, det);
            // Write the solution rows and update the right-hand sides above.
            let twov = b.broadcast_in_dim(two, &[n], &[]);
            let xj = b.select(twov, y2, x1);
            let act = b.select(twov, act2, act1);
            let rows2 = idx(b, &d2, 0);
            let jb = b.broadcast_in_dim(j, &d2, &[]);
            let jm1b = b.broadcast_in_dim(jm1c, &d2, &[]);
            let at_j = b.compare(CmpDir::Eq, rows2, jb);
            let at_jm1 = b.compare(CmpDir::Eq, rows2, jm1b);
            let twob = b.broadcast_in_dim(two, &d2, &[]);
            let at_jm1 = b.and(at_jm1, twob);
            let actb = b.broadcast_in_dim(act, &d2, &[1]);
            let xjb = b.broadcast_in_dim(xj, &d2, &[1]);
            let y1b = b.broadcast_in_dim(y1, &d2, &[1]);
            let w1 = b.and(at_j, actb);
            let x = b.select(w1, xjb, x);
            let w2 = b.and(at_jm1, actb);
            let x = b.select(w2, y1b, x);
            let tcj = col_at(b, t, j);
            let tcj = cplx(b, tcj);
            let tcjm1 = col_at(b, t, jm1c);
            let tcjm1 = cplx(b, tcjm1);
            let tj = b.broadcast_in_dim(tcj, &d2, &[0]);
            let tjm1 = b.broadcast_in_dim(tcjm1, &d2, &[0]);
            let p1 = b.mul(tj, xjb);
            let p2 = b.mul(tjm1, y1b);
            let zc = cspl(b, 0.0, e, &d2);
            let p2 = b.select(twob, p2, zc);
            let upd = b.add(p2, p1);
            let nr = b.sub(rhs, upd);
            let lim = b.select(two, jm1c, j);
            let limb = b.broadcast_in_dim(lim, &d2, &[]);
            let above = b.compare(CmpDir::Lt, rows2, limb);
            let w = b.and(above, actb);
            let rhs = b.select(w, nr, rhs);
            let two_i = b.constant_i64(2, I64E);
            let step = b.select(two, two_i, one_i);
            vec![b.sub(j, step), rhs, x]
        },
    );
    let x = b.add(x0, sol[2]);
    let zc = cplx(b, z);
    b.set_precision(Some(Precision::Highest));
    let v = b.dot_general(zc, x, &[], &[], &[1], &[0], ce);
    // dgebak: undo the scaling (rows ilo..ihi), then the permutations.
    let v = {
        let rr = idx(b, &d2, 0);
        let lo = b.broadcast_in_dim(ilo, &d2, &[]);
        let hi = b.broadcast_in_dim(ihi, &d2, &[]);
        let ge = b.compare(CmpDir::Ge, rr, lo);
        let le = b.compare(CmpDir::Le, rr, hi);
        let inr = b.and(ge, le);
        let ne = b.compare(CmpDir::Ne, ilo, ihi);
        let neb = b.broadcast_in_dim(ne, &d2, &[]);
        let inr = b.and(inr, neb);
        let sc = cplx(b, scale);
        let scb = b.broadcast_in_dim(sc, &d2, &[0]);
        let vs = b.mul(v, scb);
        b.select(inr, vs, v)
    };
    let z0 = ev.i(b, 0);
    let perm = b.while_loop(
        &[z0, v],
        |b, v| {
            let nn = b.constant_i64(n, I64E);
            b.compare(CmpDir::Lt, v[0], nn)
        },
        |b, v| {
            let (ii, m) = (v[0], v[1]);
            let one_i = b.constant_i64(1, I64E);
            let lt = b.compare(CmpDir::Lt, ii, ilo);
            let gt = b.compare(CmpDir::Gt, ii, ihi);
            let lm = b.sub(ilo, one_i);
            let rev = b.sub(lm, ii);
            let i = b.select(lt, rev, ii);
            let k = pick1(b, scale, i);
            let k = b.convert(k, I64E);
            let outside = b.or(lt, gt);
            let ne = b.compare(CmpDir::Ne, k, i);
            let go = b.and(outside, ne);
            let nm1 = b.constant_i64(n - 1, I64E);
            let z0 = b.constant_i64(0, I64E);
            let kc = b.clamp(z0, k, nm1);
            let sw = swap_lines(b, m, i, kc, 0);
            let m = b.select(go, sw, m);
            vec![b.add(ii, one_i), m]
        },
    );
    let v = perm[1];
    // dgeev's normalization.
    let re = b.real(v);
    let im = b.imag(v);
    let sq = |b: &mut Builder, x: Value| -> Value {
        let p = b.mul(x, x);
        let s = sum_over(b, p, &[0]);
        b.sqrt(s)
    };
    let nre = sq(b, re);
    let nim = sq(b, im);
    // Real columns: v / ||v||.
    let onev = spl(b, 1.0, e, &[n]);
    let inv_re = b.div(onev, nre);
    // Pairs: scale by 1 / hypot(||re||, ||im||), then rotate the largest component real.
    let hyp = lapy2(b, nre, nim);
    let inv_p = b.div(onev, hyp);
    let is_pair = first;
    let scl = b.select(is_pair, inv_p, inv_re);
    let sclb = b.broadcast_in_dim(scl, &d2, &[1]);
    let re = b.mul(re, sclb);
    let im = b.mul(im, sclb);
    let work = {
        let a = b.mul(re, re);
        let c = b.mul(im, im);
        b.add(a, c)
    };
    // First row of the largest |v_k|^2 per column.
    let (kk, _) = first_argmax(b, work, 0, -1.0);
    let rows = idx(b, &d2, 0);
    let kb = b.broadcast_in_dim(kk, &d2, &[1]);
    let atk = b.compare(CmpDir::Eq, rows, kb);
    let zz = spl(b, 0.0, e, &d2);
    let fsel = b.select(atk, re, zz);
    let f = sum_over(b, fsel, &[0]);
    let gsel = b.select(atk, im, zz);
    let g = sum_over(b, gsel, &[0]);
    let (cs, sn) = {
        let g0 = b.compare(CmpDir::Eq, g, zv);
        let f0 = b.compare(CmpDir::Eq, f, zv);
        let ff = b.mul(f, f);
        let gg = b.mul(g, g);
        let s = b.add(ff, gg);
        let dd = b.sqrt(s);
        // The general case, and sn for f == 0 (the two conventions differ only there).
        let (cs, sn, sn_f0) = if e == ElemType::F64 {
            // LAPACK before 3.10 (MKL's dlartg): cs = f / r, sn = g / r, r > 0 unless
            // |f| > |g| and f < 0.
            let cs = b.div(f, dd);
            let sn = b.div(g, dd);
            let fa = b.abs(f);
            let ga = b.abs(g);
            let gt = b.compare(CmpDir::Gt, fa, ga);
            let neg = b.compare(CmpDir::Lt, cs, zv);
            let flip = b.and(gt, neg);
            let ncs = b.neg(cs);
            let nsn = b.neg(sn);
            let cs = b.select(flip, ncs, cs);
            let sn = b.select(flip, nsn, sn);
            (cs, sn, onev)
        } else {
            // LAPACK 3.10's slartg: r has the sign of f.
            let fa = b.abs(f);
            let cs = b.div(fa, dd);
            let rr = fsign(b, dd, f);
            let sn = b.div(g, rr);
            let sg = fsign(b, onev, g);
            (cs, sn, sg)
        };
        let cs = b.select(f0, zv, cs);
        let sn = b.select(f0, sn_f0, sn);
        let cs = b.select(g0, onev, cs);
        let sn = b.select(g0, zv, sn);
        (cs, sn)
    };
    let csb = b.broadcast_in_dim(cs, &d2, &[1]);
    let snb = b.broadcast_in_dim(sn, &d2, &[1]);
    let (re_r, im_r) = plane_rot(b, re, im, csb, snb);
    let im_r = b.select(atk, zz, im_r);
    let pb = b.broadcast_in_dim(is_pair, &d2, &[1]);
    let re = b.select(pb, re_r, re);
    let im = b.select(pb, im_r, im);
    // A pair's second column: the conjugate of the first.
    let re_p = prev_along(b, re, 1);
    let im_p = prev_along(b, im, 1);
    let im_pn = b.neg(im_p);
    let sb = b.broadcast_in_dim(second, &d2, &[1]);
    let re = b.select(sb, re_p, re);
    let im = b.select(sb, im_pn, im);
    // Real columns carry no imaginary part.
    let realcol = {
        let a = b.or(first, second);
        b.not(a)
    };
    let rb = b.broadcast_in_dim(realcol, &d2, &[1]);
    let im = b.select(rb, zz, im);
    b.complex(re, im)
}

/// dgeev on each matrix of a batch [B, n, n] (real): (eigenvalues [B, n], eigenvectors [B, n, n])
/// as complex values, the vectors only when `vectors`. Matrices with a non-finite entry give NaN.
fn geev_batch(b: &mut Builder, a: Value, vectors: bool) -> (Value, Value) {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
    let ce = e.complex_of().unwrap();
    let ev = Ev { e, n };
    let w0 = cspl(b, 0.0, e, &[bs, n]);
    let v0 = cspl(b, 0.0, e, &[bs, n, n]);
    let z0 = b.constant_i64(0, I64E);
    let out = b.while_loop(
        &[z0, w0, v0],
        |b, v| {
            let nb = b.constant_i64(bs, I64E);
            b.compare(CmpDir::Lt, v[0], nb)
        },
        |b, v| {
            let (bi, wall, vall) = (v[0], v[1], v[2]);
            let z0 = b.constant_i64(0, I64E);
            let m = b.dynamic_slice(a, &[bi, z0, z0], &[1, n, n]);
            let m = b.reshape(m, &[n, n]);
            let fin = b.is_finite(m);
            let t = b.constant_bool(true);
            let all_fin = b.reduce(&[fin], &[t], &[0, 1], |b, x| vec![b.and(x[0], x[1])])[0];
            let zm = spl(b, 0.0, e, &[n, n]);
            let fb = b.broadcast_in_dim(all_fin, &[n, n], &[]);
            let m = b.select(fb, m, zm);
            let (ab, ilo, ihi, scale) = ev_gebal(b, &ev, m);
            let (h, q) = ev_hessenberg(b, &ev, ab, ilo, ihi);
            let (tt, zz, wr, wi) = ev_lahqr(b, &ev, h, q, ilo, ihi);
            let w = b.complex(wr, wi);
            let nanc = cspl(b, f64::NAN, e, &[n]);
            let fv = b.broadcast_in_dim(all_fin, &[n], &[]);
            let w = b.select(fv, w, nanc);
            let w = b.reshape(w, &[1, n]);
            let wall = b.dynamic_update_slice(wall, w, &[bi, z0]);
            let vall = if vectors {
                let vv = ev_vectors(b, &ev, tt, zz, scale, ilo, ihi);
                let nanm = cspl(b, f64::NAN, e, &[n, n]);
                let fm = b.broadcast_in_dim(all_fin, &[n, n], &[]);
                let vv = b.select(fm, vv, nanm);
                let vv = b.reshape(vv, &[1, n, n]);
                b.dynamic_update_slice(vall, vv, &[bi, z0, z0])
            } else {
                vall
            };
            let one = b.constant_i64(1, I64E);
            vec![b.add(bi, one), wall, vall]
        },
    );
    let _ = ce;
    (out[1], out[2])
}

/// The checks of linalg.eig / linalg.eigvals, and the working real type.
fn eig_input(cx: &Cx, a: &Tensor) -> Result<()> {
    let api = "linalg.eig";
    check_square(cx, a, api)?;
    check!(
        a.dtype.is_float() || a.dtype.is_complex(),
        Runtime,
        "Unknown Complex ScalarType for {}",
        a.dtype.torch_name()
    );
    check!(
        matches!(a.dtype, DType::F32 | DType::F64 | DType::C64 | DType::C128),
        NotImplemented,
        "\"linalg_eig_out_cpu\" not implemented for '{}'",
        a.dtype.torch_name()
    );
    check!(
        !a.dtype.is_complex(),
        NotImplemented,
        "linalg.eig: complex input is not supported on tpu yet"
    );
    Ok(())
}

/// The size program of linalg_eig: 1 when some entry is not finite (PyTorch raises).
fn eig_nonfinite(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let z = cx.b.constant_i64(0, I64E);
    if eig_input(cx, &a).is_err() || cx.numel(a.v) == 0 {
        return one(z);
    }
    let fin = cx.is_finite(a.v);
    let nd = cx.dims(a.v).len() as i64;
    let t = cx.b.constant_bool(true);
    let all = cx.reduce(&[fin], &[t], &(0..nd).collect::<Vec<_>>(), |b, x| vec![b.and(x[0], x[1])])[0];
    let one_ = cx.b.constant_i64(1, I64E);
    one(cx.select(all, z, one_))
}

fn eig_common(cx: &mut Cx, a: &Tensor, vectors: bool) -> Result<(Value, Value)> {
    let d = cx.dims(a.v);
    let n = d[d.len() - 1];
    let batch = d[..d.len() - 2].to_vec();
    let bs: i64 = batch.iter().product();
    let ce = a.dtype.to_complex().elem();
    let mut wd = batch.clone();
    wd.push(n);
    if bs == 0 || n == 0 {
        let w = cx.full(0.0, a.dtype, &wd);
        let w = cx.cast(w, a.dtype.to_complex());
        let v = cx.full(0.0, a.dtype, &d);
        let v = cx.cast(v, a.dtype.to_complex());
        let _ = ce;
        return Ok((w, v));
    }
    let (m, _) = flat_batch(cx, a.v);
    let (w, v) = geev_batch(cx, m, vectors);
    let w = cx.reshape(w, &wd);
    let v = cx.reshape(v, &d);
    Ok((w, v))
}

/// linalg_eig(self) -> (eigenvalues, eigenvectors), complex: LAPACK's geev for real input,
/// reproducing its eigenvalue order (the order the QR iteration deflates them) and its
/// eigenvector normalization (unit norm; a complex pair's largest component real).
fn linalg_eig(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    eig_input(cx, &a)?;
    // Compiled graphs run without the size program (no data-dependent errors there).
    check!(args.int_or("__size", 0)? == 0, Runtime, "torch.linalg.eig: input tensor should not contain infs or NaNs.");
    let (w, v) = eig_common(cx, &a, true)?;
    Ok(vec![Out::Tensor(w), Out::Tensor(v)])
}

/// _linalg_eigvals(self): the eigenvalues of linalg_eig (NaN for a matrix with non-finite
/// entries, like LAPACK's).
fn linalg_eigvals(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    eig_input(cx, &a)?;
    let (w, _) = eig_common(cx, &a, false)?;
    one(w)
}
