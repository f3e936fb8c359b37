"""FX nodes of an ATen graph into the records `_C.register_graph` reads: (op, argument names,
encoded arguments) per node."""
import operator

import torch

from .. import _C
from .sizes import concrete, number_meta

# c10::ScalarType codes of the dtypes the lowerings know (the table lives in Rust).
DTYPE_CODES = {getattr(torch, name): code for code, name in _C.dtype_codes()}


WITH_EFFECTS = getattr(torch.ops.higher_order, "with_effects", None)
# Activation checkpointing's random ops: the forward saves each one's generator state, the
# backward recomputes it from that state (torch._functorch.partitioners.functionalize_rng_ops).
_RUN_AND_SAVE_RNG = torch._prims.rng_prims.run_and_save_rng_state
_RUN_WITH_RNG = torch._prims.rng_prims.run_with_rng_state
_COND = getattr(torch.ops.higher_order, "cond", None)
_WHILE_LOOP = getattr(torch.ops.higher_order, "while_loop", None)
_FLEX = getattr(torch.ops.higher_order, "flex_attention", None)
_FLEX_BACKWARD = getattr(torch.ops.higher_order, "flex_attention_backward", None)


def text_kernel_op(target):
    """The torchtpu.kernels op of a StableHLO text kernel, if `target` is one."""
    from ..kernels import _TEXT_OPS

    name = getattr(target, "_schema", None) and target._schema.name
    return _TEXT_OPS.get(name) if name else None


