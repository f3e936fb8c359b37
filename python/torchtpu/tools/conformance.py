"""Op conformance against PyTorch's own OpInfo database.

For every OpInfo (or those named with --ops), every requested dtype the op supports on CPU,
and every sample input: run the op on CPU and on "tpu" (CPU fallback off: a fallback is a
failure) and compare with PyTorch's default tolerances for the dtype; for float32 ops that
support autograd, compare input gradients too. Then PyTorch's other per-op checks (its
test_ops TestCommon), written here over the same samples:

    out           out= gives CPU's values in the tensor passed; a nonempty out of another shape
                  is resized with CPU's warning; an out of a dtype the result cannot be cast
                  to, or on another device, is refused as CPU refuses it
    variants      the function, method and in-place forms agree
    noncontiguous samples whose tensors are strided views give CPU's values
    error_inputs  the OpInfo's error inputs raise the class and message it names
    dtypes        the dtypes that run on tpu are those that run on CPU (first sample each)

Ops run in a worker process; a crash or hang kills only the worker and counts as a failure of
that op.

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

CHECKS = ("out", "variants", "noncontiguous", "error_inputs", "dtypes")
# The dtypes the dtypes check tries (PyTorch's test_dtypes tries every dtype it knows).
PROBED_DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                 "complex64", "complex128"]

DEFAULT_DTYPES = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool",
                  "complex64"]

# Ops whose values are random: only shapes and dtypes are compared.
RANDOM_OPS = ("bernoulli", "multinomial", "normal", "rand", "randn", "randint", "randperm", "uniform",
              "nn.functional.dropout", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
              "nn.functional.dropout2d", "nn.functional.dropout3d", "cauchy", "exponential", "geometric",
              "log_normal", "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
              "empty_permuted", "rand_like", "randn_like", "randint_like", "nn.functional.rrelu")


# The key of the per-op (not per-dtype) dtypes check in an op's results.
ALL_DTYPES = "all dtypes"

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


def _run_one(op, dtype, max_samples, grads, checks=()):
    """Counts for one (op, dtype): forward and gradient passed/failed/errored + first errors,
    and {"passed", "failed", "first_error"} per check in `checks`."""
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
    for s in samples:
        if "variants" in checks:
            _check_variants(op, s, r)
        if "noncontiguous" in checks:
            _check_noncontiguous(op, s, values, r)
    if "out" in checks and op.supports_out:
        _check_out(op, samples, values, r)
    if "error_inputs" in checks and dtype == torch.float32:
        try:
            errors = list(op.error_inputs("cpu"))[:max_samples]
        except Exception:  # noqa: BLE001 - an OpInfo that can't make them has none to check
            errors = []
        for e in errors:
            _check_error_input(op, e, r)
    return r


def _tally(r, check, ok, why=None):
    c = r.setdefault(check, {"passed": 0, "failed": 0, "first_error": None})
    c["passed" if ok else "failed"] += 1
    if not ok and c["first_error"] is None:
        c["first_error"] = why


def _outcome(fn):
    """(result, None) or (None, exception)."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - the exception is the outcome compared
        return None, e


def _same_failure(got, expected):
    """None when both calls raised the same exception class (or neither raised), else why not."""
    if (got is None) != (expected is None):
        return f"tpu {'raised ' + _short(got) if got else 'ran'}, CPU {'raised ' + _short(expected) if expected else 'ran'}"
    if got is not None and type(got) is not type(expected):
        return f"tpu raised {_short(got)}, CPU {_short(expected)}"
    return None


def _check_variants(op, s, r):
    """The method and in-place forms on tpu agree with the function form on tpu (the in-place
    form where CPU's runs; where CPU's raises, tpu's raises the same class)."""
    import torch

    inp, args, kwargs = _on_device(op, s)
    base, err = _outcome(lambda: op(inp, *args, **kwargs))
    if err is not None or not isinstance(base, torch.Tensor):
        return
    forms = []
    if op.method_variant is not None:
        forms.append(("method", op.method_variant, lambda x: x))
    if op.inplace_variant is not None:
        forms.append(("inplace", op.inplace_variant, lambda x: x.clone()))
    for name, fn, prepare in forms:
        cpu_input = prepare(s.input.detach()) if isinstance(s.input, torch.Tensor) else s.input
        _, cpu_err = _outcome(lambda: fn(cpu_input, *s.args, **s.kwargs))
        dev_input = prepare(inp.detach()) if isinstance(inp, torch.Tensor) else inp
        got, err = _outcome(lambda: fn(dev_input, *args, **kwargs))
        why = _same_failure(err, cpu_err)
        if why is None and err is None:
            try:
                _compare(got, base.cpu(), values=True)
            except Exception as e:  # noqa: BLE001
                why = f"{name}: {_short(e)}"
        _tally(r, "variants", why is None, why and f"{name}: {why}")


