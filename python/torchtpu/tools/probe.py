"""Call every aten op overload the dispatcher knows on "tpu" and record what happens.

For each overload, arguments are built from its schema alone, in a few argument sets (float32
2x3, 0-d, empty (0, 3), int64, bool, 4-d, float32 with every optional argument given, and, where
PyTorch's composite kernel runs on tpu tensors, 1-d tensors with int64 sizes and lengths).
Each set runs on CPU, then on "tpu" with the same values (CPU fallback off), and the pair is
classed:

    pass            both ran (and agreed, where values are deterministic)
    mismatch        both ran, the results differ (shape, dtype or values beyond 1e-4)
    error-like-cpu  both raised the same exception class
    unsupported     tpu raised NotImplementedError while CPU ran
    error-differs   tpu raised while CPU ran, or both raised with different classes
    cpu-error-only  CPU raised, tpu ran
    crash           the worker died (signal, exit) or hung during the tpu call
    cpu-crash       the worker died or hung during the CPU call (PyTorch's own kernel); the set
                    then runs on tpu alone in a fresh worker, and is a crash if that dies too
    skipped         no arguments could be built (Storage, Stream, TorchScript classes)

An overload's outcome is its worst set's, in that order of precedence (crash first, then
unsupported, error-differs, mismatch, cpu-error-only, pass, error-like-cpu).

Ops run in a worker process that takes many ops in turn and reports each call before making
it; when the worker dies or hangs, the call it was in is recorded as a crash with the signal
or exit code and the worker's last stderr lines, and a fresh worker goes on with the next op.

    python -m torchtpu.tools.probe [--ops add mul.Tensor ...] [--subset ci] [--limit N]
                             [--timeout S] [--out probe.json] [--list unsupported] [--load f.json]
"""
import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

OUTCOMES = ["crash", "unsupported", "error-differs", "mismatch", "cpu-error-only", "pass", "error-like-cpu",
            "cpu-crash", "skipped"]

# name, dtype, shape, fill optionals. The 4-d set fits convolutions, pooling and grid samplers
# whose tensors all have one shape; "opt" reaches the code behind optional arguments.
SETS = [("f32", "float32", (2, 3), False), ("f32-0d", "float32", (), False), ("f32-empty", "float32", (0, 3), False),
        ("i64", "int64", (2, 3), False), ("bool", "bool", (2, 3), False), ("f32-4d", "float32", (2, 2, 2, 2), False),
        ("f32-opt", "float32", (2, 3), True), ("host-read", "float32", (4,), False)]

# The "host-read" set runs only where PyTorch's own composite kernel serves the tpu key (the
# dispatcher's table says "math kernel" or "default backend kernel"): C++ that runs on tpu
# tensors and may read their elements on the host (accessor, data_ptr). Its tensors are 1-d,
# and those named like sizes, lengths or offsets are int64 [1, 2], the forms such kernels read.
HOST_READ = "host-read"
SIZE_LIKE = re.compile(r"size|shape|length|offset|count|repeat|batch|split|sections|crow|ccol|row|col|dims")
COMPOSITE_KERNELS = ("[math kernel]", "[default backend kernel]")

# Every 10th overload of the sorted list, plus one overload of each op that crashed in a full
# sweep: a few hundred overloads in a few minutes, the same ones on every run of one torch release.
CI_STRIDE = 10
CI_EXTRA = ["_chunk_cat.default", "_grid_sampler_2d_cpu_fallback.default",
            "_grid_sampler_2d_cpu_fallback_backward.default", "_nnpack_spatial_convolution.default",
            "_saturate_weight_to_fp16.default", "_thnn_differentiable_gru_cell_backward.default",
            "choose_qparams_optimized.default", "fbgemm_linear_quantize_weight.default",
            "fbgemm_pack_gemm_matrix_fp16.default", "range.out_"]

