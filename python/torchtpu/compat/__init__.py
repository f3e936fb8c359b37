"""Patches of other libraries, one module per library, so that code written for CUDA runs on
"tpu" unchanged: PyTorch itself (pytorch), accelerate, transformers. install() applies them all
when torchtpu loads."""
import importlib.abc
import importlib.util
import sys


def install():
    from . import accelerate, pytorch, transformers

    pytorch.install()
    accelerate.install()  # accelerate and transformers.Trainer pick "tpu" by themselves
    transformers.install()  # transformers' flex attention on tpu


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Calls patch(module) right after the module `name` is first executed."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once only; and the lookup below must not find this finder
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec
