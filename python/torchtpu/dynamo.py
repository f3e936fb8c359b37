"""torch.compile backend "tpu": `torch.compile(model, backend="tpu")`.

AOTAutograd with PyTorch's core ATen decompositions gives forward and backward ATen graphs;
each is handed to the Rust lowerings (the same ones eager mode uses) as one graph, compiled
into one PJRT executable per input layout and run as the single op `torchtpu::run_graph`.
"""
import logging
import operator
import os
import time
import warnings

import torch

from . import _C

log = logging.getLogger("torchtpu.compile")

# Per dynamo frame: how often it was compiled, the last input signature, and per-graph counts.
_frames = {}
_graphs = []


def recompile_warn_threshold():
    return int(os.environ.get("TORCHTPU_RECOMPILE_WARN", "8"))

# c10::ScalarType codes of the dtypes the lowerings know.
_DTYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.complex64: 9, torch.complex128: 10, torch.bool: 11,
    torch.bfloat16: 15, torch.float8_e5m2: 23, torch.float8_e4m3fn: 24, torch.uint16: 27, torch.uint32: 28,
    torch.uint64: 29,
}


class _Encoder:
    """Turns an FX graph of aten ops into (nodes, outputs) for `_C.register_graph`."""

    def __init__(self):
        self.index = {}
        self.num_inputs = 0
        self.nodes = []

    def value(self, v):
        if isinstance(v, torch.fx.Node):
            return self.index[v]
        if v is None or isinstance(v, (torch.device, torch.layout, torch.memory_format)):
            return ("none", None)
        if isinstance(v, bool):
            return ("bool", v)
        if isinstance(v, int):
            return ("int", v)
        if isinstance(v, float):
            return ("float", v)
        if isinstance(v, str):
            return ("str", v)
        if isinstance(v, torch.dtype):
            if v not in _DTYPE_CODES:
                raise NotImplementedError(f"torchtpu.compile: dtype {v} is not supported")
            return ("dtype", _DTYPE_CODES[v])
        if isinstance(v, (list, tuple)):
            items = list(v)
            if items and all(isinstance(x, bool) for x in items):
                return ("bools", items)
            if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
                return ("ints", items)
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items):
                return ("floats", [float(x) for x in items])
            return ("list", [self.value(x) for x in items])
        raise NotImplementedError(f"torchtpu.compile: unsupported graph argument {v!r} ({type(v).__name__})")

    def call(self, node):
        target = node.target
        if target is operator.getitem:
            src, i = node.args
            kind, payload = self.index[src]
            self.index[node] = ("item", (payload, i))
            return
        if not isinstance(target, torch._ops.OpOverload):
            raise NotImplementedError(f"torchtpu.compile: unsupported graph call {target}")
        schema = target._schema
        names, values = [], []
        for k, a in enumerate(schema.arguments):
            if k < len(node.args):
                v = node.args[k]
            elif a.name in node.kwargs:
                v = node.kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                v = None
            names.append(a.name)
            values.append(self.value(v))
        self.nodes.append((schema.name, names, values))
        self.index[node] = ("ref", self.num_inputs + len(self.nodes) - 1)


def _mutates_input(node):
    """Whether a node other than copy_ writes one of the graph's inputs (set_, resize_, ...):
    functional graphs have none; fail loudly rather than lose the write."""
    schema = node.target._schema if isinstance(node.target, torch._ops.OpOverload) else None
    if schema is None or not schema.is_mutable:
        return False
    for k, a in enumerate(schema.arguments):
        v = node.args[k] if k < len(node.args) else node.kwargs.get(a.name)
        if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.fx.Node) and v.op == "placeholder":
            return True
    return False


def _signature(gm, example_inputs):
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    sig = []
    for name, x in zip(names, example_inputs):
        if isinstance(x, torch.Tensor):
            sig.append((name, tuple(x.shape), x.dtype, tuple(x.stride())))
        else:
            sig.append((name, repr(x), None, None))
    return sig