class Encoder:
    """Turns an FX graph of aten ops into (nodes, outputs) for `_C.register_graph`."""

    def __init__(self, bindings=None, module=None):
        # The graph's module: where get_attr nodes (the subgraphs of cond, while_loop) live.
        self.module = module
        self.index = {}
        self.num_inputs = 0
        self.nodes = []
        # Effectful ops to run eagerly after the program: (op, args, kwargs).
        self.after = []
        # Symbolic sizes' values for this specialization (sympy symbol -> int).
        self.bindings = bindings or {}
        # Whether a node draws from the device generator (the graph then runs as run_graph.random).
        self.draws = False

    def number(self, v):
        """A node computing a size, as its value; anything else as it is."""
        if isinstance(v, torch.fx.Node) and v not in self.index and number_meta(v) is not None:
            return concrete(number_meta(v), self.bindings)
        return concrete(v, self.bindings)

    def value(self, v):
        v = self.number(v)
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
            if v not in DTYPE_CODES:
                raise NotImplementedError(f"torchtpu.compile: dtype {v} is not supported")
            return ("dtype", DTYPE_CODES[v])
        if isinstance(v, (list, tuple)):
            items = [self.number(x) for x in v]
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
        if number_meta(node) is not None:
            return  # sizes are evaluated where they are used
        if target is operator.getitem:
            src, i = node.args
            kind, payload = self.index[src]
            if kind == "saved_rng":  # (the op's stream, the op's result)
                self.index[node] = payload[i]
                return
            if kind == "flex_backward":  # (grad_query, grad_key, grad_value, buffer gradients)
                self.index[node] = ("item", (payload, i)) if i < 3 else ("flex_buffer_grads", payload)
                return
            if kind == "flex_buffer_grads":
                self.index[node] = ("item", (payload, 3 + i))
                return
            if kind == "effects":
                token, inner, returns = payload
                # Item 0 is the effect token (handed back as the graph got it); the op's own
                # results follow.
                self.index[node] = ("token", token) if i == 0 else (inner if returns == 1 else ("item", (inner[1], i - 1)))
                return
            self.index[node] = ("item", (payload, i))
            return
        if target is WITH_EFFECTS:
            # with_effects(token, op, *args) orders an effectful op by threading a token. The
            # op runs eagerly after the program (its tensor arguments come back as outputs):
            # a linalg error check reads its info tensor and raises LinAlgError, as in eager.
            token, op, *args = node.args
            if op._schema.returns:
                raise NotImplementedError(f"torchtpu.compile: effectful op {op} with results in a graph")
            self.after.append((op, args, dict(node.kwargs)))
            self.index[node] = ("effects", (token, None, 0))
            return
        if target is _COND:
            pred, on_true, on_false, operands = node.args
            self.nodes.append(("higher_order::cond", [], [self.value(pred), self.subgraph(on_true),
                                                          self.subgraph(on_false), self.value(list(operands))]))
            self.index[node] = ("ref", self.num_inputs + len(self.nodes) - 1)
            return
        if target is _WHILE_LOOP:
            cond, body, carried, additional = node.args
            self.nodes.append(("higher_order::while_loop", [], [self.subgraph(cond), self.subgraph(body),
                                                                self.value(list(carried)), self.value(list(additional))]))
            self.index[node] = ("ref", self.num_inputs + len(self.nodes) - 1)
            return
        if target is not None and target in (_FLEX, _FLEX_BACKWARD):
            self.index[node] = self.flex_attention(node)
            return
        if target is _RUN_AND_SAVE_RNG:
            op, *args = node.args
            self.nodes.append(("torchtpu::rng_stream", [], []))
            self.draws = True
            stream = ("ref", self.num_inputs + len(self.nodes) - 1)
            # The partitioner leaves this node without a traced value; its result's getitem has one.
            result = next((u.meta.get("val") for u in node.users if u.target is operator.getitem and u.args[1] == 1), None)
            self.index[node] = ("saved_rng", (stream, self.record(op, args, node.kwargs, result, stream)))
            return
        if target is _RUN_WITH_RNG:
            state, op, *args = node.args
            self.index[node] = self.record(op, args, node.kwargs, node.meta.get("val"), self.index[state])
            return
        if not isinstance(target, torch._ops.OpOverload):
            raise NotImplementedError(f"torchtpu.compile: unsupported graph call {target}")
        text_op = text_kernel_op(target)
        if text_op is not None:
            # A StableHLO text kernel joins the program: its functions and a call of its @main.
            kernel, _ = text_op.kernel([a.meta["val"] for a in node.args])
            self.nodes.append(("torchtpu::stablehlo_kernel", ["kernel", "inputs"],
                               [("int", kernel), self.value(list(node.args))]))
            ref = self.num_inputs + len(self.nodes) - 1
            self.index[node] = ("item", (ref, 0)) if text_op._single else ("ref", ref)
            return
        self.index[node] = self.record(target, node.args, node.kwargs, node.meta.get("val"))

    def record(self, op, args, kwargs, result=None, stream=None):
        """Adds a call of `op` to the program; returns its index entry. A random op draws from
        the call's next stream, or from `stream` (the index entry of a saved one)."""
        schema = op._schema
        names, values = [], []
        # A factory's dtype=None means the default dtype when traced: the traced result says it.
        factory = isinstance(result, torch.Tensor) and not any("Tensor" in str(a.type) for a in schema.arguments)
        for k, a in enumerate(schema.arguments):
            if k < len(args):
                v = args[k]
            elif a.name in kwargs:
                v = kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                v = None
            names.append(a.name)
            if "Generator" in str(a.type):
                values.append(self.generator(op, v, stream))
            elif a.name == "dtype" and v is None and factory:
                values.append(self.value(result.dtype))
            elif a.name == "dtype" and isinstance(v, int) and not isinstance(v, bool):
                values.append(("dtype", v))  # a schema default (randint's dtype=long) is its code
            else:
                values.append(self.value(v))
        if torch.Tag.nondeterministic_seeded in op.tags and not any("Generator" in str(a.type) for a in schema.arguments):
            # A random op without a Generator argument (native_dropout) draws from the device's.
            names.append("generator")
            values.append(self.generator(op, None, stream))
        self.nodes.append((schema.name, names, values))
        return ("ref", self.num_inputs + len(self.nodes) - 1)

    def subgraph(self, attr):
        """A get_attr node naming a subgraph, as ("graph", (inputs, nodes, outputs)): its
        placeholders are the operands the control-flow node passes it."""
        gm = getattr(self.module, attr.target)
        sub = Encoder(self.bindings, gm)
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        for i, p in enumerate(placeholders):
            sub.index[p] = ("ref", i)
        sub.num_inputs = len(placeholders)
        for n in nodes:
            if n.op == "call_function":
                sub.call(n)
            elif n.op == "get_attr" and not isinstance(getattr(gm, n.target), torch.fx.GraphModule):
                raise NotImplementedError(f"torchtpu.compile: a tensor constant {n.target} inside a control-flow subgraph")
        if sub.after:
            raise NotImplementedError("torchtpu.compile: an effectful op inside a control-flow subgraph")
        self.draws |= sub.draws
        output = next(n.args[0] for n in nodes if n.op == "output")
        outputs = [sub.value(o) for o in (output if isinstance(output, (list, tuple)) else [output])]
        return ("graph", (sub.num_inputs, sub.nodes, outputs))

    def flex_attention(self, node):
        """flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
        score_mod_buffers, mask_mod_buffers) and flex_attention_backward(query, key, value,
        out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, block_mask, ...) as
        one node: the tensors, the functions as subgraphs, then the mask function, the block
        mask's key-block lists (kv_num_blocks, kv_indices and their full_ pair) and block sizes,
        the scale and the buffers. The kernel options choose among CUDA kernels: dropped."""
        backward = node.target is _FLEX_BACKWARD
        fixed = 12 if backward else 7
        args = [*node.args, *[()] * (fixed + 2 - len(node.args))]
        tensors, graphs = (args[:7], args[7:9]) if backward else (args[:3], args[3:4])
        block_mask, scale, _, score_buffers, mask_buffers = args[fixed - 3:fixed + 2]
        values = [self.value(t) for t in tensors] + [self.subgraph(g) for g in graphs] + [
            self.subgraph(block_mask[-1]), self.value(list(block_mask[2:6])),
            self.value([block_mask[-3], block_mask[-2]]), self.value(float(self.number(scale))),
            self.value(list(score_buffers)), self.value(list(mask_buffers))]
        name = "flex_attention_backward" if backward else "flex_attention"
        self.nodes.append((f"higher_order::{name}", [], values))
        ref = self.num_inputs + len(self.nodes) - 1
        return ("flex_backward", ref) if backward else ("ref", ref)

    def generator(self, op, v, stream):
        if v is not None:
            raise NotImplementedError(f"torchtpu.compile: {op} with an explicit torch.Generator in a graph")
        if stream is not None:
            if stream[0] != "ref":
                raise NotImplementedError(f"torchtpu.compile: {op} recomputed from a generator state {stream[0]}")
            return ("generator", stream[1])
        self.draws = True
        return ("generator", None)
