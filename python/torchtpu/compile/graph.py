"""One ATen graph into one device program: compile_graph and the function that runs it."""
import logging
import time

import torch

from .. import _C
from . import diagnostics, rewrites
from .encoder import WITH_EFFECTS, Encoder
from .host_split import HostPart, runs_eagerly, split_around_eager_ops
from .sizes import concrete, is_symbolic, lookup, number_meta

log = logging.getLogger("torchtpu.compile")


def compile_graph(gm, example_inputs, kind="forward", frame=None):
    """Compiles one ATen FX graph (the fw or bw compiler of AOTAutograd).

    A graph with symbolic sizes (`dynamic=True`, `mark_dynamic`) is lowered once per set of
    concrete sizes it meets, when it meets them: the lowerings and executables are static, and
    each new specialization is logged."""
    from functorch.compile import make_boxed_func

    gm = rewrites.fuse_cross_entropy_backward(gm)
    nodes = list(gm.graph.nodes)
    if any(runs_eagerly(n) for n in nodes):
        return make_boxed_func(split_around_eager_ops(gm, kind, frame))  # called as split(*args)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    constants = _graph_constants(gm, nodes)
    output = next(n.args[0] for n in nodes if n.op == "output")
    # Inputs the graph writes: AOTAutograd keeps their mutations as copy_(input, new) nodes
    # (keep_inference_input_mutations); run_graph_ writes them in place, donating the old
    # buffers, instead of AOTAutograd copying each one back after the call.
    # Inputs on the host (an optimizer's CPU step counts) come back as outputs and are copied
    # into place after the call.
    mutated, host_writes = [], {}
    for node in nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
            i = placeholders.index(node.args[0])
            on_tpu = isinstance(example_inputs[i], torch.Tensor) and example_inputs[i].device.type == "tpu"
            if not on_tpu:
                host_writes[i] = node
            elif i not in mutated:
                mutated.append(i)
        elif _mutates_input(node):
            raise NotImplementedError(f"torchtpu.compile: {node.target} mutates a graph input")
    for x in example_inputs:
        if not isinstance(x, (torch.Tensor, int, torch.SymInt)):
            raise NotImplementedError(f"torchtpu.compile: graph input {x!r} ({type(x).__name__}) is not supported")
    # Effect tokens (inputs threaded through with_effects) carry no data and are None at run
    # time: the program never reads them, and a token output is the token input.
    tokens = {n.args[0] for n in nodes if n.op == "call_function" and n.target is WITH_EFFECTS}
    host = HostPart(nodes, placeholders, example_inputs)
    host_writes = {i: n for i, n in host_writes.items() if n not in host.computed}  # else written on the host
    # The tensor inputs the device program reads (host ones only where a device op uses them).
    tensor_inputs = [i for i, x in enumerate(example_inputs)
                     if isinstance(x, torch.Tensor) and placeholders[i] not in tokens
                     and (x.device.type == "tpu" or placeholders[i] in host.read_by_device)]
    symbolic = is_symbolic(nodes)
    # A graph that reads no tensor (it only makes some) still needs one for the dispatcher to
    # find the device: an empty one, which the program ignores.
    anchor = not tensor_inputs and not constants[0] and not host.packs and not host.single
    stats = {"graph": None, "frame": frame, "kind": kind, "nodes": 0, "calls": 0, "first_call_seconds": None,
             "specializations": 0}
    diagnostics.graphs.append(stats)

    def specialize(bindings):
        """Registers the graph with every symbolic size replaced by its value in `bindings`."""
        enc = Encoder(bindings, gm)
        for i, n in enumerate([placeholders[i] for i in tensor_inputs] + constants[0]):
            enc.index[n] = ("ref", i)
        enc.num_inputs = len(tensor_inputs) + len(constants[0]) + anchor
        host.encode_inputs(enc)
        for node in nodes:
            if node.op == "call_function" and node not in host.computed:
                enc.call(node)
        # Outputs computed in the graph come back from run_graph in order; inputs returned as
        # outputs, sizes and constants are handed back as they are.
        plan, computed = [], []
        for o in output if isinstance(output, (list, tuple)) else [output]:
            if isinstance(o, torch.fx.Node) and enc.index.get(o, ("",))[0] == "token":
                plan.append(("input", placeholders.index(enc.index[o][1])))
            elif isinstance(o, torch.fx.Node) and o.op == "placeholder":
                plan.append(("input", placeholders.index(o)))
            elif o in host.computed:
                plan.append(("host", o))
            elif isinstance(o, torch.fx.Node) and number_meta(o) is not None:
                plan.append(("const", concrete(number_meta(o), bindings)))
            elif isinstance(o, torch.fx.Node):
                plan.append(("computed", len(computed)))
                computed.append(enc.value(o))
            else:
                plan.append(("const", o))
        host_copies = []
        for i, node in host_writes.items():
            host_copies.append((i, len(computed)))
            computed.append(enc.value(node))
        after = []  # (op, args with ("out", k) for the program's k-th result, kwargs)
        for op, args, kwargs in enc.after:
            refs = []
            for a in args:
                if isinstance(a, torch.fx.Node):
                    refs.append(("out", len(computed)))
                    computed.append(enc.value(a))
                else:
                    refs.append(("const", a))
            after.append((op, refs, kwargs))
        mutated_refs = [tensor_inputs.index(i) for i in mutated]
        graph_id = _C.register_graph(enc.num_inputs, enc.nodes, computed, mutated_refs)
        stats["graph"], stats["nodes"] = graph_id, len(enc.nodes)
        stats["specializations"] += 1
        if symbolic:
            sizes = ", ".join(f"{k}={v}" for k, v in bindings.items())
            log.info("torchtpu.compile: %s graph %d lowered for sizes %s (specialization #%d)", kind, graph_id, sizes,
                     stats["specializations"])
        return graph_id, plan, host_copies, after, bool(computed), bindings, enc.draws

    static = None if symbolic else specialize({})
    by_sizes = {}

    def execute(args):
        graph_id, plan, host_copies, after, has_outputs, bindings, draws = static or lookup(
            by_sizes, placeholders, args, specialize)
        env = host.run_before(args, bindings)
        tensors = [*(args[i] for i in tensor_inputs), *constants[1], *host.device_inputs(env)]
        if anchor:
            tensors.append(torch.empty(0, device="tpu"))
        if draws:  # the generator None: the device's default one, advanced by one per call
            results = (torch.ops.torchtpu.run_graph_.random(graph_id, [args[i] for i in mutated], tensors, None) if mutated
                       else torch.ops.torchtpu.run_graph.random(graph_id, tensors, None))
        elif mutated:
            results = torch.ops.torchtpu.run_graph_(graph_id, [args[i] for i in mutated], tensors)
        else:
            results = torch.ops.torchtpu.run_graph(graph_id, tensors) if has_outputs else []
        for i, k in host_copies:
            args[i].copy_(results[k])
        for op, refs, kwargs in after:
            op(*(results[x] if kind == "out" else x for kind, x in refs), **kwargs)
        host.run_after(args, env, bindings)
        out = []
        for kind, x in plan:
            out.append(results[x] if kind == "computed" else args[x] if kind == "input" else env[x] if kind == "host" else x)
        return tuple(out) if isinstance(output, (list, tuple)) else out[0]

    def run(*args):
        stats["calls"] += 1
        if stats["first_call_seconds"] is None:
            t0 = time.perf_counter()
            out = execute(args)
            stats["first_call_seconds"] = time.perf_counter() - t0
            return out
        return execute(args)

    return make_boxed_func(run)


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


def _graph_constants(gm, nodes):
    """The graph's tensor attributes: (their nodes, their values moved to the device once)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    constant_nodes, values = [], []
    for n in nodes:
        if n.op != "get_attr":
            continue
        value = gm
        for part in n.target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.fx.GraphModule):
            continue  # a subgraph of a control-flow node, lowered with it
        constant_nodes.append(n)
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"torchtpu.compile: graph attribute {n.target} is not a tensor")
        with unset_fake_temporarily():  # compiling runs under fake tensors; these are real
            values.append(value.detach().to("tpu"))
    return constant_nodes, values
