"""Fused eager mode (torch.tpu.set_fused_eager): recorded ops give the same values as strict
eager and as PyTorch on CPU, through views, in-place ops, autograd, the RNG and data-dependent
sizes; a repeated graph runs as one fused program; errors keep PyTorch's class and message."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import TPU


@pytest.fixture
def fused():
    # (conftest.py restores the mode the test started in.)
    torch.tpu.set_fused_eager(True)


def fused_stats():
    return torch.tpu.compile_stats()["fused"]


def chain(x, w, b):
    y = torch.tanh(x @ w + b) * 0.5
    y = y[:, 1:].exp() - y[:, :-1]
    return y.sum(dim=0), y


def test_repeated_graph_runs_fused_with_strict_values(fused):
    xs, ws, bs = torch.randn(6, 5), torch.randn(5, 7), torch.randn(7)
    ref = chain(xs, ws, bs)
    x, w, b = xs.to(TPU), ws.to(TPU), bs.to(TPU)
    before = fused_stats()
    for _ in range(20):
        got = chain(x, w, b)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g.cpu(), r, atol=1e-5, rtol=1e-5)
    after = fused_stats()
    assert after["graphs"] - before["graphs"] >= 20
    # The third run starts the fused program's compile on a worker thread; the runs go on op
    # by op until the eighth, which waits for the program and runs it (so do the next ones).
    # Where earlier tests left bucketed programs serving these shapes, they first take their
    # exact programs (each in its third graph in a row; an exact result's storage is new to
    # the next op, whose shape then does the same: here the structure settles at run 8).
    assert after["fused_runs"] - before["fused_runs"] >= 2
    assert torch.tpu.is_fused_eager()


def test_views_and_inplace_writes(fused):
    base = torch.randn(5, 6)
    t = base.to(TPU)
    for x in (base, t):
        v = x[1:4, ::2]
        v.mul_(2).add_(1)
        x.t()[2].zero_()
        x[0] = x[4] * 3
    torch.testing.assert_close(t.cpu(), base)
    # A view taken before the writes sees them.
    u = torch.zeros(4, device=TPU)
    view = u[1:3]
    u.add_(5)
    view.mul_(2)
    assert u.cpu().tolist() == [5.0, 10.0, 10.0, 5.0]


def test_empty_zero_dim_dtypes(fused):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        a = torch.randint(0, 5, (3, 4)).to(dtype)
        s = torch.tensor(2).to(dtype)
        e = torch.empty(0, 4, dtype=dtype)
        for x, y in ((a, s), (e, s), (s, s)):
            ref = (x * y).sum() if dtype != torch.bool else (x & y).any()
            got = (x.to(TPU) * y.to(TPU)).sum() if dtype != torch.bool else (x.to(TPU) & y.to(TPU)).any()
            torch.testing.assert_close(got.cpu(), ref)


def test_training_matches_strict_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))
    data, target = torch.randn(10, 8), torch.randint(0, 3, (10,))

    def train(fused):
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))
        net.load_state_dict(model.state_dict())
        net = net.to(TPU)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        torch.manual_seed(1)
        torch.tpu.manual_seed(1)
        torch.tpu.set_fused_eager(fused)
        losses = []
        try:
            # Enough steps for the step's structure to settle and fuse also where earlier
            # tests left bucketed programs that its first steps use and then promote.
            for _ in range(16):
                opt.zero_grad()
                loss = F.cross_entropy(net(data.to(TPU)), target.to(TPU))
                loss.backward()
                opt.step()
                losses.append(loss.item())
        finally:
            torch.tpu.set_fused_eager(False)
        return losses, [p.detach().cpu() for p in net.parameters()]

    strict_losses, strict_params = train(False)
    before = fused_stats()
    fused_losses, fused_params = train(True)
    assert fused_stats()["fused_runs"] > before["fused_runs"]
    torch.testing.assert_close(fused_losses, strict_losses, atol=1e-5, rtol=1e-5)
    for f, s in zip(fused_params, strict_params):
        torch.testing.assert_close(f, s, atol=1e-5, rtol=1e-5)


def test_random_ops_follow_the_generator(fused):
    torch.tpu.manual_seed(7)
    a = torch.rand(100, device=TPU)
    b = F.dropout(torch.ones(100, device=TPU), 0.5)
    torch.tpu.set_fused_eager(False)
    torch.tpu.manual_seed(7)
    a2 = torch.rand(100, device=TPU)
    b2 = F.dropout(torch.ones(100, device=TPU), 0.5)
    assert torch.equal(a.cpu(), a2.cpu()) and torch.equal(b.cpu(), b2.cpu())


def test_data_dependent_sizes_and_reads(fused):
    x = torch.tensor([0.0, 3.0, 0.0, -1.0, 2.0])
    t = (x.to(TPU) * 2).relu()
    nz = t.nonzero()
    assert nz.cpu().flatten().tolist() == [1, 4]
    assert t[t > 0].cpu().tolist() == [6.0, 4.0]
    assert (t.max().item(), bool(t.any())) == (6.0, True)
    assert repr(t.sum()).startswith("tensor(10.")


def test_errors_raise_at_the_op(fused):
    a, b = torch.randn(3, 4, device=TPU), torch.randn(5, 4, device=TPU)
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        a + b
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        a @ b
    # The graph recorded before the errors still runs.
    c = a * 2
    torch.testing.assert_close(c.cpu(), a.cpu() * 2)


def test_long_chains_are_cut():
    x = torch.zeros(3).to(TPU)
    before = fused_stats()
    torch.tpu.set_fused_eager(True)
    try:
        # 600 ops and a read per step: cut at 512 ops and at the read, the same pieces each
        # step, which run fused from their eighth time on. (Checked over the last two steps:
        # where earlier tests left a bucketed program serving the shape, the shape takes its
        # own program in its third graph, and the chain's next keys after it: the step's
        # structure settles a few steps later, fused from step 9 in a check.)
        for step in range(14):
            if step == 12:
                last_two = fused_stats()
            for _ in range(600):
                x = x + 1
            x.sum().item()
        mid = fused_stats()
        # No read at all: pieces of 512 ops drift along the loop's iterations; after a few,
        # they run op by op and nothing more is compiled.
        for _ in range(20 * 512 // 3):
            x = x * 1.0 + 1
            x = x - 1
            x = x.abs()
    finally:
        torch.tpu.set_fused_eager(False)
    assert x.cpu().tolist() == [8400.0] * 3
    assert mid["graphs"] - before["graphs"] == 28
    assert mid["graphs"] - last_two["graphs"] == 4
    assert mid["fused_runs"] - last_two["fused_runs"] == 4
    after = fused_stats()
    assert after["graphs"] - mid["graphs"] >= 20
    assert after["programs"] == mid["programs"]


def test_intermediates_are_not_kept(fused):
    # The fused program returns only what a tensor still holds: its peak is the strict one's
    # at most.
    x = torch.randn(256, 256, device=TPU)

    def step():
        y = x
        for _ in range(6):
            y = torch.sin(y) * 2
        return y.sum().item()

    def peak(on):
        torch.tpu.set_fused_eager(on)
        step()
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        for _ in range(3):
            step()
        torch.tpu.synchronize()
        return torch.tpu.max_memory_allocated()

    strict, fused_peak = peak(False), peak(True)
    assert fused_peak <= strict


def kv_step(cache, slots, rows, x):
    # A KV cache written by each layer of a step (as vLLM's paged cache is), read after each write.
    h = x
    for layer in range(3):
        cache.index_copy_(0, slots + layer, h)
        h = cache[rows].sum(1) * 0.5 + h
    return h


def kv_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.zeros(16384, 2, 32), torch.randperm(16000, generator=g)[:8],
            torch.randint(0, 16384, (8, 16), generator=g), torch.randn(8, 2, 32, generator=g)]


def test_a_chain_of_inplace_updates_runs_fused_with_cpu_values(fused):
    cpu = kv_inputs()
    cache, slots, rows, x = (t.to(TPU) for t in cpu)
    before = fused_stats()["fused_runs"]
    for _ in range(20):
        torch.testing.assert_close(kv_step(cache, slots, rows, x).cpu(), kv_step(*cpu))
    # (As in test_repeated_graph_runs_fused_with_strict_values: shapes earlier tests left on
    # bucketed programs settle on exact ones first.)
    assert fused_stats()["fused_runs"] - before >= 2
    torch.testing.assert_close(cache.cpu(), cpu[0])


def test_a_buffer_updated_by_a_chain_of_inplace_ops_is_donated(tmp_path):
    # The fused program takes the cache's buffer for its result (the last write of the chain):
    # it copied the whole cache each run before (vLLM's steps ran 0.6x strict eager).
    script = "import torch, test_fused_eager as t\n" \
             "cpu = t.kv_inputs(); a = [v.to('tpu') for v in cpu]\n" \
             "for _ in range(10): t.kv_step(*a).cpu()\n" \
             "assert torch.tpu.compile_stats()['fused']['fused_runs'] >= 2\n"
    env = dict(os.environ, TORCHTPU_DUMP_PROGRAMS=str(tmp_path), TORCHTPU_FUSED_EAGER="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    mains = [line for f in tmp_path.glob("*torchtpu__fused*.mlir") for line in f.read_text().splitlines()
             if "func.func public @main(" in line]
    assert mains, sorted(p.name for p in tmp_path.iterdir())
    for main in mains:
        cache = [a for a in main.split("%arg")[1:] if a.split(": ")[1].startswith("tensor<16384x2x32xf32>")]
        assert len(cache) == 1 and "tf.aliasing_output" in cache[0], main


def test_switching_off_and_synchronize_run_the_graph(fused):
    x = torch.ones(4, device=TPU) * 3
    torch.tpu.synchronize()
    before = fused_stats()["graphs"]
    y = x + 1
    torch.tpu.set_fused_eager(False)
    assert fused_stats()["graphs"] == before + 1
    assert y.cpu().tolist() == [4.0] * 4


def test_device_check_failures_raise_at_the_next_read(fused):
    x = torch.randn(5)
    with pytest.raises(IndexError) as cpu:
        x[torch.tensor([1, 7])]
    t = x.to(TPU)
    bad = t[torch.tensor([1, 7], device=TPU)] * 2  # recorded: no error at the call
    other = t + 1
    with pytest.raises(IndexError) as got:
        other.cpu()  # any read raises it, as in strict eager
    assert str(got.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    assert "from an earlier op (index" in str(got.value)  # the op is named
    torch.testing.assert_close((t * 0).cpu(), torch.zeros(5))  # reported once
    del bad


FUSED_TIERS = """
import torch
import torch.nn.functional as F
def f(x):
    y = torch.tanh(x) * 0.7 + torch.special.erf(x * 0.5)
    return (F.gelu(y) - torch.exp(-y.abs())).sum(dim=1)
