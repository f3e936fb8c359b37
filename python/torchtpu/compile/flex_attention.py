"""Flex attention in compiled graphs, blockwise: scores of a block of keys at a time, with
block sparsity for masks that read positions only."""
import logging

import torch

log = logging.getLogger("torchtpu.compile")


# Keys per block of blockwise flex attention: a longer key sequence is attended block by block
# (scores of [batch, heads, queries, FLEX_KV_BLOCK] at a time), a shorter one in one block.
FLEX_KV_BLOCK = 512
# Block sparsity of a mask_mod that reads positions only (causal, sliding window, prefix): the
# mask is evaluated when the graph compiles, on blocks of FLEX_SPARSE_BLOCK queries and keys, and
# the queries are attended in up to FLEX_ROW_GROUPS groups of rows, each over only the span of
# keys its blocks reach. Masks of more than FLEX_MASK_EVAL_LIMIT positions are not evaluated.
FLEX_SPARSE_BLOCK = 128
FLEX_ROW_GROUPS = 8
FLEX_MASK_EVAL_LIMIT = 1 << 28


def _flex_row_groups(mask_mod, kept, mask_mod_buffers, sizes):
    """[(first row, end row, first key, end key)] covering every query row: the keys each group
    of rows needs (an empty span where none of its keys is kept), or None where the mask is not
    known when the graph compiles (it reads tensors) or skipping would save under a tenth."""
    import torch.fx
    from torch.utils._python_dispatch import _disable_current_modes

    if mask_mod_buffers or not all(isinstance(n, int) for n in sizes) or not isinstance(mask_mod, torch.fx.GraphModule):
        return None
    batch, heads, rows, keys = sizes
    blk = FLEX_SPARSE_BLOCK
    if rows < 2 * blk:
        return None
    # Positions the mask does not read are evaluated once (b and h unused: one batch, one head).
    used = [bool(n.users) for n in mask_mod.graph.nodes if n.op == "placeholder"][:2]
    b_n, h_n = (n if u else 1 for n, u in zip((batch, heads), used))
    if b_n * h_n * rows * keys > FLEX_MASK_EVAL_LIMIT:
        return None
    spans = []
    with _disable_current_modes():  # real tensors on the host, outside the trace
        b, h, n = torch.arange(b_n), torch.arange(h_n), torch.arange(keys)
        for r0 in range(0, rows, blk):
            hit = kept(b, h, torch.arange(r0, min(r0 + blk, rows)), n).reshape(-1, keys).any(0).nonzero()
            spans.append((int(hit[0]) // blk * blk, min((int(hit[-1]) // blk + 1) * blk, keys)) if len(hit) else (0, 0))
    # Neighbouring blocks with the same span form one group; then, while there are too many
    # groups, the two neighbours whose union adds the least computed area merge.
    groups = []
    for i, span in enumerate(spans):
        r0, r1 = i * blk, min((i + 1) * blk, rows)
        if groups and groups[-1][2:] == span:
            groups[-1][1] = r1
        else:
            groups.append([r0, r1, *span])

    def area(g):
        return (g[1] - g[0]) * (g[3] - g[2])

    def union(a, c):
        lo = [x for x in (a[2:], c[2:]) if x[1] > x[0]]
        return [a[0], c[1], min(x[0] for x in lo), max(x[1] for x in lo)] if lo else [a[0], c[1], 0, 0]

    while len(groups) > FLEX_ROW_GROUPS:
        i = min(range(len(groups) - 1), key=lambda i: area(union(groups[i], groups[i + 1])) - area(groups[i]) - area(groups[i + 1]))
        groups[i:i + 2] = [union(groups[i], groups[i + 1])]
    if sum(map(area, groups)) > 0.9 * rows * keys:
        return None
    return [tuple(g) for g in groups]


def _flex_listed_blocks(block_mask, rows, keys, device):
    """The BlockMask's block lists as a dense [B, H, query blocks, key blocks] bool tensor (a
    block listed as partial or full), with its (query, key) block sizes; None where the tuple
    is not one this function knows (its layout: seq lengths, kv_num_blocks, kv_indices,
    full_kv_num_blocks, full_kv_indices, ..., Q_BLOCK_SIZE, KV_BLOCK_SIZE, mask_mod)."""
    if len(block_mask) < 9:
        return None
    q_blk, kv_blk = block_mask[-3], block_mask[-2]
    num, idx, full_num, full_idx = block_mask[2:6]
    if not (isinstance(q_blk, int) and isinstance(kv_blk, int) and isinstance(num, torch.Tensor)
            and isinstance(idx, torch.Tensor) and idx.dim() == 4 and num.shape == idx.shape[:3]):
        return None
    n_q, n_k = -(-rows // q_blk), -(-keys // kv_blk)
    if idx.size(2) != n_q:
        return None

    def dense(num, idx):
        # Slots past a row's count write to a spare column, dropped after.
        used = torch.arange(idx.size(-1), device=device) < num[..., None]
        at = torch.where(used, idx.long().clamp(0, n_k), n_k)
        hit = torch.zeros((*idx.shape[:3], n_k + 1), dtype=torch.bool, device=device)
        return hit.scatter(-1, at, True)[..., :n_k]

    listed = dense(num, idx)
    if isinstance(full_num, torch.Tensor) and isinstance(full_idx, torch.Tensor):
        listed = listed | dense(full_num, full_idx)
    return listed, q_blk, kv_blk


def _flex_tiles(rows, keys, q_blk, kv_blk):
    """Tiles (first row, end row, first key, end key) of the runtime block skipping: at most
    FLEX_ROW_GROUPS groups of rows by FLEX_ROW_GROUPS spans of keys, on the BlockMask's blocks."""
    n_q, n_k = -(-rows // q_blk), -(-keys // kv_blk)
    gq, gk = -(-n_q // FLEX_ROW_GROUPS) * q_blk, -(-n_k // FLEX_ROW_GROUPS) * kv_blk
    return [(r0, min(r0 + gq, rows), k0, min(k0 + gk, keys)) for r0 in range(0, rows, gq) for k0 in range(0, keys, gk)]


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous: a cond's backward needs the gradients
    of both branches laid out alike, and the skipping branch's are zeros."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def flex_attention_in_blocks(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_buffers=(),
                              mask_mod_buffers=(), outputs=3):
    """flex_attention's higher-order op as aten ops AOTAutograd traces (forward and backward
    become part of the graph's one program), with its semantics (PyTorch's math form): scores
    in float32 (float64 for float64 inputs), score_mod and mask_mod applied elementwise with
    vmap, rows with no key left give zeros. Over the keys in blocks of FLEX_KV_BLOCK, each
    block's softmax numerators summed into a running one, so the forward holds one block's
    scores at a time; each block is checkpointed (backward recomputes its scores rather than
    keeping them all). Key blocks a mask excludes entirely are skipped: for a mask that reads
    positions only, found when the graph compiles (`_flex_row_groups`); for one that reads
    tensors (document ids), at run time from the BlockMask's block lists, each tile of rows
    and keys under a `cond` (as compiled flex attention does, an unlisted block counts as
    masked). Returns (out, logsumexp, max score)[:outputs], the last two in base 2 as the op's
    are."""
    import math

    import torch.utils.checkpoint as checkpoint
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv

    groups = query.size(1) // key.size(1)
    key, value = (torch.repeat_interleave(t, groups, dim=1) for t in (key, value))
    batch = query.size(0)
    if key.size(0) != batch and not (key.size(0) == 1 and batch > 1):
        raise RuntimeError(f"Bq and Bkv must broadcast. Got Bq={batch} and Bkv={key.size(0)}")
    key, value = (t.expand(batch, *t.shape[1:]) for t in (key, value))
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    scored = _vmap_for_bhqkv(score_mod, prefix=(0,), suffix=(None,) * len(score_mod_buffers))
    kept = _vmap_for_bhqkv(block_mask[-1], prefix=(), suffix=(None,) * len(mask_mod_buffers))
    dev = query.device
    n_score = len(score_mod_buffers)
    buffers = (*score_mod_buffers, *mask_mod_buffers)

    def attend(q, k, v, rows, start, stop, *buffers):
        """One block of keys: its row maxima, the shift used (0 for rows with no key here),
        and the sums and value products of exp(score - shift)."""
        b, h = (torch.arange(n, device=dev) for n in q.shape[:2])
        m = torch.arange(*rows, device=dev)
        n = torch.arange(start, stop, device=dev)
        scores = ((q @ k.to(work).transpose(-2, -1)) * scale).to(work)
        with TransformGetItemToIndex():
            scores = torch.where(kept(b, h, m, n, *buffers[n_score:]), scored(scores, b, h, m, n, *buffers[:n_score]),
                                 torch.full((), -math.inf, dtype=work, device=dev))
        top = scores.amax(-1)
        shift = torch.where(top == -math.inf, 0.0, top)
        p = torch.exp(scores - shift[..., None])
        return top, shift, p.sum(-1), (p.to(query.dtype) @ v.to(query.dtype)).to(work)

    def fade(row_max, shift):
        return torch.exp(torch.where(row_max == -math.inf, -math.inf, row_max - shift))

    def merge(state, part):
        """Two running softmax states (max, shift, sum, value products) as one."""
        if state is None:
            return part
        (run_max, run_shift, run_sum, acc), (top, shift, sums, outs) = state, part
        new_max = torch.maximum(run_max, top)
        new_shift = torch.where(new_max == -math.inf, 0.0, new_max)
        old, new = fade(run_max, new_shift), fade(top, new_shift)
        return new_max, new_shift, run_sum * old + sums * new, acc * old[..., None] + outs * new[..., None]

    def after(q, state):
        # A block's queries depend on the last block's result (a zero added): the compiler
        # then runs one block after another rather than every block's scores at once.
        return q if state is None else q + (state[1] * 0.0)[..., None]

    def checkpointed(f, *args):
        return checkpoint.checkpoint(f, *args, use_reentrant=False)

    def span(q, k, v, r0, r1, k0, *buffers, save=checkpointed):
        """The running softmax state of rows r0:r1 (q) over the keys k (starting at key k0)."""
        state = None
        for start in range(0, k.size(2), FLEX_KV_BLOCK):
            stop = min(start + FLEX_KV_BLOCK, k.size(2))
            part = save(attend, after(q, state), k[:, :, start:stop], v[:, :, start:stop], (r0, r1),
                        k0 + start, k0 + stop, *buffers)
            state = merge(state, part)
        return state

    def none_seen(q, r0, r1):
        shape = (*q.shape[:2], r1 - r0)
        ninf = torch.full(shape, -math.inf, dtype=work, device=dev)
        return ninf, torch.zeros(shape, dtype=work, device=dev), torch.zeros(shape, dtype=work, device=dev), \
            torch.zeros((*shape, value.size(-1)), dtype=work, device=dev)

    def finish(state):
        run_max, run_shift, run_sum, acc = state
        empty = run_sum == 0
        out = torch.where(empty[..., None], 0.0, acc / torch.where(empty, 1.0, run_sum)[..., None])
        lse = torch.where(empty, -math.inf, torch.log(torch.where(empty, 1.0, run_sum)) + run_shift)
        return out.to(query.dtype), lse, run_max

    def attend_rows(q, r0, r1, k0, k1):
        """Rows r0:r1 over keys k0:k1 (every other key of theirs masked)."""
        q = q[:, :, r0:r1]
        if k1 <= k0:
            return finish(none_seen(q, r0, r1))
        return finish(span(q, key[:, :, k0:k1], value[:, :, k0:k1], r0, r1, k0, *buffers))

    def attend_tiles(q, listed, q_blk, kv_blk, tiles):
        """Each tile's rows over its keys where the block lists list any of its blocks, else
        nothing (a cond: only the taken branch runs; its backward recomputes the forward)."""
        cond = torch.ops.higher_order.cond
        parts, state, row = [], None, None
        for r0, r1, k0, k1 in tiles:
            if row is not None and row != (r0, r1):
                parts.append(finish(state))
                state = None
            row = (r0, r1)
            seen = listed[:, :, r0 // q_blk:-(-r1 // q_blk), k0 // kv_blk:-(-k1 // kv_blk)].any()
            qr = after(q[:, :, r0:r1], state)

            def on(*operands, r0=r0, r1=r1, k0=k0):
                qr, k, v, *buffers = map(_ContiguousGrad.apply, operands)
                return span(qr, k, v, r0, r1, k0, *buffers, save=lambda f, *a: f(*a))

            def off(qr, k, v, *buffers, r0=r0, r1=r1):
                return none_seen(qr, r0, r1)

            part = cond(seen, on, off, (qr, key[:, :, k0:k1], value[:, :, k0:k1], *buffers))
            state = merge(state, tuple(part))
        parts.append(finish(state))
        return parts

    q = query.to(work)
    sizes = (batch, query.size(1), query.size(2), key.size(2))
    spans = _flex_row_groups(block_mask[-1], kept, mask_mod_buffers, sizes)
    runtime = spans is None and mask_mod_buffers and all(isinstance(n, int) for n in sizes)
    listed = _flex_listed_blocks(block_mask, *sizes[2:], dev) if runtime else None
    tiles = None if listed is None else _flex_tiles(*sizes[2:], *listed[1:])
    if tiles is not None and len(tiles) > 1:
        parts = attend_tiles(q, *listed, tiles)
    else:
        parts = [attend_rows(q, *span) for span in spans or [(0, sizes[2], 0, sizes[3])]]
    out, lse, run_max = (torch.cat(p, dim=2) if len(parts) > 1 else p[0] for p in zip(*parts))
    return (out, lse / math.log(2), run_max / math.log(2))[:outputs]
