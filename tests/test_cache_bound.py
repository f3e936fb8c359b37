"""The in-memory executable cache is bounded (TORCHTPU_MAX_EXECUTABLES). XLA:CPU maps every
loaded executable's code into memory mappings of its own; an unbounded cache let a long
process (the whole suite in one pytest run) reach vm.max_map_count and segfault."""
import json
import os
import subprocess
import sys

PROGRAM = (
    "import json, torch\n"
    "def maps():\n"
    "    with open('/proc/self/maps') as f:\n"
    "        return sum(1 for _ in f)\n"
    "xs = [torch.arange(float(n)).to('tpu') for n in range(1, 61)]\n"
    "m0 = maps()\n"
    "passes = [[(x * 2 + 1).sum().item() for x in xs] for _ in range(3)]\n"
    "import torchtpu\n"
    "print(json.dumps({'passes': passes, 'growth': maps() - m0, 'stats': torch.tpu.compile_stats(),\n"
    "                  'platform': torchtpu.PLATFORM}))\n"
)


def run(tmp_path, limit):
    # One program per shape, as bucketed programs (which would serve most of these shapes)
    # are off: the bound is what is tested.
    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(tmp_path), "TORCHTPU_MAX_EXECUTABLES": str(limit),
           "TORCHTPU_BUCKET_PROGRAMS": "0"}
    env.pop("TORCHTPU_CACHE", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_executable_cache_is_bounded(tmp_path):
    # 60 shapes x (mul, add, sum) = 180 programs, 3 passes, at most 16 kept loaded.
    r = run(tmp_path, 16)
    expected = [float(n * (n - 1) + n) for n in range(1, 61)]
    assert all(p == expected for p in r["passes"])
    stats = r["stats"]
    assert stats["evictions"] > 0
    # Evicted programs are built again (from the persistent cache) when used again.
    assert stats["misses"] > 180 and stats["disk_hits"] > 0
    assert stats["misses"] - stats["evictions"] <= 16
    # 180 loaded programs would hold ~700 mappings; 16 hold well under 200.
    assert r["growth"] < 200, r["growth"]


def test_default_bound_keeps_small_runs(tmp_path):
    # The default bound (4096) keeps every program of a small run: no rebuilds.
    r = run(tmp_path, 4096)
    stats = r["stats"]
    assert stats["evictions"] == 0 and stats["misses"] == 180
    if r["platform"] == "cpu":
        # What the bound guards against: each program loaded on XLA:CPU holds mappings.
        assert r["growth"] > 400, r["growth"]
