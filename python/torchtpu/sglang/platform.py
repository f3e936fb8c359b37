"""The SGLang platform "tpu": device naming, memory, the distributed backend, and server
defaults (batched attention over the KV pool on tpu, PyTorch sampling, no CUDA graphs, no
Triton)."""
import os

import torch
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

ATTENTION = "torchtpu_paged"


def _register_attention():
    """`--attention-backend torchtpu_paged` (the default on tpu; SGLang's torch_native stays
    selectable). Not at import: SGLang imports this module while its own modules load."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES

    from .attention import TpuPagedAttnBackend

    if ATTENTION not in ATTENTION_BACKENDS:
        register_attention_backend(ATTENTION)(TpuPagedAttnBackend)
    if ATTENTION not in ATTENTION_BACKEND_CHOICES:
        ATTENTION_BACKEND_CHOICES.append(ATTENTION)


def _positions_on_host(extend_prefix_lens, extend_seq_lens):
    """Each scheduled token's position (its request's prefix length plus its index in the
    request's new tokens) and each request's first token's index, as SGLang's
    compute_position_torch returns them."""
    import numpy as np

    prefix, lengths = extend_prefix_lens.cpu().numpy().astype(np.int64), extend_seq_lens.cpu().numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    positions = (np.repeat(prefix - starts, lengths) + np.arange(int(lengths.sum()))).astype(np.int64)
    device = extend_seq_lens.device
    return (torch.from_numpy(positions).to(device),
            torch.from_numpy(starts).to(device=device, dtype=extend_seq_lens.dtype))


class TpuSRTPlatform(SRTPlatform):
    _enum = PlatformEnum.OOT
    device_name = "tpu"
    device_type = "tpu"
    # No Triton target, no graph capture (a program per shape is the graph already), no NCCL.
    capabilities = PlatformCapabilities()

    def get_default_attention_backend(self):
        _register_attention()
        return ATTENTION

    def init_backend(self):
        _register_attention()  # in each worker process, before its model runner picks a backend
        # SGLang fills its step buffers with one _foreach_copy_ from views that move through
        # its token pool every step: one program per view offset, compiled at every decoding
        # step. Pair by pair, each copy_ takes a program that reads its views' offsets at
        # run time (eager mode's bucketed programs), so the steps settle.
        from sglang.srt.model_executor import cuda_graph_buffer_registry

        cuda_graph_buffer_registry._has_foreach_copy = False
        # SGLang's PyTorch form of its positions kernel (used where Triton is not) reads each
        # request's lengths from the device and makes an arange per request: a program per new
        # (prefix, length) pair. Computed on the host and uploaded once instead.
        from sglang.srt.model_executor import forward_batch_info

        forward_batch_info.compute_position_torch = _positions_on_host
        # A prefill's logits come from each request's last hidden state, gathered at indices
        # whose count changes with the batch: the gather runs bucketed programs from its first
        # call, so its result (which the lm_head's matmul reads) is laid out the same way at
        # every request count.
        from sglang.srt.layers.logits_processor import LogitsProcessor

        LogitsProcessor._get_pruned_states = torch.tpu.bucketed_programs()(LogitsProcessor._get_pruned_states)

    def apply_server_args_defaults(self, server_args):
        # The defaults SGLang gives its own CPU device, which needs no CUDA kernels either.
        _register_attention()
        server_args.sampling_backend = "pytorch"
        if torch.tpu._memory_is_host() and server_args.max_total_tokens is None:
            # The CPU plugin's memory is the host's, shared with everything else: the KV pool
            # gets a fixed size (SGLang's --max-total-tokens), not a fraction of the host.
            server_args.max_total_tokens = int(os.environ.get("TORCHTPU_SGLANG_KV_TOKENS", 16384))

    def get_device(self, device_id=0):
        return torch.device("tpu", device_id)

    def set_device(self, device):
        torch.tpu.set_device(device)

    def get_device_name(self, device_id=0):
        return torch.tpu.get_device_name(device_id)

    def get_device_total_memory(self, device_id=0):
        return torch.tpu.get_device_properties(device_id).total_memory

    def get_current_memory_usage(self, device=None):
        return float(torch.tpu.memory_allocated(device))

    def get_available_memory(self, device_id=0):
        free, total = torch.tpu.mem_get_info(device_id)
        return int(free), int(total)

    def synchronize(self):
        torch.tpu.synchronize()

    def empty_cache(self):
        torch.tpu.empty_cache()

    def get_torch_distributed_backend_str(self):
        return "tccl"  # torchtpu's c10d backend (torch.distributed on tpu)

    def get_compile_backend(self, mode=None):
        return "tpu"

    def get_graph_runner_cls(self):
        return None
