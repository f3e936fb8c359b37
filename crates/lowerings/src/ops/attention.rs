//! Fused scaled-dot-product attention: PyTorch's "overrideable" SDPA backend, which
//! `F.scaled_dot_product_attention` picks on tpu for 4-d float32/bf16/f16 inputs without
//! dropout (the choice is made in csrc/metadata_ops.cpp; other cases take PyTorch's math composite),
//! and CUDA's flash and memory-efficient entry points, which some libraries call by name.
//!
//! The forward keeps only the output and each row's log-sum-exp for backward, which
//! recomputes the probabilities (flash attention's contract): the math decomposition would
//! save the L x S probability matrices of every layer instead. Scores and softmax run in f32
//! (f64 stays f64); the two products take the inputs' dtype with f32 accumulation.
use crate::args::{Arg, Args, Tensor};
use crate::blocks::contract::contract;
use crate::blocks::reduce::{reduce, Red};
use crate::cx::{broadcast_shapes, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, Out, op, Op};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    // Specialized: dropout_p decides whether the call is supported at all.
    // Routed: PyTorch's SDPA backend for other devices; its composites only raise.
    op("_scaled_dot_product_fused_attention_overrideable", forward)
        .specialized()
        .bucketed()
        .routed(&["_scaled_dot_product_fused_attention_overrideable"]),
    op("_scaled_dot_product_fused_attention_overrideable_backward", |cx, a| backward(cx, a, "grad_out"))
        .specialized()
        .routed(&["_scaled_dot_product_fused_attention_overrideable_backward"]),
    // CUDA's kernels, which some libraries call by name: the same math, the same results.
    op("_scaled_dot_product_flash_attention", forward).specialized(),
    op("_scaled_dot_product_flash_attention_backward", flash_backward).specialized(),
    op("_scaled_dot_product_efficient_attention", efficient_forward).specialized(),
    op("_scaled_dot_product_efficient_attention_backward", |cx, a| backward(cx, a, "grad_out_")).specialized(),
    // The CPU kernel's entry point, which PyTorch's CPU dispatch names and libraries call too.
    op("_scaled_dot_product_flash_attention_for_cpu", cpu_flash_forward).specialized(),
    op("_scaled_dot_product_flash_attention_for_cpu_backward", flash_backward).specialized(),
];

/// Shapes and options of one attention call; heads of the query are grouped over the
/// key/value heads (grouped-query attention): q [B, Hk*G, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev].
/// Scores are 4-d, [B, Hk, G*L, S]: the G query heads of a key/value head stacked as rows (a
/// plain reshape of q), so every product is one batched matmul over [B, Hk].
#[derive(Clone, Copy)]
struct Attn {
    b: i64,
    hk: i64,
    g: i64,
    l: i64,
    s: i64,
    /// The first query row (a block of rows: `row_blocks`): the causal mask's offset.
    first_row: i64,
    scale: f64,
    causal: bool,
    acc: DType,
    /// In a bucketed program: the scale when it comes from the real head size, and the real
    /// number of keys (0-d values); keys past it are masked out.
    padded: Option<(Option<Value>, Value)>,
}

fn float_arg(args: &Args, name: &str) -> Option<f64> {
    match args.get(name) {
        Some(Arg::Float(f)) => Some(f.value),
        Some(Arg::Int(i)) => Some(*i as f64),
        _ => None,
    }
}

/// The attention bias, of the entry points that take one (CUDA's flash attention takes none;
/// the CPU kernel's calls it attn_mask).
fn optional_bias(args: &Args) -> Option<Tensor> {
    match args.probe("attn_bias").or_else(|| args.probe("attn_mask")) {
        Some(Arg::Tensor(t)) => Some(*t),
        _ => None,
    }
}

