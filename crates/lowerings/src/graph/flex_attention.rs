//! Flex attention in compiled graphs: the higher-order ops `flex_attention` and
//! `flex_attention_backward`, whose score and mask functions (and the score function's joint
//! graph, for its gradient) arrive as subgraphs traced on 0-d values. Each is lowered on whole
//! blocks of scores: its position inputs (batch, head, query and key index) are int32 iotas of
//! the block's shape, so an index into a captured tensor gathers a block at a time and the
//! gradient of one (`flex_lib::zeros_and_scatter`) adds a block at a time, as vmap would.
//!
//! The semantics are PyTorch's math form (`sdpa_dense` and its backward): scores in float32
//! (float64 for float64 inputs), masked scores -inf, rows with no key left give zeros and a
//! log-sum-exp of -inf; the log-sum-exp and row maxima come back in base 2 and float32, as the
//! op's do.
//!
//! Keys are attended a block at a time in a while loop, with a running softmax (flash
//! attention's), so a step holds one block of scores. Where the BlockMask's lists fit the
//! sequence, the loop visits only the key blocks they list: the query rows are split into up
//! to ROW_GROUPS groups of query blocks, and each group loops over the key blocks any of its
//! blocks lists. As in compiled flex attention, a key block a query block's lists do not
//! name counts as masked for it.
use super::control::{no_failure, passed, tensors, Folded};
use super::{lower_optional, Draws, GArg, Graph, Node};
use crate::args::Arg;
use crate::blocks::contract::contract;
use crate::blocks::reduce::{reduce, Red};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, Out};
use stablehlo::{CmpDir, ElemType, TensorType, Value};
use std::sync::Arc;

/// Keys per step of the loop where the block mask lists nothing to skip, and the fewest per step
/// of the backward's loop (a step of whole key blocks; fewer, larger steps measured faster
/// there, the forward's fastest with one key block per step).
const KV_CHUNK: i64 = 512;
/// The most groups of query rows, each looping over the key blocks its lists name.
const ROW_GROUPS: i64 = 8;

/// One flex attention call: its shapes, functions and key blocks. Query heads are grouped over
/// the key/value heads: q [B, Hk*G, M, E], k [B, Hk, N, E], v [B, Hk, N, Ev]; products run on
/// [B, Hk, G*Mr, ..] (a plain reshape of a block of Mr query rows).
struct Flex {
    b: i64,
    hk: i64,
    g: i64,
    m: i64,
    n: i64,
    /// Whether the keys and values were broadcast from one batch (their gradients sum over it).
    kv_broadcast: bool,
    scale: f64,
    acc: DType,
    q_dt: DType,
    q: Value,
    /// Keys and values over batch B, padded with zeros to whole chunks.
    k: Value,
    v: Value,
    /// Keys per loop step, and the number of steps over every key.
    chunk: i64,
    chunks: i64,
    /// The BlockMask's lists, where they fit this call and list something to skip.
    listed: Option<Listed>,
    score: Arc<Graph>,
    mask: Arc<Graph>,
    score_buffers: Vec<Value>,
    mask_buffers: Vec<Value>,
}

/// The key blocks listed per query block, as [Bm, Hm, query blocks, chunks * per_chunk] (pred;
/// the blocks past the last key unlisted), and the block sizes.
#[derive(Clone, Copy)]
struct Listed {
    blocks: Value,
    q_block: i64,
    kv_block: i64,
    /// Key blocks per loop step.
    per_chunk: i64,
}

/// The int32 positions of a block of scores, each of the block's shape [B, Hq, Mr, C]: batch,
/// head, query row and key (clamped to the last key), and whether the key is a real one (not
/// the padding of the last chunk).
struct Positions {
    b: Value,
    h: Value,
    m: Value,
    n: Value,
    real: Value,
}