def _changes(old, new):
    if len(old) != len(new):
        return [f"the graph now takes {len(new)} inputs instead of {len(old)}"]
    out = []
    for (name, shape, dtype, stride), (_, shape2, dtype2, stride2) in zip(old, new):
        if dtype is None or dtype2 is None:
            if shape != shape2:
                out.append(f"input {name} changed value {shape} -> {shape2}")
        elif shape != shape2:
            out.append(f"input {name} shape {list(shape)} -> {list(shape2)}")
        elif dtype != dtype2:
            out.append(f"input {name} dtype {dtype} -> {dtype2}")
        elif stride != stride2:
            out.append(f"input {name} strides {list(stride)} -> {list(stride2)}")
    return out


def _failed_guard():
    """The guard whose failure made dynamo recompile this frame, as dynamo recorded it."""
    try:
        from torch._dynamo.utils import guard_failures

        tc = torch._guards.TracingContext.try_get()
        codes = getattr(tc, "traced_code", None) or []
        for code in codes:
            failures = guard_failures.get(code)
            if failures:
                # Each lookup records one failure per cached graph ("frame/compile: guard"); the
                # newest graph's failure says what changed since the last compile.
                def compile_number(f):
                    head = f.split(":", 1)[0].strip()
                    return int(head.split("/")[-1]) if head.replace("/", "").isdigit() else -1

                recent = failures[-len(set(map(compile_number, failures))):]
                return max(recent, key=compile_number).splitlines()[0].strip()
    except Exception:  # noqa: BLE001 - explanations must never break compiling
        pass
    return None


def _explain_recompile(gm, example_inputs):
    """Logs why a frame compiles again, and warns when one frame recompiles too often."""
    cid = torch._guards.CompileContext.current_compile_id()
    if cid is None:
        return None
    sig = _signature(gm, example_inputs)
    rec = _frames.get(cid.frame_id)
    if rec is None:
        _frames[cid.frame_id] = {"compiles": 1, "signature": sig, "reason": None}
        return cid.frame_id
    rec["compiles"] += 1
    changes = _changes(rec["signature"], sig)
    guard = _failed_guard()
    what = "; ".join(changes) if changes else "same input shapes, dtypes and strides"
    reason = f"frame {cid.frame_id} compiles again (compile #{rec['compiles']}): {what}"
    if guard:
        reason += f"; failed guard: {guard}"
    rec["reason"], rec["signature"] = reason, sig
    log.info("torchtpu.compile: %s", reason)
    if rec["compiles"] == recompile_warn_threshold() + 1:
        warnings.warn(f"torchtpu.compile: frame {cid.frame_id} recompiled {rec['compiles'] - 1} times; last: {reason}. "
                      "Mark varying dimensions dynamic or keep shapes fixed (pad or bucket them).")
    return cid.frame_id


def graph_stats():
    """Per compiled graph: its frame, kind, calls, and the first call's seconds (compile + run)."""
    out = []
    for g in _graphs:
        rec = _frames.get(g["frame"], {})
        out.append({**g, "frame_compiles": rec.get("compiles", 0), "last_recompile": rec.get("reason")})
    return out


