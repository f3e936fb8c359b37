//! PyTorch's "better transformer" inference fast path, which nn.TransformerEncoderLayer and
//! nn.MultiheadAttention take in eval mode without autograd: `_native_multi_head_attention`
//! and `_transformer_encoder_layer_fwd`, each one program; and the left-alignment check of
//! its padding masks, `_nested_tensor_from_mask_left_aligned`.
//!
//! The arithmetic follows PyTorch's CPU kernels (transformers/attention.cpp and
//! transformer.cpp): the q/k/v projection without bias, then `_transform_bias_rescale_qkv`
//! (q = (q + q_bias) / sqrt(head_dim), k and v plus their biases), scores q k^T, a masked
//! softmax over the keys (the mask converted to bool: true, or any nonzero float, excludes a
//! key; a fully masked row gives NaN as on CPU), the context, and the output projection with
//! bias. For 16-bit floats every intermediate PyTorch materializes is rounded to the input
//! dtype where it does; products accumulate in float32.
use crate::args::{Args, Scalar, Tensor};
use crate::blocks::contract::contract;
use crate::blocks::reduce::{reduce, Red};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, Out, op, Op};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("_native_multi_head_attention", native_multi_head_attention),
    op("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd),
    op("_nested_tensor_from_mask_left_aligned", nested_tensor_from_mask_left_aligned),
];