/// The arguments the graph encoder gives both ops after their tensors:
/// [score function(s)..., mask function, kv lists (4, each a tensor or none), [Q_BLOCK_SIZE,
/// KV_BLOCK_SIZE], scale, score buffers, mask buffers].
/// `min_chunk`: the fewest keys per loop step where the lists are used.
fn setup(cx: &mut Cx, values: &[Out], draws: &mut Draws, qkv: [Value; 3], score: &GArg, rest: &[GArg], min_chunk: i64) -> Result<Flex> {
    let [GArg::Graph(mask), lists, sizes, scale, score_buffers, mask_buffers] = rest else {
        bail!(Runtime, "torchtpu.compile: malformed flex attention node")
    };
    let GArg::Graph(score) = score else { bail!(Runtime, "torchtpu.compile: malformed flex attention node") };
    let [q, k, v] = qkv;
    let (qd, kd, vd) = (cx.dims(q), cx.dims(k), cx.dims(v));
    check!(qd.len() == 4 && kd.len() == 4 && vd.len() == 4, Runtime, "flex_attention: query, key and value must be 4-d");
    let (b, hq, m, e) = (qd[0], qd[1], qd[2], qd[3]);
    let (bk, hk, n) = (kd[0], kd[1], kd[2]);
    check!(bk == b || (b > 1 && bk == 1), Runtime, "Bq and Bkv must broadcast. Got Bq={} and Bkv={}", b, bk);
    check!(hk > 0 && hq % hk == 0 && vd[1] == hk && vd[2] == n && kd[3] == e, Runtime,
        "flex_attention: query {:?}, key {:?} and value {:?} do not fit", qd, kd, vd);
    let q_dt = cx.dtype(q);
    let acc = if q_dt == DType::F64 { DType::F64 } else { DType::F32 };
    let scale = match super::arg(cx, values, scale, draws)? {
        Arg::Float(f) => f.value,
        Arg::Int(i) => i as f64,
        other => bail!(Runtime, "torchtpu.compile: flex attention's scale {:?}", other),
    };
    let (q_block, kv_block) = match super::arg(cx, values, sizes, draws)? {
        Arg::IntList(s) if s.len() == 2 => (s[0], s[1]),
        other => bail!(Runtime, "torchtpu.compile: flex attention's block sizes {:?}", other),
    };
    let lists: Vec<Option<Value>> = match super::arg(cx, values, lists, draws)? {
        Arg::List(items) => items.into_iter().map(|x| if let Arg::Tensor(t) = x { Some(t.v) } else { None }).collect(),
        _ => Vec::new(),
    };
    let mut listed = listed_blocks(cx, &lists, [b, hq, m, n], [q_block, kv_block]);
    let key_blocks = listed.map_or(1, |blocks| cx.dims(blocks)[3]);
    let per_chunk = ((min_chunk + kv_block - 1) / kv_block.max(1)).clamp(1, key_blocks);
    let chunk = if listed.is_some() { kv_block * per_chunk } else { KV_CHUNK.min(n).max(1) };
    let chunks = (n + chunk - 1) / chunk;
    if let Some(blocks) = listed {
        let d = cx.dims(blocks);
        let unlisted = cx.b.constant_bool(false);
        let blocks = cx.b.pad(blocks, unlisted, &[0, 0, 0, 0], &[0, 0, 0, chunks * per_chunk - d[3]], &[0, 0, 0, 0]);
        listed = Some(blocks);
    }
    let listed = listed.map(|blocks| Listed { blocks, q_block, kv_block, per_chunk });
    let full = |cx: &mut Cx, x: Value, last: i64| {
        let x = if bk == b { x } else { cx.b.broadcast_in_dim(x, &[b, hk, n, last], &[0, 1, 2, 3]) };
        let zero = cx.full(0.0, cx.dtype(x), &[]);
        cx.b.pad(x, zero, &[0, 0, 0, 0], &[0, 0, chunks * chunk - n, 0], &[0, 0, 0, 0])
    };
    let (k, v) = (full(cx, k, e), full(cx, v, vd[3]));
    Ok(Flex {
        b,
        hk,
        g: hq / hk,
        m,
        n,
        kv_broadcast: bk != b,
        scale,
        acc,
        q_dt,
        q,
        k,
        v,
        chunk,
        chunks,
        listed,
        score: score.clone(),
        mask: mask.clone(),
        score_buffers: tensors(cx, values, score_buffers, draws)?,
        mask_buffers: tensors(cx, values, mask_buffers, draws)?,
    })
}

/// The key blocks the BlockMask lists (partial or full) per query block, as a [Bm, Hm, query
/// blocks, key blocks] pred; None where the lists do not fit the call's sizes, or a key block
/// covers every key (nothing to skip).
fn listed_blocks(cx: &mut Cx, lists: &[Option<Value>], [b, hq, m, n]: [i64; 4], [qb, kb]: [i64; 2]) -> Option<Value> {
    let (Some(Some(num)), Some(Some(idx))) = (lists.first(), lists.get(1)) else { return None };
    let (nd, id) = (cx.dims(*num), cx.dims(*idx));
    let (nq, nk) = ((m + qb - 1) / qb.max(1), (n + kb - 1) / kb.max(1));
    let fits = qb > 0 && kb > 0 && qb <= m && kb < n && id.len() == 4 && nd[..] == id[..3] && id[2] == nq
        && (id[0] == 1 || id[0] == b) && (id[1] == 1 || id[1] == hq);
    if !fits {
        return None;
    }
    let mut listed = dense_list(cx, *num, *idx, nk);
    if let (Some(Some(num)), Some(Some(idx))) = (lists.get(2), lists.get(3)) {
        if cx.dims(*idx) == id {
            let full = dense_list(cx, *num, *idx, nk);
            listed = cx.b.or(listed, full);
        }
    }
    Some(listed)
}

