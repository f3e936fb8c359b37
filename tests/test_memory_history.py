"""torch.tpu.memory's history and snapshots, in torch.cuda.memory's format: each tpu storage made
while recording is a block with the Python stack that made it, its allocation and release are
trace events, and PyTorch's own _memory_viz reads the dump."""
import io
import pickle
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

from helpers import TPU


@pytest.fixture
def history():
    torch.tpu.memory._record_memory_history(stacks="python")
    yield
    torch.tpu.memory._record_memory_history(enabled=None)


def names(frames):
    return {f["name"] for f in frames}


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(TPU)


def train_step(model, opt):
    loss = model(torch.randn(8, 16, device=TPU)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def segment_at(snapshot, tensor):
    address = tensor.untyped_storage().data_ptr()
    found = [s for s in snapshot["segments"] if s["address"] == address]
    assert len(found) == 1, (address, [s["address"] for s in snapshot["segments"]])
    return found[0]


def test_a_training_steps_snapshot_lists_parameters_and_optimizer_state_with_their_stacks(history):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(model, opt)
    snapshot = torch.tpu.memory._snapshot()
    for p in model.parameters():
        seg = segment_at(snapshot, p)
        assert seg["total_size"] == seg["blocks"][0]["size"] == p.untyped_storage().nbytes()
        assert seg["blocks"][0]["state"] == "active_allocated" and seg["device"] == 0
        assert "make_model" in names(seg["blocks"][0]["frames"])
        for moment in ("exp_avg", "exp_avg_sq"):
            frames = segment_at(snapshot, opt.state[p][moment])["blocks"][0]["frames"]
            assert {"train_step", "step"} <= names(frames), names(frames)
    # Frames are innermost first, with file and line, as CUDA's.
    frames = segment_at(snapshot, next(model.parameters()))["frames"]
    assert frames[0]["filename"].endswith(".py") and frames[0]["line"] > 0
    assert [f["name"] for f in frames].index("make_model") > 0


def test_allocations_and_releases_are_trace_events(history):
    x = torch.empty(1000, device=TPU)
    address = x.untyped_storage().data_ptr()
    del x
    trace = torch.tpu.memory._snapshot()["device_traces"][0]
    mine = [e for e in trace if e["addr"] == address]
    assert [e["action"] for e in mine][-5:] == ["segment_alloc", "alloc", "free_requested", "free_completed",
                                                 "segment_free"]
    assert all(e["size"] == 4000 and e["stream"] == 0 for e in mine[-5:])
    assert "test_allocations_and_releases_are_trace_events" in names(mine[-4]["frames"])
    assert mine[-5]["time_us"] <= mine[-1]["time_us"]
    assert all(s["address"] != address for s in torch.tpu.memory._snapshot()["segments"])


def test_max_entries_keeps_the_newest_and_none_stops_and_forgets():
    torch.tpu.memory._record_memory_history(max_entries=7, stacks="python")
    try:
        kept = [torch.ones(i + 1, device=TPU) for i in range(5)]
        trace = torch.tpu.memory._snapshot()["device_traces"][0]
        assert len(trace) == 7 and trace[-1]["action"] == "alloc" and trace[-1]["size"] == 20
        # "state" keeps live storages but no events.
        torch.tpu.memory._record_memory_history(enabled="state", stacks="python")
        more = torch.ones(3, device=TPU)
        snapshot = torch.tpu.memory._snapshot()
        assert segment_at(snapshot, more)["blocks"][0]["frames"]
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)
    snapshot = torch.tpu.memory._snapshot()
    assert snapshot["segments"] == [] and all(t == [] for t in snapshot["device_traces"])
    del kept, more


def test_context_none_records_no_stacks():
    torch.tpu.memory._record_memory_history(context=None)
    try:
        x = torch.ones(5, device=TPU)
        assert segment_at(torch.tpu.memory._snapshot(), x)["frames"] == []
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)


def test_memory_viz_reads_the_dump(history, tmp_path):
    model = make_model()
    train_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    path = tmp_path / "snapshot.pickle"
    torch.tpu.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert len(snapshot["segments"]) >= 4
    # PyTorch's own tools, as a user runs them on a CUDA dump.
    for action in ("stats", "trace"):
        p = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", action, str(path)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert ("segments:" in p.stdout) if action == "stats" else ("cudaMalloc(" in p.stdout and "TOTAL MEM" in p.stdout)
    flame = io.StringIO()
    _memory_viz._write_blocks(flame, "tpu", snapshot["segments"][0]["blocks"])
    assert "make_model" in flame.getvalue() or "train_step" in flame.getvalue()
    assert "<html" in _memory_viz.trace_plot(snapshot)


def test_bad_arguments_and_paths_raise():
    with pytest.raises(RuntimeError, match="expected state to be 'state', 'all', or None"):
        torch.tpu.memory._record_memory_history(enabled="everything")
    with pytest.raises(RuntimeError, match="expected context"):
        torch.tpu.memory._record_memory_history(context="some")
    with pytest.raises(RuntimeError, match="expected stacks"):
        torch.tpu.memory._record_memory_history(stacks="cpp")
    with pytest.raises(OSError, match="no/such/dir"):
        torch.tpu.memory._dump_snapshot("/no/such/dir/snapshot.pickle")


def test_memory_summary_is_cudas_table():
    x = torch.ones(4096, device=TPU)
    text = torch.tpu.memory_summary()
    assert text == torch.tpu.memory.memory_summary(0)
    assert "PyTorch tpu memory summary, device ID 0" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.count("|") == 6}
    assert {"Allocated memory", "Active memory", "Requested memory", "Reserved memory", "Allocations",
            "Active allocs"} <= set(rows)
    current = int(rows["Allocations"].split("|")[2])
    assert current == torch.tpu.memory_stats()["allocation.all.current"] >= 1
    del x


def test_recording_starts_a_device_that_was_never_started():
    code = ("import torch; assert not torch.tpu.is_initialized(); torch.tpu.memory._record_memory_history(); "
            "print(torch.tpu.is_initialized(), torch.tpu.memory._snapshot()['segments'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["True", "[]"], p.stdout + p.stderr[-2000:]