def _noncontiguous(x):
    """The same values on tpu as a strided view (every other element of a buffer twice as large)."""
    import torch

    if isinstance(x, torch.Tensor):
        y = x.detach().to("tpu")
        if y.numel() > 1:
            y = torch.stack([y, y], dim=-1).select(-1, 0)
        return y.requires_grad_(x.requires_grad) if x.requires_grad and y.is_floating_point() else y
    if isinstance(x, (list, tuple)):
        return type(x)(_noncontiguous(v) for v in x)
    if isinstance(x, dict):
        return {k: _noncontiguous(v) for k, v in x.items()}
    return _to(x, "tpu")


def _check_noncontiguous(op, s, values, r):
    import torch

    keep = CPU_ARGS.get(op.name, ())
    if not any(isinstance(t, torch.Tensor) and t.numel() > 1 for t in _tensors([s.input, s.args, s.kwargs])):
        return
    torch.manual_seed(0)
    expected, cpu_err = _outcome(lambda: op(s.input, *s.args, **s.kwargs))
    if cpu_err is not None:
        return
    inp = _noncontiguous(s.input)
    args = tuple(a if i in keep else _noncontiguous(a) for i, a in enumerate(s.args))
    torch.manual_seed(0)
    got, err = _outcome(lambda: op(inp, *args, **_noncontiguous(s.kwargs)))
    why = _short(err) if err is not None else None
    if why is None:
        try:
            _compare(got, expected, values)
        except Exception as e:  # noqa: BLE001
            why = _short(e)
    _tally(r, "noncontiguous", why is None, why)


def _check_out(op, samples, values, r):
    """out= on the first sample with one tensor result that CPU computes."""
    import warnings

    import torch

    for s in samples:
        expected, cpu_err = _outcome(lambda: op(s.input, *s.args, **s.kwargs))
        if cpu_err is None and isinstance(expected, torch.Tensor):
            break
    else:
        return
    inp, args, kwargs = _on_device(op, s)

    def call(out_cpu, out_dev):
        with warnings.catch_warnings(record=True) as cpu_warned:
            warnings.simplefilter("always")
            cpu = _outcome(lambda: op(s.input, *s.args, **s.kwargs, out=out_cpu))
        with warnings.catch_warnings(record=True) as dev_warned:
            warnings.simplefilter("always")
            dev = _outcome(lambda: op(inp, *args, **kwargs, out=out_dev))
        resized = [any("resized" in str(w.message) for w in ws) for ws in (cpu_warned, dev_warned)]
        return cpu, dev, resized

    # The right shape and dtype: the values, in the tensor passed.
    out = torch.empty_like(expected, device="tpu")
    (_, cpu_err), (got, err), _ = call(torch.empty_like(expected), out)
    why = _same_failure(err, cpu_err)
    if why is None and err is None:
        try:
            if got is not out:
                raise AssertionError("out= returned another tensor than the one passed")
            _compare(out, expected, values)
        except Exception as e:  # noqa: BLE001
            why = _short(e)
    _tally(r, "out", why is None, why and f"out of the right shape: {why}")
    # A nonempty out of another shape: resized, with CPU's warning.
    if expected.numel() != 1 or expected.dim() != 1:
        shape = (1,)
        (_, cpu_err), (_, err), (cpu_warned, dev_warned) = call(torch.empty(shape, dtype=expected.dtype),
                                                                 torch.empty(shape, dtype=expected.dtype, device="tpu"))
        why = _same_failure(err, cpu_err) or (None if cpu_warned == dev_warned else
                                              f"resize warning on CPU {cpu_warned}, on tpu {dev_warned}")
        _tally(r, "out", why is None, why and f"out of another shape: {why}")
    # A dtype the result cannot be cast to.
    narrow = torch.float32 if expected.dtype.is_complex else torch.int64 if expected.dtype.is_floating_point else None
    if narrow is not None:
        (_, cpu_err), (_, err), _ = call(torch.empty_like(expected, dtype=narrow),
                                         torch.empty_like(expected, dtype=narrow, device="tpu"))
        why = _same_failure(err, cpu_err)
        _tally(r, "out", why is None, why and f"out of dtype {narrow}: {why}")
    # An out on the CPU for tpu inputs: refused (CUDA refuses a CPU out the same way).
    if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in _tensors([inp, args, kwargs])):
        _, err = _outcome(lambda: op(inp, *args, **kwargs, out=torch.empty_like(expected)))
        why = None if isinstance(err, RuntimeError) else (
            f"tpu {'raised ' + _short(err) if err else 'wrote a CPU out'}; expected a RuntimeError")
        _tally(r, "out", why is None, why and f"out on the CPU: {why}")


def _check_error_input(op, e, r):
    import re

    import torch

    s = e.sample_input
    try:
        inp, args, kwargs = _on_device(op, s)
        op(inp, *args, **kwargs)
        torch.tpu.synchronize()  # an error found on the device belongs to this call
        why = f"ran; expected {e.error_type.__name__}: {e.error_regex}"
    except Exception as err:  # noqa: BLE001
        if not isinstance(err, e.error_type):
            why = f"raised {_short(err)}; expected {e.error_type.__name__}: {e.error_regex}"
        elif not re.search(e.error_regex, str(err)):
            why = f"message {str(err)[:150]!r} does not match {e.error_regex!r}"
        else:
            why = None
    _tally(r, "error_inputs", why is None, why)