# Values are not compared for ops whose results are random or uninitialized.
NONDETERMINISTIC = ("rand", "normal", "bernoulli", "dropout", "empty", "multinomial", "uniform", "exponential",
                    "cauchy", "geometric", "log_normal", "poisson", "rrelu", "random", "_efficientzerotensor")

MARK = "torchtpu.tools.probe: calling "

STRINGS = {"reduce": "sum", "rounding_mode": "trunc", "ord": "fro", "p": "fro", "padding": "same",
           "indexing": "ij", "equation": "ij,ij->ij", "filename": "/nonexistent/torchtpu-probe"}


def all_overloads():
    """Sorted "op.overload" names of every aten op the dispatcher knows ("default" for the unnamed one)."""
    import torch

    names = []
    for n in torch._C._dispatch_get_all_op_names():
        if n.startswith("aten::"):
            op, _, ov = n[6:].partition(".")
            names.append(f"{op}.{ov or 'default'}")
    return sorted(names)


def select_overloads(ops=None, subset=None, limit=None):
    names = all_overloads()
    if subset == "ci":
        extra = set(CI_EXTRA)
        names = [n for i, n in enumerate(names) if i % CI_STRIDE == 0 or n in extra]
    if ops:
        wanted = set(ops)
        names = [n for n in names if n in wanted or n.split(".")[0] in wanted]
    return names[:limit] if limit else names


# ---------------------------------------------------------------- worker side: arguments and calls

def _schema(name):
    import torch

    op, ov = name.split(".")
    return torch._C._get_schema("aten::" + op, "" if ov == "default" else ov)


def _overload(name):
    import torch

    op, ov = name.split(".")
    return getattr(getattr(torch.ops.aten, op), ov)


class Unbuildable(Exception):
    pass


def served_by_composite(name):
    """Whether the kernel that runs this overload for tpu tensors is one of PyTorch's composites."""
    import torch

    op, ov = name.split(".")
    table = torch._C._dispatch_dump_table("aten::" + op + ("" if ov == "default" else "." + ov))
    line = next((ln for ln in table.splitlines() if ln.startswith("PrivateUse1:")), "")
    return line.endswith(COMPOSITE_KERNELS)


def _tensor(dtype, shape, gen, index=False):
    import torch

    if index or dtype in (torch.int64, torch.bool):
        # 0 and 1 index every dimension of every set's shapes (except empty ones).
        t = torch.randint(0, 2, shape, generator=gen)
        return t.bool() if dtype == torch.bool else t
    return torch.randn(shape, generator=gen, dtype=dtype)


def _value(arg, typ, dtype, shape, gen, schema, host_read=False):
    """A value for one argument of type string `typ` (the schema's real type, Optional stripped)."""
    import torch

    name = arg.name
    index = "index" in name or "indices" in name
    if host_read and typ in ("Tensor", "List[Tensor]") and (index or SIZE_LIKE.search(name)):
        t = torch.tensor([1, 2])
        return t if typ == "Tensor" else [t, t.clone()]
    if typ == "Tensor":
        return _tensor(torch.int64 if index else dtype, shape, gen)
    if typ == "List[Tensor]":
        return [_tensor(dtype, shape, gen), _tensor(dtype, shape, gen)]
    if typ == "List[Optional[Tensor]]":
        return [_tensor(torch.int64, shape, gen, index=True)]
    if typ in ("int", "SymInt"):
        return 0 if "dim" in name else 1
    if typ in ("List[int]", "List[SymInt]"):
        if name in ("size", "sizes", "shape"):
            return list(shape)
        if name == "stride" and any(a.name == "size" for a in schema.arguments):
            return list(torch.empty(shape).stride())
        if name == "dims":
            return list(reversed(range(len(shape))))
        return [0 if ("dim" in name or "padding" in name) else 1] * (arg.N or 1)
    if typ == "float":
        return 0.5
    if typ == "bool":
        return False
    if typ == "List[bool]":
        return [True] * (arg.N or 2)
    if typ == "number":  # Scalar
        return 1
    if typ == "List[number]":
        return [1, 2]
    if typ == "List[float]":
        return [0.5]
    if typ == "str":
        return STRINGS.get(name, "probe")
    if typ == "ScalarType":
        return dtype
    if typ == "Layout":
        return torch.strided
    if typ == "MemoryFormat":
        return torch.contiguous_format
    if typ == "Device":
        return torch.device("cpu")  # the tpu copy of the arguments turns it into "tpu"
    if typ == "Generator":
        return None
    raise Unbuildable(f"argument {name}: {typ}")