/// A list of key blocks per query block (counts [Bm, Hm, Q], indices [Bm, Hm, Q, slots]) as a
/// dense [Bm, Hm, Q, nk] pred. Slots past a row's count, and indices out of range, name a spare
/// block that is dropped.
fn dense_list(cx: &mut Cx, num: Value, idx: Value, nk: i64) -> Value {
    let id = cx.dims(idx);
    let (num, idx) = (cx.cast(num, DType::I64), cx.cast(idx, DType::I64));
    let slot = cx.b.iota(&TensorType::new(ElemType::I64, &id), 3);
    let count = cx.b.broadcast_in_dim(num, &id, &[0, 1, 2]);
    let used = cx.b.compare(CmpDir::Lt, slot, count);
    let zero = cx.full(0.0, DType::I64, &id);
    let spare = cx.full(nk as f64, DType::I64, &id);
    let low = cx.b.compare(CmpDir::Ge, idx, zero);
    let high = cx.b.compare(CmpDir::Lt, idx, spare);
    let inside = cx.b.and(low, high);
    let used = cx.b.and(used, inside);
    let at = cx.b.select(used, idx, spare);
    let wide = [id[0], id[1], id[2], id[3], nk + 1];
    let at = cx.b.broadcast_in_dim(at, &wide, &[0, 1, 2, 3]);
    let block = cx.b.iota(&TensorType::new(ElemType::I64, &wide), 4);
    let hit = cx.b.compare(CmpDir::Eq, at, block);
    let any = reduce(cx, hit, &[3], Red::Or);
    cx.b.slice(any, &[0, 0, 0, 0], &[id[0], id[1], id[2], nk], &[1, 1, 1, 1])
}

impl Flex {
    fn hq(&self) -> i64 {
        self.hk * self.g
    }

    /// Groups of query rows [r0, r1): whole query blocks where the lists are used, else all rows.
    fn row_groups(&self) -> Vec<(i64, i64)> {
        let Some(Listed { q_block: qb, .. }) = self.listed else { return vec![(0, self.m)] };
        let nq = (self.m + qb - 1) / qb;
        let per = (nq + ROW_GROUPS - 1) / ROW_GROUPS;
        (0..nq).step_by(per as usize).map(|i| (i * qb, ((i + per) * qb).min(self.m))).collect()
    }

    /// The key chunks rows [r0, r1) visit: (their indices first in a [chunks] int64, their
    /// count as a 0-d int64).
    fn visited(&self, cx: &mut Cx, r0: i64, r1: i64) -> (Value, Value) {
        let all = TensorType::new(ElemType::I64, &[self.chunks]);
        let order = cx.b.iota(&all, 0);
        let Some(Listed { blocks, q_block: qb, per_chunk, .. }) = self.listed else {
            return (order, cx.b.constant_i64(self.chunks, ElemType::I64));
        };
        let d = cx.dims(blocks);
        let (b0, b1) = (r0 / qb, (r1 + qb - 1) / qb);
        let ours = cx.b.slice(blocks, &[0, 0, b0, 0], &[d[0], d[1], b1, d[3]], &[1, 1, 1, 1]);
        let ours = cx.b.reshape(ours, &[d[0], d[1], b1 - b0, self.chunks, per_chunk]);
        let need = reduce(cx, ours, &[0, 1, 2, 4], Red::Or);
        // Needed chunks sort first, each group in order.
        let later = cx.full(self.chunks as f64, DType::I64, &[self.chunks]);
        let after = cx.b.add(order, later);
        let key = cx.b.select(need, order, after);
        let sorted = cx.b.sort(&[key], 0, false, |b, a| b.compare(CmpDir::Lt, a[0], a[1]))[0];
        let limit = cx.full((self.chunks - 1) as f64, DType::I64, &[self.chunks]);
        let sorted = cx.b.min(sorted, limit);
        let count = cx.cast(need, DType::I64);
        let count = reduce(cx, count, &[0], Red::Sum);
        (sorted, count)
    }

    /// Query rows [r0, r1) of [B, Hk*G, M, ..] (per-row values: [B, Hk*G, M]) as
    /// [B, Hk, G*Mr, ..] in `dt`.
    fn grouped_rows(&self, cx: &mut Cx, x: Value, r0: i64, r1: i64, dt: DType) -> Value {
        let d = cx.dims(x);
        let (mut lo, mut hi) = (vec![0; d.len()], d.clone());
        (lo[2], hi[2]) = (r0, r1);
        let rows = cx.b.slice(x, &lo, &hi, &vec![1; d.len()]);
        let mut grouped = vec![self.b, self.hk, self.g * (r1 - r0)];
        grouped.extend_from_slice(&d[3..]);
        let rows = cx.b.reshape(rows, &grouped);
        cx.cast(rows, dt)
    }

    /// A [B, Hk, G*Mr, ..] value back as [B, Hk*G, Mr, ..] (per-row values: [B, Hk*G, Mr]).
    fn ungrouped(&self, cx: &mut Cx, x: Value, mr: i64) -> Value {
        let mut d = vec![self.b, self.hq(), mr];
        d.extend_from_slice(&cx.dims(x)[3..]);
        cx.b.reshape(x, &d)
    }

    /// A per-row [B, Hk, G*Mr] value broadcast along the keys of a [B, Hk, G*Mr, C] block.
    fn along_keys(&self, cx: &mut Cx, x: Value, block: &[i64]) -> Value {
        cx.b.broadcast_in_dim(x, block, &[0, 1, 2])
    }