fn setup(cx: &Cx, q: &Tensor, k: &Tensor, v: &Tensor, args: &Args) -> Result<Attn> {
    for (name, t) in [("query", q), ("key", k), ("value", v)] {
        check!(
            cx.dims(t.v).len() == 4,
            Runtime,
            "scaled_dot_product_attention on tpu: {name} must be 4-d (batch, heads, sequence, features), got {}-d",
            cx.dims(t.v).len()
        );
        check!(t.dtype.is_float(), Runtime, "scaled_dot_product_attention: expected a floating-point {name}, got {}", t.dtype.torch_name());
    }
    check!(
        q.dtype == k.dtype && q.dtype == v.dtype,
        Runtime,
        "Expected query, key, and value to have the same dtype, but got query.dtype: {} key.dtype: {} and value.dtype: {} instead.",
        q.dtype.torch_name(),
        k.dtype.torch_name(),
        v.dtype.torch_name()
    );
    let (qd, kd, vd) = (cx.dims(q.v), cx.dims(k.v), cx.dims(v.v));
    check!(
        qd[0] == kd[0] && kd[0] == vd[0] && kd[1] == vd[1] && kd[2] == vd[2] && qd[3] == kd[3],
        Runtime,
        "scaled_dot_product_attention: incompatible shapes query {:?}, key {:?}, value {:?}",
        qd,
        kd,
        vd
    );
    check!(
        kd[1] > 0 && qd[1] % kd[1] == 0,
        Runtime,
        "number of heads in key/value must divide number of heads in query"
    );
    let dropout = float_arg(args, "dropout_p").unwrap_or(0.0);
    check!(dropout == 0.0, NotImplemented, "torchtpu: fused attention with dropout_p > 0 is not supported; F.scaled_dot_product_attention takes the math path for it");
    let scale = float_arg(args, "scale").unwrap_or(1.0 / (qd[3] as f64).sqrt());
    Ok(Attn {
        b: qd[0],
        hk: kd[1],
        g: qd[1] / kd[1],
        l: qd[2],
        s: kd[2],
        first_row: 0,
        scale,
        causal: args.bool_or("is_causal", false)?,
        acc: q.dtype.opmath(),
        padded: None,
    })
}

impl Attn {
    /// [B, Hk*G, L, x] -> [B, Hk, G*L, x]
    fn group(&self, cx: &mut Cx, x: Value) -> Value {
        let last = *cx.dims(x).last().unwrap();
        cx.b.reshape(x, &[self.b, self.hk, self.g * self.l, last])
    }

    /// [B, Hk, G*L, x] -> [B, Hk*G, L, x]
    fn ungroup(&self, cx: &mut Cx, x: Value) -> Value {
        let last = *cx.dims(x).last().unwrap();
        cx.b.reshape(x, &[self.b, self.hk * self.g, self.l, last])
    }

    fn scores_dims(&self) -> [i64; 4] {
        [self.b, self.hk, self.g * self.l, self.s]
    }

