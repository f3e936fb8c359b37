"""Choosing the PJRT plugin behind device "tpu".

libtpu where a TPU is present, XLA's CUDA plugin where an NVIDIA GPU is visible, XLA's CPU
plugin otherwise. TORCHTPU_PLATFORM (cpu|cuda|tpu) forces a platform, TORCHTPU_PJRT_PLUGIN
a plugin file.
"""
import glob
import importlib.util
import os

# (platform, python package, file inside it, pip package to install)
_PLUGINS = {
    "cpu": [
        ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so", "xla-cpu-pjrt"),
        ("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so", "lammps-jax-pjrt-cpu"),
    ],
    "cuda": [
        ("jax_plugins.xla_cuda13", "xla_cuda_plugin.so", "jax-cuda13-pjrt"),
        ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so", "jax-cuda12-pjrt"),
    ],
    "tpu": [("libtpu", "libtpu.so", "libtpu")],
}


def _package_file(module, filename):
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        path = os.path.join(d, filename)
        if os.path.exists(path):
            return path
    return None


def find_plugin(platform):
    for module, filename, _ in _PLUGINS[platform]:
        path = _package_file(module, filename)
        if path:
            return path
    names = " or ".join(p for _, _, p in _PLUGINS[platform])
    raise RuntimeError(
        f"torchtpu: no PJRT plugin for platform '{platform}' is installed; "
        f"install it with `pip install {names}`"
    )


def _tpu_present():
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _gpu_present():
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def choose():
    """Returns (platform, plugin path, client create options)."""
    path = os.environ.get("TORCHTPU_PJRT_PLUGIN")
    platform = os.environ.get("TORCHTPU_PLATFORM", "").lower() or None
    if platform is not None and platform not in _PLUGINS:
        raise ValueError(f"TORCHTPU_PLATFORM must be one of cpu, cuda, tpu; got '{platform}'")
    if path:
        platform = platform or "cpu"
    elif platform:
        path = find_plugin(platform)
    else:
        platform = "cpu"
        for candidate, present in (("tpu", _tpu_present), ("cuda", _gpu_present)):
            if present():
                try:
                    path = find_plugin(candidate)
                    platform = candidate
                    break
                except RuntimeError:
                    pass
        if path is None:
            path = find_plugin("cpu")
    options = []
    if platform == "cpu":
        # Under torchrun each process has a client of its own with one device per local rank,
        # so that LOCAL_RANK names a device as it does on GPUs.
        default = os.environ.get("LOCAL_WORLD_SIZE", "1")
        options.append(("cpu_device_count", int(os.environ.get("TORCHTPU_CPU_DEVICES", default))))
    if platform == "cuda":
        # XLA's GPU allocator reserves a fixed share of the memory up front (0.75 by default,
        # sized for sharing with another framework); a torch user expects most of it.
        options.append(("memory_fraction", float(os.environ.get("TORCHTPU_GPU_MEMORY_FRACTION", "0.9"))))
        options.append(("preallocate", os.environ.get("TORCHTPU_GPU_PREALLOCATE", "1") != "0"))
    if platform == "tpu":
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    return platform, path, options
