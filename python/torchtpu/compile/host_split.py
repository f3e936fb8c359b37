"""The parts of a graph that do not run in its device program: ops that run eagerly between
programs (collectives, mutating custom ops, ops without a lowering), around which the graph is
split, and the host part (an optimizer's CPU step counts) that runs on the host."""
import logging
import operator

import torch

from .. import _C
from .encoder import text_kernel_op
from .sizes import concrete, number_meta

log = logging.getLogger("torchtpu.compile")


def _is_collective(node):
    """Whether a graph node is a functional collective (all_reduce, wait_tensor, ...)."""
    return node.op == "call_function" and getattr(node.target, "namespace", None) == "_c10d_functional"


_AUTO_FUNCTIONALIZED = tuple(op for op in (getattr(torch.ops.higher_order, "auto_functionalized", None),
                                           getattr(torch.ops.higher_order, "auto_functionalized_v2", None)) if op)


def runs_eagerly(node):
    """Whether a node runs eagerly between the graph's programs: functional collectives (they
    run through the c10d backend), custom ops that mutate their inputs (auto_functionalized),
    and ops without a lowering (custom ops implemented in Python)."""
    if node.op != "call_function":
        return False
    if _is_collective(node) or node.target in _AUTO_FUNCTIONALIZED:
        return True
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and number_meta(node) is None
            and target.namespace not in ("torchtpu",) and not _C.is_lowered(target._schema.name)
            and text_kernel_op(target) is None)


class _CompiledOnFirstCall(torch.nn.Module):
    """A piece of a split graph, compiled with the inputs of its first call."""

    def __init__(self, piece, kind, frame):
        super().__init__()
        self.piece, self.kind, self.frame, self.fn = piece, kind, frame, None

    def forward(self, *args):
        if self.fn is None:
            from .backend import compiled_or_eager

            self.fn = compiled_or_eager(self.piece, list(args), self.kind, self.frame)
        return self.fn(list(args))


def split_around_eager_ops(gm, kind, frame):
    """A graph with nodes that run eagerly (see `runs_eagerly`) runs as device programs split
    around them: each run of such nodes runs eagerly, each piece between them is compiled like
    a graph of its own."""
    from torch.fx.passes.split_module import split_module

    parts, current, in_eager, eager_nodes = {}, 0, False, set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        # The items of an eager node's results are taken where it runs (pieces pass tensors).
        eager = runs_eagerly(node) or (node.target is operator.getitem and node.args[0] in eager_nodes)
        if eager:
            eager_nodes.add(node)
        if eager != in_eager:
            current += 1
            in_eager = eager
        parts[node] = current
    split = split_module(gm, None, lambda node: parts[node])
    eager = {parts[n] for n in eager_nodes}
    for name, piece in list(split.named_children()):
        if int(name.rsplit("_", 1)[1]) not in eager:
            setattr(split, name, _CompiledOnFirstCall(piece, kind, frame))
    names = sorted({str(n.target) for n in parts if runs_eagerly(n)})
    log.info("torchtpu.compile: %s graph split around %d run(s) of ops that run eagerly: %s", kind, len(eager),
             ", ".join(names))
    return split


class HostPart:
    """The part of a graph that computes on CPU tensors only: an optimizer's step counts and
    their bias corrections (capturable=False keeps the counts on the CPU). It runs eagerly on
    the host around the device program, which gets the values it reads as inputs (0-d ones
    packed into one tensor per dtype), instead of uploading the counts one by one, computing
    on the device and copying every new count back (a wait for the device per count). Writes
    into host inputs run after the device program is queued (it copies its host inputs when
    it is queued, so it reads the values from before the writes, as the graph says)."""

    def __init__(self, nodes, placeholders, example_inputs):
        self.index = {p: i for i, (p, x) in enumerate(zip(placeholders, example_inputs))
                      if isinstance(x, torch.Tensor) and x.device.type == "cpu"}
        host = set(self.index)
        self.before, self.after = [], []
        for n in nodes:
            if n.op != "call_function" or number_meta(n) is not None or not _on_cpu(n.meta.get("val")):
                continue
            if all(a in host or number_meta(a) is not None for a in _node_args(n)):
                host.add(n)
                writes_input = n.target is torch.ops.aten.copy_.default and n.args[0] in self.index
                (self.after if writes_input else self.before).append(n)
        self.computed = set(self.before) | set(self.after)
        # What device ops read from the host part, in graph order.
        self.read_by_device = []
        for n in nodes:
            if n.op == "call_function" and n not in self.computed:
                for a in _node_args(n):
                    if a in host and a not in self.read_by_device:
                        self.read_by_device.append(a)
        feeds = [a for a in self.read_by_device if a in self.computed]
        if any(not isinstance(a.meta.get("val"), torch.Tensor) for a in feeds):
            # A device op reads a whole list the host made: keep everything on the device.
            self.before, self.after, self.computed, feeds = [], [], set(), []
            self.read_by_device = list(self.index)
        self.packs = {}
        self.single = []
        for a in feeds:
            v = a.meta["val"]
            if v.dim() == 0:
                self.packs.setdefault(v.dtype, []).append(a)
            else:
                self.single.append(a)

    def encode_inputs(self, enc):
        """Adds the device program's inputs from the host part (after enc's other inputs)."""
        first = enc.num_inputs
        enc.num_inputs += len(self.packs) + len(self.single)
        for k, group in enumerate(self.packs.values()):
            for j, a in enumerate(group):
                enc.nodes.append(("aten::select", ["self", "dim", "index"], [("ref", first + k), ("int", 0), ("int", j)]))
                enc.index[a] = ("ref", enc.num_inputs + len(enc.nodes) - 1)
        for k, a in enumerate(self.single):
            enc.index[a] = ("ref", first + len(self.packs) + k)

    def device_inputs(self, env):
        packed = [torch.stack([env[a] for a in group]) for group in self.packs.values()]
        return [*packed, *(env[a] for a in self.single)]

    def _eval(self, n, args, env, bindings):
        def value(a):
            if not isinstance(a, torch.fx.Node):
                return a
            if a in env:
                return env[a]
            if a in self.index:
                return args[self.index[a]]
            return concrete(number_meta(a), bindings)

        env[n] = n.target(*torch.fx.node.map_aggregate(n.args, value), **torch.fx.node.map_aggregate(n.kwargs, value))

    def run_before(self, args, bindings):
        env = {}
        for n in self.before:
            self._eval(n, args, env, bindings)
        return env

    def run_after(self, args, env, bindings):
        for n in self.after:
            self._eval(n, args, env, bindings)


def _on_cpu(v):
    if isinstance(v, (list, tuple)):
        return len(v) > 0 and all(_on_cpu(x) for x in v)
    return isinstance(v, torch.Tensor) and v.device.type == "cpu"


def _node_args(n):
    """The nodes a node reads."""
    found = []
    torch.fx.node.map_arg((n.args, n.kwargs), found.append)
    return found