    /// scale * q k^T (+ bias, causal mask) in the accumulation dtype: [B, Hk, G*L, S].
    fn scores(&self, cx: &mut Cx, q4: Value, k: Value, bias: Option<&Tensor>) -> Result<Value> {
        let qk = contract(cx, q4, k, (&[0, 1], &[0, 1]), (&[3], &[3]));
        let dims = self.scores_dims();
        let scale = match self.padded {
            Some((Some(scale), _)) => cx.b.broadcast_in_dim(scale, &dims, &[]),
            _ => cx.full(self.scale, self.acc, &dims),
        };
        let mut s = cx.b.mul(qk, scale);
        if let Some(bias) = bias {
            let full = [self.b, self.hk * self.g, self.l, self.s];
            broadcast_shapes(&[cx.dims(bias.v), full.to_vec()])?;
            let bv = if bias.dtype == DType::Bool {
                // A boolean mask keeps the positions where it is true.
                let zero = cx.full(0.0, self.acc, &cx.dims(bias.v));
                let ninf = cx.full(f64::NEG_INFINITY, self.acc, &cx.dims(bias.v));
                cx.b.select(bias.v, zero, ninf)
            } else {
                cx.cast(bias.v, self.acc)
            };
            let bv = cx.b.broadcast_to(bv, &full);
            let bv = cx.b.reshape(bv, &dims);
            s = cx.b.add(s, bv);
        }
        if self.causal {
            // PyTorch's is_causal keeps key j for query i when j <= i (top-left aligned); row
            // r of the stacked groups is query first_row + r mod L. 32-bit positions: the
            // compare vectorizes at the scores' width.
            let ty = stablehlo::TensorType { elem: DType::I32.elem(), dims: vec![self.g * self.l, self.s] };
            let mut row = cx.b.iota(&ty, 0);
            if self.g > 1 {
                let l = cx.b.splat_i64(self.l, &ty);
                row = cx.b.rem(row, l);
            }
            if self.first_row > 0 {
                let first = cx.b.splat_i64(self.first_row, &ty);
                row = cx.b.add(row, first);
            }
            let col = cx.b.iota(&ty, 1);
            let keep = cx.b.compare(CmpDir::Le, col, row);
            let keep = cx.b.broadcast_in_dim(keep, &dims, &[2, 3]);
            let ninf = cx.full(f64::NEG_INFINITY, self.acc, &dims);
            s = cx.b.select(keep, s, ninf);
        }
        if let Some((_, keys)) = self.padded {
            let ty = stablehlo::TensorType { elem: DType::I64.elem(), dims: dims.to_vec() };
            let col = cx.b.iota(&ty, 3);
            let keys = cx.b.broadcast_in_dim(keys, &dims, &[]);
            let keep = cx.b.compare(CmpDir::Lt, col, keys);
            let ninf = cx.full(f64::NEG_INFINITY, self.acc, &dims);
            s = cx.b.select(keep, s, ninf);
        }
        Ok(s)
    }

    /// Broadcasts a per-row value [B, Hk, G*L] over the last dim of `dims`.
    fn rows(&self, cx: &mut Cx, x: Value, dims: &[i64]) -> Value {
        cx.b.broadcast_in_dim(x, dims, &[0, 1, 2])
    }

    /// The blocks of query rows [r0, r1) the attention is computed in. Causal attention over
    /// enough rows (no bias, no padding) is split: a block reads only the keys before its
    /// last row, which skips the blocks of the masked upper triangle (3/4 of the dense work
    /// in 2 blocks, 9/16 in 8). Anything else is one block.
    fn row_blocks(&self, has_bias: bool) -> Vec<(i64, i64)> {
        if !self.causal || has_bias || self.padded.is_some() || self.l < 2 * MIN_BLOCK_ROWS || self.s <= MIN_BLOCK_ROWS {
            return vec![(0, self.l)];
        }
        let n = CAUSAL_BLOCKS.min(self.l / MIN_BLOCK_ROWS);
        let rows = (self.l + n - 1) / n;
        (0..n).map(|i| (i * rows, ((i + 1) * rows).min(self.l))).filter(|(r0, r1)| r0 < r1).collect()
    }

    /// This attention for the query rows [r0, r1) and the keys they can see.
    fn block(&self, r0: i64, r1: i64) -> Attn {
        let s = if self.causal && (r0, r1) != (0, self.l) { r1.min(self.s) } else { self.s };
        Attn { l: r1 - r0, s, first_row: r0, ..*self }
    }
}

/// Causal attention is split into at most this many blocks of query rows, each of at least
/// MIN_BLOCK_ROWS rows (`Attn::row_blocks`). Measured on the CPU plugin, fwd+bwd of 4 heads
/// of 32: at 128 rows 2 blocks took 0.83x the one-block time (4 blocks of 32 rows 0.9x, 8 of
/// 16 1.15x); at 512 rows 8 blocks 0.59x.
const CAUSAL_BLOCKS: i64 = 8;
const MIN_BLOCK_ROWS: i64 = 64;

/// Positions [start, stop) of dim 2 of a [B, H, N, x] value (all of them: the value itself).
fn along_dim2(cx: &mut Cx, x: Value, start: i64, stop: i64) -> Value {
    let d = cx.dims(x);
    if (start, stop) == (0, d[2]) {
        return x;
    }
    let mut lo = vec![0; d.len()];
    let mut hi = d.clone();
    lo[2] = start;
    hi[2] = stop;
    cx.b.slice(x, &lo, &hi, &vec![1; d.len()])
}

