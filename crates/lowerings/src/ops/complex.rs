//! Complex numbers from real parts: complex (real, imag) and polar (abs, angle), and the zero
//! tensors autograd gives real inputs of complex-aware formulas.
//! view_as_real / view_as_complex as values are for compiled graphs: in eager mode they are views
//! (the shim makes them over the same storage, the engine reinterprets its bytes).
use crate::args::Args;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[
    op("complex", complex),
    op("polar", polar),
    op("_efficientzerotensor", efficient_zero_tensor),
    op("view_as_real", view_as_real),
    op("view_as_complex", view_as_complex),
];

/// PyTorch's complex_check_dtype: two Half/Float/Double parts of one dtype, and an out= of the
/// matching complex dtype. Gives the parts broadcast together.
fn parts(cx: &mut Cx, args: &Args, first: &str, second: &str) -> Result<(Value, Value)> {
    let a = args.tensor(first)?;
    let b = args.tensor(second)?;
    let floating = |d: DType| matches!(d, DType::F16 | DType::F32 | DType::F64);
    check!(
        floating(a.dtype) && floating(b.dtype),
        Runtime,
        "Expected both inputs to be Half, Float or Double tensors but got {} and {}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    check!(
        a.dtype == b.dtype,
        Runtime,
        "Expected object of scalar type {} but got scalar type {} for second argument",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    let want = match a.dtype {
        DType::F32 => DType::C64,
        DType::F64 => DType::C128,
        _ => bail!(NotImplemented, "torchtpu: ComplexHalf tensors are not supported on tpu"),
    };
    if let Some(out) = args.opt_tensor("out")? {
        check!(
            out.dtype == want,
            Runtime,
            "Expected object of scalar type {} but got scalar type {} for argument 'out'",
            want.torch_name(),
            out.dtype.torch_name()
        );
    }
    let v = cx.broadcast_all(&[a.v, b.v])?;
    Ok((v[0], v[1]))
}

/// complex(real, imag): real + imag * 1j, broadcast.
fn complex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (re, im) = parts(cx, args, "real", "imag")?;
    one(cx.complex(re, im))
}

/// polar(abs, angle): abs * cos(angle) + abs * sin(angle) * 1j, as PyTorch's CPU kernel.
fn polar(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (r, theta) = parts(cx, args, "abs", "angle")?;
    let c = cx.cos(theta);
    let s = cx.sin(theta);
    let re = cx.mul(r, c);
    let im = cx.mul(r, s);
    one(cx.complex(re, im))
}

/// _efficientzerotensor(size, dtype): the zero gradients autograd's complex-aware formulas give
/// real inputs (sgn, angle, ...). CPU and CUDA make a storage-less ZeroTensor; on tpu it is a
/// plain zero-filled tensor (same values, and every op can read it).
fn efficient_zero_tensor(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let size = args.ints("size")?;
    let dtype = args.dtype("dtype")?.unwrap_or(DType::F32);
    one(cx.full(0.0, dtype, &size))
}

/// view_as_real as a value (compiled graphs): [..., 2] of (real, imag).
fn view_as_real(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_complex(), Runtime, "view_as_real is only supported for complex tensors");
    let mut dims = cx.dims(x.v);
    dims.push(1);
    let re = cx.real(x.v);
    let im = cx.imag(x.v);
    let re = cx.reshape(re, &dims);
    let im = cx.reshape(im, &dims);
    one(cx.concatenate(&[re, im], dims.len() as i64 - 1))
}

/// view_as_complex as a value (compiled graphs): [..., 2] pairs as complex numbers.
fn view_as_complex(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(
        matches!(x.dtype, DType::F16 | DType::F32 | DType::F64),
        Runtime,
        "view_as_complex is only supported for half, float and double tensors, but got a tensor of scalar type: {}",
        x.dtype.torch_name()
    );
    let dims = cx.dims(x.v);
    check!(!dims.is_empty(), Runtime, "Input tensor must have one or more dimensions");
    check!(dims[dims.len() - 1] == 2, Runtime, "Tensor must have a last dimension of size 2");
    if x.dtype == DType::F16 {
        bail!(NotImplemented, "torchtpu: ComplexHalf tensors are not supported on tpu");
    }
    let n = dims.len();
    let out_dims = dims[..n - 1].to_vec();
    let mut start = vec![0i64; n];
    let mut limit = dims.clone();
    let strides = vec![1i64; n];
    limit[n - 1] = 1;
    let re = cx.slice(x.v, &start, &limit, &strides);
    start[n - 1] = 1;
    limit[n - 1] = 2;
    let im = cx.slice(x.v, &start, &limit, &strides);
    let re = cx.reshape(re, &out_dims);
    let im = cx.reshape(im, &out_dims);
    one(cx.complex(re, im))
}
