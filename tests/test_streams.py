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
