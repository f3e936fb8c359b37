"""vLLM's compiled mode on tpu: the pieces of the model graph vLLM splits at its attention
ops are compiled by torchtpu's torch.compile backend (one program per piece and size)."""
from vllm.compilation.compiler_interface import CompilerInterface


class TpuCompiler(CompilerInterface):
    name = "tpu"

    def compile(self, graph, example_inputs, compiler_config, compile_range, key=None):
        import torch

        from torchtpu.compile import backend

        # AOTAutograd's cache stores inductor's compiled code, which tpu's graphs are not; no
        # handle either: torchtpu's persistent compile cache keeps the executables.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return backend(graph, example_inputs), None