/// The pieces along dim 2, joined (one piece: itself).
fn join_dim2(cx: &mut Cx, parts: &[Value]) -> Value {
    if parts.len() == 1 {
        parts[0]
    } else {
        cx.b.concatenate(parts, 2)
    }
}

/// (query, key, value, attn_bias?, dropout_p, is_causal, return_debug_mask, *, scale) ->
/// (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug_attn_mask)
fn forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (mut q, mut k, mut v) = (args.tensor("query")?, args.tensor("key")?, args.tensor("value")?);
    let bias = optional_bias(args);
    let mut a = setup(cx, &q, &k, &v, args)?;
    let mut real_lengths = None;
    if cx.padded.is_some() {
        real_lengths = Some(unpad(cx, &mut a, &mut q, &mut k, &mut v, args));
    }
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for (r0, r1) in a.row_blocks(bias.is_some()) {
        let ab = a.block(r0, r1);
        let qb = along_dim2(cx, q.v, r0, r1);
        let kb = along_dim2(cx, k.v, 0, ab.s);
        let vb = along_dim2(cx, v.v, 0, ab.s);
        let (out, lse) = attend(cx, &ab, qb, kb, vb, bias.as_ref(), q.dtype, v.dtype)?;
        outs.push(out);
        lses.push(lse);
    }
    let out = join_dim2(cx, &outs);
    let lse = join_dim2(cx, &lses);
    // No variable-length batches, no dropout state, no debug mask: empty tensors stand in
    // for PyTorch's undefined ones.
    let empty = |cx: &mut Cx, d: DType| Out::Tensor(cx.full(0.0, d, &[0]));
    let (max_q, max_k) = match real_lengths {
        Some(lengths) => lengths,
        None => (cx.full(a.l as f64, DType::I64, &[]), cx.full(a.s as f64, DType::I64, &[])),
    };
    Ok(vec![
        Out::Tensor(out),
        Out::Tensor(lse),
        empty(cx, DType::I32),
        empty(cx, DType::I32),
        Out::Tensor(max_q),
        Out::Tensor(max_k),
        empty(cx, DType::I64),
        empty(cx, DType::I64),
        empty(cx, q.dtype),
    ])
}

/// _scaled_dot_product_efficient_attention(query, key, value, attn_bias?, compute_log_sumexp,
/// dropout_p, is_causal, *, scale) -> (output, log_sumexp, philox_seed, philox_offset).
fn efficient_forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let mut outs = forward(cx, args)?;
    let philox = outs.split_off(6);
    outs.truncate(2);
    outs.extend(philox.into_iter().take(2));
    Ok(outs)
}

/// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *,
/// attn_mask, scale) -> (output, logsumexp), the log-sum-exp in the inputs' opmath dtype.
fn cpu_flash_forward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let query = args.tensor("query")?.dtype;
    if let Some(mask) = optional_bias(args) {
        check!(
            mask.dtype == query || mask.dtype == query.opmath(),
            Runtime,
            "scaled_dot_product_attention_flash_attention: Attention mask is the same data type as query"
        );
    }
    let mut outs = forward(cx, args)?;
    outs.truncate(2);
    Ok(outs)
}

/// _scaled_dot_product_flash_attention_backward(...) -> (grad_query, grad_key, grad_value):
/// the overrideable backward's without a bias.
fn flash_backward(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let mut grads = backward(cx, args, "grad_out")?;
    grads.truncate(3);
    Ok(grads)
}

