"""Batched attention over SGLang's KV pool on tpu ("torchtpu_paged", the platform's default).

SGLang's torch-native backend runs one SDPA per request (a Python loop, and a device-to-host
read of each request's lengths). This one runs each layer's attention for the whole batch as a
few tensor programs, as the vLLM backend does: a step's queries are laid out per request,
[requests, longest query]; each request's keys and values are gathered from the pool through
its row of req_to_token; one masked SDPA covers prefills, chunked prefills and decodes. Query
slot i of request r sits at position prefix(r) + i and sees the keys at positions <= its own
that the request has (for sliding-window layers, only the last window of them).

Requests, longest query and keys read are padded to powers of two, so the attention programs
come in a bounded set of sizes. The per-step metadata is built once per forward on the host
(SGLang keeps the lengths there too) and uploaded in one copy. Batches this backend does not
cover (encoder-decoder models, a sliding-window KV pool) run SGLang's per-request code."""
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend


def bucket(n, cap):
    """The size a dimension of n is padded to: the next power of two (at least 8), at most cap."""
    return min(max(8, 1 << (max(n, 1) - 1).bit_length()), max(cap, n))


@dataclass
class StepMetadata:
    query_slots: torch.Tensor  # [tokens]: where each query sits in [requests * longest query + 1]
    kv_tokens: torch.Tensor  # [requests, kv length]: the pool rows each request reads
    query_positions: torch.Tensor  # [requests, longest query]
    in_request: torch.Tensor  # [requests, 1, kv length]: the keys each request has
    mask: torch.Tensor  # [requests, longest query, kv length]: causal and within the request
    num_reqs: int  # padded
    max_query_len: int  # padded


def _pad_tokens(forward_batch, tokens):
    """Pads a prefill step's tokens to their bucket, as vLLM's CUDA graph sizes pad a step, so
    that the model's programs come in a bounded set of sizes: the padding tokens (token 0 at
    position 0) run through the model after the real ones, write their keys and values into
    the KV pool's padding slot 0 (which SGLang hands to no request), and attend to nothing;
    SGLang takes each request's last real token's logits by its lengths. Called before the
    model runs (SGLang plans the attention first), it replaces the batch's token tensors, and
    counts the padding as the batch's own tokens: SGLang would otherwise give the attention
    backend the real rows only (its way with padded batches), at a new size each step.
    Returns the step's token count as the model will see it."""
    padded = bucket(tokens, 1 << 30)
    names = ("input_ids", "positions", "out_cache_loc")
    held = [getattr(forward_batch, name, None) for name in names]
    if padded == tokens or any(t is None or t.dim() != 1 or t.shape[0] != tokens for t in held):
        return tokens
    for name, t in zip(names, held):
        setattr(forward_batch, name, torch.cat([t, t.new_zeros(padded - tokens)]))
    if getattr(forward_batch, "global_num_token_non_padded_cpu", None) is not None:
        forward_batch.global_num_token_non_padded_cpu = padded
    return padded


