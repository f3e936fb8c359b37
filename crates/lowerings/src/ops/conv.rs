//! Convolutions: convolution_overrideable (what at::_convolution calls for this backend, with
//! its shape checks already done) and convolution_backward_overrideable, for any number of
//! spatial dims, strides, padding, dilation, groups, and transposed convolutions. The
//! gradients are convolutions too (as in JAX's conv_general_dilated transpose rules).
//! torch.compile graphs name the same ops convolution and convolution_backward.
use crate::args::{Args, Tensor};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use crate::blocks::precision;
use stablehlo::{ConvDims, Value};

pub(crate) const OPS: &[Op] = &[
    // Routed: the composite kernels of both only raise for backends other than CPU/CUDA.
    op("convolution_overrideable", convolution).routed(&["convolution_overrideable"]),
    op("convolution_backward_overrideable", convolution_backward).routed(&["convolution_backward_overrideable"]),
    // The same ops under the names torch.compile graphs use.
    op("convolution", convolution),
    op("convolution_backward", convolution_backward),
];

/// Stride, padding, dilation and groups of one call, one entry per spatial dim.
struct Params {
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    output_padding: Vec<i64>,
    transposed: bool,
    groups: i64,
}

/// A list argument expanded to `n` entries (PyTorch accepts one value for all dims).
fn per_dim(args: &Args, name: &str, n: usize, default: i64) -> Result<Vec<i64>> {
    let v = args.opt_ints(name)?.unwrap_or_default();
    Ok(match v.len() {
        0 => vec![default; n],
        1 => vec![v[0]; n],
        _ => {
            check!(v.len() == n, Runtime, "expected {} to have {} elements, but got {}", name, n, v.len());
            v
        }
    })
}

fn params(args: &Args, n: usize) -> Result<Params> {
    let p = Params {
        stride: per_dim(args, "stride", n, 1)?,
        padding: per_dim(args, "padding", n, 0)?,
        dilation: per_dim(args, "dilation", n, 1)?,
        output_padding: per_dim(args, "output_padding", n, 0)?,
        transposed: args.bool("transposed")?,
        groups: args.int("groups")?,
    };
    check!(p.groups > 0, Runtime, "non-positive groups is not supported");
    check!(p.stride.iter().all(|&s| s > 0), Runtime, "non-positive stride is not supported");
    check!(p.padding.iter().all(|&s| s >= 0), Runtime, "negative padding is not supported");
    check!(p.dilation.iter().all(|&s| s > 0), Runtime, "dilation should be greater than zero");
    Ok(p)
}

/// 1 + d * (s - 1), or 0 for an empty dim.
fn dilate(s: i64, d: i64) -> i64 {
    if s == 0 {
        0
    } else {
        1 + d * (s - 1)
    }
}

fn spatial(cx: &Cx, v: Value) -> Vec<i64> {
    cx.dims(v)[2..].to_vec()
}

/// One stablehlo.convolution with f32 accumulation for 16-bit floats and HIGHEST precision for
/// f32 and wider.
#[allow(clippy::too_many_arguments)]
fn conv(
    cx: &mut Cx,
    lhs: Value,
    rhs: Value,
    strides: &[i64],
    padding: &[(i64, i64)],
    lhs_dilation: &[i64],
    rhs_dilation: &[i64],
    dn: &ConvDims,
    feature_groups: i64,
    batch_groups: i64,
) -> Value {
    let d = cx.dtype(lhs);
    precision::set_for(cx, d);
    cx.convolution(lhs, rhs, strides, padding, lhs_dilation, rhs_dilation, dn, feature_groups, batch_groups, d.opmath().elem())
}

/// The regular (cross-correlation) convolution of x (N, C, ...) and w (O, C/g, ...).
fn conv_forward(cx: &mut Cx, x: Value, w: Value, p: &Params) -> Value {
    let n = cx.dims(x).len() - 2;
    let pad: Vec<(i64, i64)> = p.padding.iter().map(|&q| (q, q)).collect();
    conv(cx, x, w, &p.stride, &pad, &vec![1; n], &p.dilation, &ConvDims::nchw(n), p.groups, 1)
}

