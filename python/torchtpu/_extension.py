"""Loading torchtpu's compiled extension into the running torch, or refusing to.

The C++ shim is compiled against one torch release: another release numbers its dispatch keys
differently and exports other C++ symbols, so a shim built for one torch would register its
kernels under the wrong keys of another (or fail to load with a missing symbol). The library
registers nothing when it loads; `load()` first compares the torch it was built for with the
running one and only then registers the device.
"""
import importlib.util

import torch

SUPPORTED = ((2, 11), (2, 15))  # the first and last supported torch minor releases
REBUILD = (
    "pip install --no-build-isolation --force-reinstall --no-deps .   "
    "(from a torchtpu checkout; or `bash scripts/setup.sh`)"
)
_MARK = b"torchtpu-built-for-torch="


class TorchVersionMismatchError(ImportError):
    """torchtpu's extension was built for another torch than the one running."""


def release(version):
    """'2.14.0+cu130' -> (2, 14, 0): the release, without the local build tag."""
    parts = version.split("+")[0].split(".")
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts[:3])


def _mismatch(built, running, detail=""):
    lo, hi = SUPPORTED
    supported = f"torch {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"
    return TorchVersionMismatchError(
        f"torchtpu was built for torch {built}, but torch {running} is running{detail}. "
        f"Rebuild torchtpu against the installed torch: {REBUILD}. "
        f"torchtpu supports {supported}."
    )


def built_for_from_file(path):
    """The torch version recorded in the library file, read without loading it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    at = data.find(_MARK)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    return data[at + len(_MARK) : end].decode("ascii", "replace")


def load():
    """Imports torchtpu._C, checks its torch, registers the device; returns the module."""
    running = torch.__version__
    try:
        from . import _C
    except ImportError as e:
        spec = importlib.util.find_spec("torchtpu._C")
        built = built_for_from_file(spec.origin) if spec and spec.origin else None
        if built is not None and release(built) != release(running):
            raise _mismatch(built, running, f" (the library cannot load: {e})") from e
        raise
    built = _C.built_with_torch()
    if release(built) != release(running):
        raise _mismatch(built, running)
    _C.set_torch_version(*release(running)[:2])
    _C.register_device()
    return _C