/// Attention of one block of rows: q [B, Hk*G, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev] ->
/// (output [B, Hk*G, L, Ev] in `out_dt`, log-sum-exp [B, Hk*G, L] in the accumulation dtype: float32, or float64 for float64).
#[allow(clippy::too_many_arguments)]
fn attend(cx: &mut Cx, a: &Attn, q: Value, k: Value, v: Value, bias: Option<&Tensor>, out_dt: DType, v_dt: DType) -> Result<(Value, Value)> {
    let q4 = a.group(cx, q);
    let s = a.scores(cx, q4, k, bias)?;
    let sd = a.scores_dims();
    // Fully masked rows give zeros (PyTorch's safe softmax) and a log-sum-exp of -inf.
    let m = reduce(cx, s, &[3], Red::ShiftMax);
    let ninf = cx.full(f64::NEG_INFINITY, a.acc, &cx.dims(m));
    let zero = cx.full(0.0, a.acc, &cx.dims(m));
    let empty_row = cx.b.compare(CmpDir::Eq, m, ninf);
    let m = cx.b.select(empty_row, zero, m);
    let mb = a.rows(cx, m, &sd);
    let shifted = cx.b.sub(s, mb);
    let p = cx.b.exp(shifted);
    let total = reduce(cx, p, &[3], Red::Sum);
    let log_total = cx.b.log(total);
    let lse = cx.b.add(m, log_total);
    let one = cx.full(1.0, a.acc, &cx.dims(total));
    let zero_total = cx.b.compare(CmpDir::Eq, total, zero);
    let inv = cx.b.div(one, total);
    let inv = cx.b.select(zero_total, zero, inv);
    // The weights are normalized after the product with the values (as flash attention
    // does): a pass over [.., L, Ev] in place of one over the [.., L, S] scores.
    let pv = cx.cast(p, v_dt);
    let out = contract(cx, pv, v, (&[0, 1], &[0, 1]), (&[3], &[2]));
    let invb = a.rows(cx, inv, &cx.dims(out));
    let out = cx.b.mul(out, invb);
    let out = cx.cast(out, out_dt);
    let out = a.ungroup(cx, out);
    let lse = cx.cast(lse, a.acc);
    let lse = cx.b.reshape(lse, &[a.b, a.hk * a.g, a.l]);
    Ok((out, lse))
}

/// Attention on inputs padded to bucketed sizes (a bucketed program): the padding lanes of the
/// head size are zeroed in q and k (they then add nothing to the scores), the default scale
/// comes from the real head size, keys past the real ones are masked, and key/value heads are
/// repeated per query head by the real group size (the padded head counts need not keep it).
/// Padded batches and queries compute rows that are dropped. The real query and key lengths.
fn unpad(cx: &mut Cx, a: &mut Attn, q: &mut Tensor, k: &mut Tensor, v: &mut Tensor, args: &Args) -> (Value, Value) {
    let p = cx.padded.as_ref().unwrap();
    let (rq, rk) = (p.real_sizes(q.v).unwrap().to_vec(), p.real_sizes(k.v).unwrap().to_vec());
    let i64 = |dims: &[i64]| stablehlo::TensorType { elem: DType::I64.elem(), dims: dims.to_vec() };
    for (t, real) in [(&mut *q, &rq), (&mut *k, &rk)] {
        let dims = cx.dims(t.v);
        let lane = cx.b.iota(&i64(&dims), 3);
        let size = cx.b.broadcast_in_dim(real[3], &dims, &[]);
        let inside = cx.b.compare(CmpDir::Lt, lane, size);
        let zero = cx.full(0.0, t.dtype, &dims);
        t.v = cx.b.select(inside, t.v, zero);
    }
    let hq = cx.dims(q.v)[1];
    if a.g != 1 || a.hk != hq {
        // Query head h reads key/value head min(h / (Hq / Hk), Hk - 1), in real head counts.
        let group = cx.b.div(rq[1], rk[1]);
        let heads = cx.b.iota(&i64(&[hq]), 0);
        let group = cx.b.broadcast_in_dim(group, &[hq], &[]);
        let kv_head = cx.b.div(heads, group);
        let one = cx.full(1.0, DType::I64, &[]);
        let last = cx.b.sub(rk[1], one);
        let last = cx.b.broadcast_in_dim(last, &[hq], &[]);
        let kv_head = cx.b.min(kv_head, last);
        k.v = crate::blocks::gather::take_along(cx, k.v, 1, kv_head);
        v.v = crate::blocks::gather::take_along(cx, v.v, 1, kv_head);
        a.hk = hq;
        a.g = 1;
    }
    let scale = float_arg(args, "scale").is_none().then(|| {
        // 1 / sqrt(E) in f64, rounded once, as the exact program's constant is.
        let e = cx.convert(rq[3], DType::F64.elem());
        let root = cx.b.sqrt(e);
        let one = cx.full(1.0, DType::F64, &[]);
        let scale = cx.b.div(one, root);
        cx.convert(scale, a.acc.elem())
    });
    a.padded = Some((scale, rk[2]));
    (rq[2], rk[2])
}

