"""TorchTitan (0.3) trains its llama3 debugmodel on "tpu" with FSDP2 over 2 torchrun processes,
on a tokenizer and data set the test makes: the loss goes down and equals a 1-process run on the
same global batches (both start from one seed checkpoint: DTensor's sharded init differs from the
unsharded one). The 1-process run also writes TorchTitan's memory snapshots (torch.tpu.memory)
and its profiler trace. scripts/setup.sh installs torchtitan."""
import glob
import gzip
import json
import os
import pickle
import re
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "torchtitan")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(EXAMPLE), env.get("PYTHONPATH", "")) if p)
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp / "hf"))
    return env


def _titan(tmp, nproc, data, local_bs, *extra):
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(_port()),
           os.path.join(EXAMPLE, "titan_tpu.py"), "--module", "titan_tpu", "--config", "llama3_debugmodel_tpu",
           "--hf_assets_path", str(tmp / "assets" / "tokenizer"),
           "--dataloader.dataset_path", str(tmp / "assets" / data),
           "--training.local_batch_size", str(local_bs), "--dump_folder", str(tmp / f"out{nproc}"), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env(tmp))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    losses = {}
    for m in re.finditer(r"step:\s+(\d+)\s+\S*loss:\s+([0-9.]+)", re.sub(r"\x1b\[[0-9;]*m", "", out)):
        losses[int(m.group(1))] = float(m.group(2))
    return losses


def test_llama_fsdp2_two_processes_matches_one(tmp_path):
    import torchtitan  # noqa: F401  (installed by scripts/setup.sh: a missing one fails here)

    subprocess.run([sys.executable, os.path.join(EXAMPLE, "titan_tpu.py"), "--make-assets", str(tmp_path / "assets")],
                   check=True, env=_env(tmp_path), timeout=120)
    seed = tmp_path / "seed"
    _titan(tmp_path, 1, "data_1p", 4, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
           "--checkpoint.folder", str(seed))
    load = ["--checkpoint.enable", "--checkpoint.load_only", "--checkpoint.initial_load_path", str(seed / "step-0")]
    one = _titan(tmp_path, 1, "data_1p", 4, *load, "--checkpoint.folder", str(tmp_path / "ck1"),
                 "--profiler.enable_memory_snapshot", "--profiler.memory_snapshot_freq", "4",
                 "--profiler.enable_profiling", "--profiler.profile_freq", "8", "--profiler.profiler_warmup", "1")
    two = _titan(tmp_path, 2, "data_2p", 2, *load, "--checkpoint.folder", str(tmp_path / "ck2"))
    assert sorted(one) == sorted(two) == list(range(1, 9)), (one, two)
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=2e-4), (step, one, two)
    assert sum(one[s] for s in (6, 7, 8)) / 3 < one[1] - 0.5, one
    # TorchTitan's memory snapshots (steps 4 and 8), in CUDA's format, with its frames.
    dumps = sorted(glob.glob(str(tmp_path / "out1" / "**" / "*.pickle"), recursive=True))
    assert len(dumps) == 2, dumps
    with open(dumps[-1], "rb") as f:
        snapshot = pickle.load(f)
    files = {fr["filename"] for s in snapshot["segments"] for fr in s["frames"]}
    assert any("torchtitan" in f for f in files), sorted(files)[:20]
    assert {e["action"] for e in snapshot["device_traces"][0]} >= {"alloc", "free_completed"}
    # TorchTitan's profiler trace of step 8: its step and the aten calls that ran on tpu. It
    # asks torch.profiler for CPU activity (and CUDA's or XPU's), so the trace has no tpu lane.
    traces = glob.glob(str(tmp_path / "out1" / "**" / "iteration_8" / "rank0_trace.json.gz"), recursive=True)
    assert len(traces) == 1, traces
    with gzip.open(traces[0], "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    steps = [n for n in names if n and n.startswith("ProfilerStep#")]
    assert len(steps) == 1 and {"aten::mm", "aten::embedding", "aten::embedding_dense_backward"} <= names, sorted(n for n in names if n)[:40]
