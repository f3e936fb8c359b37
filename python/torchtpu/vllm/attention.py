"""Paged attention on tpu for vLLM: the KV cache is vLLM's paged cache, allocated on tpu; new
keys and values are written into it in place (one index_copy_ per layer and step, which the
engine runs as an update of the donated cache buffer), and attention reads each request's
blocks through its block table, as tensor programs (no Python loop over requests or blocks).

A step's queries are laid out per request, [requests, longest query], so one masked SDPA
covers prefills, chunked prefills and decodes together: query slot i of request r sits at
position context(r) + i and sees the keys at positions <= its own that the request has (and,
for sliding-window layers, only the last `window` of them)."""
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.kv_cache_layout import KVCacheLayout

NAME = "TORCHTPU_PAGED"


class TpuAttentionBackend(AttentionBackend):
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto", "float16", "bfloat16", "float32"]
    forward_includes_kv_cache_update = True

    @staticmethod
    def get_name():
        return NAME

    @staticmethod
    def get_impl_cls():
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TpuAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls):
        # Per block, token-major: the cache reads as rows [block * block_size + offset] of
        # [kv_heads, key | value], so a token's slot is a row.
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def supports_sliding_window(cls):
        return True

    @classmethod
    def supports_attn_type(cls, attn_type):
        return attn_type == AttentionType.DECODER


def bucket(n, cap):
    """The size a dimension of n is padded to: the next power of two (at least 8), at most cap."""
    return min(max(8, 1 << (max(n, 1) - 1).bit_length()), max(cap, n))


def _extend(t, n):
    """The first n elements of a view into a longer buffer (vLLM's persistent input buffers),
    at most as many as the buffer holds past the view's start."""
    if t.shape[0] >= n:
        return t[:n]
    row = max(t.stride(0), 1)
    held = (t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()) // row
    return t.as_strided((min(n, held), *t.shape[1:]), t.stride(), t.storage_offset())


def padded_view(t, cap):
    """A 1-d view of a vLLM buffer grown to its length's bucket (the rest is padding)."""
    return _extend(t, bucket(t.shape[0], cap))


