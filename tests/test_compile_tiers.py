"""Which programs compile at the quick tier, the compile log that says so, and the persistent
cache keyed on the compiler flags (each case a fresh process, reading TORCHTPU_LOG_COMPILES)."""
import json
import os
import re
import subprocess
import sys

import pytest

CODE = """
import torch
small = torch.arange(8.0, device="tpu") * 3
big = torch.ones(128, 128, device="tpu") * 3
loop = torch.special.hermite_polynomial_h(torch.tensor([0.5], device="tpu"), torch.tensor([4.0], device="tpu"))
print(small.cpu().sum().item(), big.cpu().sum().item(), round(loop.cpu().item(), 4))
"""


def run(tmp_path, **env):
    full = {**os.environ, "TORCHTPU_LOG_COMPILES": "1", "TORCHTPU_CACHE_DIR": str(tmp_path / "cache"), **env}
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=full, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["84.0", "49152.0", "1.0"]  # H_4(0.5) = 16x^4 - 48x^2 + 12 = 1
    return [line for line in p.stderr.splitlines() if line.startswith("torchtpu: compile ")]


def tier_of(lines, op, types):
    pattern = re.compile(rf"torchtpu: compile {re.escape(op)}\({re.escape(types)}\) [0-9.]+ ms \((compiled|persistent cache)(, quick tier)?\)")
    found = [m for m in map(pattern.match, lines) if m]
    assert found, f"no compile of {op}({types}) in:\n" + "\n".join(lines)
    return found[0].group(1), bool(found[0].group(2))


def test_small_loop_free_programs_take_the_quick_tier(tmp_path):
    lines = run(tmp_path)
    assert tier_of(lines, "aten::mul", "8xf32, i64") == ("compiled", True)
    # Above TORCHTPU_QUICK_COMPILE_ELEMENTS (4096): the quick tier first (it tiers up after
    # some runs, test_a_program_tiers_up_at_a_fixed_run)...
    assert tier_of(lines, "aten::mul", "128x128xf32, i64") == ("compiled", True)
    # ... or with tier-ups off, full optimization at once.
    off = run(tmp_path / "off", TORCHTPU_TIER_UP_ELEMENTS="0")
    assert tier_of(off, "aten::mul", "128x128xf32, i64") == ("compiled", False)
    # A recurrence (a while loop), however small: the quick tier first too, never for good (its
    # body runs many times; test_a_program_tiers_up_at_a_fixed_run)...
    assert tier_of(lines, "aten::special_hermite_polynomial_h", "1xf32, 1xf32") == ("compiled", True)
    # ... or with tier-ups off, full optimization at once.
    assert tier_of(off, "aten::special_hermite_polynomial_h", "1xf32, 1xf32") == ("compiled", False)


def test_quick_tier_can_be_turned_off(tmp_path):
    lines = run(tmp_path, TORCHTPU_QUICK_COMPILE_ELEMENTS="0")
    assert tier_of(lines, "aten::mul", "8xf32, i64") == ("compiled", False)
    assert tier_of(lines, "aten::mul", "128x128xf32, i64") == ("compiled", False)


TIER_UP = """
import json, sys, torch
torch.tpu.set_fused_eager(sys.argv[1] == "fused")
name, shape = sys.argv[2], [int(n) for n in sys.argv[3].split("x")]
graph = lambda x: torch.tanh(x) * 2
op = {
    "aten::tanh": torch.tanh,
    "aten::special_hermite_polynomial_h": lambda x: torch.special.hermite_polynomial_h(x, 5),
    "torchtpu::run_graph": graph,
}[name]
on_tpu = torch.compile(graph, backend="tpu") if op is graph else op
x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 2
d = x.to("tpu")
rows = []
for run in range(1, 31):
    got = on_tpu(d).cpu()
    torch.testing.assert_close(got, op(x), rtol=1e-5, atol=1e-5)
    s = torch.tpu.compile_stats()
    tier = [p["tier"] for p in s["programs"] if p["op"] == name]
    rows.append([run, tier, s["tier_ups"], got.view(torch.int32).sum().item()])
print(json.dumps(rows))
"""