/// Sums a [B, H, L, S] gradient down to the shape of the bias it was broadcast from.
fn sum_to(cx: &mut Cx, g: Value, shape: &[i64]) -> Value {
    let gd = cx.dims(g);
    let off = gd.len() - shape.len();
    let dims: Vec<i64> =
        (0..gd.len()).filter(|&i| i < off || (shape[i - off] == 1 && gd[i] != 1)).map(|i| i as i64).collect();
    let r = reduce(cx, g, &dims, Red::Sum);
    cx.b.reshape(r, shape)
}

/// (grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
/// cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale) ->
/// (grad_query, grad_key, grad_value, grad_attn_bias)
fn backward(cx: &mut Cx, args: &Args, grad_out: &str) -> Result<Vec<Out>> {
    let (q, k, v) = (args.tensor("query")?, args.tensor("key")?, args.tensor("value")?);
    let bias = optional_bias(args).filter(|b| cx.dims(b.v) != [0]);
    let a = setup(cx, &q, &k, &v, args)?;
    let mask = match args.probe("grad_input_mask") {
        Some(Arg::BoolList(m)) if m.len() == 4 => [m[0], m[1], m[2], m[3]],
        _ => [true, true, true, bias.is_some()],
    };
    let go = args.tensor(grad_out)?;
    let go = cx.cast(go.v, q.dtype);
    let o = args.tensor("out")?;
    let o = cx.cast(o.v, q.dtype);
    let lse = args.tensor("logsumexp")?;
    let lse = cx.cast(lse.v, a.acc);
    // Per block of rows: its query gradient, and its key and value gradients (float32 sums
    // over the blocks, zero-padded past the keys the block reads).
    let (mut grad_qs, mut grad_k, mut grad_v, mut grad_bias) = (Vec::new(), None, None, None);
    for (r0, r1) in a.row_blocks(bias.is_some()) {
        let ab = a.block(r0, r1);
        let rows = |cx: &mut Cx, x: Value| along_dim2(cx, x, r0, r1);
        let (qb, gob, ob, lseb) = (rows(cx, q.v), rows(cx, go), rows(cx, o), rows(cx, lse));
        let kb = along_dim2(cx, k.v, 0, ab.s);
        let vb = along_dim2(cx, v.v, 0, ab.s);
        let g = attend_backward(cx, &ab, [qb, kb, vb, gob, ob, lseb], bias.as_ref(), [q.dtype, k.dtype, v.dtype], mask)?;
        grad_qs.extend(g.q);
        let keys_after = a.s - ab.s;
        for (sum, part) in [(&mut grad_k, g.k), (&mut grad_v, g.v)] {
            if let Some(part) = part {
                let part = if keys_after > 0 {
                    let zero = cx.full(0.0, a.acc, &[]);
                    cx.b.pad(part, zero, &[0, 0, 0, 0], &[0, 0, keys_after, 0], &[0, 0, 0, 0])
                } else {
                    part
                };
                *sum = Some(match *sum {
                    Some(acc) => cx.b.add(acc, part),
                    None => part,
                });
            }
        }
        grad_bias = g.bias;
    }
    let grad_q = if mask[0] { join_dim2(cx, &grad_qs) } else { cx.full(0.0, q.dtype, &[0]) };
    let grad_k = match grad_k {
        Some(r) => cx.cast(r, k.dtype),
        None => cx.full(0.0, k.dtype, &[0]),
    };
    let grad_v = match grad_v {
        Some(r) => cx.cast(r, v.dtype),
        None => cx.full(0.0, v.dtype, &[0]),
    };
    let grad_bias = grad_bias.unwrap_or_else(|| cx.full(0.0, q.dtype, &[0]));
    Ok(vec![Out::Tensor(grad_q), Out::Tensor(grad_k), Out::Tensor(grad_v), Out::Tensor(grad_bias)])
}

