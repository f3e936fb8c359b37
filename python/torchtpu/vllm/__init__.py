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
    # vLLM pads its steps to a bounded set of sizes and warms them up, so bucketed programs
    # (new shapes served through gathers) would only slow its steps: 35.7 against 44.2 output
    # tokens/s in benches/serving.py, for 2 fewer compiles in its timed pass.
    os.environ.setdefault("TORCHTPU_BUCKET_PROGRAMS", "0")
    return "torchtpu.vllm.platform.TpuPlatform"