/// The gradient of conv_forward with respect to its input, of spatial size `in_sp`, given
/// the output gradient `gy` (N, O, ...) and the weight (O, C/g, ...): a transposed
/// convolution with the flipped kernel.
fn conv_input_grad(cx: &mut Cx, gy: Value, w: Value, in_sp: &[i64], p: &Params) -> Value {
    let n = in_sp.len();
    let wd = cx.dims(w);
    let (o, cg) = (wd[0], wd[1]);
    let k: Vec<i64> = wd[2..].to_vec();
    let g = p.groups;
    // (O, C/g, k) -> (g, O/g, C/g, k) -> (O/g, g, C/g, k) -> (O/g, C, k): the kernel's output
    // features become C, grouped g-major.
    let mut split = vec![g, o / g, cg];
    split.extend(&k);
    let w4 = cx.reshape(w, &split);
    let mut perm = vec![1, 0, 2];
    perm.extend((3..3 + n as i64).collect::<Vec<_>>());
    let w4 = cx.transpose(w4, &perm);
    let mut merged = vec![o / g, g * cg];
    merged.extend(&k);
    let w2 = cx.reshape(w4, &merged);
    let sp: Vec<i64> = (2..2 + n as i64).collect();
    let w2 = cx.reverse(w2, &sp);
    let out_sp = spatial(cx, gy);
    let pad: Vec<(i64, i64)> = (0..n)
        .map(|i| {
            let lhs_d = dilate(in_sp[i], 1);
            let rhs_d = dilate(k[i], p.dilation[i]);
            let out_d = dilate(out_sp[i], p.stride[i]);
            let before = rhs_d - p.padding[i] - 1;
            let after = lhs_d + rhs_d - 1 - out_d - before;
            (before, after)
        })
        .collect();
    let mut dn = ConvDims::nchw(n);
    dn.kernel_output_feature_dimension = 1;
    dn.kernel_input_feature_dimension = 0;
    conv(cx, gy, w2, &vec![1; n], &pad, &p.stride, &p.dilation, &dn, g, 1)
}

/// The gradient of conv_forward with respect to the weight (O, C/g, k...), given the input x
/// and the output gradient gy: a convolution over the batch.
fn conv_weight_grad(cx: &mut Cx, x: Value, gy: Value, k: &[i64], p: &Params) -> Value {
    let n = k.len();
    let in_sp = spatial(cx, x);
    let out_sp = spatial(cx, gy);
    let pad: Vec<(i64, i64)> = (0..n)
        .map(|i| {
            let lhs_d = dilate(in_sp[i], 1);
            let rhs_d = dilate(k[i], p.dilation[i]);
            let out_d = dilate(out_sp[i], p.stride[i]);
            let lo = p.padding[i];
            let hi = (out_d - lhs_d) + (rhs_d - lo - 1);
            (lo, hi)
        })
        .collect();
    let sp: Vec<i64> = (2..2 + n as i64).collect();
    let dn = ConvDims {
        input_batch_dimension: 1,
        input_feature_dimension: 0,
        input_spatial_dimensions: sp.clone(),
        kernel_input_feature_dimension: 0,
        kernel_output_feature_dimension: 1,
        kernel_spatial_dimensions: sp.clone(),
        output_batch_dimension: 1,
        output_feature_dimension: 0,
        output_spatial_dimensions: sp,
    };
    conv(cx, x, gy, &p.dilation, &pad, &vec![1; n], &p.stride, &dn, 1, p.groups)
}

/// Keeps the first `sizes` entries of each spatial dim (an over-long transposed result).
fn crop_spatial(cx: &mut Cx, v: Value, sizes: &[i64]) -> Value {
    let d = cx.dims(v);
    if d[2..] == *sizes {
        return v;
    }
    let mut limit = d.clone();
    limit[2..].copy_from_slice(sizes);
    cx.slice(v, &vec![0; d.len()], &limit, &vec![1; d.len()])
}

fn check_operands(cx: &Cx, x: &Tensor, w: &Tensor) -> Result<usize> {
    let (xd, wd) = (cx.dims(x.v), cx.dims(w.v));
    check!(
        xd.len() >= 3 && xd.len() == wd.len(),
        Runtime,
        "convolution_overrideable: expected a batched input with as many dims as the weight, got input {:?} and weight {:?}",
        xd,
        wd
    );
    check!(
        x.dtype == w.dtype,
        Runtime,
        "Input type ({}) and weight type ({}) should be the same",
        x.dtype.torch_name(),
        w.dtype.torch_name()
    );
    check!(x.dtype != DType::Bool, NotImplemented, "\"convolution\" not implemented for 'Bool'");
    Ok(xd.len() - 2)
}

