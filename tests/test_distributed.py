"""torch.distributed on "tpu" under a real torchrun: 2 processes on loopback, each with its own
CPU-plugin client. The checks themselves are in distributed_worker.py; every distributed result
is compared there with the same computation done on one process."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distributed_worker.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")

CHECKS = [
    "all_reduce", "premul_sum", "async_and_zero_d", "broadcast", "all_gather", "reduce_scatter",
    "reduce_gather_scatter", "all_to_all",
    "send_recv_and_barrier", "objects", "subgroup", "gloo_subgroup", "staging_reuse", "in_place_device_memory", "functional", "mismatched_sizes_raise",
    "ddp", "ddp_unused_parameters", "sync_batch_norm", "fsdp2", "fsdp2_mixed_precision_uneven", "dtensor_and_tp",
    "sequence_parallel", "checkpoint", "compiled_functional",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, init, checks, nproc=2, timeout=300):
    """Runs the worker under torchrun; returns each rank's results."""
    out = tmp_path / init
    out.mkdir()
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           WORKER, init, str(out), *checks]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHTPU_CPU_DEVICES")}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    results = []
    for r in range(nproc):
        f = out / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no results (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
        results.append(json.loads(f.read_text()))
    return results


@pytest.fixture(scope="module")
def device_id_run(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("dist"), "device_id", CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_check(device_id_run, check):
    for rank, results in enumerate(device_id_run):
        assert results[check] == "ok", f"rank {rank}:\n{results[check]}"


def test_backend_is_chosen_for_tpu(device_id_run):
    # init_process_group(device_id=tpu:i) with no backend: "tccl" for tpu (and the CPU tensors of its groups).
    assert device_id_run[0]["backend"] == "cpu:tccl,tpu:tccl"


@pytest.mark.parametrize("init,backend", [("none", "tpu:tccl"), ("string", "cpu:gloo,tpu:tccl")])
def test_other_ways_to_start(tmp_path, init, backend):
    results = launch(tmp_path, init, ["all_reduce", "ddp"])
    for rank, r in enumerate(results):
        assert r["backend"] == backend
        assert r["all_reduce"] == "ok" and r["ddp"] == "ok", f"rank {rank}: {r}"


@pytest.mark.parametrize("init", ["none", "device_id"])
def test_a_two_dimensional_mesh(tmp_path, init):
    # 4 processes: a 2 x 2 mesh's row and column subgroups, and a DTensor sharded over both.
    # Started with device_id, DeviceMesh makes its subgroups by splitting the default group
    # (torch's split_group), without it with new_group.
    for rank, r in enumerate(launch(tmp_path, init, ["mesh_2d"], nproc=4)):
        assert r["mesh_2d"] == "ok", f"rank {rank}: {r['mesh_2d']}"


def test_registered_in_one_process():
    import torch.distributed as dist

    assert "tccl" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["tpu"] == "tccl"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_a_dead_rank_makes_the_other_fail(tmp_path):
    # Rank 1 exits without a word; rank 0's next collective raises (it does not hang).
    code = (
        "import os, sys, torch, torch.distributed as dist\n"
        "from datetime import timedelta\n"
        "dist.init_process_group(timeout=timedelta(seconds=20))\n"
        "if dist.get_rank() == 1: os._exit(0)\n"
        "x = torch.ones(3, device='tpu')\n"
        "try:\n"
        "    dist.all_reduce(x); dist.all_reduce(x)\n"
        "except Exception as e:\n"
        "    open(sys.argv[1], 'w').write(type(e).__name__)\n"
    )
    script = tmp_path / "die.py"
    script.write_text(code)
    marker = tmp_path / "raised"
    cmd = [TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), str(marker)]
    subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert marker.exists(), "rank 0 did not raise after rank 1 died"
