"""Op conformance against PyTorch's own OpInfo database.

For every OpInfo (or those named with --ops), every requested dtype the op supports on CPU,
and every sample input: run the op on CPU and on "tpu" (CPU fallback off: a fallback is a
failure) and compare with PyTorch's default tolerances for the dtype; for float32 ops that
support autograd, compare input gradients too. Ops run in a worker process; a crash or hang
kills only the worker and counts as a failure of that op.

    python -m torchtpu.tools.conformance [--ops add mul ...] [--dtypes float32 bfloat16 ...]
                                   [--json out.json] [--markdown out.md] [--max-samples N]
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback

DEFAULT_DTYPES = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool",
                  "complex64"]

# Ops whose values are random: only shapes and dtypes are compared.
RANDOM_OPS = ("bernoulli", "multinomial", "normal", "rand", "randn", "randint", "randperm", "uniform",
              "nn.functional.dropout", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
              "nn.functional.dropout2d", "nn.functional.dropout3d", "cauchy", "exponential", "geometric",
              "log_normal", "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
              "empty_permuted", "rand_like", "randn_like", "randint_like", "nn.functional.rrelu")


# Positional arguments PyTorch requires on the CPU whatever the op's device (CUDA too): the
# samples make them there, and they stay there.
CPU_ARGS = {"tensor_split": (0,)}


def _on_device(op, s):
    """A sample's (input, args, kwargs) on tpu, except arguments that must stay on the CPU."""
    keep = CPU_ARGS.get(op.name, ())
    args = tuple(a if i in keep else _to(a, "tpu") for i, a in enumerate(s.args))
    return _to(s.input, "tpu"), args, _to(s.kwargs, "tpu")


def _op_id(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _to(x, device):
    import torch

    if isinstance(x, torch.Tensor):
        y = x.detach().to(device)
        return y.requires_grad_(x.requires_grad) if x.requires_grad and y.is_floating_point() else y
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, torch.device) or (isinstance(x, str) and x == "cpu"):
        return device
    return x


def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _compare(got, expected, values=True):
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"expected a tensor, got {type(got).__name__}")
        if got.device.type != "tpu":
            raise AssertionError(f"result is on {got.device}, not tpu")
        got = got.cpu()
        if got.shape != expected.shape or got.dtype != expected.dtype:
            raise AssertionError(f"got {got.dtype}{list(got.shape)}, expected {expected.dtype}{list(expected.shape)}")
        if values:
            torch.testing.assert_close(got, expected, equal_nan=True, check_stride=False)
    elif isinstance(expected, (list, tuple)):
        if len(got) != len(expected):
            raise AssertionError(f"got {len(got)} results, expected {len(expected)}")
        for g, e in zip(got, expected):
            _compare(g, e, values)
    elif values and isinstance(expected, float) and expected != expected:
        if got == got:
            raise AssertionError(f"got {got}, expected nan")
    elif values and got != expected:
        raise AssertionError(f"got {got!r}, expected {expected!r}")


def _short(e):
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    return msg[0][:300] if msg else type(e).__name__


def _run_one(op, dtype, max_samples, grads):
    """Counts for one (op, dtype): forward and gradient passed/failed/errored + first errors."""
    import torch

    r = {"passed": 0, "failed": 0, "errored": 0, "first_error": None,
         "grad_passed": 0, "grad_failed": 0, "grad_errored": 0, "grad_first_error": None}
    values = not any(_op_id(op) == n or _op_id(op).startswith(n + ".") for n in RANDOM_OPS)
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:max_samples]
    except Exception as e:  # noqa: BLE001 - an OpInfo that can't make samples is skipped
        r["skipped"] = _short(e)
        return r
    for s in samples:
        torch.manual_seed(0)
        # Copy to tpu first: in-place ops modify the CPU sample.
        dev_input, dev_args, dev_kwargs = _on_device(op, s)
        try:
            expected = op(s.input, *s.args, **s.kwargs)
        except Exception:  # noqa: BLE001 - CPU rejects it: nothing to compare
            continue
        try:
            got = op(dev_input, *dev_args, **dev_kwargs)
        except Exception as e:  # noqa: BLE001
            r["errored"] += 1
            r["first_error"] = r["first_error"] or _short(e)
            continue
        try:
            _compare(got, expected, values)
            r["passed"] += 1
        except Exception as e:  # noqa: BLE001
            r["failed"] += 1
            r["first_error"] = r["first_error"] or _short(e)
    if grads and op.supports_autograd and dtype == torch.float32 and values:
        try:
            gsamples = list(op.sample_inputs("cpu", dtype, requires_grad=True))[:max_samples]
        except Exception:  # noqa: BLE001
            gsamples = []
        for s in gsamples:
            outcome = _grad_sample(op, s)
            if outcome is None:
                continue
            kind, err = outcome
            r["grad_" + kind] += 1
            if err:
                r["grad_first_error"] = r["grad_first_error"] or err
    return r


