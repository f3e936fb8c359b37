//! The fused recurrent cells that PyTorch's RNN composites call on devices other than CPU:
//! `_thnn_fused_lstm_cell` and `_thnn_fused_gru_cell` (nn.LSTM, nn.GRU, nn.LSTMCell and
//! nn.GRUCell run them once per step after the two gate products), and their backward ops
//! `_thnn_fused_lstm_cell_backward_impl` and `_thnn_fused_gru_cell_backward`.
//!
//! The workspaces follow PyTorch's CUDA kernels (RNN.cu), since autograd hands the forward's
//! workspace to the backward: LSTM [B, 4H] holds the activated gates (input, forget, cell,
//! output); GRU [B, 5H] holds the reset gate, the update gate, the new gate, hx, and the
//! hidden new-gate pre-activation plus its bias. Arithmetic runs in float32 for 16-bit inputs
//! (the kernels' accumulate type) and each result is rounded once.
use crate::args::{Args, Tensor};
use crate::blocks::reduce::{reduce, Red};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, Out, op, Op};
use stablehlo::Value;

pub(crate) const OPS: &[Op] = &[
    op("_thnn_fused_lstm_cell", fused_lstm_cell),
    op("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward_impl),
    op("_thnn_fused_gru_cell", fused_gru_cell),
    op("_thnn_fused_gru_cell_backward", fused_gru_cell_backward),
];

/// An argument as PyTorch's TensorArg prints it in check messages.
fn arg_name(pos: usize, name: &str) -> String {
    format!("argument #{pos} '{name}'")
}

fn dims_str(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// TensorUtils' checkDim.
fn check_dim(cx: &Cx, t: &Tensor, pos: usize, name: &str, dim: usize, from: &str) -> Result<()> {
    let nd = cx.dims(t.v).len();
    check!(
        nd == dim,
        Runtime,
        "Expected {}-dimensional tensor, but got {}-dimensional tensor for {} (while checking arguments for {})",
        dim,
        nd,
        arg_name(pos, name),
        from
    );
    Ok(())
}

/// TensorUtils' checkSameSize.
fn check_same_size(cx: &Cx, a: (&Tensor, usize, &str), b: (&Tensor, usize, &str), from: &str) -> Result<()> {
    let (da, db) = (cx.dims(a.0.v), cx.dims(b.0.v));
    check!(
        da == db,
        Runtime,
        "Expected tensor for {} to have same size as tensor for {}; but {} does not equal {} (while checking arguments for {})",
        arg_name(a.1, a.2),
        arg_name(b.1, b.2),
        dims_str(&da),
        dims_str(&db),
        from
    );
    Ok(())
}

/// TensorUtils' checkNumel.
fn check_numel(cx: &Cx, t: &Tensor, pos: usize, name: &str, numel: i64, from: &str) -> Result<()> {
    let n = cx.numel(t.v);
    check!(
        n == numel,
        Runtime,
        "Expected tensor for {} to have {} elements; but it actually has {} elements (while checking arguments for {})",
        arg_name(pos, name),
        numel,
        n,
        from
    );
    Ok(())
}

/// TensorUtils' checkSize.
fn check_size(cx: &Cx, t: &Tensor, pos: usize, name: &str, size: &[i64], from: &str) -> Result<()> {
    let d = cx.dims(t.v);
    check!(
        d == size,
        Runtime,
        "Expected tensor of size {}, but got tensor of size {} for {} (while checking arguments for {})",
        dims_str(size),
        dims_str(&d),
        arg_name(pos, name),
        from
    );
    Ok(())
}

/// The kernels are dispatched on floating types, reading every tensor as the first one's type.
fn check_dtypes(ts: &[Option<Tensor>], kernel: &str) -> Result<DType> {
    let first = ts.iter().flatten().next().expect("a tensor argument").dtype;
    check!(first.is_float(), NotImplemented, "\"{}\" not implemented for '{}'", kernel, first.torch_name());
    for t in ts.iter().flatten() {
        check!(
            t.dtype == first,
            Runtime,
            "expected scalar type {} but found {}",
            first.torch_name(),
            t.dtype.torch_name()
        );
    }
    Ok(first)
}

/// Gate tensors [B, k*H] as [B, k, H] in the accumulate type.
fn gates(cx: &mut Cx, v: Value, k: i64, acc: DType) -> Value {
    let d = cx.dims(v);
    let g = cx.reshape(v, &[d[0], k, d[1] / k]);
    cx.cast(g, acc)
}

/// A bias [k*H] broadcast to [B, k, H] in the accumulate type.
fn bias(cx: &mut Cx, v: Value, k: i64, b: i64, acc: DType) -> Value {
    let n = cx.dims(v)[0];
    let r = cx.reshape(v, &[k, n / k]);
    let r = cx.cast(r, acc);
    cx.broadcast_in_dim(r, &[b, k, n / k], &[1, 2])
}

/// Gate `j` of a [B, k, H] tensor, as [B, H].
fn gate(cx: &mut Cx, g: Value, j: i64) -> Value {
    let d = cx.dims(g);
    let s = cx.slice(g, &[0, j, 0], &[d[0], j + 1, d[2]], &[1, 1, 1]);
    cx.reshape(s, &[d[0], d[2]])
}

/// [B, H] gates stacked into one [B, k*H] tensor of `dtype`.
fn stack_gates(cx: &mut Cx, gs: &[Value], dtype: DType) -> Value {
    let d = cx.dims(gs[0]);
    let parts: Vec<Value> = gs.iter().map(|&g| cx.reshape(g, &[d[0], 1, d[1]])).collect();
    let s = cx.concatenate(&parts, 1);
    let s = cx.reshape(s, &[d[0], d[1] * gs.len() as i64]);
    cx.cast(s, dtype)
}

fn ones_like(cx: &mut Cx, v: Value) -> Value {
    let d = cx.dims(v);
    let dt = cx.dtype(v);
    cx.full(1.0, dt, &d)
}

/// 1 - x
fn one_minus(cx: &mut Cx, x: Value) -> Value {
    let one = ones_like(cx, x);
    cx.sub(one, x)
}

/// g * (1 - s) * s: a gradient through a sigmoid whose output is s (in RNN.cu's order).
fn through_sigmoid(cx: &mut Cx, g: Value, s: Value) -> Value {
    let d = one_minus(cx, s);
    let g = cx.mul(g, d);
    cx.mul(g, s)
}

/// g * (1 - t * t): a gradient through a tanh whose output is t.
fn through_tanh(cx: &mut Cx, g: Value, t: Value) -> Value {
    let t2 = cx.mul(t, t);
    let d = one_minus(cx, t2);
    cx.mul(g, d)
}

/// The bias gradient: the gate gradients (as returned, in their dtype) summed over the batch.
fn bias_grad(cx: &mut Cx, grad_gates: Value) -> Value {
    let dt = cx.dtype(grad_gates);
    let g = cx.cast(grad_gates, dt.opmath());
    let s = reduce(cx, g, &[0], Red::Sum);
    cx.cast(s, dt)
}

/// The checks the CUDA kernels make of the gate, bias and hidden-state arguments (checkSizes):
/// the hidden size.
fn check_cell(cx: &Cx, args: &Args, factor: i64, from: &str, hidden: &str) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>, Option<Tensor>, i64)> {
    let ig = args.tensor("input_gates")?;
    let hg = args.tensor("hidden_gates")?;
    let h = args.tensor(hidden)?;
    let ib = args.opt_tensor("input_bias")?;
    let hb = args.opt_tensor("hidden_bias")?;
    check_dim(cx, &ig, 1, "input_gates", 2, from)?;
    check_same_size(cx, (&ig, 1, "input_gates"), (&hg, 2, "hidden_gates"), from)?;
    let gd = cx.dims(ig.v);
    let gates_size = gd[1];
    match (ib, hb) {
        (Some(ib), Some(hb)) => {
            check_dim(cx, &ib, 3, "input_bias", 1, from)?;
            check_numel(cx, &ib, 3, "input_bias", gates_size, from)?;
            check_same_size(cx, (&ib, 3, "input_bias"), (&hb, 4, "hidden_bias"), from)?;
        }
        (Some(_), None) => bail!(Runtime, "{}: input_bias is defined but hidden_bias is not", from),
        (None, Some(_)) => bail!(Runtime, "{}: hidden_bias is defined but input_bias is not", from),
        (None, None) => {}
    }
    check_dim(cx, &h, 5, "prev_hidden", 2, from)?;
    check_numel(cx, &h, 5, "prev_hidden", gd[0] * gates_size / factor, from)?;
    let hd = cx.dims(h.v);
    check!(
        gates_size % factor == 0 && hd == [gd[0], gates_size / factor],
        Runtime,
        "{}: expected prev_hidden of size {}, got {}",
        from,
        dims_str(&[gd[0], gates_size / factor]),
        dims_str(&hd)
    );
    Ok((ig, hg, h, ib, hb, gates_size / factor))
}

/// Input plus hidden gates plus both biases, [B, k, H] in the accumulate type, summed in the
/// kernels' order.
fn gate_sum(cx: &mut Cx, ig: Value, hg: Value, biases: Option<(Value, Value)>, k: i64, acc: DType) -> (Value, Value, Option<(Value, Value)>) {
    let b = cx.dims(ig)[0];
    let i = gates(cx, ig, k, acc);
    let h = gates(cx, hg, k, acc);
    let bs = biases.map(|(b1, b2)| (bias(cx, b1, k, b, acc), bias(cx, b2, k, b, acc)));
    (i, h, bs)
}

/// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias)
/// -> (hy, cy, workspace).
fn fused_lstm_cell(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let from = "_thnn_fused_lstm_cell";
    let (ig, hg, c, ib, hb, _) = check_cell(cx, args, 4, from, "cx")?;
    let dt = check_dtypes(&[Some(ig), Some(hg), Some(c), ib, hb], from)?;
    let acc = dt.opmath();
    let (i, h, bs) = gate_sum(cx, ig.v, hg.v, ib.zip(hb).map(|(a, b)| (a.v, b.v)), 4, acc);
    let mut g = cx.add(i, h);
    if let Some((b1, b2)) = bs {
        g = cx.add(g, b1);
        g = cx.add(g, b2);
    }
    let in_g = gate(cx, g, 0);
    let in_g = cx.logistic(in_g);
    let forget = gate(cx, g, 1);
    let forget = cx.logistic(forget);
    let cell = gate(cx, g, 2);
    let cell = cx.tanh(cell);
    let out_g = gate(cx, g, 3);
    let out_g = cx.logistic(out_g);
    let c0 = cx.cast(c.v, acc);
    let fc = cx.mul(forget, c0);
    let ic = cx.mul(in_g, cell);
    let cy = cx.add(fc, ic);
    let tc = cx.tanh(cy);
    let hy = cx.mul(out_g, tc);
    let workspace = stack_gates(cx, &[in_g, forget, cell, out_g], dt);
    let hy = cx.cast(hy, dt);
    let cy = cx.cast(cy, dt);
    Ok(vec![Out::Tensor(hy), Out::Tensor(cy), Out::Tensor(workspace)])
}

/// _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)
/// -> (grad_gates, grad_cx, grad_bias). A missing gradient counts as zero; PyTorch returns
/// undefined tensors when both are missing (zeros here), and an undefined grad_bias without
/// bias (a [0] tensor here: the engine returns no undefined tensors).
fn fused_lstm_cell_backward_impl(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let from = "fused_lstm_cell_backward";
    let ghy = args.opt_tensor("grad_hy")?;
    let gcy = args.opt_tensor("grad_cy")?;
    let c = args.tensor("cx")?;
    let cy = args.tensor("cy")?;
    let ws = args.tensor("workspace")?;
    let has_bias = args.bool("has_bias")?;
    let (exp, pos, name) = match (ghy, gcy) {
        (Some(g), _) => (g, 1, "grad_hy"),
        (None, Some(g)) => (g, 2, "grad_cy"),
        (None, None) => (c, 3, "cx"),
    };
    check_dim(cx, &exp, pos, name, 2, from)?;
    let size = cx.dims(exp.v);
    if let Some(g) = ghy {
        check_size(cx, &g, 1, "grad_hy", &size, from)?;
    }
    if let Some(g) = gcy {
        check_size(cx, &g, 2, "grad_cy", &size, from)?;
    }
    check_size(cx, &c, 3, "cx", &size, from)?;
    check_size(cx, &cy, 4, "cy", &size, from)?;
    check_dim(cx, &ws, 5, "workspace", 2, from)?;
    check_numel(cx, &ws, 5, "workspace", size[0] * size[1] * 4, from)?;
    let wd = cx.dims(ws.v);
    check!(wd == [size[0], size[1] * 4], Runtime, "{}: expected workspace of size {}, got {}", from, dims_str(&[size[0], size[1] * 4]), dims_str(&wd));
    let dt = check_dtypes(&[Some(ws), ghy, gcy, Some(c), Some(cy)], from)?;
    let acc = dt.opmath();
    let (b, hsz) = (size[0], size[1]);
    let zero = cx.full(0.0, acc, &[b, hsz]);
    let go = match ghy {
        Some(g) => cx.cast(g.v, acc),
        None => zero,
    };
    let goc = match gcy {
        Some(g) => cx.cast(g.v, acc),
        None => zero,
    };
    let w = gates(cx, ws.v, 4, acc);
    let ig = gate(cx, w, 0);
    let fg = gate(cx, w, 1);
    let cg = gate(cx, w, 2);
    let og = gate(cx, w, 3);
    let c0 = cx.cast(c.v, acc);
    let c1 = cx.cast(cy.v, acc);
    // As RNN.cu's lstm_cell_backward.
    let t = cx.tanh(c1);
    let gog = cx.mul(go, t);
    let gcx = cx.mul(go, og);
    let gcx = through_tanh(cx, gcx, t);
    let gcx = cx.add(gcx, goc);
    let gig = cx.mul(gcx, cg);
    let gfg = cx.mul(gcx, c0);
    let gcg = cx.mul(gcx, ig);
    let grad_cx = cx.mul(gcx, fg);
    let gig = through_sigmoid(cx, gig, ig);
    let gfg = through_sigmoid(cx, gfg, fg);
    let gcg = through_tanh(cx, gcg, cg);
    let gog = through_sigmoid(cx, gog, og);
    let grad_gates = stack_gates(cx, &[gig, gfg, gcg, gog], dt);
    let grad_cx = cx.cast(grad_cx, dt);
    let grad_bias = if has_bias { bias_grad(cx, grad_gates) } else { cx.full(0.0, dt, &[0]) };
    Ok(vec![Out::Tensor(grad_gates), Out::Tensor(grad_cx), Out::Tensor(grad_bias)])
}

/// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias)
/// -> (hy, workspace).
fn fused_gru_cell(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let from = "_thnn_fused_gru_cell";
    let (ig, hg, hx, ib, hb, _) = check_cell(cx, args, 3, from, "hx")?;
    let dt = check_dtypes(&[Some(ig), Some(hg), Some(hx), ib, hb], from)?;
    let acc = dt.opmath();
    let (i, h, bs) = gate_sum(cx, ig.v, hg.v, ib.zip(hb).map(|(a, b)| (a.v, b.v)), 3, acc);
    // r and z: input + hidden + input bias + hidden bias; n: input + input bias + r * (hidden
    // + hidden bias).
    let mut rz = cx.add(i, h);
    let mut hn = gate(cx, h, 2);
    let mut inn = gate(cx, i, 2);
    if let Some((b1, b2)) = bs {
        rz = cx.add(rz, b1);
        rz = cx.add(rz, b2);
        let b1n = gate(cx, b1, 2);
        let b2n = gate(cx, b2, 2);
        inn = cx.add(inn, b1n);
        hn = cx.add(hn, b2n);
    }
    let rg = gate(cx, rz, 0);
    let rg = cx.logistic(rg);
    let zg = gate(cx, rz, 1);
    let zg = cx.logistic(zg);
    let rhn = cx.mul(rg, hn);
    let ng = cx.add(inn, rhn);
    let ng = cx.tanh(ng);
    let h0 = cx.cast(hx.v, acc);
    let diff = cx.sub(h0, ng);
    let zd = cx.mul(zg, diff);
    let hy = cx.add(ng, zd);
    let hy = cx.cast(hy, dt);
    let workspace = stack_gates(cx, &[rg, zg, ng, h0, hn], dt);
    Ok(vec![Out::Tensor(hy), Out::Tensor(workspace)])
}

/// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
/// -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias);
/// without bias the two bias gradients are [0] tensors (undefined in PyTorch).
fn fused_gru_cell_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let from = "fused_gru_cell_backward";
    let g = args.tensor("grad_hy")?;
    let ws = args.tensor("workspace")?;
    let has_bias = args.bool("has_bias")?;
    check_dim(cx, &g, 1, "grad_hy", 2, from)?;
    let gd = cx.dims(g.v);
    check_size(cx, &ws, 2, "workspace", &[gd[0], gd[1] * 5], from)?;
    let dt = check_dtypes(&[Some(ws), Some(g)], from)?;
    let acc = dt.opmath();
    let w = gates(cx, ws.v, 5, acc);
    let rg = gate(cx, w, 0);
    let zg = gate(cx, w, 1);
    let ng = gate(cx, w, 2);
    let hx = gate(cx, w, 3);
    let hn = gate(cx, w, 4);
    let go = cx.cast(g.v, acc);
    // As RNN.cu's gru_cell_backward.
    let d = cx.sub(hx, ng);
    let gig = cx.mul(go, d);
    let gig = through_sigmoid(cx, gig, zg);
    let ghx = cx.mul(go, zg);
    let oz = one_minus(cx, zg);
    let gin = cx.mul(go, oz);
    let gin = through_tanh(cx, gin, ng);
    let ghn = cx.mul(gin, rg);
    let grg = cx.mul(gin, hn);
    let grg = through_sigmoid(cx, grg, rg);
    let grad_in = stack_gates(cx, &[grg, gig, gin], dt);
    let grad_hid = stack_gates(cx, &[grg, gig, ghn], dt);
    let grad_hx = cx.cast(ghx, dt);
    let (gib, ghb) = if has_bias {
        (bias_grad(cx, grad_in), bias_grad(cx, grad_hid))
    } else {
        (cx.full(0.0, dt, &[0]), cx.full(0.0, dt, &[0]))
    };
    Ok(vec![Out::Tensor(grad_in), Out::Tensor(grad_hid), Out::Tensor(grad_hx), Out::Tensor(gib), Out::Tensor(ghb)])
}