# Eager ops only (quick tier), then with a compiled function's graph (which tiers up). Each
# graph runs strict first: its ops' programs are compiled then, so fused eager mode fuses it
# once it repeats (not at its first run, as a graph of new programs): from its 8th run. The
# second graph's fused program runs 9 times: its full-tier build starts at its 8th.
compiled = torch.compile(lambda x: torch.exp(x).sum(dim=1), backend="tpu")
torch.tpu.set_fused_eager(False)
x = torch.randn(7, 9, device="tpu")
for g, runs in ((f, 9), (lambda x: f(x) + compiled(x), 16)):
    strict = g(x).cpu()
    torch.tpu.set_fused_eager(True)
    for _ in range(runs):
        torch.testing.assert_close(g(x).cpu(), strict, rtol=1e-6, atol=1e-6)
    torch.tpu.set_fused_eager(False)
print(torch.tpu.compile_stats()["fused"]["fused_runs"])
"""


def test_fused_programs_take_their_ops_tier(tmp_path):
    # Small programs compile at the quick tier, whose transcendental functions round unlike the
    # full tier's: a fused graph of quick-tier programs takes the quick tier for good, one with
    # any other program (here a compiled graph's) tiers up as graphs do: the quick tier first
    # (its tensors are small), its full-tier build from its 8th run.
    env = {**os.environ, "TORCHTPU_LOG_COMPILES": "1", "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", FUSED_TIERS], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["11"]
    fused = [line for line in p.stderr.splitlines() if line.startswith("torchtpu: compile torchtpu::fused")]
    assert len(fused) == 2, p.stderr
    assert all(line.endswith("(compiled, quick tier)") for line in fused), fused
    tier_ups = [line for line in p.stderr.splitlines() if line.startswith("torchtpu: tier-up torchtpu::fused")]
    assert len(tier_ups) == 1, p.stderr


def test_a_call_before_the_device_starts_outranks_the_environment():
    # TORCHTPU_FUSED_EAGER is read when first needed; turning the mode off before any device
    # work must hold (the variable once turned it back on as the engine started).
    code = ("import torch, torchtpu\n"
            "torch.tpu.set_fused_eager(False)\n"
            "y = (torch.ones(3, device='tpu') + 1).cpu()\n"
            "print(torch.tpu.is_fused_eager(), torch.tpu.compile_stats()['fused']['graphs'])\n")
    for value, want in (("1", "False 0"), ("0", "False 0")):
        env = {**os.environ, "TORCHTPU_FUSED_EAGER": value}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split() == want.split()
    # Fused is the default; TORCHTPU_FUSED_EAGER=0 picks strict eager.
    for value, want in (("1", "True"), ("", "True"), (None, "True"), ("0", "False")):
        env = {k: v for k, v in os.environ.items() if k != "TORCHTPU_FUSED_EAGER"}
        if value is not None:
            env["TORCHTPU_FUSED_EAGER"] = value
        p = subprocess.run([sys.executable, "-c", code.replace("torch.tpu.set_fused_eager(False)\n", "")], capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split()[0] == want, (value, p.stdout)


NEW_GRAPH = """
import json, torch
import torch.nn.functional as F
g = torch.Generator().manual_seed(0)
xs, ws = torch.randn(6, 10, generator=g), torch.randn(10, 10, generator=g)
x, w = xs.to("tpu"), ws.to("tpu")
def f(x, w):
    y = F.layer_norm(torch.tanh(x @ w) * 0.5 + x, (10,))
    return (F.gelu(y) - y.exp()).sum(1)