def _check_dtypes(op):
    """Per dtype PyTorch knows: whether the first sample runs on tpu as it does on CPU."""
    import torch

    r = {}
    for name in PROBED_DTYPES:
        dtype = getattr(torch, name)
        try:
            s = next(iter(op.sample_inputs("cpu", dtype)))
        except Exception:  # noqa: BLE001 - no sample of this dtype: nothing to compare
            continue
        _, cpu_err = _outcome(lambda: op(s.input, *s.args, **s.kwargs))
        inp, args, kwargs = _on_device(op, s)
        # Synchronized: a failure found when the program runs belongs to this call.
        _, err = _outcome(lambda: (op(inp, *args, **kwargs), torch.tpu.synchronize()))
        why = None
        if (cpu_err is None) != (err is None):
            why = f"{name}: {'runs' if err is None else 'raises ' + _short(err)} on tpu, " \
                  f"{'runs' if cpu_err is None else 'raises'} on CPU"
        _tally(r, "dtypes", why is None, why)
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


def _worker(conn, dtypes, max_samples, grads, checks):
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
                out[dt] = _run_one(op, dtype, max_samples, grads, checks)
            except Exception as e:  # noqa: BLE001
                out[dt] = {"passed": 0, "failed": 0, "errored": 1, "first_error": "harness: " + _short(e)}
                traceback.print_exc()
        if "dtypes" in checks:
            out[ALL_DTYPES] = _check_dtypes(op)
        conn.send(out)


class _Worker:
    def __init__(self, dtypes, max_samples, grads, checks):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, dtypes, max_samples, grads, checks), daemon=True)
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


def run(names, dtypes, max_samples=20, grads=True, timeout=300, log=sys.stderr, checks=()):
    results = {}
    worker = None
    for i, name in enumerate(names):
        if worker is None:
            worker = _Worker(dtypes, max_samples, grads, tuple(checks))
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
                               for d, v in out.items() if d != ALL_DTYPES)
            print(f"[{i + 1}/{len(names)}] {name} {summary} ({time.time() - t0:.1f}s)", file=log, flush=True)
    if worker is not None:
        worker.conn.send(None)
        worker.proc.join(timeout=10)
        worker.stop()
    return results


def check_counts(results):
    """{check: [passed, total]} over every op and dtype."""
    counts = {c: [0, 0] for c in CHECKS}
    for per in results.values():
        for r in per.values():
            for c in CHECKS:
                if c in r:
                    counts[c][0] += r[c]["passed"]
                    counts[c][1] += r[c]["passed"] + r[c]["failed"]
    return counts


def summarize(results, dtypes):
    lines = []
    totals = {}
    crashes = 0
    for name, per in results.items():
        for dt, r in per.items():
            if r.get("crashed"):
                crashes += 1
            if dt == ALL_DTYPES:
                continue
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
    checks = [f"{c} {p}/{n} ({100 * p / n:.1f}%)" for c, (p, n) in check_counts(results).items() if n]
    return (f"conformance: {len(results)} OpInfos; " + "; ".join(lines) + f"; crashes {crashes}"
            + ("\nchecks: " + "; ".join(checks) if checks else ""))


def markdown(results):
    rows = ["| op | dtype | passed | failed | errored | grad passed/total | first error |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, per in sorted(results.items()):
        for dt, r in per.items():
            gn = r.get("grad_passed", 0) + r.get("grad_failed", 0) + r.get("grad_errored", 0)
            grad = f"{r.get('grad_passed', 0)}/{gn}" if gn else ""
            err = (r.get("first_error") or r.get("grad_first_error") or r.get("skipped")
                   or next((r[c]["first_error"] for c in CHECKS if c in r and r[c]["first_error"]), None) or "")
            err = err.replace("|", "\\|")
            rows.append(f"| {name} | {dt} | {r.get('passed', 0)} | {r.get('failed', 0)} | {r.get('errored', 0)} | "
                        f"{grad} | {err[:160]} |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="*", help="OpInfo names (default: all)")
    p.add_argument("--dtypes", nargs="*", default=DEFAULT_DTYPES)
    p.add_argument("--max-samples", type=int, default=20)
    p.add_argument("--no-grads", action="store_true")
    p.add_argument("--checks", nargs="*", default=list(CHECKS), choices=CHECKS,
                   help="PyTorch's other per-op checks to run (default: all)")
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
    results = run(names, a.dtypes, a.max_samples, not a.no_grads, a.timeout, checks=a.checks)
    line = summarize(results, a.dtypes)
    with open(a.json, "w") as f:
        json.dump({"summary": line, "results": results}, f, indent=1)
    with open(a.markdown, "w") as f:
        f.write(line + "\n\n" + markdown(results))
    print(line)
    return results


if __name__ == "__main__":
    main()