/// One block's gradients: the query's (in its dtype), the key's and value's (in the
/// accumulation dtype), the bias's; each where `mask` asks for it.
struct BlockGrads {
    q: Option<Value>,
    k: Option<Value>,
    v: Option<Value>,
    bias: Option<Value>,
}

/// The backward of `attend` for one block of rows: [q, k, v, grad_out, out, logsumexp] of
/// the block, the inputs' dtypes [q, k, v].
fn attend_backward(cx: &mut Cx, a: &Attn, vals: [Value; 6], bias: Option<&Tensor>, dts: [DType; 3], mask: [bool; 4]) -> Result<BlockGrads> {
    let [q, k, v, go, o, lse] = vals;
    let [q_dt, k_dt, v_dt] = dts;
    let q4 = a.group(cx, q);
    let s = a.scores(cx, q4, k, bias)?;
    let sd = a.scores_dims();
    let lse = cx.b.reshape(lse, &[a.b, a.hk, a.g * a.l]);
    let ninf = cx.full(f64::NEG_INFINITY, a.acc, &cx.dims(lse));
    let empty_row = cx.b.compare(CmpDir::Eq, lse, ninf);
    let empty_row = cx.b.broadcast_in_dim(empty_row, &sd, &[0, 1, 2]);
    let lseb = a.rows(cx, lse, &sd);
    let shifted = cx.b.sub(s, lseb);
    let p = cx.b.exp(shifted);
    let zeros = cx.full(0.0, a.acc, &sd);
    let p = cx.b.select(empty_row, zeros, p);
    let go4 = a.group(cx, go);
    let o4 = a.group(cx, o);
    // dV = P^T dO, summed over the query heads of each group.
    let grad_v = mask[2].then(|| {
        let pv = cx.cast(p, v_dt);
        contract(cx, pv, go4, (&[0, 1], &[0, 1]), (&[2], &[2]))
    });
    // dS = P * (dO V^T - rowsum(dO * O))
    let dp = contract(cx, go4, v, (&[0, 1], &[0, 1]), (&[3], &[3]));
    let goa = cx.cast(go4, a.acc);
    let oa = cx.cast(o4, a.acc);
    let prod = cx.b.mul(goa, oa);
    let d = reduce(cx, prod, &[3], Red::Sum);
    let db = a.rows(cx, d, &sd);
    let centered = cx.b.sub(dp, db);
    let ds = cx.b.mul(p, centered);
    let scale = cx.full(a.scale, a.acc, &[]);
    let grad_q = mask[0].then(|| {
        let dsq = cx.cast(ds, q_dt);
        let r = contract(cx, dsq, k, (&[0, 1], &[0, 1]), (&[3], &[2]));
        let sc = cx.b.broadcast_in_dim(scale, &cx.dims(r), &[]);
        let r = cx.b.mul(r, sc);
        let r = cx.cast(r, q_dt);
        a.ungroup(cx, r)
    });
    let grad_k = mask[1].then(|| {
        let dsk = cx.cast(ds, k_dt);
        let r = contract(cx, dsk, q4, (&[0, 1], &[0, 1]), (&[2], &[2]));
        let sc = cx.b.broadcast_in_dim(scale, &cx.dims(r), &[]);
        cx.b.mul(r, sc)
    });
    let grad_bias = match bias {
        Some(bias) if mask[3] && bias.dtype.is_float() => {
            let full = cx.b.reshape(ds, &[a.b, a.hk * a.g, a.l, a.s]);
            let r = sum_to(cx, full, &cx.dims(bias.v));
            Some(cx.cast(r, bias.dtype))
        }
        _ => None,
    };
    Ok(BlockGrads { q: grad_q, k: grad_k, v: grad_v, bias: grad_bias })
}
