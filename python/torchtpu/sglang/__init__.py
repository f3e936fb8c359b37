"""SGLang on device "tpu": the platform SGLang finds through the `sglang.srt.platforms` entry
point (`pip install torchtpu[sglang]`, then `--device tpu`).

SGLang's runtime (scheduler, radix prefix cache, chunked prefill, sampling) runs unchanged, with
its torch-native attention over its KV pool on tpu and every layer's native PyTorch form; this
package says what is device-specific: the device, its memory, the distributed backend and the
defaults that keep SGLang off CUDA-only kernels."""


def activate():
    """The entry point: the platform class's qualified name, or None where torchtpu cannot load
    (SGLang then looks at its other platforms)."""
    try:
        import torchtpu  # noqa: F401  (the "tpu" device and torch.tpu)
    except Exception:  # noqa: BLE001 - an unusable install only means this platform is absent
        return None
    return "torchtpu.sglang.platform.TpuSRTPlatform"