PROGRAMS = {
    # Above the quick tier's 4096 elements.
    "aten::tanh": ("128x128", "128x128xf32"),
    # A recurrence (a while loop), however small.
    "aten::special_hermite_polynomial_h": ("4x4", "4x4xf32, i64"),
    # A torch.compile graph, however small.
    "torchtpu::run_graph": ("4x4", "4x4xf32"),
}


@pytest.mark.parametrize("program", list(PROGRAMS))
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_program_tiers_up_at_a_fixed_run(tmp_path, mode, program):
    # Programs that keep no quick-tier code for good compile there first; their full-tier
    # program compiles on a worker thread from their 8th run and takes over at their 25th,
    # whatever the compile's speed (a script run twice gives the same numbers).
    shape, types = PROGRAMS[program]
    env = {**os.environ, "TORCHTPU_LOG_COMPILES": "1", "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", TIER_UP, mode, program, shape], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    assert [r[1] for r in rows] == [["quick"]] * 24 + [["full"]] * 6, rows
    assert [r[2] for r in rows] == [0] * 7 + [1] * 23, rows
    # The same bits before and after each switch's run, and across the runs of one tier.
    bits = {tier[0]: {r[3] for r in rows if r[1] == [tier[0]]} for tier in (["quick"], ["full"])}
    assert len(bits["quick"]) == 1 and len(bits["full"]) == 1, bits
    assert tier_of(p.stderr.splitlines(), program, types) == ("compiled", True)
    # The log names the full-tier build a tier-up: it is no new program.
    full = [line for line in p.stderr.splitlines() if line.startswith(f"torchtpu: tier-up {program}({types})")]
    assert len(full) == 1 and full[0].endswith("(compiled)"), p.stderr


def test_persistent_cache_keys_on_compiler_flags(tmp_path):
    run(tmp_path)
    assert tier_of(run(tmp_path), "aten::mul", "8xf32, i64") == ("persistent cache", True)
    # Other XLA_FLAGS: other executables, never the cached ones.
    flagged = run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert tier_of(flagged, "aten::mul", "8xf32, i64") == ("compiled", True)


STATS = """
import json, torch
x = torch.arange(8.0, device="tpu")
(x * 3).cpu(); (x + 1).cpu(); (x[:5] * 3).cpu()
s = torch.tpu.compile_stats()
print(json.dumps({k: s[k] for k in ("misses", "compile_seconds", "phases", "ops")}))
"""


def stats_of(tmp_path):
    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", STATS], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_compile_stats_split_compile_time_by_phase_and_op(tmp_path):
    first = stats_of(tmp_path)
    phases = first["phases"]
    assert set(phases) == {"lower", "xla_compile", "cache_load", "cache_store"}
    assert phases["xla_compile"] > 0 and phases["lower"] > 0 and phases["cache_store"] > 0
    # Cache stores run on a writer thread, outside compile_seconds.
    assert phases["lower"] + phases["xla_compile"] + phases["cache_load"] == pytest.approx(first["compile_seconds"], rel=1e-6)
    # Every miss is one program of one op, compiled or loaded; two shapes of mul, one of add.
    assert sum(op["programs"] for op in first["ops"].values()) == first["misses"]
    assert [op["programs"] for name, op in first["ops"].items() if name.startswith("aten::mul")] == [2]
    assert [op["programs"] for name, op in first["ops"].items() if name.startswith("aten::add")] == [1]
    # A second process finds every program in the persistent cache: no XLA compile.
    second = stats_of(tmp_path)
    assert second["phases"]["xla_compile"] == 0 and second["phases"]["cache_load"] > 0
    assert second["ops"].keys() == first["ops"].keys()