fn dims_str(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// `v` (in the accumulate type) as PyTorch stores it: rounded to `dt`, kept in `acc`.
fn round(cx: &mut Cx, v: Value, dt: DType) -> Value {
    let acc = cx.dtype(v);
    if acc == dt {
        return v;
    }
    let r = cx.cast(v, dt);
    cx.cast(r, acc)
}

/// x [..., K] times w [M, K] transposed, in the accumulate type (no rounding).
fn matmul_nt(cx: &mut Cx, x: Value, w: Value) -> Value {
    let nd = cx.dims(x).len() as i64;
    contract(cx, x, w, (&[], &[]), (&[nd - 1], &[1]))
}

/// at::linear / addmm: x [..., K] w [M, K]^T + b [M], rounded once to the input dtype.
fn linear(cx: &mut Cx, x: Value, w: &Tensor, b: Option<&Tensor>, dt: DType) -> Result<Value> {
    let (xd, wd) = (cx.dims(x), cx.dims(w.v));
    check!(wd.len() == 2, Runtime, "2d weights expected");
    let k = *xd.last().unwrap_or(&1);
    let rows: i64 = xd[..xd.len() - 1].iter().product();
    check!(
        wd[1] == k,
        Runtime,
        "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
        rows,
        k,
        wd[1],
        wd[0]
    );
    let mut y = matmul_nt(cx, x, w.v);
    let yd = cx.dims(y);
    if let Some(b) = b {
        let bd = cx.dims(b.v);
        check!(
            bd.len() == 1 && (bd[0] == wd[0] || bd[0] == 1),
            Runtime,
            "The expanded size of the tensor ({}) must match the existing size ({}) at non-singleton dimension 1.  Target sizes: [{}, {}].  Tensor sizes: {}",
            wd[0],
            bd.last().copied().unwrap_or(1),
            rows,
            wd[0],
            dims_str(&bd)
        );
        let acc = cx.dtype(y);
        let bv = cx.cast(b.v, acc);
        let bv = cx.broadcast_in_dim(bv, &yd, &[yd.len() as i64 - 1]);
        y = cx.add(y, bv);
    }
    Ok(round(cx, y, dt))
}

/// at::layer_norm over the last dim (in the accumulate type; the result rounded to `dt`).
fn layer_norm(cx: &mut Cx, x: Value, w: &Tensor, b: &Tensor, eps: Scalar, dt: DType) -> Result<Value> {
    let d = cx.dims(x);
    let n = *d.last().unwrap();
    for (t, name) in [(w, "weight"), (b, "bias")] {
        let td = cx.dims(t.v);
        check!(
            td == [n],
            Runtime,
            "Expected {} to be of same shape as normalized_shape, but got {} of shape {} and normalized_shape = [{}]",
            name,
            name,
            dims_str(&td),
            n
        );
    }
    let acc = cx.dtype(x);
    let last = d.len() as i64 - 1;
    let keep: Vec<i64> = (0..last).collect();
    let s = reduce(cx, x, &[last], Red::Sum);
    let nv = cx.full(n as f64, acc, &cx.dims(s));
    let mean = cx.div(s, nv);
    let mb = cx.broadcast_in_dim(mean, &d, &keep);
    let c = cx.sub(x, mb);
    let c2 = cx.mul(c, c);
    let s2 = reduce(cx, c2, &[last], Red::Sum);
    let var = cx.div(s2, nv);
    let e = cx.scalar(eps, acc);
    let vd = cx.dims(var);
    let e = cx.broadcast_in_dim(e, &vd, &[]);
    let ve = cx.add(var, e);
    let rstd = cx.rsqrt(ve);
    let rb = cx.broadcast_in_dim(rstd, &d, &keep);
    let y = cx.mul(c, rb);
    let wv = cx.cast(w.v, acc);
    let wv = cx.broadcast_in_dim(wv, &d, &[last]);
    let y = cx.mul(y, wv);
    let bv = cx.cast(b.v, acc);
    let bv = cx.broadcast_in_dim(bv, &d, &[last]);
    let y = cx.add(y, bv);
    Ok(round(cx, y, dt))
}

/// The arguments of one attention call (shared by both ops).
struct Mha {
    embed_dim: i64,
    num_head: i64,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor,
    mask: Option<Tensor>,
    mask_type: Option<i64>,
}

impl Mha {
    fn from_args(args: &Args, num_head: &str) -> Result<Mha> {
        Ok(Mha {
            embed_dim: args.int("embed_dim")?,
            num_head: args.int(num_head)?,
            qkv_weight: args.tensor("qkv_weight")?,
            qkv_bias: args.tensor("qkv_bias")?,
            proj_weight: args.tensor("proj_weight")?,
            proj_bias: args.tensor("proj_bias")?,
            mask: args.opt_tensor("mask")?,
            mask_type: args.opt_int("mask_type")?,
        })
    }
}

/// native_multi_head_attention's checks, in its order.
fn check_mha(cx: &Cx, q: &Tensor, k: &Tensor, v: &Tensor, m: &Mha) -> Result<()> {
    let d = m.embed_dim;
    let (qd, kd, vd) = (cx.dims(q.v), cx.dims(k.v), cx.dims(v.v));
    check!(qd.len() == 3, Runtime, "expected 3-D `query`, got {}-D tensor", qd.len());
    check!(qd[2] == d, Runtime, "passed-in embed_dim {} didn't match last dim of query {}", d, qd[2]);
    check!(kd.len() == 3, Runtime, "expected 3-D `key`, got {}-D tensor", kd.len());
    check!(vd.len() == 3, Runtime, "expected 3-D `value`, got {}-D tensor", vd.len());
    check!(qd == kd && kd == vd, Runtime, "expected `query`/`key`/`value` shapes to match");
    let wd = cx.dims(m.qkv_weight.v);
    check!(wd.len() == 2, Runtime, "expected 2-D `qkv_weight`, got {}-D tensor", wd.len());
    check!(d * 3 == wd[0], Runtime, "expected `qkv_weight` first dim to be 3x embed_dim");
    check!(d == wd[1], Runtime, "expected `qkv_weight` second dim to be embed_Dim");
    let bd = cx.dims(m.qkv_bias.v);
    check!(bd.len() == 1, Runtime, "expected 1-D `qkv_bias`, got {}-D tensor", bd.len());
    check!(bd[0] == 3 * d, Runtime, "expected `qkv_bias` first dim and first dim of query to be equal");
    check!(m.num_head > 0 && d % m.num_head == 0, Runtime, "`embed_dim` must divide evenly by `num_heads`");
    let dt = q.dtype;
    for t in [k, v, &m.qkv_weight, &m.qkv_bias, &m.proj_weight, &m.proj_bias] {
        check!(
            t.dtype == dt,
            Runtime,
            "expected m1 and m2 to have the same dtype, but got: {} != {}",
            dt.torch_name(),
            t.dtype.torch_name()
        );
    }
    check!(dt.is_float(), NotImplemented, "\"transform_bias_rescale_qkv\" not implemented for '{}'", dt.torch_name());
    Ok(())
}

/// The mask as a bool tensor of the scores' shape [B, H, T, S] (true: excluded), with the
/// checks of the attention softmax (masked_softmax and _masked_softmax on CPU).
fn scores_mask(cx: &mut Cx, m: &Mha, scores: &[i64]) -> Result<Option<Value>> {
    let Some(mask) = m.mask else { return Ok(None) };
    let Some(mut mask_type) = m.mask_type else { bail!(Runtime, "Mask Type should be defined") };
    check!(
        (0..=2).contains(&mask_type),
        Runtime,
        "Mask Type should be 0 (src_mask) or 1 (src_key_padding_mask), or 2 (default_mask)"
    );
    let md = cx.dims(mask.v);
    if md.len() != 2 {
        // Types 0 and 1 are for 2-d masks of 4-d inputs only.
        mask_type = 2;
    }
    let bool_mask = cx.cast(mask.v, DType::Bool);
    let v = match mask_type {
        2 => {
            check!(md == scores, Runtime, "For mask_type == 2 mask shape should match input shape");
            bool_mask
        }
        1 => {
            check!(scores[0] == md[0] && scores[2] == md[1], Runtime, "For mask_type == 1 mask shape should be (B, L)");
            check!(scores[3] == md[1], Runtime, "For mask_type == 1 mask shape should be (B, L)");
            cx.broadcast_in_dim(bool_mask, scores, &[0, 3])
        }
        _ => {
            check!(scores[2] == md[0] && scores[2] == md[1], Runtime, "For mask_type == 0 mask shape should be (L, L)");
            check!(scores[3] == md[1], Runtime, "For mask_type == 0 mask shape should be (L, L)");
            cx.broadcast_in_dim(bool_mask, scores, &[2, 3])
        }
    };
    Ok(Some(v))
}

/// Softmax over the last dim of [B, H, T, S] scores (accumulate type), masked keys excluded.
/// Without a mask it is PyTorch's softmax (exponentials over their sum); with one, CPU's
/// masked softmax kernel, which for 16-bit floats works in the dtype: the shifted scores, the
/// exponentials and the reciprocal of their (float32) sum are each rounded to it.
fn masked_softmax(cx: &mut Cx, s: Value, mask: Option<Value>, dt: DType) -> Value {
    let d = cx.dims(s);
    let acc = cx.dtype(s);
    let keep = [0, 1, 2];
    let Some(m) = mask else {
        let mx = reduce(cx, s, &[3], Red::ShiftMax);
        let mb = cx.broadcast_in_dim(mx, &d, &keep);
        let z = cx.sub(s, mb);
        let e = cx.exp(z);
        let t = reduce(cx, e, &[3], Red::Sum);
        let tb = cx.broadcast_in_dim(t, &d, &keep);
        return cx.div(e, tb);
    };
    let ninf = cx.full(f64::NEG_INFINITY, acc, &d);
    let s = cx.select(m, ninf, s);
    let mx = reduce(cx, s, &[3], Red::ShiftMax);
    let mb = cx.broadcast_in_dim(mx, &d, &keep);
    let z = cx.sub(s, mb);
    let z = round(cx, z, dt);
    let e = cx.exp(z);
    let e = round(cx, e, dt);
    let t = reduce(cx, e, &[3], Red::Sum);
    let tb = cx.broadcast_in_dim(t, &d, &keep);
    if acc == dt {
        return cx.div(e, tb);
    }
    let one = cx.full(1.0, acc, &d);
    let r = cx.div(one, tb);
    let r = round(cx, r, dt);
    cx.mul(e, r)
}

/// One multi-head attention: (output [B, T, D] in the input dtype, probabilities [B, H, T, S]
/// in the accumulate type rounded to the input dtype).
fn attention(cx: &mut Cx, q: &Tensor, k: &Tensor, v: &Tensor, m: &Mha) -> Result<(Value, Value)> {
    let dt = q.dtype;
    let acc = dt.opmath();
    let qd = cx.dims(q.v);
    let (b, t, d) = (qd[0], qd[1], m.embed_dim);
    let s_len = cx.dims(k.v)[1];
    let h = m.num_head;
    let dh = d / h;
    // The in-projection without bias (one product per input, rounded as mm's result).
    let w = m.qkv_weight.v;
    let part = |cx: &mut Cx, i: i64| cx.slice(w, &[i * d, 0], &[(i + 1) * d, d], &[1, 1]);
    let (wq, wk, wv) = (part(cx, 0), part(cx, 1), part(cx, 2));
    let proj = |cx: &mut Cx, x: Value, w: Value| {
        let y = matmul_nt(cx, x, w);
        round(cx, y, dt)
    };
    let qp = proj(cx, q.v, wq);
    let kp = proj(cx, k.v, wk);
    let vp = proj(cx, v.v, wv);
    // _transform_bias_rescale_qkv.
    let bias = cx.cast(m.qkv_bias.v, acc);
    let bpart = |cx: &mut Cx, i: i64, n: i64| {
        let s = cx.slice(bias, &[i * d], &[(i + 1) * d], &[1]);
        cx.broadcast_in_dim(s, &[b, n, d], &[2])
    };
    let bq = bpart(cx, 0, t);
    let bk = bpart(cx, 1, s_len);
    let bv = bpart(cx, 2, s_len);
    // q = (q + q_bias) / sqrt(head_dim) in the accumulate type, rounded once.
    let qp = cx.add(qp, bq);
    let inv = 1.0 / (dh as f64).sqrt();
    let inv = cx.full(inv, acc, &[b, t, d]);
    let qp = cx.mul(qp, inv);
    let kp = cx.add(kp, bk);
    let vp = cx.add(vp, bv);
    let heads = |cx: &mut Cx, x: Value, n: i64| {
        let x = cx.cast(x, dt);
        let x = cx.reshape(x, &[b, n, h, dh]);
        cx.transpose(x, &[0, 2, 1, 3])
    };
    let qh = heads(cx, qp, t);
    let kh = heads(cx, kp, s_len);
    let vh = heads(cx, vp, s_len);
    let scores = contract(cx, qh, kh, (&[0, 1], &[0, 1]), (&[3], &[3]));
    let scores = round(cx, scores, dt);
    let sd = cx.dims(scores);
    let mask = scores_mask(cx, m, &sd)?;
    let p = masked_softmax(cx, scores, mask, dt);
    let p = round(cx, p, dt);
    let pd = cx.cast(p, dt);
    let ctx = contract(cx, pd, vh, (&[0, 1], &[0, 1]), (&[3], &[2]));
    let ctx = cx.cast(ctx, dt);
    let ctx = cx.transpose(ctx, &[0, 2, 1, 3]);
    let ctx = cx.reshape(ctx, &[b, t, d]);
    let out = linear(cx, ctx, &m.proj_weight, Some(&m.proj_bias), dt)?;
    Ok((cx.cast(out, dt), p))
}

/// _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
/// proj_weight, proj_bias, mask, need_weights, average_attn_weights, mask_type)
/// -> (output, weights). Weights that were not asked for (or of empty inputs) are undefined
/// (None), as PyTorch returns them.
fn native_multi_head_attention(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let (q, k, v) = (args.tensor("query")?, args.tensor("key")?, args.tensor("value")?);
    let m = Mha::from_args(args, "num_head")?;
    let need_weights = args.bool_or("need_weights", true)?;
    let average = args.bool_or("average_attn_weights", true)?;
    check_mha(cx, &q, &k, &v, &m)?;
    let dt = q.dtype;
    if cx.numel(q.v) == 0 {
        let z = cx.full(0.0, dt, &cx.dims(q.v));
        return Ok(vec![Out::Tensor(z), Out::Undefined]);
    }
    let (out, p) = attention(cx, &q, &k, &v, &m)?;
    if !need_weights {
        return Ok(vec![Out::Tensor(out), Out::Undefined]);
    }
    let weights = if average {
        // qkt.sum(1) then /= num_head, each rounded to the dtype.
        let s = reduce(cx, p, &[1], Red::Sum);
        let s = round(cx, s, dt);
        let acc = cx.dtype(s);
        let n = cx.full(m.num_head as f64, acc, &cx.dims(s));
        let a = cx.div(s, n);
        cx.cast(a, dt)
    } else {
        cx.cast(p, dt)
    };
    Ok(vec![Out::Tensor(out), Out::Tensor(weights)])
}

/// _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias,
/// proj_weight, proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
/// norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask,
/// mask_type): self-attention and feed-forward blocks with residuals and layer norms
/// (before each block with norm_first, after each residual otherwise).
fn transformer_encoder_layer_fwd(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let src = args.tensor("src")?;
    let m = Mha::from_args(args, "num_heads")?;
    let use_gelu = args.bool("use_gelu")?;
    let norm_first = args.bool("norm_first")?;
    let eps = args.scalar("eps")?;
    let t = |name: &str| args.tensor(name);
    let (nw1, nb1, nw2, nb2) = (t("norm_weight_1")?, t("norm_bias_1")?, t("norm_weight_2")?, t("norm_bias_2")?);
    let (fw1, fb1, fw2, fb2) = (t("ffn_weight_1")?, t("ffn_bias_1")?, t("ffn_weight_2")?, t("ffn_bias_2")?);
    if cx.numel(src.v) == 0 {
        let z = cx.full(0.0, src.dtype, &cx.dims(src.v));
        return Ok(vec![Out::Tensor(z)]);
    }
    let dt = src.dtype;
    check!(dt.is_float(), NotImplemented, "\"transform_bias_rescale_qkv\" not implemented for '{}'", dt.torch_name());
    let acc = dt.opmath();
    let x0 = cx.cast(src.v, acc);
    let mut x = src;
    if norm_first {
        let n = layer_norm(cx, x0, &nw1, &nb1, eps, dt)?;
        x = Tensor { v: cx.cast(n, dt), ..src };
    }
    check_mha(cx, &x, &x, &x, &m)?;
    let (attn, _) = attention(cx, &x, &x, &x, &m)?;
    let a = cx.cast(attn, acc);
    let mut y = cx.add(a, x0);
    y = round(cx, y, dt);
    if !norm_first {
        y = layer_norm(cx, y, &nw1, &nb1, eps, dt)?;
    }
    let pre = y;
    if norm_first {
        y = layer_norm(cx, y, &nw2, &nb2, eps, dt)?;
    }
    // The feed-forward block: addmm, relu or (exact) gelu, addmm.
    let yd = cx.cast(y, dt);
    let h1 = linear(cx, yd, &fw1, Some(&fb1), dt)?;
    let h1 = if use_gelu {
        let r = cx.full(std::f64::consts::FRAC_1_SQRT_2, acc, &cx.dims(h1));
        let xs = cx.mul(h1, r);
        let erf = cx.chlo("erf", &[xs]);
        let one = cx.full(1.0, acc, &cx.dims(h1));
        let half = cx.full(0.5, acc, &cx.dims(h1));
        let cdf = cx.add(one, erf);
        let cdf = cx.mul(half, cdf);
        cx.mul(h1, cdf)
    } else {
        let zero = cx.full(0.0, acc, &cx.dims(h1));
        let neg = cx.compare(CmpDir::Lt, h1, zero);
        cx.select(neg, zero, h1)
    };
    let h1 = cx.cast(h1, dt);
    let h2 = linear(cx, h1, &fw2, Some(&fb2), dt)?;
    let mut z = cx.add(h2, pre);
    z = round(cx, z, dt);
    if !norm_first {
        z = layer_norm(cx, z, &nw2, &nb2, eps, dt)?;
    }
    Ok(vec![Out::Tensor(cx.cast(z, dt))])
}

/// _nested_tensor_from_mask_left_aligned(t, mask) -> bool: whether every row of the padding
/// mask [N, L] (true: a token) is a run of trues followed by falses, as nn.TransformerEncoder
/// asks before packing a batch into a nested tensor.
fn nested_tensor_from_mask_left_aligned(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let t = args.tensor("t")?;
    let mask = args.tensor("mask")?;
    check!(
        mask.dtype == DType::Bool,
        Runtime,
        "Expected mask to be of ScalarType Bool, but got {} instead.",
        mask.dtype.torch_name()
    );
    let (td, md) = (cx.dims(t.v), cx.dims(mask.v));
    check!(md.len() == 2, Runtime, "Padding mask should be 2D");
    check!(td.len() == 3, Runtime, "Input should be a 3D tensor, N * L * D");
    check!(md[0] == td[0] && md[1] == td[1], Runtime, "Mask size should match input size");
    // Left aligned: each row equals (position < number of trues in the row).
    let counts = cx.cast(mask.v, DType::I64);
    let counts = reduce(cx, counts, &[1], Red::Sum);
    let counts = cx.broadcast_in_dim(counts, &md, &[0]);
    let pos = cx.iota(&stablehlo::TensorType { elem: DType::I64.elem(), dims: md.clone() }, 1);
    let prefix = cx.compare(CmpDir::Lt, pos, counts);
    let same = cx.compare(CmpDir::Eq, prefix, mask.v);
    let all = reduce(cx, same, &[0, 1], Red::And);
    Ok(vec![Out::Tensor(all)])
}
