"""The dynamo backend "tpu", the stand-in for inductor on graphs that touch tpu, and fake
kernels for ops whose meta functions refuse what tpu runs."""
import logging

import torch

from .. import _C
from . import diagnostics
from .graph import compile_graph

log = logging.getLogger("torchtpu.compile")


def backend(gm, example_inputs, **kwargs):
    """The dynamo backend registered as "tpu"."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    frame = diagnostics.explain_recompile(gm, example_inputs)

    def fw(g, ex):
        return compiled_or_eager(g, ex, "forward", frame)

    def bw(g, ex):
        return compiled_or_eager(g, ex, "backward", frame)

    # The min-cut partitioner (inductor's) saves fewer activations for backward and recomputes
    # cheap elementwise ops there: whole-layer memory is what limits batch sizes on a device.
    from functorch.compile import min_cut_rematerialization_partition

    return aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=_decompositions(),
                        partition_fn=min_cut_rematerialization_partition,
                        keep_inference_input_mutations=True)(gm, example_inputs)


def _unsupported(e):
    """Whether an error says the graph has something the lowerings cannot compile."""
    return isinstance(e, NotImplementedError) and str(e).startswith("torchtpu.compile:")


def compiled_or_eager(gm, example_inputs, kind, frame):
    """The graph as one program; where it holds something that cannot be lowered (found when
    it is compiled, or when its program is built at the first call, before anything ran),
    the graph runs eagerly instead, op by op on tpu, with a warning naming what."""
    from functorch.compile import make_boxed_func

    def eager(e):
        log.warning("%s; the %s graph runs eagerly, op by op", e, kind)
        return make_boxed_func(gm)

    try:
        compiled = compile_graph(gm, example_inputs, kind, frame)
    except NotImplementedError as e:
        if not _unsupported(e):
            raise
        return eager(e)
    state = {"fn": compiled, "first": True}

    def call(args):
        if state["first"]:
            state["first"] = False
            try:
                return state["fn"](args)
            except NotImplementedError as e:
                if not _unsupported(e):
                    raise
                state["fn"] = eager(e)
        return state["fn"](args)

    call._boxed_call = True
    return call


def _touches_tpu(gm, inputs):
    """Whether a graph reads, makes or returns a tensor on tpu: its inputs, the values its
    nodes were traced with, or a factory's device argument (create_block_mask's graph takes
    only sizes and makes its tensors on the device it is given)."""
    if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs):
        return True
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        traced = node.meta.get("example_value", node.meta.get("val"))
        if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in torch.utils._pytree.tree_leaves(traced)):
            return True
        device = node.kwargs.get("device")
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "tpu":
            return True
    return False


def install_as_default_for_tpu():
    """`torch.compile(model)` without a backend, or with backend="inductor", means inductor,
    whose code generator for a device named "tpu" (torch 2.14's Pallas, which imports JAX) is
    not this one: graphs that touch tpu go to this backend instead."""
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_torchtpu", False):
        return
    inductor = wrapper.__call__

    def __call__(self, model_, inputs_):
        if _touches_tpu(model_, inputs_):
            return backend(model_, inputs_)
        return inductor(self, model_, inputs_)

    __call__._torchtpu = True
    wrapper.__call__ = __call__


def _grouped_mm_fake(fake_mode, func, *args, **kwargs):
    """Output of torch._grouped_mm for graphs on tpu. PyTorch's meta function admits only what
    its CUDA kernel does (bf16, 16-byte aligned strides); tpu lowers every float dtype and
    layout, and checks the arguments when the graph is lowered."""
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    names = ("self", "mat2", "offs", "bias", "out_dtype")
    bound = {**dict(zip(names, args)), **kwargs}
    a, b, offs = bound["self"], bound["mat2"], bound.get("offs")
    if not isinstance(a, torch.Tensor) or a.device.type != "tpu":
        return NotImplemented
    if a.dim() == 2 and b.dim() == 2:
        shape = (offs.shape[0], a.shape[0], b.shape[1])  # one product per group of the shared dim
    elif a.dim() == 2:
        shape = (a.shape[0], b.shape[-1])
    elif b.dim() == 2:
        shape = (a.shape[1], b.shape[1])
    else:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    with in_kernel_invocation_manager(fake_mode):
        out = torch.empty(shape, dtype=bound.get("out_dtype") or a.dtype, device="meta")
    return FakeTensor(fake_mode, out, a.device)


def install_fake_kernels():
    from torch._subclasses.fake_impls import op_implementations_checks

    check = lambda func: func is torch.ops.aten._grouped_mm.default  # noqa: E731
    if not any(impl is _grouped_mm_fake for _, impl in op_implementations_checks):
        op_implementations_checks.append((check, _grouped_mm_fake))


def _decompositions():
    """PyTorch's core ATen decompositions, except for ops lowered natively: one native
    lowering beats a chain of smaller ops (and some decompositions call out= factories)."""
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items()
            if not (isinstance(op, torch._ops.OpOverload) and _C.is_lowered(op._schema.name))}
