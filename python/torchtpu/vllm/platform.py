"""The vLLM platform "tpu": device naming and memory, the worker, the attention backend and
the distributed backend (the tccl c10d backend) vLLM should use on torchtpu's device."""
import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger("vllm." + __name__)  # under "vllm": vLLM configures that logger tree


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "tpu"
    device_type = "tpu"
    dispatch_key = "PrivateUse1"
    dist_backend = "tccl"
    # Standalone functions vLLM compiles (sampling helpers) compile with torchtpu's backend.
    simple_compile_backend = "tpu"

    @property
    def supported_dtypes(self):
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_mla:
            raise NotImplementedError("vLLM on tpu: MLA attention (DeepSeek) is not supported yet")
        return "torchtpu.vllm.attention.TpuAttentionBackend"

    @classmethod
    def opaque_attention_op(cls):
        # Attention runs as vLLM's custom op, which compiled graphs are split at: its metadata
        # (the batch's block tables) changes every step and is not traced into a graph.
        return True

    @classmethod
    def get_compile_backend(cls):
        return "torchtpu.vllm.compiler.TpuCompiler"

    @classmethod
    def get_device_name(cls, device_id=0):
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id=0):
        return torch.tpu.get_device_properties(device_id).total_memory

    @classmethod
    def get_device_capability(cls, device_id=0):
        return None

    @classmethod
    def set_device(cls, device):
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed):
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls):
        return True

    @classmethod
    def get_current_memory_usage(cls, device=None):
        return torch.tpu.memory_allocated(device)

    @classmethod
    def get_device_communicator_cls(cls):
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def check_if_supports_dtype(cls, dtype):
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"vLLM on tpu: model dtype {dtype} is not supported (bfloat16, float16 or float32)")

    @classmethod
    def import_kernels(cls):
        pass  # vllm._C holds CUDA kernels: layers run their native PyTorch forms on tpu

    @classmethod
    def register_triton_kernel_overrides(cls):
        from vllm.triton_utils.dispatcher import register_kernels

        from .kernels import OVERRIDES

        register_kernels(OVERRIDES)

    @classmethod
    def check_and_update_config(cls, vllm_config):
        from vllm.config import CUDAGraphMode
        from vllm.config.compilation import CompilationMode

        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "torchtpu.vllm.worker.TpuWorker"
        compilation = vllm_config.compilation_config
        # No CUDA graphs: a compiled model is one program per padded size already.
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        if vllm_config.model_config is not None and vllm_config.model_config.enforce_eager:
            compilation.mode = CompilationMode.NONE
        if compilation.mode != CompilationMode.NONE:
            compilation.backend = "tpu"
            # vLLM's fusion passes rewrite graphs into CUDA kernels (quantization, all-reduce,
            # RoPE + KV cache writes); tpu's graphs keep the plain ops.
            passes = compilation.pass_config
            for name in type(passes).model_fields if hasattr(type(passes), "model_fields") else vars(passes):
                if name.startswith("fuse_") or name.endswith("_fusion"):
                    setattr(passes, name, False)
        if compilation.compile_sizes is None:
            compilation.compile_sizes = []
        if on_host() and parallel.world_size > 1:
            # The CPU plugin gives each process as many devices as it is told (torchrun's
            # LOCAL_WORLD_SIZE); vLLM's workers, started after this, each take device local_rank.
            os.environ.setdefault("TORCHTPU_CPU_DEVICES", str(parallel.world_size))
        cache = vllm_config.cache_config
        if cache.block_size is None:
            cache.block_size = 16
        if on_host() and cache.kv_cache_memory_bytes is None:
            # The CPU plugin's device memory is the host's, shared with everything else: a
            # fixed KV cache budget, like vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE, in GiB).
            gib = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 4)
            cache.kv_cache_memory_bytes = int(gib * (1 << 30))
            logger.info("vLLM on tpu (CPU plugin): KV cache of %.1f GiB (VLLM_CPU_KVCACHE_SPACE)", gib)


def on_host():
    """Whether tpu runs on the CPU plugin (its memory is the host's)."""
    return torch.tpu._memory_is_host()
