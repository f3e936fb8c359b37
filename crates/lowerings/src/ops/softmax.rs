//! Softmax along a dim: _softmax, _log_softmax and their backward ops _softmax_backward_data
//! and _log_softmax_backward_data; _masked_softmax (nn.MultiheadAttention's and the transformer
//! fast path's) and its backward. 16-bit floats are computed in float32 and rounded once.
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
    op("_masked_softmax", masked_softmax),
    op("_masked_softmax_backward", masked_softmax_backward),
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
        softmax_grad(cx, gv, ov, &dims)
    };
    one(cx.cast(r, in_dt))
}

/// Softmax's input gradient from its output's: output * (grad - sum(grad * output)).
fn softmax_grad(cx: &mut Cx, grad: Value, output: Value, dims: &[i64]) -> Value {
    let go = cx.mul(grad, output);
    let s = reduce_back(cx, go, dims, Red::Sum);
    let d = cx.sub(grad, s);
    cx.mul(output, d)
}

// ---- masked softmax -------------------------------------------------------------------------------

/// The mask of _masked_softmax(self, mask, dim, mask_type) broadcast to the input, with
/// PyTorch's CPU rules: a 2-d mask of a 4-d input is an (L, L) attention mask (type 0) or a
/// (B, L) key padding mask (type 1); every other mask has the input's shape (type 2).
fn broadcast_mask(cx: &mut Cx, args: &Args, xd: &[i64]) -> Result<Value> {
    let mask = args.tensor("mask")?;
    check!(mask.dtype == DType::Bool, Runtime, "Mask should be a boolean tensor");
    let md = cx.dims(mask.v);
    let mask_type = if md.len() != 2 || xd.len() != 4 { Some(2) } else { args.opt_int("mask_type")? };
    match mask_type {
        Some(2) => {
            check!(md == xd, Runtime, "For mask_type == 2 mask shape should match input shape");
            Ok(mask.v)
        }
        Some(1) => {
            check!(xd[0] == md[0] && xd[2] == md[1] && xd[3] == md[1], Runtime, "For mask_type == 1 mask shape should be (B, L)");
            Ok(cx.broadcast_in_dim(mask.v, xd, &[0, 3]))
        }
        Some(0) => {
            check!(xd[2] == md[0] && xd[2] == md[1] && xd[3] == md[1], Runtime, "For mask_type == 0 mask shape should be (L, L)");
            Ok(cx.broadcast_in_dim(mask.v, xd, &[2, 3]))
        }
        _ => crate::bail!(Runtime, "Mask Type should be defined"),
    }
}

/// Softmax with the mask's true elements left out (as if -inf): a row with all of them left
/// out gives NaN, as on CPU.
fn masked_softmax(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_float(), NotImplemented, "\"masked_softmax\" not implemented for '{}'", x.dtype.torch_name());
    let xd = cx.dims(x.v);
    let mask = broadcast_mask(cx, args, &xd)?;
    let dim = args.opt_int("dim")?.unwrap_or(xd.len() as i64 - 1);
    let dims = along(dim, xd.len())?;
    let acc = x.dtype.opmath();
    let v = cx.cast(x.v, acc);
    let minus_inf = cx.full(f64::NEG_INFINITY, acc, &xd);
    let v = cx.select(mask, minus_inf, v);
    let m = reduce_back(cx, v, &dims, Red::ShiftMax);
    let z = cx.sub(v, m);
    let e = cx.exp(z);
    let s = reduce_back(cx, e, &dims, Red::Sum);
    let r = cx.div(e, s);
    one(cx.cast(r, x.dtype))
}

/// _masked_softmax_backward(grad_output, output, mask, dim): softmax's backward with the
/// masked elements' gradient 0.
fn masked_softmax_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let out = args.tensor("output")?;
    let mask = args.tensor("mask")?;
    check!(mask.dtype == DType::Bool, Runtime, "Mask should be a boolean tensor");
    let gd = cx.dims(g.v);
    check!(cx.dims(out.v) == gd && cx.dims(mask.v) == gd, Runtime, "_masked_softmax_backward: grad_output, output and mask must have the same shape");
    let dim = args.opt_int("dim")?.unwrap_or(gd.len() as i64 - 1);
    let dims = along(dim, gd.len())?;
    let acc = g.dtype.opmath();
    let gv = cx.cast(g.v, acc);
    let ov = cx.cast(out.v, acc);
    let r = softmax_grad(cx, gv, ov, &dims);
    let zero = cx.full(0.0, acc, &gd);
    let r = cx.select(mask.v, zero, r);
    let r = cx.cast(r, g.dtype);
    // CPU's kernel views a 0-d gradient as one element, and so returns it.
    one(if gd.is_empty() { cx.reshape(r, &[1]) } else { r })
}