    /// Keys or values [start, start + chunk) of `x` (padded over batch B), in `dt`.
    fn chunk_of(&self, cx: &mut Cx, x: Value, start: Value, dt: DType) -> Value {
        let d = cx.dims(x);
        let zero = cx.b.constant_i64(0, ElemType::I64);
        let part = cx.b.dynamic_slice(x, &[zero, zero, start, zero], &[d[0], d[1], self.chunk, d[3]]);
        cx.cast(part, dt)
    }

    /// The positions of rows [r0, r1) against the chunk starting at key `start`.
    fn positions(&self, cx: &mut Cx, r0: i64, r1: i64, start: Value) -> Positions {
        let dims = [self.b, self.hq(), r1 - r0, self.chunk];
        let ty = TensorType::new(ElemType::I32, &dims);
        let (b, h) = (cx.b.iota(&ty, 0), cx.b.iota(&ty, 1));
        let m = cx.b.iota(&ty, 2);
        let first = cx.full(r0 as f64, DType::I32, &dims);
        let m = cx.b.add(m, first);
        let n = cx.b.iota(&ty, 3);
        let start = cx.b.convert(start, ElemType::I32);
        let start = cx.b.broadcast_in_dim(start, &dims, &[]);
        let n = cx.b.add(n, start);
        let count = cx.full(self.n as f64, DType::I32, &dims);
        let real = cx.b.compare(CmpDir::Lt, n, count);
        let last = cx.full((self.n - 1).max(0) as f64, DType::I32, &dims);
        let n = cx.b.min(n, last);
        Positions { b, h, m, n, real }
    }

    /// One subgraph on a block: `first` (the scores, or none for the mask), the positions, then
    /// `rest` and the captured buffers.
    fn call(&self, cx: &mut Cx, g: &Graph, first: Option<Value>, at: &Positions, rest: &[Value], buffers: &[Value]) -> Result<Vec<Option<Value>>> {
        let mut inputs: Vec<Value> = first.into_iter().collect();
        inputs.extend([at.b, at.h, at.m, at.n]);
        inputs.extend_from_slice(rest);
        inputs.extend_from_slice(buffers);
        check!(g.num_inputs == inputs.len(), NotImplemented,
            "torchtpu.compile: a flex attention function of {} inputs, given {}", g.num_inputs, inputs.len());
        // Random ops have no stream here: they fail as in a graph without one.
        let mut draws = Draws { state: None, next: 0 };
        lower_optional(cx, g, inputs.into_iter().map(Out::Tensor).collect(), &mut draws, &mut [])
    }

    /// Scores of rows [r0, r1) against the chunk at key `start` (index `kc`), each [B, Hq, Mr,
    /// C]: before score_mod, after it and the mask (masked: -inf), and the kept pred.
    fn scores(&self, cx: &mut Cx, q_rows: Value, r0: i64, r1: i64, start: Value, kc: Value) -> Result<(Value, Value, Value, Positions)> {
        let mr = r1 - r0;
        let dims = [self.b, self.hq(), mr, self.chunk];
        let k = self.chunk_of(cx, self.k, start, self.acc);
        let s = contract(cx, q_rows, k, (&[0, 1], &[0, 1]), (&[3], &[3]));
        let s = cx.cast(s, self.acc);
        let scale = cx.full(self.scale, self.acc, &cx.dims(s));
        let s = cx.b.mul(s, scale);
        let s = self.ungrouped(cx, s, mr);
        let at = self.positions(cx, r0, r1, start);
        let post = single(self.call(cx, &self.score, Some(s), &at, &[], &self.score_buffers)?, "score")?;
        let post = cx.cast(post, self.acc);
        let post = cx.b.broadcast_to(post, &dims);
        let kept = single(self.call(cx, &self.mask, None, &at, &[], &self.mask_buffers)?, "mask")?;
        let kept = cx.cast(kept, DType::Bool);
        let kept = cx.b.broadcast_to(kept, &dims);
        let mut kept = cx.b.and(kept, at.real);
        if let Some(listed) = self.listed {
            let named = named_blocks(cx, &listed, r0, r1, kc);
            let named = cx.b.broadcast_in_dim(named, &dims, &[0, 1, 2, 3]);
            kept = cx.b.and(kept, named);
        }
        let ninf = cx.full(f64::NEG_INFINITY, self.acc, &dims);
        let masked = cx.b.select(kept, post, ninf);
        Ok((s, masked, kept, at))
    }

