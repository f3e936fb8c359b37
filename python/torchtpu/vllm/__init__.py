"""vLLM on device "tpu": the platform plugin vLLM finds through the `vllm.platform_plugins`
entry point (`pip install torchtpu[vllm]`), its worker and model runner, and an attention
backend whose paged KV cache lives on tpu.

vLLM's V1 engine (scheduler, continuous batching, prefix caching, chunked prefill, sampling)
runs unchanged; this package supplies what is device-specific: where tensors live, how memory
is measured, and attention over the paged cache as torchtpu programs."""
import os


def register():
    """The entry point: the platform class vLLM should use."""
    # The V2 model runner prepares its inputs with Triton kernels, which have no tpu target.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    # The engine process is started after this process may have used tpu (a PJRT client
    # does not survive a fork), as vLLM does for an initialized CUDA.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return "torchtpu.vllm.platform.TpuPlatform"