class TpuPagedAttnBackend(TorchNativeAttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.step = None

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self.step = None
        mode = forward_batch.forward_mode
        if (self.use_sliding_window_kv_pool or forward_batch.encoder_lens is not None or mode.is_idle()
                or not (mode.is_decode() or mode.is_extend())):
            return  # SGLang's per-request code (see the module docstring)
        reqs = forward_batch.batch_size
        seq_lens = forward_batch.seq_lens_cpu
        seq_lens = (seq_lens if seq_lens is not None else forward_batch.seq_lens.cpu())[:reqs].numpy().astype(np.int64)
        if mode.is_decode():
            query_lens = np.ones(reqs, dtype=np.int64)
        elif forward_batch.extend_seq_lens_cpu is not None:
            query_lens = np.asarray(forward_batch.extend_seq_lens_cpu, dtype=np.int64)
        else:
            return  # (speculative verification steps, which this platform does not run)
        pool_indices = forward_batch.req_pool_indices_cpu
        pool_indices = (pool_indices if pool_indices is not None else forward_batch.req_pool_indices.cpu())
        req_to_token = self.req_to_token_pool.req_to_token
        tokens = int(query_lens.sum())
        padded_tokens = tokens
        if mode.is_extend() and getattr(forward_batch, "input_embeds", None) is None:
            padded_tokens = _pad_tokens(forward_batch, tokens)
        padded_reqs = bucket(reqs, req_to_token.shape[0])
        longest = bucket(int(query_lens.max(initial=1)), 1 << 30)
        kv_len = bucket(int(seq_lens.max(initial=1)), req_to_token.shape[1])
        starts = np.concatenate([[0], np.cumsum(query_lens)])
        req = np.repeat(np.arange(reqs), query_lens)
        slots = np.full(padded_tokens, padded_reqs * longest, dtype=np.int64)  # the zero row
        slots[:tokens] = req * longest + (np.arange(tokens) - starts[req])
        positions = np.zeros((padded_reqs, longest), dtype=np.int64)
        positions[:reqs] = (seq_lens - query_lens)[:, None] + np.arange(longest)
        lengths = np.zeros(padded_reqs, dtype=np.int64)
        lengths[:reqs] = seq_lens
        rows = np.zeros(padded_reqs, dtype=np.int64)  # padding requests read row 0 (masked out)
        rows[:reqs] = pool_indices[:reqs].numpy()
        host = torch.from_numpy(np.concatenate([slots, positions.reshape(-1), lengths, rows]))
        packed = host.to(req_to_token.device, non_blocking=True)
        query_slots, rest = packed[:padded_tokens], packed[padded_tokens:]
        positions = rest[: padded_reqs * longest].view(padded_reqs, longest)
        lengths = rest[padded_reqs * longest : padded_reqs * longest + padded_reqs]
        rows = rest[padded_reqs * longest + padded_reqs :]
        offsets = torch.arange(kv_len, device=packed.device)
        in_request = offsets < lengths[:, None, None]
        mask = (offsets <= positions[:, :, None]) & in_request
        self.step = StepMetadata(
            query_slots=query_slots,
            kv_tokens=req_to_token[rows, :kv_len].long(),
            query_positions=positions,
            in_request=in_request,
            mask=mask,
            num_reqs=padded_reqs,
            max_query_len=longest,
        )

    def _attend(self, query, output, k_cache, v_cache, scaling, enable_gqa, causal, sliding_window_size):
        """One layer's attention for the step: query [tokens, heads, d], output [tokens, heads, dv]."""
        m = self.step
        heads, d = query.shape[1], query.shape[2]
        k = k_cache[m.kv_tokens].transpose(1, 2)  # [requests, kv heads, kv length, d]
        v = v_cache[m.kv_tokens].transpose(1, 2)
        padded = query.new_zeros(m.num_reqs * m.max_query_len + 1, heads, d).index_copy_(0, m.query_slots, query)
        q = padded[:-1].view(m.num_reqs, m.max_query_len, heads, d).transpose(1, 2)
        mask = m.mask if causal else m.in_request.expand_as(m.mask)
        if sliding_window_size is not None:
            offsets = torch.arange(mask.shape[-1], device=mask.device)
            mask = mask & (offsets >= m.query_positions[:, :, None] - sliding_window_size)
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None], scale=scaling,
                                             enable_gqa=enable_gqa)
        out = out.transpose(1, 2).reshape(m.num_reqs * m.max_query_len, -1)
        out = torch.cat([out, out.new_zeros(1, out.shape[1])])[m.query_slots]
        output.copy_(out.view(output.shape))
        return output

    def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                                 enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
        if self.step is None or is_cross_attn:
            return super()._run_sdpa_forward_extend(
                query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens,
                extend_seq_lens, encoder_lens, scaling, enable_gqa, causal, is_cross_attn, sliding_window_size)
        return self._attend(query, output, k_cache, v_cache, scaling, enable_gqa, causal, sliding_window_size)

    def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False,
                                 sliding_window_size=None):
        if self.step is None or is_cross_attn:
            return super()._run_sdpa_forward_decode(
                query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, encoder_lens, scaling,
                enable_gqa, causal, is_cross_attn, sliding_window_size)
        # (SGLang passes causal=False for decode: the one query is the request's last position,
        # which sees every key the request has; the causal mask says the same.)
        return self._attend(query, output, k_cache, v_cache, scaling, enable_gqa, True, sliding_window_size)
