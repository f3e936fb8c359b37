"""accelerate, and so transformers.Trainer, on "tpu" with no change to the user's script.

accelerate before 1.16 picks its device from a fixed list of backends it knows (CUDA, XPU, MPS,
NPU, ...) and does not detect a PrivateUse1 device (1.16 asks torch.accelerator, which names
tpu, so there this only keeps `cpu=True` working). The mechanism it offers for other devices is the
environment variable ACCELERATE_TORCH_DEVICE, read whenever its state is set up and winning
over that list. So when torchtpu loads on a machine where torch has no accelerator of its own,
"tpu" becomes the variable's default. A value the user set wins; TORCHTPU_ACCELERATE=0 turns
this off.

accelerate lets the variable win over an explicit request for the CPU as well
(`Accelerator(cpu=True)`, `TrainingArguments(use_cpu=True)`), which would put the model on cpu
and the batches on tpu. So when accelerate.state is imported, its PartialState learns that
cpu=True wins over the default set here (not over a value the user set).
"""
import functools
import os
import sys

import torch

from . import PatchOnImport

VAR = "ACCELERATE_TORCH_DEVICE"
_set_here = False  # whether VAR holds the default set by install(), not a value of the user


def _torch_has_own_accelerator():
    # CUDA and ROCm are judged by their device nodes, not by torch.cuda.is_available(): that
    # initializes the driver, and a DataLoader worker forked later could not use CUDA then.
    if torch.version.cuda is not None and os.path.exists("/dev/nvidiactl"):
        return True
    if torch.version.hip is not None and os.path.exists("/dev/kfd"):
        return True
    return torch.xpu.is_available() or torch.backends.mps.is_available()


def install():
    global _set_here
    if os.environ.get("TORCHTPU_ACCELERATE") == "0" or VAR in os.environ:
        return
    if _torch_has_own_accelerator():
        return
    os.environ[VAR] = "tpu"
    _set_here = True
    if "accelerate.state" in sys.modules:
        _cpu_wins(sys.modules["accelerate.state"])
    else:
        sys.meta_path.insert(0, PatchOnImport("accelerate.state", _cpu_wins))


def _cpu_wins(state_module):
    partial_state = state_module.PartialState
    init = partial_state.__init__

    @functools.wraps(init)
    def __init__(self, cpu=False, **kwargs):
        first = not partial_state._shared_state  # later calls share the first one's state
        init(self, cpu, **kwargs)
        if first and cpu and _set_here and os.environ.get(VAR) == "tpu":
            self.device = torch.device("cpu")

    partial_state.__init__ = __init__