def _grad_sample(op, s):
    """('passed'|'failed'|'errored', message) or None when CPU has no gradient to compare."""
    import torch

    leaves = [t for t in _tensors([s.input, s.args, s.kwargs]) if t.requires_grad]
    try:
        out = [t for t in _tensors(op(s.input, *s.args, **s.kwargs)) if t.requires_grad]
        if not leaves or not out:
            return None
        gens = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i), dtype=o.dtype) for i, o in enumerate(out)]
        expected = torch.autograd.grad(out, leaves, gens, allow_unused=True)
    except Exception:  # noqa: BLE001
        return None
    try:
        inp, args, kwargs = _on_device(op, s)
        dleaves = [t for t in _tensors([inp, args, kwargs]) if t.requires_grad]
        dout = [t for t in _tensors(op(inp, *args, **kwargs)) if t.requires_grad]
        got = torch.autograd.grad(dout, dleaves, [g.to("tpu") for g in gens], allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return "errored", _short(e)
    try:
        for g, e in zip(got, expected):
            if e is None:
                continue
            if g is None:
                raise AssertionError("missing gradient")
            torch.testing.assert_close(g.cpu(), e, equal_nan=True, atol=1e-4, rtol=1e-4)
        return "passed", None
    except Exception as e:  # noqa: BLE001
        return "failed", _short(e)


def _worker(conn, dtypes, max_samples, grads):
    os.environ.pop("TORCHTPU_CPU_FALLBACK", None)
    import warnings

    import torch

    import torchtpu  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db

    warnings.filterwarnings("ignore")
    ops = {_op_id(o): o for o in op_db}
    while True:
        name = conn.recv()
        if name is None:
            return
        op = ops[name]
        out = {}
        for dt in dtypes:
            dtype = getattr(torch, dt)
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                out[dt] = _run_one(op, dtype, max_samples, grads)
            except Exception as e:  # noqa: BLE001
                out[dt] = {"passed": 0, "failed": 0, "errored": 1, "first_error": "harness: " + _short(e)}
                traceback.print_exc()
        conn.send(out)


class _Worker:
    def __init__(self, dtypes, max_samples, grads):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, dtypes, max_samples, grads), daemon=True)
        self.proc.start()

    def run(self, name, timeout):
        self.conn.send(name)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        return None

    def stop(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


def all_op_names():
    from torch.testing._internal.common_methods_invocations import op_db

    return [_op_id(o) for o in op_db]


def run(names, dtypes, max_samples=20, grads=True, timeout=300, log=sys.stderr):
    results = {}
    worker = None
    for i, name in enumerate(names):
        if worker is None:
            worker = _Worker(dtypes, max_samples, grads)
        t0 = time.time()
        out = worker.run(name, timeout)
        if out is None:
            alive = worker.proc.is_alive()
            worker.stop()
            why = "timeout" if alive else f"crash (exit code {worker.proc.exitcode})"
            worker = None
            out = {"all": {"passed": 0, "failed": 0, "errored": 1, "first_error": f"harness: {why}", "crashed": True}}
        results[name] = out
        if log:
            summary = " ".join(f"{d}:{v.get('passed', 0)}/{v.get('passed', 0) + v.get('failed', 0) + v.get('errored', 0)}"
                               for d, v in out.items())
            print(f"[{i + 1}/{len(names)}] {name} {summary} ({time.time() - t0:.1f}s)", file=log, flush=True)
    if worker is not None:
        worker.conn.send(None)
        worker.proc.join(timeout=10)
        worker.stop()
    return results


def summarize(results, dtypes):
    lines = []
    totals = {}
    crashes = 0
    for name, per in results.items():
        for dt, r in per.items():
            if r.get("crashed"):
                crashes += 1
            t = totals.setdefault(dt, [0, 0, 0, 0])
            t[0] += r.get("passed", 0)
            t[1] += r.get("passed", 0) + r.get("failed", 0) + r.get("errored", 0)
            t[2] += r.get("grad_passed", 0)
            t[3] += r.get("grad_passed", 0) + r.get("grad_failed", 0) + r.get("grad_errored", 0)
    for dt in dtypes:
        if dt in totals:
            p, n, gp, gn = totals[dt]
            part = f"{dt} {p}/{n} ({100 * p / max(n, 1):.1f}%)"
            if gn:
                part += f", grad {gp}/{gn} ({100 * gp / max(gn, 1):.1f}%)"
            lines.append(part)
    return f"conformance: {len(results)} OpInfos; " + "; ".join(lines) + f"; crashes {crashes}"


def markdown(results):
    rows = ["| op | dtype | passed | failed | errored | grad passed/total | first error |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, per in sorted(results.items()):
        for dt, r in per.items():
            gn = r.get("grad_passed", 0) + r.get("grad_failed", 0) + r.get("grad_errored", 0)
            grad = f"{r.get('grad_passed', 0)}/{gn}" if gn else ""
            err = (r.get("first_error") or r.get("grad_first_error") or r.get("skipped") or "").replace("|", "\\|")
            rows.append(f"| {name} | {dt} | {r.get('passed', 0)} | {r.get('failed', 0)} | {r.get('errored', 0)} | "
                        f"{grad} | {err[:160]} |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="*", help="OpInfo names (default: all)")
    p.add_argument("--dtypes", nargs="*", default=DEFAULT_DTYPES)
    p.add_argument("--max-samples", type=int, default=20)
    p.add_argument("--no-grads", action="store_true")
    p.add_argument("--timeout", type=float, default=300, help="seconds per OpInfo before it counts as hung")
    p.add_argument("--json", default="conformance.json")
    p.add_argument("--markdown", default="conformance.md")
    a = p.parse_args(argv)
    names = all_op_names()
    if a.ops:
        wanted = set(a.ops)
        names = [n for n in names if n in wanted or n.split(".")[0] in wanted]
        missing = wanted - {n for n in names} - {n.split(".")[0] for n in names}
        if missing:
            p.error(f"no OpInfo named: {', '.join(sorted(missing))}")
    results = run(names, a.dtypes, a.max_samples, not a.no_grads, a.timeout)
    line = summarize(results, a.dtypes)
    with open(a.json, "w") as f:
        json.dump({"summary": line, "results": results}, f, indent=1)
    with open(a.markdown, "w") as f:
        f.write(line + "\n\n" + markdown(results))
    print(line)
    return results


if __name__ == "__main__":
    main()