/// PyTorch's check for transposed convolutions, with its message (1-d runs as 2-d there).
fn check_output_padding(p: &Params) -> Result<()> {
    let ok = (0..p.stride.len()).all(|i| p.output_padding[i] < p.stride[i] || p.output_padding[i] < p.dilation[i]);
    if ok {
        return Ok(());
    }
    let (mut op, mut st, mut di) = (p.output_padding.clone(), p.stride.clone(), p.dilation.clone());
    if op.len() == 1 {
        op.insert(0, 0);
        st.insert(0, 1);
        di.insert(0, 1);
    }
    let names: &[&str] = if op.len() == 3 { &["depth", "height", "width"] } else { &["height", "width"] };
    let mut msg = String::from("output padding must be smaller than either stride or dilation, but got");
    for (what, vals) in [("output_padding", &op), ("stride", &st), ("dilation", &di)] {
        for (name, v) in names.iter().zip(vals.iter()) {
            msg.push_str(&format!(" {what}_{name}: {v}"));
        }
    }
    Err(crate::TorchError::new(crate::ErrorKind::Runtime, msg))
}

/// convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
/// output_padding, groups).
fn convolution(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("input")?;
    let w = args.tensor("weight")?;
    let bias = args.opt_tensor("bias")?;
    let n = check_operands(cx, &x, &w)?;
    let p = params(args, n)?;
    if p.transposed {
        check_output_padding(&p)?;
    }
    let y = if p.transposed {
        // The input gradient of the regular convolution whose weight this is.
        let xs = spatial(cx, x.v);
        let k = spatial(cx, w.v);
        let out_sp: Vec<i64> = (0..n)
            .map(|i| (xs[i] - 1) * p.stride[i] - 2 * p.padding[i] + p.dilation[i] * (k[i] - 1) + p.output_padding[i] + 1)
            .collect();
        conv_input_grad(cx, x.v, w.v, &out_sp, &p)
    } else {
        conv_forward(cx, x.v, w.v, &p)
    };
    let y = match bias {
        Some(b) => {
            let acc = cx.dtype(y);
            let bv = cx.cast(b.v, acc);
            let dims = cx.dims(y);
            let bv = cx.broadcast_in_dim(bv, &dims, &[1]);
            cx.add(y, bv)
        }
        None => y,
    };
    one(cx.cast(y, x.dtype))
}

/// An unrequested gradient: an empty tensor (autograd drops it).
fn unused(cx: &mut Cx, dtype: DType) -> Value {
    cx.full(0.0, dtype, &[0])
}

/// convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
/// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias).
fn convolution_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let gy = args.tensor("grad_output")?;
    let x = args.tensor("input")?;
    let w = args.tensor("weight")?;
    let n = check_operands(cx, &x, &w)?;
    let p = params(args, n)?;
    let mask = match args.get("output_mask") {
        Some(crate::args::Arg::BoolList(m)) if m.len() == 3 => [m[0], m[1], m[2]],
        _ => [true, true, true],
    };
    let dt = x.dtype;
    let gv = cx.cast(gy.v, dt);
    let xs = spatial(cx, x.v);
    let k = spatial(cx, w.v);
    let grad_input = if !mask[0] {
        unused(cx, dt)
    } else if p.transposed {
        // y = T(x; w) is the adjoint of conv(.; w): dx = conv(gy; w).
        let r = conv_forward(cx, gv, w.v, &p);
        let r = crop_spatial(cx, r, &xs);
        cx.cast(r, dt)
    } else {
        let r = conv_input_grad(cx, gv, w.v, &xs, &p);
        cx.cast(r, dt)
    };
    let grad_weight = if !mask[1] {
        unused(cx, w.dtype)
    } else if p.transposed {
        // The regular convolution maps gy -> x, so its weight gradient pairs (gy, x).
        let r = conv_weight_grad(cx, gv, x.v, &k, &p);
        cx.cast(r, w.dtype)
    } else {
        let r = conv_weight_grad(cx, x.v, gv, &k, &p);
        cx.cast(r, w.dtype)
    };
    let grad_bias = if !mask[2] {
        unused(cx, dt)
    } else {
        let acc = dt.opmath();
        let g = cx.cast(gv, acc);
        let zero = cx.b.constant_f64(0.0, acc.elem());
        let mut dims = vec![0i64];
        dims.extend(2..2 + n as i64);
        let r = cx.reduce(&[g], &[zero], &dims, |b, a| vec![b.add(a[0], a[1])]);
        cx.cast(r[0], dt)
    };
    Ok(vec![Out::Tensor(grad_input), Out::Tensor(grad_weight), Out::Tensor(grad_bias)])
}
