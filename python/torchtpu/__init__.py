"""torchtpu: PyTorch on device "tpu", backed by an XLA PJRT plugin (TPU, NVIDIA GPU or CPU).

`import torch` is enough (torchtpu autoloads through the `torch.backends` entry point, see
torchtpu_autoload); then use device "tpu" wherever you would use "cuda".
"""
import atexit
import os

# XLA's plugins log informational lines to stderr at start; keep warnings and errors.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import torch  # noqa: E402

from . import _platform  # noqa: E402

_platform_error = None
try:
    PLATFORM, PLUGIN_PATH, _OPTIONS = _platform.choose()
except (RuntimeError, ValueError) as e:  # reported at first use, not at `import torch`
    PLATFORM, PLUGIN_PATH, _OPTIONS = None, None, []
    _platform_error = e

from . import _extension  # noqa: E402

_C = _extension.load()  # checks the torch version, then registers the device's kernels

if PLUGIN_PATH:
    _C.configure(PLUGIN_PATH, _OPTIONS)
    # Exit waits for programs still running (results nobody read), compiles on worker threads
    # and the persistent cache's queued writes: the plugin torn down under a running program
    # or compile crashed the process.
    atexit.register(_C.wait_before_exit)

if torch._C._get_privateuse1_backend_name() != "tpu":
    torch.utils.rename_privateuse1_backend("tpu")

from . import device as _device_module  # noqa: E402

torch._register_device_module("tpu", _device_module)

from . import compat  # noqa: E402

compat.install()  # patches of PyTorch, accelerate and transformers for tpu
from . import compile as _compile  # noqa: E402

_compile.install_as_default_for_tpu()
_compile.install_fake_kernels()
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

from . import distributed as _distributed  # noqa: E402

_distributed.register()  # the c10d backend "tccl" for device "tpu"


__version__ = "0.1.0"


__all__ = ["PLATFORM", "PLUGIN_PATH"]
