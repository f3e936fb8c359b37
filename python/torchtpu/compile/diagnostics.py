"""Why a frame compiles again (logged, and a warning when one frame recompiles too often), and
per-graph statistics (torch.tpu.compile_stats()["graphs"])."""
import logging
import os
import warnings

import torch

log = logging.getLogger("torchtpu.compile")

# Per dynamo frame: how often it was compiled, the last input signature, and per-graph counts.
_frames = {}
graphs = []


def recompile_warn_threshold():
    return int(os.environ.get("TORCHTPU_RECOMPILE_WARN", "8"))


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


def explain_recompile(gm, example_inputs):
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


def reset_graph_calls():
    for g in graphs:
        g["calls"] = 0


def graph_stats():
    """Per compiled graph: its frame, kind, calls, and the first call's seconds (compile + run)."""
    out = []
    for g in graphs:
        rec = _frames.get(g["frame"], {})
        out.append({**g, "frame_compiles": rec.get("compiles", 0), "last_recompile": rec.get("reason")})
    return out
