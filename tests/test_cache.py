"""The persistent executable cache: warm starts hit it, other plugins and corrupted entries
never load."""
import importlib.util
import json
import os
import subprocess
import sys

PROGRAM = (
    "import json, torch\n"
    "x = torch.arange(12.0).reshape(3, 4).to('tpu')\n"
    "y = (x.exp() * 0.5 + x.sin()).sum(dim=0)\n"
    "print(json.dumps({'y': y.cpu().tolist(), 'stats': torch.tpu.compile_stats()}))\n"
)


def run(cache_dir, plugin=None):
    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(cache_dir)}
    env.pop("TORCHTPU_CACHE", None)
    if plugin:
        env["TORCHTPU_PJRT_PLUGIN"] = plugin
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def expected():
    import torch

    x = torch.arange(12.0).reshape(3, 4)
    return (x.exp() * 0.5 + x.sin()).sum(dim=0).tolist()


def close(a, b):
    return all(abs(p - q) <= 1e-4 * max(1.0, abs(q)) for p, q in zip(a, b))


def test_warm_start_loads_from_disk(tmp_path):
    cold = run(tmp_path)
    assert cold["stats"]["disk_writes"] > 0 and cold["stats"]["disk_hits"] == 0
    warm = run(tmp_path)
    assert warm["stats"]["disk_hits"] == cold["stats"]["disk_writes"]
    assert warm["stats"]["disk_writes"] == 0
    assert close(warm["y"], expected()) and close(cold["y"], expected())


def test_other_plugin_never_loads_our_entries(tmp_path):
    spec = importlib.util.find_spec("lammps_jax_pjrt_cpu")
    assert spec is not None
    other = os.path.join(spec.submodule_search_locations[0], "pjrt_c_api_cpu_plugin.so")
    first = run(tmp_path)
    second = run(tmp_path, plugin=other)
    assert second["stats"]["disk_hits"] == 0 and second["stats"]["disk_writes"] > 0
    assert close(second["y"], expected()) and close(first["y"], expected())


def test_corrupted_entries_are_recompiled(tmp_path):
    cold = run(tmp_path)
    entries = [p for p in tmp_path.iterdir() if p.suffix == ".xla"]
    assert entries
    for i, p in enumerate(entries):
        data = bytearray(p.read_bytes())
        if i % 2:
            data[len(data) // 2] ^= 0xFF
            p.write_bytes(bytes(data))
        else:
            p.write_bytes(bytes(data[: len(data) // 3]))
    again = run(tmp_path)
    assert again["stats"]["disk_hits"] == 0
    assert again["stats"]["disk_rejected"] == len(entries)
    assert again["stats"]["disk_writes"] == cold["stats"]["disk_writes"]
    assert close(again["y"], expected())



def test_compile_stats_reset_starts_the_counts_over_and_keeps_the_programs():
    import torch

    from helpers import TPU

    was = torch.tpu.is_fused_eager()
    torch.tpu.set_fused_eager(False)
    try:
        x = torch.randn(7, 19, device=TPU)
        (x.atan() * 3).cpu()
        before = torch.tpu.compile_stats(reset=True)
        assert before["misses"] + before["hits"] > 0 and before["executions"] > 0
        after = torch.tpu.compile_stats()
        assert (after["hits"], after["misses"], after["executions"], after["compile_seconds"]) == (0, 0, 0, 0.0)
        assert after["ops"] == {} and after["fused"]["ops"] == 0
        assert all(v == 0.0 for v in after["phases"].values())
        (x.atan() * 3).cpu()  # cached: hits only
        again = torch.tpu.compile_stats()
        assert again["misses"] == 0 and again["hits"] >= 2 and again["executions"] >= 2
        torch.randn(7, 23, device=TPU).atan().cpu()  # a new shape compiles
        assert torch.tpu.compile_stats()["misses"] >= 1
    finally:
        torch.tpu.set_fused_eager(was)


def test_compile_stats_lists_each_cached_program_with_its_calls_compile_time_and_last_use():
    import torch

    from helpers import TPU

    was = torch.tpu.is_fused_eager()
    torch.tpu.set_fused_eager(False)
    try:
        x = torch.randn(5, 13, device=TPU)
        for _ in range(4):
            x.asinh()
        x.acosh().cpu()
        programs = torch.tpu.compile_stats()["programs"]
        asinh = [p for p in programs if p["op"] == "aten::asinh" and p["signature"] == "(5x13xf32)"]
        acosh = [p for p in programs if p["op"] == "aten::acosh" and p["signature"] == "(5x13xf32)"]
        assert len(asinh) == 1 and len(acosh) == 1, programs[:5]
        assert asinh[0]["calls"] == 4 and acosh[0]["calls"] == 1
        # Most recently used first: acosh was the last op, asinh one call before it.
        assert acosh[0]["calls_ago"] == 0 and asinh[0]["calls_ago"] == 1
        assert programs.index(acosh[0]) < programs.index(asinh[0])
        assert all(p["compile_seconds"] > 0 for p in asinh + acosh)
        assert not asinh[0]["bucketed"]
        # reset=True starts the counts over; the programs stay cached with theirs.
        torch.tpu.compile_stats(reset=True)
        x.asinh().cpu()
        again = [p for p in torch.tpu.compile_stats()["programs"] if p["op"] == "aten::asinh" and p["signature"] == "(5x13xf32)"]
        assert again[0]["calls"] == 5 and again[0]["calls_ago"] == 0
    finally:
        torch.tpu.set_fused_eager(was)


def test_compile_stats_lists_fused_programs_with_the_ops_they_hold():
    import torch

    from helpers import TPU

    torch.tpu.set_fused_eager(True)  # conftest restores the mode
    x = torch.randn(3, 17, device=TPU)
    x.cpu()  # its own graph

    def fused():
        return [p for p in torch.tpu.compile_stats()["programs"]
                if p["op"] == "torchtpu::fused" and p["ops"] == ["aten::mul", "aten::add", "aten::atan"]
                and p["signature"] == "(3x17xf32, i64, i64)"]

    # A step's graph runs op by op a few times (more where its ops' programs change, as
    # bucketed ones give way to exact ones), compiles as one program on a worker thread, and
    # runs as that.
    for _ in range(20):
        got = (x * 3 + 1).atan().cpu()
    torch.testing.assert_close(got, (x.cpu() * 3 + 1).atan())
    rows = fused()
    assert len(rows) == 1 and rows[0]["calls"] >= 1, [p for p in torch.tpu.compile_stats()["programs"] if p["op"] == "torchtpu::fused"]
    runs = rows[0]["calls"]
    for _ in range(2):
        (x * 3 + 1).atan().cpu()
    row = fused()[0]
    assert row["calls"] == runs + 2 and row["calls_ago"] == 0 and row["compile_seconds"] > 0
    assert not row["bucketed"] and row["tier"] == "quick"
    # An op's own program lists itself (called alone, in strict mode: whether the graph's
    # ops ran alone before its program took over depends on what the process ran before).
    torch.tpu.set_fused_eager(False)
    torch.atan(x).cpu()
    programs = torch.tpu.compile_stats()["programs"]
    assert any(p["op"] == "aten::atan" for p in programs)
    assert all(p["ops"] == [p["op"]] for p in programs if p["op"] != "torchtpu::fused")