def build(name, set_index):
    """(args, kwargs) on CPU for one overload and argument set; Unbuildable if a type is not handled."""
    import torch

    set_name, dt, shape, fill = SETS[set_index]
    dtype = getattr(torch, dt)
    schema = _schema(name)
    if set_name == HOST_READ and not served_by_composite(name):
        raise Unbuildable("the host-read set is for overloads that PyTorch's composites serve on tpu")
    gen = torch.Generator().manual_seed(set_index)
    args, kwargs = [], {}
    by_name = False  # once an argument is left to its default, later ones go by name
    for arg in schema.arguments:
        typ = str(arg.real_type)
        optional = typ.startswith("Optional[")
        inner = typ[9:-1] if optional else typ
        if arg.is_out:
            # Empty out= tensors: PyTorch resizes them. Indices are int64.
            ret = schema.returns[[a for a in schema.arguments if a.is_out].index(arg)] \
                if len(schema.returns) == sum(a.is_out for a in schema.arguments) else None
            ind = "indices" in arg.name or (ret is not None and "indices" in (ret.name or ""))
            value = torch.empty(0, dtype=torch.int64 if ind else dtype)
        elif inner == "Device":
            value = torch.device("cpu")  # given even where optional, so factories run on tpu
        elif arg.has_default_value() and not (optional and fill):
            by_name = True  # the op's own default
            continue
        elif optional and not fill:
            value = None
        else:
            value = _value(arg, inner, dtype, shape, gen, schema, set_name == HOST_READ)
        if arg.kwarg_only or by_name:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


def _to(x, device):
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, torch.device):
        return torch.device(device)
    return x


def _short(e):
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    return msg[0][:300] if msg else type(e).__name__


