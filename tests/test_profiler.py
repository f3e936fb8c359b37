"""torch.profiler with the device: each program tpu runs is a device event linked to the aten
call that launched it, a fused eager graph is one event naming its ops, and compiles are host
events saying whether the program was compiled or loaded."""
import json
import time

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from helpers import TPU

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


@pytest.fixture
def strict_eager():
    torch.tpu.set_fused_eager(False)
    yield
    torch.tpu.set_fused_eager(True)


def test_device_time_per_op_adds_up_to_a_device_bound_loop(strict_eager):
    # Large products, so that the loop stays device-bound while other processes share the cores.
    x = torch.randn(1024, 1024, device=TPU) / 32
    for _ in range(2):  # compiled before the profile
        torch.tanh(x @ x).cpu()
    with profile(activities=BOTH) as prof:
        start = time.perf_counter()
        for _ in range(8):
            x = torch.tanh(x @ x)
        torch.tpu.synchronize()
        wall = time.perf_counter() - start
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::mm"].count == 8 and rows["aten::mm"].self_device_time_total > 0
    assert rows["aten::tanh"].self_device_time_total > 0
    events = device_events(prof)
    assert {e.name for e in events} == {"aten::mm", "aten::tanh"} and len(events) == 16
    assert all(e.time_range.end >= e.time_range.start for e in events)
    # One device: its events do not overlap.
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    busy = sum(e.time_range.elapsed_us() for e in events) / 1e6
    # The device is busy nearly all the loop; the rest is the host's share of each call.
    print(f"device busy {busy:.3f} s of {wall:.3f} s")
    assert 0.8 * wall <= busy <= wall, (busy, wall)


def test_a_fused_step_is_one_device_event_naming_its_ops():
    x = torch.randn(32, 32, device=TPU)

    def step(x):
        return torch.tanh(x @ x) * 0.5 + 1.0

    for _ in range(12):  # fused from its third run, compiled by the twelfth
        x = step(x)
        x.sum().item()
    assert torch.tpu.is_fused_eager()
    with profile(activities=BOTH) as prof:
        for _ in range(3):
            x = step(x)
            x.sum().item()
    names = [e.name for e in device_events(prof)]
    assert names == ["torchtpu fused graph (5 ops): mm, tanh, mul, add, sum"] * 3


def test_compiles_are_host_events_saying_where_the_program_came_from(strict_eager):
    z = torch.randn(29, 13, device=TPU)
    with profile(activities=BOTH) as prof:
        torch.special.erfcx(z).cpu()
        torch.special.erfcx(z).cpu()  # the same program: no second compile
    compiles = [e for e in prof.events() if e.name.startswith("torchtpu compile aten::special_erfcx")]
    assert len(compiles) == 1 and compiles[0].device_type == DeviceType.CPU
    assert compiles[0].name.endswith(("(compiled)", "(persistent cache)"))
    assert compiles[0].time_range.elapsed_us() > 0


def test_chrome_trace_has_a_device_lane(tmp_path, strict_eager):
    x = torch.randn(16, 16, device=TPU)
    with profile(activities=BOTH) as prof:
        (x + 1).cpu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert [k["name"] for k in kernels] == ["aten::add"]
    assert kernels[0]["dur"] > 0 and "External id" in kernels[0]["args"]


def test_no_device_work_or_no_device_activity_gives_no_device_events():
    with profile(activities=BOTH) as prof:
        pass
    assert device_events(prof) == []
    x = torch.randn(8, device=TPU)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x * 2).cpu()
    assert device_events(prof) == []
    assert any(e.name == "aten::mul" for e in prof.events())