def compile_graph(gm, example_inputs, kind="forward", frame=None):
    """Compiles one ATen FX graph (the fw or bw compiler of AOTAutograd)."""
    from functorch.compile import make_boxed_func

    enc = _Encoder()
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    # Tensor constants of the graph become trailing inputs, moved to the device once.
    constant_nodes = [n for n in nodes if n.op == "get_attr"]
    for i, n in enumerate(placeholders + constant_nodes):
        enc.index[n] = ("ref", i)
    enc.num_inputs = len(placeholders) + len(constant_nodes)
    constants = []
    for n in constant_nodes:
        value = gm
        for part in n.target.split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"torchtpu.compile: graph attribute {n.target} is not a tensor")
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # compiling runs under fake tensors; these are real
            constants.append(value.detach().to("tpu"))
    output = None
    # Inputs the graph writes: AOTAutograd keeps their mutations as copy_(input, new) nodes
    # (keep_inference_input_mutations); run_graph_ writes them in place, donating the old
    # buffers, instead of AOTAutograd copying each one back after the call.
    # Inputs on the host (an optimizer's CPU step counts) come back as outputs and are copied
    # into place after the call.
    mutated, host_writes = [], {}
    for node in nodes:
        if node.op == "call_function":
            if node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
                i = placeholders.index(node.args[0])
                on_tpu = isinstance(example_inputs[i], torch.Tensor) and example_inputs[i].device.type == "tpu"
                if not on_tpu:
                    host_writes[i] = node
                elif i not in mutated:
                    mutated.append(i)
            elif _mutates_input(node):
                raise NotImplementedError(f"torchtpu.compile: {node.target} mutates a graph input")
            enc.call(node)
        elif node.op == "output":
            output = node.args[0]
    for x in example_inputs:
        if not isinstance(x, torch.Tensor):
            raise NotImplementedError("torchtpu.compile: symbolic or scalar graph inputs are not supported yet")
    outputs = list(output) if isinstance(output, (list, tuple)) else [output]
    # Outputs computed in the graph come back from run_graph in order; inputs returned as
    # outputs and constants are handed back as they are.
    plan, computed = [], []
    for o in outputs:
        if isinstance(o, torch.fx.Node) and o.op == "placeholder":
            plan.append(("input", placeholders.index(o)))
        elif isinstance(o, torch.fx.Node):
            plan.append(("computed", len(computed)))
            computed.append(enc.value(o))
        else:
            plan.append(("const", o))
    host_copies = []
    for i, node in host_writes.items():
        host_copies.append((i, len(computed)))
        computed.append(enc.value(node))
    graph_id = _C.register_graph(enc.num_inputs, enc.nodes, computed, mutated)
    stats = {"graph": graph_id, "frame": frame, "kind": kind, "nodes": len(enc.nodes), "calls": 0,
             "first_call_seconds": None}
    _graphs.append(stats)

    def execute(args):
        if mutated:
            return torch.ops.torchtpu.run_graph_(graph_id, [args[i] for i in mutated], [*args, *constants])
        return torch.ops.torchtpu.run_graph(graph_id, [*args, *constants]) if computed else []

    def run(*args):
        stats["calls"] += 1
        if stats["first_call_seconds"] is None:
            t0 = time.perf_counter()
            results = execute(args)
            stats["first_call_seconds"] = time.perf_counter() - t0
        else:
            results = execute(args)
        for i, k in host_copies:
            args[i].copy_(results[k])
        out = []
        for kind, x in plan:
            out.append(results[x] if kind == "computed" else args[x] if kind == "input" else x)
        return tuple(out) if isinstance(output, (list, tuple)) else out[0]

    return make_boxed_func(run)


def backend(gm, example_inputs, **kwargs):
    """The dynamo backend registered as "tpu"."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    # Graphs are compiled per concrete shape (the executable cache is keyed by shapes), so a
    # new shape recompiles a static graph instead of tracing a symbolic one.
    torch._dynamo.config.automatic_dynamic_shapes = False
    frame = _explain_recompile(gm, example_inputs)

    def fw(g, ex):
        return compile_graph(g, ex, "forward", frame)

    def bw(g, ex):
        return compile_graph(g, ex, "backward", frame)

    # The min-cut partitioner (inductor's) saves fewer activations for backward and recomputes
    # cheap elementwise ops there: whole-layer memory is what limits batch sizes on a device.
    from functorch.compile import min_cut_rematerialization_partition

    return aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=_decompositions(),
                        partition_fn=min_cut_rematerialization_partition,
                        keep_inference_input_mutations=True)(gm, example_inputs)


def install_as_default_for_tpu():
    """`torch.compile(model)` without a backend means inductor, which has no code generator
    for tpu: graphs whose inputs live on tpu go to this backend instead."""
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_torchtpu", False):
        return
    inductor = wrapper.__call__

    def __call__(self, model_, inputs_):
        if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs_):
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

    lowered = set(_C.lowered_ops())

    def base(op):
        name = op.name().split("::")[-1].split(".")[0]
        return name[:-1] if name.endswith("_") and not name.startswith("__") else name

    return {op: fn for op, fn in core_aten_decompositions().items()
            if not (isinstance(op, torch._ops.OpOverload) and base(op) in lowered)}