def _compare(got, exp, values):
    """None when the tpu result (already on the host) matches CPU's, else what differs."""
    import torch

    if isinstance(exp, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        if got.shape != exp.shape or got.dtype != exp.dtype:
            return f"got {got.dtype}{list(got.shape)}, expected {exp.dtype}{list(exp.shape)}"
        if values and exp.layout == torch.strided and not exp.is_quantized:
            try:
                torch.testing.assert_close(got, exp, equal_nan=True, check_stride=False, atol=1e-4, rtol=1e-4)
            except AssertionError as e:
                return _short(e)
        return None
    if isinstance(exp, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(exp):
            return f"got {got!r:.80}, expected {exp!r:.80}"
        for g, e in zip(got, exp):
            d = _compare(g, e, values)
            if d:
                return d
        return None
    if values and isinstance(exp, float) and exp != exp:
        return None if got != got else f"got {got!r}, expected nan"
    if values and got != exp:
        return f"got {got!r:.80}, expected {exp!r:.80}"
    return None


def _host(x):
    """The tpu result with every tensor copied to the host, which also waits for it (and raises
    errors found on the device, such as out-of-range indices, inside the tpu call)."""
    import torch

    if isinstance(x, torch.Tensor):
        # Not checked to be on tpu: some ops return host tensors on every device (_shape_as_tensor).
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_host(v) for v in x)
    return x


def run_set(name, k, say, no_cpu=False):
    """Outcome of one argument set; `say` reports the phase before each call, for crash records.
    no_cpu: the CPU call crashed the last worker; only the tpu call runs."""
    import torch

    try:
        args, kwargs = build(name, k)
    except Unbuildable as e:
        return {"set": SETS[k][0], "outcome": "skipped", "why": str(e)}
    op = _overload(name)
    # The tpu copy first: in-place ops modify the CPU arguments.
    try:
        dargs, dkwargs = _to(args, "tpu"), _to(kwargs, "tpu")
    except Exception as e:  # noqa: BLE001 - a copy that fails is the set's tpu error
        dargs = e
    cpu = tpu = None
    if not no_cpu:
        say("cpu")
        torch.manual_seed(0)
        try:
            exp = op(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any exception PyTorch raises is a result
            cpu = e
    say("tpu")
    torch.manual_seed(0)
    try:
        if isinstance(dargs, Exception):
            raise dargs
        got = _host(op(*dargs, **dkwargs))
    except Exception as e:  # noqa: BLE001
        tpu = e
    r = {"set": SETS[k][0]}
    if no_cpu:  # what tpu did where CPU crashed
        return dict(r, outcome="cpu-crash", tpu=_short(tpu) if tpu is not None else "ran")
    if cpu is not None:
        r["cpu"] = _short(cpu)
    if tpu is not None:
        r["tpu"] = _short(tpu)
    if cpu is not None and tpu is not None:
        r["outcome"] = "error-like-cpu" if type(cpu) is type(tpu) else "error-differs"
    elif tpu is not None:
        r["outcome"] = "unsupported" if type(tpu) is NotImplementedError else "error-differs"
    elif cpu is not None:
        r["outcome"] = "cpu-error-only"
    else:
        values = not any(w in name for w in NONDETERMINISTIC)
        try:
            diff = _compare(got, exp, values)
        except Exception as e:  # noqa: BLE001 - results that cannot be compared are a mismatch
            diff = "compare: " + _short(e)
        r["outcome"] = "mismatch" if diff else "pass"
        if diff:
            r["diff"] = diff
    return r


def worker():
    """Reads {"op", "from"} lines on stdin; writes {"at"}, {"result"} and {"done"} lines."""
    # Protocol on a private copy of stdout; ops that print (aten::_print) go to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import warnings

    import torch

    import torchtpu  # noqa: F401

    warnings.filterwarnings("ignore")

    def send(msg):
        out.write(json.dumps(msg) + "\n")

    def say(name, k, phase):
        # The marker in stderr lets a crash record keep only what this call wrote.
        os.write(2, f"{MARK}{name} {SETS[k][0]} {phase}\n".encode())
        send({"at": name, "set": k, "phase": phase})

    send({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        name = req["op"]
        for k in range(req["from"], len(SETS)):
            r = run_set(name, k, lambda phase: say(name, k, phase), req["no_cpu"] and k == req["from"])
            send({"result": r})
            try:  # no error left pending for the next op
                torch.tpu.synchronize()
            except Exception:  # noqa: BLE001
                pass
        send({"done": name})


# ---------------------------------------------------------------- parent side

class _Worker:
    def __init__(self):
        env = dict(os.environ)
        env.pop("TORCHTPU_CPU_FALLBACK", None)  # a fallback would hide what tpu lacks
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "torchtpu.tools.probe", "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env)
        self.buf = b""

    def send(self, msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout):
        """The next message, or None when the worker died or sent nothing for `timeout` seconds."""
        fd = self.proc.stdout.fileno()
        deadline = time.time() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def death(self, timeout):
        """How the worker ended (killing it if it hung) and its last stderr lines."""
        try:
            rc = self.proc.wait(timeout=2)
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            how = f"hung (no answer in {timeout:g} s)"
        self.err.seek(0)
        # Without the frames of Rust and C++ backtraces, the last lines say why.
        text = self.err.read().decode(errors="replace")
        text = text[text.rfind(MARK):].split("\n", 1)[-1] if MARK in text else text
        lines = [ln for ln in text.splitlines()
                 if ln.strip() and not re.match(r"\s+(at |\d+: )|stack backtrace:|note: Some details|\[W", ln)]
        self.err.close()
        return how, lines[-12:]

    def stop(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def outcome(sets):
    return min((s["outcome"] for s in sets), key=OUTCOMES.index) if sets else "skipped"


def run(names, timeout=20.0, log=sys.stderr):
    """{overload: {"outcome", "sets", ["crash"]}} for every name, a worker process at a time."""
    results = {}
    worker = None
    i, start = 0, 0
    sets = []
    cpu_crash = None  # how the CPU call of set `start` died: that set is retried on tpu alone
    t0 = time.time()
    while i < len(names):
        name = names[i]
        if worker is None:
            worker = _Worker()
            if worker.read(300) is None:
                how, tail = worker.death(300)
                raise RuntimeError(f"probe worker did not start ({how}):\n" + "\n".join(tail))
        worker.send({"op": name, "from": start, "no_cpu": cpu_crash is not None})
        at = {"set": start, "phase": "cpu"}
        while True:
            msg = worker.read(timeout)
            if msg is None:
                how, tail = worker.death(timeout)
                worker = None
                rec = {"set": SETS[at["set"]][0], "how": how, "stderr": tail}
                if at["phase"] == "cpu":
                    # PyTorch's own CPU kernel died: still see what tpu does with these arguments.
                    cpu_crash, start = dict(rec, outcome="cpu-crash"), at["set"]
                    break
                if cpu_crash:
                    rec["cpu"] = f"crashed too ({cpu_crash['how']})"
                    cpu_crash = None
                sets.append(dict(rec, outcome="crash"))
                msg = {"done": name}  # the rest of this op's sets are skipped
            if "at" in msg:
                at = msg
            elif "result" in msg:
                sets.append(dict(msg["result"], **cpu_crash) if cpu_crash else msg["result"])
                cpu_crash = None
            elif "done" in msg:
                results[name] = {"outcome": outcome(sets), "sets": sets}
                crash = next((s for s in sets if s["outcome"] == "crash"), None)
                if log and (crash or len(results) % 100 == 0):
                    print(f"[{i + 1}/{len(names)} {time.time() - t0:.0f}s] {name}: {results[name]['outcome']}"
                          + (f" ({crash['set']}: {crash['how']})" if crash else ""), file=log, flush=True)
                i, start, sets = i + 1, 0, []
                break
    if worker is not None:
        worker.stop()
    return results


def counts(results):
    c = {k: 0 for k in OUTCOMES}
    for r in results.values():
        c[r["outcome"]] += 1
    return c


def summarize(results):
    c = counts(results)
    ops = len({n.split(".")[0] for n in results})
    return (f"probe: {len(results)} overloads of {ops} ops; pass {c['pass']}, errors like CPU {c['error-like-cpu']}, "
            f"unsupported {c['unsupported']}, differs {c['error-differs']}, mismatch {c['mismatch']}, "
            f"cpu-error-only {c['cpu-error-only']}, skipped {c['skipped']}, cpu crashes {c['cpu-crash']}, "
            f"crashes {c['crash']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="*", help="op names (all overloads) or op.overload names")
    p.add_argument("--subset", choices=["ci"], help="ci: a fixed subset of a few hundred overloads")
    p.add_argument("--limit", type=int, help="only the first N overloads")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds a call may take before it counts as hung")
    p.add_argument("--out", default="probe.json")
    p.add_argument("--list", choices=OUTCOMES, help="print the overloads with this outcome, sorted")
    p.add_argument("--load", help="read results from this JSON file instead of running")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker()
    if a.load:
        with open(a.load) as f:
            results = json.load(f)["results"]
    else:
        names = select_overloads(a.ops, a.subset, a.limit)
        if not names:
            p.error("no aten overload matches")
        t0 = time.time()
        results = run(names, a.timeout)
        line = summarize(results)
        with open(a.out, "w") as f:
            json.dump({"summary": line, "seconds": round(time.time() - t0, 1), "counts": counts(results),
                       "results": results}, f, indent=1)
    if a.list:
        for n in sorted(n for n, r in results.items() if r["outcome"] == a.list):
            print(n)
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