    /// Runs `step` over the chunks rows [r0, r1) visit, threading `state` through: a while loop
    /// (its data-dependent checks folded into one, as control flow's are), or the step itself
    /// when there is one chunk.
    fn each_chunk(
        &self,
        cx: &mut Cx,
        r0: i64,
        r1: i64,
        state: Vec<Value>,
        mut step: impl FnMut(&mut Cx, Value, Value, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<Vec<Value>> {
        if self.listed.is_none() && self.chunks == 1 {
            let zero = cx.b.constant_i64(0, ElemType::I64);
            return step(cx, zero, zero, &state);
        }
        if self.chunks == 0 {
            return Ok(state);
        }
        let (order, count) = self.visited(cx, r0, r1);
        let n = state.len();
        let mut inits = vec![cx.b.constant_i64(0, ElemType::I64)];
        inits.extend(&state);
        inits.push(no_failure(cx));
        let types: Vec<TensorType> = inits.iter().map(|&v| cx.ty(v).clone()).collect();

        let a = cx.open_region(&types);
        let more = cx.b.compare(CmpDir::Lt, a[0], count);
        let ok = passed(cx, a[n + 1]);
        let go = cx.b.and(more, ok);
        let (cond_text, _) = cx.close_region(&[go]);

        let a = cx.open_region(&types);
        let checks = cx.checks.len();
        let kc = cx.b.dynamic_slice(order, &[a[0]], &[1]);
        let kc = cx.b.reshape(kc, &[]);
        let width = cx.b.constant_i64(self.chunk, ElemType::I64);
        let start = cx.b.mul(kc, width);
        let mut next = vec![crate::blocks::loops::next_count(&mut cx.b, a[0])];
        let stepped = step(cx, start, kc, &a[1..n + 1])?;
        for (v, t) in stepped.into_iter().zip(&types[1..n + 1]) {
            next.push(if cx.ty(v).elem == t.elem { v } else { cx.convert(v, t.elem) });
        }
        let mut folded = Folded::default();
        let bad = folded.fold(cx, checks)?;
        let ok = passed(cx, a[n + 1]);
        next.push(cx.select(ok, bad, a[n + 1]));
        let (body_text, got) = cx.close_region(&next);
        check!(got == types, Runtime, "torchtpu.compile: flex attention's loop returns {:?} for {:?}", got, types);

        let mut results = cx.while_regions(&inits, cond_text, body_text);
        let bad = results.pop().unwrap();
        folded.add_to(cx, bad);
        Ok(results[1..].to_vec())
    }
}

/// Whether each row of [r0, r1) lists the key block of each key of chunk `kc`: [Bm, Hm, Mr, C].
fn named_blocks(cx: &mut Cx, listed: &Listed, r0: i64, r1: i64, kc: Value) -> Value {
    let Listed { blocks, q_block: qb, kv_block: kb, per_chunk: r } = *listed;
    let d = cx.dims(blocks);
    let zero = cx.b.constant_i64(0, ElemType::I64);
    let width = cx.b.constant_i64(r, ElemType::I64);
    let first = cx.b.mul(kc, width);
    let columns = cx.b.dynamic_slice(blocks, &[zero, zero, zero, first], &[d[0], d[1], d[2], r]);
    let (b0, b1) = (r0 / qb, (r1 + qb - 1) / qb);
    let ours = cx.b.slice(columns, &[0, 0, b0, 0], &[d[0], d[1], b1, r], &[1, 1, 1, 1]);
    let each = cx.b.broadcast_in_dim(ours, &[d[0], d[1], b1 - b0, qb, r, kb], &[0, 1, 2, 4]);
    let each = cx.b.reshape(each, &[d[0], d[1], (b1 - b0) * qb, r * kb]);
    cx.b.slice(each, &[0, 0, 0, 0], &[d[0], d[1], r1 - r0, r * kb], &[1, 1, 1, 1])
}

/// A function's one output.
fn single(outs: Vec<Option<Value>>, what: &str) -> Result<Value> {
    match outs[..] {
        [Some(v)] => Ok(v),
        _ => bail!(NotImplemented, "torchtpu.compile: flex attention's {} function must return one tensor", what),
    }
}

fn tensor(cx: &mut Cx, values: &[Out], a: &GArg, draws: &mut Draws) -> Result<Option<Value>> {
    Ok(match super::arg(cx, values, a, draws)? {
        Arg::Tensor(t) => Some(t.v),
        Arg::None => None,
        other => bail!(Runtime, "torchtpu.compile: flex attention's tensor argument {:?}", other),
    })
}

/// flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
/// score_mod_buffers, mask_mod_buffers) -> (output, logsumexp, max_scores).
pub(super) fn forward(cx: &mut Cx, values: &[Out], node: &Node, draws: &mut Draws) -> Result<Out> {
    let [q, k, v, score, rest @ ..] = &node.args[..] else { bail!(Runtime, "torchtpu.compile: malformed flex_attention node") };
    let mut qkv = Vec::new();
    for a in [q, k, v] {
        match tensor(cx, values, a, draws)? {
            Some(t) => qkv.push(t),
            None => bail!(Runtime, "torchtpu.compile: flex_attention without a query, key or value"),
        }
    }
    let f = setup(cx, values, draws, [qkv[0], qkv[1], qkv[2]], score, rest, 1)?;
    let (mut outs, mut lses, mut maxes) = (Vec::new(), Vec::new(), Vec::new());
    for (r0, r1) in f.row_groups() {
        let (out, lse, max) = forward_rows(cx, &f, r0, r1)?;
        outs.push(out);
        lses.push(lse);
        maxes.push(max);
    }
    let join = |cx: &mut Cx, parts: &[Value]| if parts.len() == 1 { parts[0] } else { cx.b.concatenate(parts, 2) };
    let (out, lse, max) = (join(cx, &outs), join(cx, &lses), join(cx, &maxes));
    Ok(Out::List(vec![out, lse, max]))
}

/// Rows [r0, r1): (output [B, Hq, Mr, Ev] in the query's dtype, log-sum-exp and row maxima
/// [B, Hq, Mr] in base 2, float32).
fn forward_rows(cx: &mut Cx, f: &Flex, r0: i64, r1: i64) -> Result<(Value, Value, Value)> {
    let (mr, acc) = (r1 - r0, f.acc);
    let rows = [f.b, f.hk, f.g * mr];
    let ev = cx.dims(f.v)[3];
    let q_rows = f.grouped_rows(cx, f.q, r0, r1, acc);
    // The running softmax: each row's maximum, its sum of exp(score - shift) and its value
    // products, where shift is the maximum (0 while it is -inf).
    let state = vec![cx.full(f64::NEG_INFINITY, acc, &rows), cx.full(0.0, acc, &rows), cx.full(0.0, acc, &[f.b, f.hk, f.g * mr, ev])];
    let state = f.each_chunk(cx, r0, r1, state, |cx, start, kc, s| {
        let (run_max, run_sum, run_out) = (s[0], s[1], s[2]);
        let (_, masked, _, _) = f.scores(cx, q_rows, r0, r1, start, kc)?;
        let block = [f.b, f.hk, f.g * mr, f.chunk];
        let masked = cx.b.reshape(masked, &block);
        let top = reduce(cx, masked, &[3], Red::ShiftMax);
        let new_max = cx.b.max(run_max, top);
        let shift = shift_of(cx, new_max);
        let shift_b = f.along_keys(cx, shift, &block);
        let centered = cx.b.sub(masked, shift_b);
        let p = cx.b.exp(centered);
        let fade = fade(cx, run_max, shift);
        let sums = reduce(cx, p, &[3], Red::Sum);
        let kept_sum = cx.b.mul(run_sum, fade);
        let new_sum = cx.b.add(kept_sum, sums);
        let v = f.chunk_of(cx, f.v, start, f.q_dt);
        let pv = cx.cast(p, f.q_dt);
        let pv = contract(cx, pv, v, (&[0, 1], &[0, 1]), (&[3], &[2]));
        let pv = cx.cast(pv, acc);
        let fade_b = cx.b.broadcast_in_dim(fade, &cx.dims(run_out), &[0, 1, 2]);
        let kept_out = cx.b.mul(run_out, fade_b);
        let new_out = cx.b.add(kept_out, pv);
        Ok(vec![new_max, new_sum, new_out])
    })?;
    let (run_max, run_sum, run_out) = (state[0], state[1], state[2]);
    let shift = shift_of(cx, run_max);
    let zero = cx.full(0.0, acc, &rows);
    let one = cx.full(1.0, acc, &rows);
    let empty = cx.b.compare(CmpDir::Eq, run_sum, zero);
    let total = cx.b.select(empty, one, run_sum);
    let total_b = cx.b.broadcast_in_dim(total, &cx.dims(run_out), &[0, 1, 2]);
    let out = cx.b.div(run_out, total_b);
    let empty_b = cx.b.broadcast_in_dim(empty, &cx.dims(run_out), &[0, 1, 2]);
    let zeros = cx.full(0.0, acc, &cx.dims(run_out));
    let out = cx.b.select(empty_b, zeros, out);
    let out = cx.cast(out, f.q_dt);
    let log_total = cx.b.log(total);
    let lse = cx.b.add(log_total, shift);
    let ninf = cx.full(f64::NEG_INFINITY, acc, &rows);
    let lse = cx.b.select(empty, ninf, lse);
    let inv_ln2 = cx.full(1.0 / std::f64::consts::LN_2, acc, &rows);
    let lse = cx.b.mul(lse, inv_ln2);
    let max = cx.b.mul(run_max, inv_ln2);
    // Float32 for every input dtype, as the op's traced outputs are.
    let (lse, max) = (cx.cast(lse, DType::F32), cx.cast(max, DType::F32));
    Ok((f.ungrouped(cx, out, mr), f.ungrouped(cx, lse, mr), f.ungrouped(cx, max, mr)))
}

/// The shift of a running maximum: itself, 0 where it is -inf (no key yet).
fn shift_of(cx: &mut Cx, max: Value) -> Value {
    let d = cx.dims(max);
    let ninf = cx.full(f64::NEG_INFINITY, cx.dtype(max), &d);
    let zero = cx.full(0.0, cx.dtype(max), &d);
    let none = cx.b.compare(CmpDir::Eq, max, ninf);
    cx.b.select(none, zero, max)
}

/// exp(old max - new shift): what the sums made under the old maximum are worth now (0 where
/// there were none).
fn fade(cx: &mut Cx, old_max: Value, shift: Value) -> Value {
    let d = cx.dims(old_max);
    let ninf = cx.full(f64::NEG_INFINITY, cx.dtype(old_max), &d);
    let none = cx.b.compare(CmpDir::Eq, old_max, ninf);
    let diff = cx.b.sub(old_max, shift);
    let diff = cx.b.select(none, ninf, diff);
    cx.b.exp(diff)
}

/// flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp,
/// fw_graph, joint_graph, block_mask, scale, kernel_options, score_mod_buffers,
/// mask_mod_buffers) -> (grad_query, grad_key, grad_value, *grad_score_mod_buffers). A buffer
/// the joint graph gives no gradient gets an empty tensor (the graph never reads it).
pub(super) fn backward(cx: &mut Cx, values: &[Out], node: &Node, draws: &mut Draws) -> Result<Out> {
    let [q, k, v, out, lse, grad_out, grad_lse, fw, GArg::Graph(joint), rest @ ..] = &node.args[..] else {
        bail!(Runtime, "torchtpu.compile: malformed flex_attention_backward node")
    };
    let mut t = Vec::new();
    for a in [q, k, v, out, lse, grad_out, grad_lse] {
        t.push(tensor(cx, values, a, draws)?);
    }
    let (Some(q), Some(k), Some(v), Some(out), Some(lse)) = (t[0], t[1], t[2], t[3], t[4]) else {
        bail!(Runtime, "torchtpu.compile: flex_attention_backward without its saved tensors")
    };
    let (qd, kd_t, vd_t) = (cx.dtype(q), cx.dtype(k), cx.dtype(v));
    if qd != kd_t || qd != vd_t {
        bail!(Value, "Backward pass with mixed query, key, and value dtype is not supported, got query.dtype={}, key.dtype={}, and value.dtype={}",
            qd.torch_name(), kd_t.torch_name(), vd_t.torch_name());
    }
    let f = setup(cx, values, draws, [q, k, v], fw, rest, KV_CHUNK)?;
    let acc = f.acc;
    let grad_out = match t[5] {
        Some(g) => g,
        None => cx.full(0.0, f.q_dt, &cx.dims(out)),
    };
    let buffers = f.score_buffers.clone();
    // The joint graph's outputs: the score's gradient, none for the four positions, then one
    // per score buffer (none where the buffer gets no gradient).
    let wants: Vec<bool> = (0..buffers.len()).map(|i| !matches!(joint.outputs.get(5 + i), None | Some(GArg::None))).collect();
    let buffer_acc: Vec<DType> = buffers.iter().map(|&b| cx.dtype(b).opmath()).collect();
    let padded = f.chunks * f.chunk;
    let kd = cx.dims(f.k);
    let vd = cx.dims(f.v);
    let mut grad_k = cx.full(0.0, acc, &[f.b, f.hk, padded, kd[3]]);
    let mut grad_v = cx.full(0.0, acc, &[f.b, f.hk, padded, vd[3]]);
    let mut grad_buffers: Vec<Option<Value>> =
        buffers.iter().zip(&wants).zip(&buffer_acc).map(|((&b, &w), &d)| w.then(|| cx.full(0.0, d, &cx.dims(b)))).collect();
    let mut grad_qs = Vec::new();
    for (r0, r1) in f.row_groups() {
        let mr = r1 - r0;
        let rows = [f.b, f.hk, f.g * mr];
        let q_rows = f.grouped_rows(cx, f.q, r0, r1, f.q_dt);
        let q_acc = cx.cast(q_rows, acc);
        let go = f.grouped_rows(cx, grad_out, r0, r1, f.q_dt);
        let go_acc = cx.cast(go, acc);
        let o_acc = f.grouped_rows(cx, out, r0, r1, acc);
        // delta = rowsum(out * grad_out), minus grad_logsumexp (natural log) per row.
        let prod = cx.b.mul(o_acc, go_acc);
        let mut delta = reduce(cx, prod, &[3], Red::Sum);
        let ln2 = cx.full(std::f64::consts::LN_2, acc, &rows);
        if let Some(g) = t[6] {
            let g = f.grouped_rows(cx, g, r0, r1, acc);
            let g = cx.b.div(g, ln2);
            delta = cx.b.sub(delta, g);
        }
        let lse = f.grouped_rows(cx, lse, r0, r1, acc);
        let lse = cx.b.mul(lse, ln2);
        let ninf = cx.full(f64::NEG_INFINITY, acc, &rows);
        let no_keys = cx.b.compare(CmpDir::Eq, lse, ninf);
        let mut state = vec![cx.full(0.0, acc, &[f.b, f.hk, f.g * mr, kd[3]]), grad_k, grad_v];
        state.extend(grad_buffers.iter().flatten());
        let state = f.each_chunk(cx, r0, r1, state, |cx, start, kc, s| {
            let (s_pre, masked, kept, at) = f.scores(cx, q_acc, r0, r1, start, kc)?;
            let block = [f.b, f.hk, f.g * mr, f.chunk];
            let masked = cx.b.reshape(masked, &block);
            let lse_b = f.along_keys(cx, lse, &block);
            let centered = cx.b.sub(masked, lse_b);
            let p = cx.b.exp(centered);
            let none_b = f.along_keys(cx, no_keys, &block);
            let zeros = cx.full(0.0, acc, &block);
            let p = cx.b.select(none_b, zeros, p);
            // dV = P^T dO, summed over the group's query heads.
            let pq = cx.cast(p, f.q_dt);
            let dv = contract(cx, pq, go, (&[0, 1], &[0, 1]), (&[2], &[2]));
            let v = f.chunk_of(cx, f.v, start, acc);
            let dp = contract(cx, go_acc, v, (&[0, 1], &[0, 1]), (&[3], &[3]));
            let dp = cx.cast(dp, acc);
            let delta_b = f.along_keys(cx, delta, &block);
            let centered = cx.b.sub(dp, delta_b);
            let ds = cx.b.mul(p, centered);
            let ds = f.ungrouped(cx, ds, mr);
            let grads = f.call(cx, &joint, Some(s_pre), &at, &[ds], &buffers)?;
            let Some(Some(gs)) = grads.first() else {
                bail!(NotImplemented, "torchtpu.compile: flex attention's score function gives the score no gradient")
            };
            let dims = cx.dims(kept);
            let gs = cx.cast(*gs, acc);
            let gs = cx.b.broadcast_to(gs, &dims);
            let scale = cx.full(f.scale, acc, &dims);
            let gs = cx.b.mul(gs, scale);
            let gs = cx.cast(gs, f.q_dt);
            let zero = cx.full(0.0, f.q_dt, &dims);
            let gs = cx.b.select(kept, gs, zero);
            let gs = cx.b.reshape(gs, &block);
            let k = f.chunk_of(cx, f.k, start, f.q_dt);
            let dq = contract(cx, gs, k, (&[0, 1], &[0, 1]), (&[3], &[2]));
            let dq = cx.cast(dq, acc);
            let dk = contract(cx, gs, q_rows, (&[0, 1], &[0, 1]), (&[2], &[2]));
            let dk = cx.cast(dk, acc);
            let dv = cx.cast(dv, acc);
            let mut next = vec![cx.b.add(s[0], dq), add_chunk(cx, s[1], dk, start), add_chunk(cx, s[2], dv, start)];
            let mut held = s[3..].iter();
            for (i, want) in wants.iter().enumerate() {
                if !want {
                    continue;
                }
                let total = *held.next().unwrap();
                let Some(Some(g)) = grads.get(5 + i) else {
                    bail!(Runtime, "torchtpu.compile: flex attention's joint graph lost buffer {}'s gradient", i)
                };
                let g = cx.cast(*g, buffer_acc[i]);
                let g = cx.b.broadcast_to(g, &cx.dims(total));
                next.push(cx.b.add(total, g));
            }
            Ok(next)
        })?;
        grad_qs.push(f.ungrouped(cx, state[0], mr));
        grad_k = state[1];
        grad_v = state[2];
        let mut held = state[3..].iter();
        for g in grad_buffers.iter_mut().flatten() {
            *g = *held.next().unwrap();
        }
    }
    let grad_q = if grad_qs.len() == 1 { grad_qs[0] } else { cx.b.concatenate(&grad_qs, 2) };
    let grad_q = cx.cast(grad_q, f.q_dt);
    let keys = |cx: &mut Cx, x: Value, dt: DType| {
        let d = cx.dims(x);
        let x = cx.b.slice(x, &[0, 0, 0, 0], &[d[0], d[1], f.n, d[3]], &[1, 1, 1, 1]);
        let x = if f.kv_broadcast {
            let summed = reduce(cx, x, &[0], Red::Sum);
            cx.b.reshape(summed, &[1, d[1], f.n, d[3]])
        } else {
            x
        };
        cx.cast(x, dt)
    };
    let grad_k = keys(cx, grad_k, cx.dtype(f.k));
    let grad_v = keys(cx, grad_v, cx.dtype(f.v));
    let mut results = vec![grad_q, grad_k, grad_v];
    for (g, &b) in grad_buffers.into_iter().zip(&buffers) {
        results.push(match g {
            Some(g) => cx.cast(g, cx.dtype(b)),
            None => cx.full(0.0, DType::F32, &[0]),
        });
    }
    Ok(Out::List(results))
}

/// `total` with `part` added at keys [start, start + chunk) (dim 2).
fn add_chunk(cx: &mut Cx, total: Value, part: Value, start: Value) -> Value {
    let d = cx.dims(part);
    let zero = cx.b.constant_i64(0, ElemType::I64);
    let at = [zero, zero, start, zero];
    let old = cx.b.dynamic_slice(total, &at, &d);
    let new = cx.b.add(old, part);
    cx.b.dynamic_update_slice(total, new, &at)
}
