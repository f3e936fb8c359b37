"""torch's device-backend autoload entry point for torchtpu (`import torch` registers "tpu").

It lives outside the torchtpu package so that it can decide before torchtpu is imported.
PyTorch lets one accelerator own autograd's streams, and a registered PrivateUse1 backend
takes that role; on a machine where torch's own CUDA works, autoloading "tpu" would break
CUDA backward passes. There torchtpu loads only on an explicit `import torchtpu` (or with
TORCHTPU_AUTOLOAD=1); TORCHTPU_AUTOLOAD=0 turns autoloading off everywhere.

A torchtpu built for another torch release warns instead of failing `import torch`: torch
stays usable, and `import torchtpu` raises the error that says how to rebuild.
"""
import os
import warnings


def _torch_cuda_usable():
    import torch

    return torch.version.cuda is not None and os.path.exists("/dev/nvidiactl")


def autoload():
    choice = os.environ.get("TORCHTPU_AUTOLOAD")
    if choice == "0" or (choice != "1" and _torch_cuda_usable()):
        return
    try:
        import torchtpu  # noqa: F401  (importing registers the device)
    except ImportError as e:
        if type(e).__name__ != "TorchVersionMismatchError":
            raise
        warnings.warn(f"{e} Device 'tpu' is not available in this process.", RuntimeWarning, stacklevel=2)
