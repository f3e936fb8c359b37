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

# c10::ScalarType codes of the dtypes the lowerings know (the table lives in Rust).
_DTYPE_CODES = {getattr(torch, name): code for code, name in _C.dtype_codes()}


_WITH_EFFECTS = getattr(torch.ops.higher_order, "with_effects", None)
# Activation checkpointing's random ops: the forward saves each one's generator state, the
# backward recomputes it from that state (torch._functorch.partitioners.functionalize_rng_ops).
_RUN_AND_SAVE_RNG = torch._prims.rng_prims.run_and_save_rng_state
_RUN_WITH_RNG = torch._prims.rng_prims.run_with_rng_state
_COND = getattr(torch.ops.higher_order, "cond", None)
_WHILE_LOOP = getattr(torch.ops.higher_order, "while_loop", None)


class _Encoder:
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
        if isinstance(v, torch.fx.Node) and v not in self.index and _number_meta(v) is not None:
            return _concrete(_number_meta(v), self.bindings)
        return _concrete(v, self.bindings)

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
            if v not in _DTYPE_CODES:
                raise NotImplementedError(f"torchtpu.compile: dtype {v} is not supported")
            return ("dtype", _DTYPE_CODES[v])
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
        if _number_meta(node) is not None:
            return  # sizes are evaluated where they are used
        if target is operator.getitem:
            src, i = node.args
            kind, payload = self.index[src]
            if kind == "saved_rng":  # (the op's stream, the op's result)
                self.index[node] = payload[i]
                return
            if kind == "effects":
                token, inner, returns = payload
                # Item 0 is the effect token (handed back as the graph got it); the op's own
                # results follow.
                self.index[node] = ("token", token) if i == 0 else (inner if returns == 1 else ("item", (inner[1], i - 1)))
                return
            self.index[node] = ("item", (payload, i))
            return
        if target is _WITH_EFFECTS:
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
        text_op = _text_kernel_op(target)
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
        sub = _Encoder(self.bindings, gm)
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

    def generator(self, op, v, stream):
        if v is not None:
            raise NotImplementedError(f"torchtpu.compile: {op} with an explicit torch.Generator in a graph")
        if stream is not None:
            if stream[0] != "ref":
                raise NotImplementedError(f"torchtpu.compile: {op} recomputed from a generator state {stream[0]}")
            return ("generator", stream[1])
        self.draws = True
        return ("generator", None)


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
    """Per graph input: name -> (sizes, dtype, strides, dynamic dims) for tensors, or its value
    for plain numbers. Symbolic sizes (sizes dynamo made dynamic) are shown by the example's
    value and listed as dynamic; the symbolic size inputs themselves are left out."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sig = {}
    for node, x in zip(placeholders, example_inputs):
        # Dynamo hands the backend real inputs; the graph's placeholders hold the symbolic ones.
        traced = node.meta.get("example_value", x)
        if isinstance(x, torch.Tensor):
            shape = traced.shape if isinstance(traced, torch.Tensor) else x.shape
            dynamic = tuple(i for i, d in enumerate(shape) if isinstance(d, torch.SymInt))
            sig[node.name] = (tuple(x.shape), x.dtype, tuple(x.stride()), dynamic)
        elif not isinstance(traced, torch.SymInt):
            sig[node.name] = repr(x)
    return sig


def _changes(old, new):
    out = []
    for name, now in new.items():
        before = old.get(name)
        if before is None:
            out.append(f"new input {name}")
        elif isinstance(now, str) or isinstance(before, str):
            if before != now:
                out.append(f"input {name} changed value {before} -> {now}")
        else:
            (shape, dtype, stride, dyn), (shape2, dtype2, stride2, dyn2) = before, now
            if dyn2 != dyn and dyn2:
                out.append(f"input {name} shape {list(shape)} -> {list(shape2)}: dims {list(dyn2)} are now dynamic "
                           "(this graph is lowered per size without new traces)")
            elif shape != shape2:
                out.append(f"input {name} shape {list(shape)} -> {list(shape2)}")
            elif dtype != dtype2:
                out.append(f"input {name} dtype {dtype} -> {dtype2}")
            elif stride != stride2:
                out.append(f"input {name} strides {list(stride)} -> {list(stride2)}")
    out += [f"input {name} is gone" for name in old if name not in new]
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
    if rec is None or cid.frame_compile_id == 0:  # a frame's first compile (frame ids restart at dynamo.reset())
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


def _fuse_cross_entropy_backward(gm):
    """Rewrites cross-entropy's backward, _log_softmax_backward_data(nll_loss_backward(...)),
    as r * (one_hot - exp(log_probs)) with r each row's -weight * grad (0 where its target is
    ignored or outside [0, C)): the same value, without the one-hot gradient materialized and
    summed over every class again (`G - exp(out) * G.sum(1)`, where G.sum(1) is r). For 2-d
    log-probabilities of known size only."""
    aten = torch.ops.aten
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten._log_softmax_backward_data.default:
            continue
        grad, out, dim, dtype = node.args[:4]
        if not (isinstance(grad, torch.fx.Node) and grad.target is aten.nll_loss_backward.default
                and len(grad.users) == 1 and isinstance(out, torch.fx.Node)):
            continue
        g, logp, target, weight, reduction, ignore_index, total_weight = grad.args[:7]
        val = out.meta.get("val")
        if (not isinstance(val, torch.Tensor) or val.dim() != 2 or dim not in (1, -1) or val.dtype != dtype
                or not isinstance(val.shape[1], int) or not isinstance(reduction, int) or not isinstance(ignore_index, int)):
            continue
        classes = val.shape[1]
        acc = torch.float64 if dtype == torch.float64 else torch.float32  # as nll_loss sums
        with graph.inserting_before(node):
            def f(op, *args, **kwargs):
                return graph.call_function(op, args, kwargs)

            counted = f(aten.logical_and.default, f(aten.ne.Scalar, target, ignore_index),
                        f(aten.logical_and.default, f(aten.ge.Scalar, target, 0), f(aten.lt.Scalar, target, classes)))
            r = f(aten.neg.default, f(aten._to_copy.default, g, dtype=acc))
            if weight is not None:
                clamped = f(aten.clamp.default, target, 0, classes - 1)
                r = f(aten.mul.Tensor, r, f(aten._to_copy.default, f(aten.index_select.default, weight, 0, clamped), dtype=acc))
            if reduction == 1:  # mean
                r = f(aten.div.Tensor, r, total_weight)
            r = f(aten.where.ScalarOther, counted, r, 0.0)
            r = f(aten.unsqueeze.default, f(aten._to_copy.default, r, dtype=dtype), 1)
            classes_row = f(aten.arange.start, 0, classes, dtype=torch.int64, device=val.device)
            one_hot = f(aten._to_copy.default, f(aten.eq.Tensor, classes_row, f(aten.unsqueeze.default, target, 1)),
                        dtype=dtype)
            fused = f(aten.mul.Tensor, f(aten.sub.Tensor, one_hot, f(aten.exp.default, out)), r)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(grad)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm


def compile_graph(gm, example_inputs, kind="forward", frame=None):
    """Compiles one ATen FX graph (the fw or bw compiler of AOTAutograd).

    A graph with symbolic sizes (`dynamic=True`, `mark_dynamic`) is lowered once per set of
    concrete sizes it meets, when it meets them: the lowerings and executables are static, and
    each new specialization is logged."""
    from functorch.compile import make_boxed_func

    gm = _fuse_cross_entropy_backward(gm)
    nodes = list(gm.graph.nodes)
    if any(_runs_eagerly(n) for n in nodes):
        return make_boxed_func(_split_around_eager_ops(gm, kind, frame))  # called as split(*args)
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
    tokens = {n.args[0] for n in nodes if n.op == "call_function" and n.target is _WITH_EFFECTS}
    host = _HostPart(nodes, placeholders, example_inputs)
    host_writes = {i: n for i, n in host_writes.items() if n not in host.computed}  # else written on the host
    # The tensor inputs the device program reads (host ones only where a device op uses them).
    tensor_inputs = [i for i, x in enumerate(example_inputs)
                     if isinstance(x, torch.Tensor) and placeholders[i] not in tokens
                     and (x.device.type == "tpu" or placeholders[i] in host.read_by_device)]
    symbolic = _is_symbolic(nodes)
    # A graph that reads no tensor (it only makes some) still needs one for the dispatcher to
    # find the device: an empty one, which the program ignores.
    anchor = not tensor_inputs and not constants[0] and not host.packs and not host.single
    stats = {"graph": None, "frame": frame, "kind": kind, "nodes": 0, "calls": 0, "first_call_seconds": None,
             "specializations": 0}
    _graphs.append(stats)

    def specialize(bindings):
        """Registers the graph with every symbolic size replaced by its value in `bindings`."""
        enc = _Encoder(bindings, gm)
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
            elif isinstance(o, torch.fx.Node) and _number_meta(o) is not None:
                plan.append(("const", _concrete(_number_meta(o), bindings)))
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
        graph_id, plan, host_copies, after, has_outputs, bindings, draws = static or _lookup(
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


def _is_collective(node):
    """Whether a graph node is a functional collective (all_reduce, wait_tensor, ...)."""
    return node.op == "call_function" and getattr(node.target, "namespace", None) == "_c10d_functional"


_AUTO_FUNCTIONALIZED = tuple(op for op in (getattr(torch.ops.higher_order, "auto_functionalized", None),
                                           getattr(torch.ops.higher_order, "auto_functionalized_v2", None)) if op)


def _text_kernel_op(target):
    """The torchtpu.kernels op of a StableHLO text kernel, if `target` is one."""
    from .kernels import _TEXT_OPS

    name = getattr(target, "_schema", None) and target._schema.name
    return _TEXT_OPS.get(name) if name else None


def _runs_eagerly(node):
    """Whether a node runs eagerly between the graph's programs: functional collectives (they
    run through the c10d backend), custom ops that mutate their inputs (auto_functionalized),
    and ops without a lowering (custom ops implemented in Python)."""
    if node.op != "call_function":
        return False
    if _is_collective(node) or node.target in _AUTO_FUNCTIONALIZED:
        return True
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and _number_meta(node) is None
            and target.namespace not in ("torchtpu",) and not _C.is_lowered(target._schema.name)
            and _text_kernel_op(target) is None)


class _CompiledOnFirstCall(torch.nn.Module):
    """A piece of a split graph, compiled with the inputs of its first call."""

    def __init__(self, piece, kind, frame):
        super().__init__()
        self.piece, self.kind, self.frame, self.fn = piece, kind, frame, None

    def forward(self, *args):
        if self.fn is None:
            self.fn = _compiled_or_eager(self.piece, list(args), self.kind, self.frame)
        return self.fn(list(args))


def _split_around_eager_ops(gm, kind, frame):
    """A graph with nodes that run eagerly (see `_runs_eagerly`) runs as device programs split
    around them: each run of such nodes runs eagerly, each piece between them is compiled like
    a graph of its own."""
    from torch.fx.passes.split_module import split_module

    parts, current, in_eager, eager_nodes = {}, 0, False, set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        # The items of an eager node's results are taken where it runs (pieces pass tensors).
        eager = _runs_eagerly(node) or (node.target is operator.getitem and node.args[0] in eager_nodes)
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
    names = sorted({str(n.target) for n in parts if _runs_eagerly(n)})
    log.info("torchtpu.compile: %s graph split around %d run(s) of ops that run eagerly: %s", kind, len(eager),
             ", ".join(names))
    return split


class _HostPart:
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
            if n.op != "call_function" or _number_meta(n) is not None or not _on_cpu(n.meta.get("val")):
                continue
            if all(a in host or _number_meta(a) is not None for a in _node_args(n)):
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
            return _concrete(_number_meta(a), bindings)

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


# ---- symbolic sizes ------------------------------------------------------------------------------

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _number_meta(node):
    """The value of a node that computes a number (a size, `sym_size`, arithmetic on sizes)."""
    v = node.meta.get("val")
    return v if isinstance(v, (*_SYM_TYPES, int, float, bool)) else None


def _is_symbolic(nodes):
    import sympy

    def sym(v):
        return isinstance(v, _SYM_TYPES) and not sympy.sympify(v.node.expr).is_number

    for n in nodes:
        v = n.meta.get("val")
        if sym(v) or (isinstance(v, torch.Tensor) and any(sym(d) for d in (*v.shape, *v.stride()))):
            return True
    return False


def _concrete(v, bindings):
    """A number or symbolic number, evaluated with the sizes in `bindings` (symbol -> int)."""
    if not isinstance(v, _SYM_TYPES):
        return v
    import sympy

    expr = sympy.sympify(sympy.sympify(v.node.expr).xreplace(bindings))
    if not expr.is_number:
        raise NotImplementedError(f"torchtpu.compile: the size {v.node.expr} depends on {sorted(map(str, expr.free_symbols))}, "
                                  "which no graph input determines")
    return bool(expr) if isinstance(v, torch.SymBool) else float(expr) if isinstance(v, torch.SymFloat) else int(expr)


def _lookup(by_sizes, placeholders, args, specialize):
    """The specialization of a symbolic graph for the sizes of these inputs (made on first use)."""
    import sympy

    bindings = {}

    def bind(sym, value):
        if isinstance(sym, torch.SymInt) and isinstance(sym.node.expr, sympy.Symbol):
            bindings[sym.node.expr] = int(value)

    for node, a in zip(placeholders, args):
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor):
            for sym, n in zip((*meta.shape, *meta.stride(), meta.storage_offset()), (*a.shape, *a.stride(), a.storage_offset())):
                bind(sym, n)
        else:
            bind(meta, a)
    key = tuple(bindings.items())
    found = by_sizes.get(key)
    if found is None:
        found = by_sizes[key] = specialize(bindings)
    return found


# Keys per block of blockwise flex attention: a longer key sequence is attended block by block
# (scores of [batch, heads, queries, FLEX_KV_BLOCK] at a time), a shorter one in one block.
FLEX_KV_BLOCK = 512
# Block sparsity of a mask_mod that reads positions only (causal, sliding window, prefix): the
# mask is evaluated when the graph compiles, on blocks of FLEX_SPARSE_BLOCK queries and keys, and
# the queries are attended in up to FLEX_ROW_GROUPS groups of rows, each over only the span of
# keys its blocks reach. Masks of more than FLEX_MASK_EVAL_LIMIT positions are not evaluated.
FLEX_SPARSE_BLOCK = 128
FLEX_ROW_GROUPS = 8
FLEX_MASK_EVAL_LIMIT = 1 << 28


def _flex_row_groups(mask_mod, kept, mask_mod_buffers, sizes):
    """[(first row, end row, first key, end key)] covering every query row: the keys each group
    of rows needs (an empty span where none of its keys is kept), or None where the mask is not
    known when the graph compiles (it reads tensors) or skipping would save under a tenth."""
    import torch.fx
    from torch.utils._python_dispatch import _disable_current_modes

    if mask_mod_buffers or not all(isinstance(n, int) for n in sizes) or not isinstance(mask_mod, torch.fx.GraphModule):
        return None
    batch, heads, rows, keys = sizes
    blk = FLEX_SPARSE_BLOCK
    if rows < 2 * blk:
        return None
    # Positions the mask does not read are evaluated once (b and h unused: one batch, one head).
    used = [bool(n.users) for n in mask_mod.graph.nodes if n.op == "placeholder"][:2]
    b_n, h_n = (n if u else 1 for n, u in zip((batch, heads), used))
    if b_n * h_n * rows * keys > FLEX_MASK_EVAL_LIMIT:
        return None
    spans = []
    with _disable_current_modes():  # real tensors on the host, outside the trace
        b, h, n = torch.arange(b_n), torch.arange(h_n), torch.arange(keys)
        for r0 in range(0, rows, blk):
            hit = kept(b, h, torch.arange(r0, min(r0 + blk, rows)), n).reshape(-1, keys).any(0).nonzero()
            spans.append((int(hit[0]) // blk * blk, min((int(hit[-1]) // blk + 1) * blk, keys)) if len(hit) else (0, 0))
    # Neighbouring blocks with the same span form one group; then, while there are too many
    # groups, the two neighbours whose union adds the least computed area merge.
    groups = []
    for i, span in enumerate(spans):
        r0, r1 = i * blk, min((i + 1) * blk, rows)
        if groups and groups[-1][2:] == span:
            groups[-1][1] = r1
        else:
            groups.append([r0, r1, *span])

    def area(g):
        return (g[1] - g[0]) * (g[3] - g[2])

    def union(a, c):
        lo = [x for x in (a[2:], c[2:]) if x[1] > x[0]]
        return [a[0], c[1], min(x[0] for x in lo), max(x[1] for x in lo)] if lo else [a[0], c[1], 0, 0]

    while len(groups) > FLEX_ROW_GROUPS:
        i = min(range(len(groups) - 1), key=lambda i: area(union(groups[i], groups[i + 1])) - area(groups[i]) - area(groups[i + 1]))
        groups[i:i + 2] = [union(groups[i], groups[i + 1])]
    if sum(map(area, groups)) > 0.9 * rows * keys:
        return None
    return [tuple(g) for g in groups]


def _flex_listed_blocks(block_mask, rows, keys, device):
    """The BlockMask's block lists as a dense [B, H, query blocks, key blocks] bool tensor (a
    block listed as partial or full), with its (query, key) block sizes; None where the tuple
    is not one this function knows (its layout: seq lengths, kv_num_blocks, kv_indices,
    full_kv_num_blocks, full_kv_indices, ..., Q_BLOCK_SIZE, KV_BLOCK_SIZE, mask_mod)."""
    if len(block_mask) < 9:
        return None
    q_blk, kv_blk = block_mask[-3], block_mask[-2]
    num, idx, full_num, full_idx = block_mask[2:6]
    if not (isinstance(q_blk, int) and isinstance(kv_blk, int) and isinstance(num, torch.Tensor)
            and isinstance(idx, torch.Tensor) and idx.dim() == 4 and num.shape == idx.shape[:3]):
        return None
    n_q, n_k = -(-rows // q_blk), -(-keys // kv_blk)
    if idx.size(2) != n_q:
        return None

    def dense(num, idx):
        # Slots past a row's count write to a spare column, dropped after.
        used = torch.arange(idx.size(-1), device=device) < num[..., None]
        at = torch.where(used, idx.long().clamp(0, n_k), n_k)
        hit = torch.zeros((*idx.shape[:3], n_k + 1), dtype=torch.bool, device=device)
        return hit.scatter(-1, at, True)[..., :n_k]

    listed = dense(num, idx)
    if isinstance(full_num, torch.Tensor) and isinstance(full_idx, torch.Tensor):
        listed = listed | dense(full_num, full_idx)
    return listed, q_blk, kv_blk


def _flex_tiles(rows, keys, q_blk, kv_blk):
    """Tiles (first row, end row, first key, end key) of the runtime block skipping: at most
    FLEX_ROW_GROUPS groups of rows by FLEX_ROW_GROUPS spans of keys, on the BlockMask's blocks."""
    n_q, n_k = -(-rows // q_blk), -(-keys // kv_blk)
    gq, gk = -(-n_q // FLEX_ROW_GROUPS) * q_blk, -(-n_k // FLEX_ROW_GROUPS) * kv_blk
    return [(r0, min(r0 + gq, rows), k0, min(k0 + gk, keys)) for r0 in range(0, rows, gq) for k0 in range(0, keys, gk)]


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous: a cond's backward needs the gradients
    of both branches laid out alike, and the skipping branch's are zeros."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _flex_attention_in_blocks(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_buffers=(),
                              mask_mod_buffers=(), outputs=3):
    """flex_attention's higher-order op as aten ops AOTAutograd traces (forward and backward
    become part of the graph's one program), with its semantics (PyTorch's math form): scores
    in float32 (float64 for float64 inputs), score_mod and mask_mod applied elementwise with
    vmap, rows with no key left give zeros. Over the keys in blocks of FLEX_KV_BLOCK, each
    block's softmax numerators summed into a running one, so the forward holds one block's
    scores at a time; each block is checkpointed (backward recomputes its scores rather than
    keeping them all). Key blocks a mask excludes entirely are skipped: for a mask that reads
    positions only, found when the graph compiles (`_flex_row_groups`); for one that reads
    tensors (document ids), at run time from the BlockMask's block lists, each tile of rows
    and keys under a `cond` (as compiled flex attention does, an unlisted block counts as
    masked). Returns (out, logsumexp, max score)[:outputs], the last two in base 2 as the op's
    are."""
    import math

    import torch.utils.checkpoint as checkpoint
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv

    groups = query.size(1) // key.size(1)
    key, value = (torch.repeat_interleave(t, groups, dim=1) for t in (key, value))
    batch = query.size(0)
    if key.size(0) != batch and not (key.size(0) == 1 and batch > 1):
        raise RuntimeError(f"Bq and Bkv must broadcast. Got Bq={batch} and Bkv={key.size(0)}")
    key, value = (t.expand(batch, *t.shape[1:]) for t in (key, value))
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    scored = _vmap_for_bhqkv(score_mod, prefix=(0,), suffix=(None,) * len(score_mod_buffers))
    kept = _vmap_for_bhqkv(block_mask[-1], prefix=(), suffix=(None,) * len(mask_mod_buffers))
    dev = query.device
    n_score = len(score_mod_buffers)
    buffers = (*score_mod_buffers, *mask_mod_buffers)

    def attend(q, k, v, rows, start, stop, *buffers):
        """One block of keys: its row maxima, the shift used (0 for rows with no key here),
        and the sums and value products of exp(score - shift)."""
        b, h = (torch.arange(n, device=dev) for n in q.shape[:2])
        m = torch.arange(*rows, device=dev)
        n = torch.arange(start, stop, device=dev)
        scores = ((q @ k.to(work).transpose(-2, -1)) * scale).to(work)
        with TransformGetItemToIndex():
            scores = torch.where(kept(b, h, m, n, *buffers[n_score:]), scored(scores, b, h, m, n, *buffers[:n_score]),
                                 torch.full((), -math.inf, dtype=work, device=dev))
        top = scores.amax(-1)
        shift = torch.where(top == -math.inf, 0.0, top)
        p = torch.exp(scores - shift[..., None])
        return top, shift, p.sum(-1), (p.to(query.dtype) @ v.to(query.dtype)).to(work)

    def fade(row_max, shift):
        return torch.exp(torch.where(row_max == -math.inf, -math.inf, row_max - shift))

    def merge(state, part):
        """Two running softmax states (max, shift, sum, value products) as one."""
        if state is None:
            return part
        (run_max, run_shift, run_sum, acc), (top, shift, sums, outs) = state, part
        new_max = torch.maximum(run_max, top)
        new_shift = torch.where(new_max == -math.inf, 0.0, new_max)
        old, new = fade(run_max, new_shift), fade(top, new_shift)
        return new_max, new_shift, run_sum * old + sums * new, acc * old[..., None] + outs * new[..., None]

    def after(q, state):
        # A block's queries depend on the last block's result (a zero added): the compiler
        # then runs one block after another rather than every block's scores at once.
        return q if state is None else q + (state[1] * 0.0)[..., None]

    def checkpointed(f, *args):
        return checkpoint.checkpoint(f, *args, use_reentrant=False)

    def span(q, k, v, r0, r1, k0, *buffers, save=checkpointed):
        """The running softmax state of rows r0:r1 (q) over the keys k (starting at key k0)."""
        state = None
        for start in range(0, k.size(2), FLEX_KV_BLOCK):
            stop = min(start + FLEX_KV_BLOCK, k.size(2))
            part = save(attend, after(q, state), k[:, :, start:stop], v[:, :, start:stop], (r0, r1),
                        k0 + start, k0 + stop, *buffers)
            state = merge(state, part)
        return state

    def none_seen(q, r0, r1):
        shape = (*q.shape[:2], r1 - r0)
        ninf = torch.full(shape, -math.inf, dtype=work, device=dev)
        return ninf, torch.zeros(shape, dtype=work, device=dev), torch.zeros(shape, dtype=work, device=dev), \
            torch.zeros((*shape, value.size(-1)), dtype=work, device=dev)

    def finish(state):
        run_max, run_shift, run_sum, acc = state
        empty = run_sum == 0
        out = torch.where(empty[..., None], 0.0, acc / torch.where(empty, 1.0, run_sum)[..., None])
        lse = torch.where(empty, -math.inf, torch.log(torch.where(empty, 1.0, run_sum)) + run_shift)
        return out.to(query.dtype), lse, run_max

    def attend_rows(q, r0, r1, k0, k1):
        """Rows r0:r1 over keys k0:k1 (every other key of theirs masked)."""
        q = q[:, :, r0:r1]
        if k1 <= k0:
            return finish(none_seen(q, r0, r1))
        return finish(span(q, key[:, :, k0:k1], value[:, :, k0:k1], r0, r1, k0, *buffers))

    def attend_tiles(q, listed, q_blk, kv_blk, tiles):
        """Each tile's rows over its keys where the block lists list any of its blocks, else
        nothing (a cond: only the taken branch runs; its backward recomputes the forward)."""
        cond = torch.ops.higher_order.cond
        parts, state, row = [], None, None
        for r0, r1, k0, k1 in tiles:
            if row is not None and row != (r0, r1):
                parts.append(finish(state))
                state = None
            row = (r0, r1)
            seen = listed[:, :, r0 // q_blk:-(-r1 // q_blk), k0 // kv_blk:-(-k1 // kv_blk)].any()
            qr = after(q[:, :, r0:r1], state)

            def on(*operands, r0=r0, r1=r1, k0=k0):
                qr, k, v, *buffers = map(_ContiguousGrad.apply, operands)
                return span(qr, k, v, r0, r1, k0, *buffers, save=lambda f, *a: f(*a))

            def off(qr, k, v, *buffers, r0=r0, r1=r1):
                return none_seen(qr, r0, r1)

            part = cond(seen, on, off, (qr, key[:, :, k0:k1], value[:, :, k0:k1], *buffers))
            state = merge(state, tuple(part))
        parts.append(finish(state))
        return parts

    q = query.to(work)
    sizes = (batch, query.size(1), query.size(2), key.size(2))
    spans = _flex_row_groups(block_mask[-1], kept, mask_mod_buffers, sizes)
    runtime = spans is None and mask_mod_buffers and all(isinstance(n, int) for n in sizes)
    listed = _flex_listed_blocks(block_mask, *sizes[2:], dev) if runtime else None
    tiles = None if listed is None else _flex_tiles(*sizes[2:], *listed[1:])
    if tiles is not None and len(tiles) > 1:
        parts = attend_tiles(q, *listed, tiles)
    else:
        parts = [attend_rows(q, *span) for span in spans or [(0, sizes[2], 0, sizes[3])]]
    out, lse, run_max = (torch.cat(p, dim=2) if len(parts) > 1 else p[0] for p in zip(*parts))
    return (out, lse / math.log(2), run_max / math.log(2))[:outputs]


def _inline_higher_order_ops(gm):
    """Replaces higher-order ops that have an aten form by that form, before AOTAutograd."""
    flex = getattr(torch.ops.higher_order, "flex_attention", None)
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and flex is not None and node.target is flex:
            traced = node.meta.get("example_value", node.meta.get("val"))
            node.target = _flex_attention_in_blocks
            if isinstance(traced, (tuple, list)):
                node.kwargs = {**node.kwargs, "outputs": len(traced)}
            changed = True
    if changed:
        gm.recompile()
    return gm


def backend(gm, example_inputs, **kwargs):
    """The dynamo backend registered as "tpu"."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    frame = _explain_recompile(gm, example_inputs)
    gm = _inline_higher_order_ops(gm)

    def fw(g, ex):
        return _compiled_or_eager(g, ex, "forward", frame)

    def bw(g, ex):
        return _compiled_or_eager(g, ex, "backward", frame)

    # The min-cut partitioner (inductor's) saves fewer activations for backward and recomputes
    # cheap elementwise ops there: whole-layer memory is what limits batch sizes on a device.
    from functorch.compile import min_cut_rematerialization_partition

    return aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=_decompositions(),
                        partition_fn=min_cut_rematerialization_partition,
                        keep_inference_input_mutations=True)(gm, example_inputs)


def _unsupported(e):
    """Whether an error says the graph has something the lowerings cannot compile."""
    return isinstance(e, NotImplementedError) and str(e).startswith("torchtpu.compile:")


def _compiled_or_eager(gm, example_inputs, kind, frame):
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