out = f(x, w).cpu()
torch.testing.assert_close(out, f(xs, ws), rtol=1e-5, atol=1e-5)
# A device-side check in a new graph raises at the read, as strict eager's does.
try:
    (x[torch.tensor([1, 9], device="tpu")] * 2 + 1).cpu()
    raise SystemExit("no error")
except IndexError as e:
    error = str(e).splitlines()[0]
print(json.dumps({"out": out.tolist(), "error": error, "at_first_run": torch.tpu.compile_stats()["fused"]["fused_at_first_run"]}))
"""


def run_new_graph(tmp_path, **env):
    full = {**os.environ, "TORCHTPU_LOG_COMPILES": "1", "TORCHTPU_CACHE_DIR": str(tmp_path / "cache"), **env}
    p = subprocess.run([sys.executable, "-c", NEW_GRAPH], capture_output=True, text=True, env=full, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    compiles = [line.split("(")[0].removeprefix("torchtpu: compile ") for line in p.stderr.splitlines() if line.startswith("torchtpu: compile ")]
    return json.loads(p.stdout.strip().splitlines()[-1]), compiles


def test_a_graph_of_new_programs_compiles_as_one_program_at_its_first_run(tmp_path):
    # TORCHTPU_FUSE_NEW_GRAPHS=1: its ops' own programs never compile, one program instead of a
    # dozen (about 40 ms against 200-350 ms on the CPU plugin).
    got, compiles = run_new_graph(tmp_path, TORCHTPU_FUSE_NEW_GRAPHS="1")
    assert got["at_first_run"] >= 1
    assert "aten::tanh" not in compiles and "aten::gelu" not in compiles, compiles
    assert "torchtpu::fused" in compiles
    # The same numbers in a second run (its programs from the persistent cache) and, to
    # rounding, as strict eager's; the same error as strict eager's.
    again, cached = run_new_graph(tmp_path, TORCHTPU_FUSE_NEW_GRAPHS="1")
    assert again == got and "torchtpu::fused" in cached
    strict, _ = run_new_graph(tmp_path, TORCHTPU_FUSED_EAGER="0")
    torch.testing.assert_close(torch.tensor(got["out"]), torch.tensor(strict["out"]), rtol=1e-6, atol=1e-6)
    assert got["error"] == strict["error"] and "out of bounds" in got["error"]
    # By default: op by op, each op's program compiled.
    off, op_by_op = run_new_graph(tmp_path / "off")
    assert off["at_first_run"] == 0 and "aten::tanh" in op_by_op and "aten::gelu" in op_by_op
    torch.testing.assert_close(torch.tensor(off["out"]), torch.tensor(got["out"]), rtol=1e-6, atol=1e-6)
