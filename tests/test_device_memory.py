"""Memory statistics on "tpu": torch.tpu.memory_stats and friends with CUDA's key names, and
torch.accelerator's memory functions (through the shim's DeviceAllocator), counted per device."""
import subprocess
import sys

import pytest
import torch
from helpers import TPU

MiB = 2**20


def test_allocated_counts_live_buffers_bytes_and_peak():
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    stats0 = torch.tpu.memory_stats()
    torch.tpu.reset_peak_memory_stats()
    a = torch.ones(MiB // 4, device=TPU)  # 1 MiB of float32
    b = torch.ones(2 * MiB // 4, device=TPU)
    assert torch.tpu.memory_allocated() == base + 3 * MiB
    del a
    assert torch.tpu.memory_allocated() == base + 2 * MiB
    assert torch.tpu.max_memory_allocated() == base + 3 * MiB
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + 2 * MiB
    assert stats["allocated_bytes.all.peak"] == base + 3 * MiB
    assert stats["allocated_bytes.all.allocated"] - stats0["allocated_bytes.all.allocated"] == 3 * MiB
    assert stats["allocated_bytes.all.freed"] - stats0["allocated_bytes.all.freed"] == MiB
    assert stats["allocation.all.current"] == stats0["allocation.all.current"] + 1
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    # The CPU plugin allocates each buffer on its own: what it holds is what tensors hold.
    if torch.tpu.get_device_name() == "XLA CPU":
        assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved() >= 0
    del b
    assert torch.tpu.memory_allocated() == base
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


def test_reset_accumulated_zeroes_the_totals():
    x = torch.ones(1024, device=TPU)
    torch.tpu.reset_accumulated_memory_stats()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0 and stats["allocated_bytes.all.freed"] == 0
    del x
    assert torch.tpu.memory_stats()["allocated_bytes.all.freed"] == 4096


def test_torch_accelerator_memory_functions():
    assert torch.accelerator.current_accelerator().type == "tpu"
    base = torch.accelerator.memory_allocated()
    x = torch.zeros(MiB // 4, device=TPU) + 1  # a computed result: one live 1 MiB buffer more
    assert torch.accelerator.memory_allocated() == base + MiB
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.accelerator.max_memory_allocated() >= base + MiB
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + MiB
    assert stats["reserved_bytes.all.current"] == torch.tpu.memory_reserved()
    torch.accelerator.empty_cache()  # nothing cached: a no-op that must not fail
    del x
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base
    if hasattr(torch.accelerator, "get_memory_info"):
        assert torch.accelerator.get_memory_info() == pytest.approx(torch.tpu.mem_get_info(), rel=0.05)


def test_get_device_properties():
    props = torch.tpu.get_device_properties(0)
    assert props.name == torch.tpu.get_device_name()
    assert props.total_memory == torch.tpu.mem_get_info(0)[1] > 0
    assert props.type == "tpu" and props.index == 0
    assert isinstance(props.attributes, dict)  # the plugin's own facts (the CPU plugin: none needed)
    if "core_count" in props.attributes:  # a GPU: its SM count under CUDA's name
        assert props.multi_processor_count == props.attributes["core_count"] > 0
    assert torch.tpu.get_device_properties("tpu:0").name == props.name
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.tpu.get_device_properties(torch.tpu.device_count())


def test_stats_are_per_device():
    code = (
        "import torch\n"
        "x = torch.ones(1024, device='tpu:1')\n"
        "print(torch.tpu.memory_allocated(0), torch.tpu.memory_allocated(1),"
        " torch.accelerator.memory_allocated(1), torch.tpu.memory_stats('tpu:1')['allocation.all.current'])\n"
    )
    env = {**__import__("os").environ, "TORCHTPU_CPU_DEVICES": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "4096", "4096", "1"]


def test_pin_memory():
    # Pinned host memory is ordinary CPU memory that says it is pinned: DDP asserts it for its
    # staging buffers, and DataLoader(pin_memory=True) hands out pinned batches.
    x = torch.ones(2)
    assert not x.is_pinned()
    y = x.pin_memory()
    assert y.device.type == "cpu" and y.is_pinned() and torch.equal(x, y)
    assert torch.empty(3, pin_memory=True).is_pinned() and torch.empty(0, pin_memory=True).device.type == "cpu"
    assert not y.clone().is_pinned() and not y[1:].clone().is_pinned()
    data = torch.utils.data.TensorDataset(torch.arange(8.0).view(4, 2))
    loaded = list(torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True))
    assert all(b.is_pinned() for (b,) in loaded)
    batches = [b.to(TPU, non_blocking=True) for (b,) in loaded]
    assert torch.equal(torch.cat(batches).cpu(), data.tensors[0])
