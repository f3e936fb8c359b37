//! Softmax along a dim: _softmax, _log_softmax and their backward ops _softmax_backward_data
//! and _log_softmax_backward_data. 16-bit floats are computed in float32 and rounded once.
use crate::args::Args;
use crate::blocks::reduce::{along, opt_dtype, reduce, reduce_back, unreduce, Red};
use crate::blocks::round16::is_16bit;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[
    op("_softmax", |cx, a| softmax(cx, a, false)),
    op("_log_softmax", |cx, a| softmax(cx, a, true)),
    op("_softmax_backward_data", |cx, a| softmax_backward(cx, a, false)),
    op("_log_softmax_backward_data", |cx, a| softmax_backward(cx, a, true)),
];

// ---- softmax --------------------------------------------------------------------------------------

/// _softmax/_log_softmax(self, dim, half_to_float) and their out= forms. half_to_float (a
/// Half input giving a float result) is supported as on CUDA.
fn softmax(cx: &mut Cx, args: &Args, log: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let name = if log { "log_softmax" } else { "softmax" };
    check!(
        x.dtype.is_float(),
        NotImplemented,
        "\"{}_lastdim_kernel_impl\" not implemented for '{}'",
        name,
        x.dtype.torch_name()
    );
    let half_to_float = args.bool_or("half_to_float", false)?;
    check!(!half_to_float || x.dtype == DType::F16, Runtime, "conversion is supported for Half type only");
    let out_dt = if half_to_float { DType::F32 } else { x.dtype };
    let in_dims = cx.dims(x.v);
    let dim = args.int("dim")?;
    let dims = along(dim, in_dims.len())?;
    // PyTorch's CPU kernels for 16-bit floats round one intermediate to the input dtype: the
    // exponentials when the softmax dim is not innermost, the sum of exponentials for a
    // log_softmax over the innermost dim. Rounding the same way matches them to the last bit
    // far more often than a plain float32 computation does.
    let innermost = dims.iter().all(|&d| in_dims[d as usize + 1..].iter().all(|&s| s == 1));
    let round_16 = |cx: &mut Cx, v: Value| {
        if is_16bit(x.dtype) && !half_to_float {
            let r = cx.cast(v, x.dtype);
            cx.cast(r, DType::F32)
        } else {
            v
        }
    };
    let v = cx.cast(x.v, x.dtype.opmath());
    let m = reduce_back(cx, v, &dims, Red::ShiftMax);
    let z = cx.sub(v, m);
    let e = cx.exp(z);
    // The sum stays reduced until its last use: the log runs once per row, not per element.
    let s = reduce(cx, e, &dims, Red::Sum);
    let r = if log {
        let s = if innermost { round_16(cx, s) } else { s };
        let l = cx.log(s);
        let l = unreduce(cx, l, &in_dims, &dims);
        cx.sub(z, l)
    } else {
        let e = if innermost { e } else { round_16(cx, e) };
        let s = unreduce(cx, s, &in_dims, &dims);
        cx.div(e, s)
    };
    one(cx.cast(r, out_dt))
}

/// _softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, input_dtype).
fn softmax_backward(cx: &mut Cx, args: &Args, log: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let out = args.tensor("output")?;
    let in_dt = opt_dtype(args, "input_dtype")?.unwrap_or(g.dtype);
    check!(
        g.dtype == in_dt || (g.dtype == DType::F32 && in_dt == DType::F16),
        Runtime,
        "expected input and grad types to match, or input to be at::Half and grad to be at::Float"
    );
    check!(
        cx.dims(g.v) == cx.dims(out.v),
        Runtime,
        "grad_output and output must have the same shape, got {:?} and {:?}",
        cx.dims(g.v),
        cx.dims(out.v)
    );
    let dims = along(args.int("dim")?, cx.dims(g.v).len())?;
    let acc = g.dtype.opmath();
    let gv = cx.cast(g.v, acc);
    let ov = cx.cast(out.v, acc);
    let r = if log {
        let s = reduce_back(cx, gv, &dims, Red::Sum);
        let p = cx.exp(ov);
        let ps = cx.mul(p, s);
        cx.sub(gv, ps)
    } else {
        let go = cx.mul(gv, ov);
        let s = reduce_back(cx, go, &dims, Red::Sum);
        let d = cx.sub(gv, s);
        cx.mul(ov, d)
    };
    one(cx.cast(r, in_dt))
}