def _whole_storage_rows(rows):
    """`rows` (a layer's cache rows) extended to every row of its storage, and the index of its
    first row there. vLLM may allocate all layers' caches in one storage; an in-place write into
    a part of a storage reads and writes back the whole part (a layer's cache, per step), while
    a write through a view of the whole storage updates the donated buffer where it is written."""
    row = rows.stride(0)
    held = rows.untyped_storage().nbytes() // rows.element_size()
    if not rows.is_contiguous() or rows.storage_offset() % row or held % row:
        return rows, 0
    return rows.as_strided((held // row, *rows.shape[1:]), rows.stride(), 0), rows.storage_offset() // row


@dataclass
class TpuAttentionMetadata:
    tokens: int  # the step's token count padded to its bucket: the length of query, key and value
    slot_mapping: torch.Tensor  # [tokens]: the cache row each new key and value goes to
    query_slots: torch.Tensor  # [tokens]: where each query sits in [requests * longest query + 1]
    kv_rows: torch.Tensor  # [requests, kv length]: the cache rows each request reads
    query_positions: torch.Tensor  # [requests, longest query]
    mask: torch.Tensor  # [requests, longest query, kv length]: causal and within the request
    num_reqs: int  # padded
    max_query_len: int  # padded


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    """Every dimension of a step's attention (tokens, requests, longest query, blocks read) is
    padded to a power of two, so that a running server meets a bounded set of shapes: its
    programs are all compiled after the first few steps of each size class. Padding tokens
    write into the null block (block 0, which vLLM never hands to a request) and read a zero
    query row; padding requests have no keys."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        sched = vllm_config.scheduler_config
        self.max_tokens = sched.max_num_batched_tokens
        self.max_reqs = sched.max_num_seqs
        self.max_blocks = -(-vllm_config.model_config.max_model_len // self.block_size)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        reqs, tokens = m.num_reqs, m.num_actual_tokens
        padded_tokens = bucket(tokens, self.max_tokens)
        padded_reqs = bucket(reqs, self.max_reqs)
        longest = bucket(m.max_query_len, self.max_tokens)
        # (Warm-up steps may claim longer sequences than a request can have: at most the table.)
        blocks = min(bucket(-(-m.max_seq_len // self.block_size), self.max_blocks), m.block_table_tensor.shape[1])
        kv_len = blocks * self.block_size
        # Per token and per request, on the host (vLLM keeps these there too): one upload.
        starts = m.query_start_loc_cpu[: reqs + 1].numpy().astype(np.int64)
        seq_lens = (m.seq_lens_cpu_upper_bound if m.seq_lens_cpu_upper_bound is not None else m.seq_lens.cpu())
        seq_lens = seq_lens[:reqs].numpy().astype(np.int64)
        query_lens = starts[1:] - starts[:-1]
        req = np.repeat(np.arange(reqs), query_lens)
        slots = np.full(padded_tokens, padded_reqs * longest, dtype=np.int64)  # the zero row
        slots[:tokens] = req * longest + (np.arange(tokens) - starts[req])
        positions = np.zeros((padded_reqs, longest), dtype=np.int64)
        positions[:reqs] = (seq_lens - query_lens)[:, None] + np.arange(longest)
        lengths = np.zeros(padded_reqs, dtype=np.int64)
        lengths[:reqs] = seq_lens
        host = torch.from_numpy(np.concatenate([slots, positions.reshape(-1), lengths]))
        packed = host.to(m.query_start_loc.device, non_blocking=True)
        query_slots = packed[:padded_tokens]
        positions = packed[padded_tokens : padded_tokens + padded_reqs * longest].view(padded_reqs, longest)
        lengths = packed[padded_tokens + padded_reqs * longest :]
        offsets = torch.arange(kv_len, device=packed.device)
        table = _extend(m.block_table_tensor, padded_reqs)[:, :blocks].long()
        kv_rows = table.repeat_interleave(self.block_size, dim=1) * self.block_size + offsets % self.block_size
        mask = (offsets <= positions[:, :, None]) & (offsets < lengths[:, None, None])
        # Past the step's tokens the slot mapping holds -1 (vLLM's padding): the null block's row.
        slot_mapping = _extend(m.slot_mapping, padded_tokens).long().clamp(min=0)
        return TpuAttentionMetadata(
            tokens=padded_tokens,
            slot_mapping=slot_mapping,
            query_slots=query_slots,
            kv_rows=kv_rows,
            query_positions=positions,
            mask=mask,
            num_reqs=padded_reqs,
            max_query_len=longest,
        )


class TpuAttentionImpl(AttentionImpl[TpuAttentionMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None, **kwargs):
        if alibi_slopes is not None or sinks is not None:
            raise NotImplementedError("vLLM on tpu: ALiBi and attention sinks are not supported yet")
        self.logits_soft_cap = logits_soft_cap or None
        if kv_sharing_target_layer_name is not None:
            raise NotImplementedError("vLLM on tpu: KV cache sharing between layers is not supported yet")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("vLLM on tpu: fused output quantization is not supported")
        m = attn_metadata
        if m is None:  # a profiling run without a cache
            return output
        heads, kv_heads, d = self.num_heads, self.num_kv_heads, self.head_size
        tokens = query.shape[0]
        if tokens != m.tokens:
            raise RuntimeError(f"vLLM on tpu: {tokens} tokens in a step whose attention metadata is padded to "
                               f"{m.tokens}")
        # [blocks, kv_heads, block_size, key | value] stored token-major: rows of [kv_heads, key | value].
        cache = kv_cache.permute(0, 2, 1, 3)
        rows = cache.reshape(-1, *cache.shape[2:])
        if key is not None:
            new = torch.cat([key.view(tokens, kv_heads, -1), value.view(tokens, kv_heads, -1)], dim=-1)
            whole, first_row = _whole_storage_rows(rows)
            whole.index_copy_(0, m.slot_mapping + first_row if first_row else m.slot_mapping, new.to(rows.dtype))
        kv = rows[m.kv_rows]  # [requests, kv length, kv_heads, key | value]
        k, v = kv[..., :d], kv[..., d:]
        q = query.view(tokens, heads, d)
        # One more row than the padded queries: padding tokens read it (zeros).
        padded = q.new_zeros(m.num_reqs * m.max_query_len + 1, heads, d).index_copy_(0, m.query_slots, q)
        padded = padded[:-1].view(m.num_reqs, m.max_query_len, heads, d)
        mask = m.mask
        if self.sliding_window is not None:
            offsets = torch.arange(mask.shape[-1], device=mask.device)
            mask = mask & (m.query_positions[:, :, None] - offsets < self.sliding_window)
        q, k, v = padded.transpose(1, 2), k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype)
        if self.logits_soft_cap is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.scale,
                                                 enable_gqa=heads != kv_heads)
        else:
            # Gemma 2's soft-capped scores: cap * tanh(scores / cap) before the mask and softmax.
            k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
            scores = (q @ k.transpose(-1, -2)) * self.scale
            scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
            out = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1) @ v
        out = out.transpose(1, 2).reshape(m.num_reqs * m.max_query_len, -1)
        out = torch.cat([out, out.new_zeros(1, out.shape[1])])[m.query_slots]
        output.copy_(out.view(output.shape))
        return output


# vLLM's attention layers look their backend up by name in its registry.
if NAME not in AttentionBackendEnum.__members__:
    register_backend(NAME, f"{TpuAttentionBackend.__module__}.{TpuAttentionBackend.__qualname__}")
