"""torch.tpu.Event and torch.tpu.Stream, shaped like torch.cuda's."""
import math
import pytest
import torch
from helpers import TPU, make


def test_event_times_the_work_between_two_records():
    # A recurrence h <- tanh(h @ w) with w's entries of variance 1/n: each
    # product stays O(1) and w's spectral norm is about 2, so rounding
    # differences stay near float32's epsilon whatever the seed and the CPU's
    # vector width (squaring x four times saturated tanh and flipped signs).
    n = 256
    w = make((n, n)) / math.sqrt(3 * n)  # make() is uniform on [-3, 3]: variance 3
    ref = make((n, n))
    x, wd = ref.to(TPU), w.to(TPU)
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        x = torch.tanh(x @ wd)
        ref = torch.tanh(ref @ w)
    end.record()
    end.synchronize()
    assert end.query() and start.query()
    ms = start.elapsed_time(end)
    assert ms >= 0.0
    assert end.elapsed_time(start) == pytest.approx(-ms)
    torch.testing.assert_close(x.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_event_query_and_synchronize_without_timing():
    e = torch.tpu.Event()
    assert e.query()  # never recorded: nothing to wait for, like CUDA
    y = make((128, 128)).to(TPU).exp().sum()
    e.record()
    e.synchronize()
    assert e.query()
    assert torch.isfinite(y).item()


def test_event_timing_errors():
    a, b = torch.tpu.Event(), torch.tpu.Event()
    a.record()
    b.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        a.elapsed_time(b)
    with pytest.raises(RuntimeError, match="recorded"):
        torch.tpu.Event(enable_timing=True).elapsed_time(torch.tpu.Event(enable_timing=True))
    with pytest.raises(NotImplementedError):
        torch.tpu.Event(interprocess=True)


def test_streams_share_the_device_queue():
    s = torch.tpu.Stream()
    assert torch.tpu.current_stream() == torch.tpu.default_stream() == s
    x = make((8, 8))
    with torch.tpu.stream(s):
        y = x.to(TPU) * 2
    other = torch.tpu.Stream()
    other.wait_stream(s)
    e = s.record_event()
    other.wait_event(e)
    with torch.tpu.stream(other):
        z = y + 1
    other.synchronize()
    assert other.query()
    torch.testing.assert_close(z.cpu(), x * 2 + 1)


def test_work_whose_results_were_dropped_is_waited_for():
    # A timing loop that never reads its results: an event recorded after it is not done while
    # that work runs, and synchronize waits for it (before, both ignored work whose buffers had
    # been freed: synchronize returned at once, and a script exiting under it could crash).
    torch.tpu.set_fused_eager(False)  # each call runs when made
    a = torch.randn(1500, 1500, device=TPU)
    f = torch.compile(lambda a: (a @ a @ a @ a).sin().sum(0), backend="tpu")
    f(a).cpu()
    for _ in range(3):
        f(a)
    after = torch.tpu.Event()
    after.record()
    assert not after.query()  # three calls of about 0.1 s each, queued just now
    torch.tpu.synchronize()
    assert after.query()


def test_a_script_exiting_under_running_work_exits_cleanly():
    import subprocess
    import sys

    # (Compiled flex attention over 4096 tokens: exiting under its calls crashed 3 runs in 4.)
    script = ("import torch\n"
              "from torch.nn.attention.flex_attention import create_block_mask, flex_attention\n"
              "torch.tpu.set_fused_eager(False)\n"
              "q, k, v = (torch.randn(1, 8, 4096, 64, device='tpu') for _ in range(3))\n"
              "mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, 4096, 4096, device='tpu')\n"
              "f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=mask), backend='tpu')\n"
              "for _ in range(4):\n"
              "    f(q, k, v)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
