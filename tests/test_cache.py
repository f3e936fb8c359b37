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
