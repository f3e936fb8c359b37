"""Copies between host memory and tpu, as CUDA's: with non_blocking=True and pinned memory they
return before they are done, and torch.tpu.synchronize, torch.accelerator.synchronize, an Event
or a later read on the device wait for them; from pageable memory they are synchronous. Each
case runs in strict and in fused eager mode."""
import subprocess
import sys
import textwrap

import pytest
import torch

TPU = "tpu"


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    torch.tpu.set_fused_eager(request.param == "fused")
    return request.param


def waits(how):
    """Ways to wait for queued work, as a user would write them."""
    if how == "synchronize":
        torch.tpu.synchronize()
    elif how == "accelerator":
        torch.accelerator.synchronize()
    elif how == "event":
        e = torch.tpu.Event()
        e.record()
        e.synchronize()
    else:
        torch.tpu.current_stream().synchronize()


@pytest.mark.parametrize("how", ["synchronize", "accelerator", "event", "stream"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_non_blocking_copy_into_pinned_memory_is_done_after_a_wait(mode, how, dtype):
    a = (torch.randn(64, 33) * 10).to(dtype)
    b = (torch.randn(64, 33) * 10).to(dtype)
    expected = a | b if dtype == torch.bool else a * b - a
    out = torch.empty(64, 33, dtype=dtype).pin_memory()
    ta, tb = a.to(TPU), b.to(TPU)
    out.copy_(ta | tb if dtype == torch.bool else ta * tb - ta, non_blocking=True)  # a result not yet run
    waits(how)
    torch.testing.assert_close(out, expected)


def test_to_cpu_non_blocking_returns_pinned_memory(mode):
    x = torch.randn(5, 7)
    y = (x.to(TPU) * 3).to("cpu", non_blocking=True)
    assert y.device.type == "cpu" and y.is_pinned()
    torch.tpu.synchronize()
    torch.testing.assert_close(y, x * 3)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (17,), (4, 5, 6)])
def test_non_blocking_copies_of_0d_empty_and_nd_tensors(mode, shape):
    x = torch.randn(shape)
    dev = x.pin_memory().to(TPU, non_blocking=True)
    back = torch.empty(shape).pin_memory()
    back.copy_(dev + 1, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(dev.cpu(), x) and torch.equal(back, x + 1)


def test_non_blocking_copy_into_strided_or_converting_pinned_views(mode):
    # Not a whole buffer of the source's dtype: copied before returning, and still right.
    x = torch.randn(6, 4)
    out = torch.zeros(4, 6).pin_memory()
    out.t().copy_(x.to(TPU), non_blocking=True)
    wide = torch.zeros(6, 4, dtype=torch.float64).pin_memory()
    wide.copy_(x.to(TPU), non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(out.t(), x) and torch.equal(wide, x.double())


def test_non_blocking_upload_from_pinned_memory_is_read_on_the_device(mode):
    x = torch.randn(128, 64)
    src = x.pin_memory()
    dev = src.to(TPU, non_blocking=True)
    # The device's reads wait for the copy: an op on it, and a read back.
    torch.testing.assert_close((dev * 2).sum(0).cpu(), (x * 2).sum(0))
    half = src.to(TPU, dtype=torch.float16, non_blocking=True)  # converted on the host first
    assert torch.equal(half.cpu(), x.half())
    part = torch.zeros(4, 128, 64, device=TPU)
    part[2].copy_(src, non_blocking=True)  # a part of a storage
    assert torch.equal(part[2].cpu(), x) and part[:2].abs().sum().item() == 0


def test_non_blocking_upload_from_pageable_memory_is_synchronous(mode):
    # PyTorch's semantics: from pageable memory non_blocking changes nothing, so the source may
    # be changed as soon as the copy returns.
    x = torch.arange(1000.0)
    dev = x.to(TPU, non_blocking=True)
    x.fill_(-1)
    assert torch.equal(dev.cpu(), torch.arange(1000.0))


def _run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_memory_of_a_running_copy_outlives_its_tensor():
    # The copy holds the pinned storages it reads and writes: dropping the tensors before the
    # copy is done neither crashes nor changes what arrives.
    out = _run("""
        import gc, torch, torchtpu
        n = 1 << 22
        for step in range(6):
            src = torch.full((n,), float(step)).pin_memory()
            dev = src.to("tpu", non_blocking=True)
            del src
            dst = torch.empty(n).pin_memory()
            dst.copy_(dev * 2, non_blocking=True)
            del dst
            gc.collect()
            junk = [torch.ones(n).pin_memory() for _ in range(3)]  # reuses freed memory, if any
            print(int(dev.sum().item()) == step * n, end=" ")
        torch.tpu.synchronize()
        print("done", flush=True)
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"] * 6 + ["done"]


def test_a_failed_device_check_before_a_non_blocking_copy_raises_at_synchronize(mode):
    x, idx = torch.randn(10), torch.tensor([3, 12])
    blocking = x.to(TPU)[idx.to(TPU)]
    with pytest.raises(Exception) as expected:
        blocking.cpu()
    out = torch.empty(2).pin_memory()
    out.copy_(x.to(TPU)[idx.to(TPU)], non_blocking=True)
    with pytest.raises(type(expected.value)) as got:
        torch.tpu.synchronize()
    assert str(got.value).splitlines()[0] == str(expected.value).splitlines()[0]
    assert torch.equal(torch.arange(3.0, device=TPU).cpu(), torch.arange(3.0))  # usable after


def test_copies_through_one_pinned_buffer_keep_their_order(mode):
    # A cache offloaded to pinned memory and brought back (Hugging Face's offloaded caches): the
    # upload reads what the download wrote, as on one CUDA stream; so does a CPU op on it
    # after a synchronization.
    n = 1 << 20
    pinned = torch.empty(n).pin_memory()
    for step in range(4):
        pinned.copy_(torch.full((n,), 1.0, device=TPU) * (step + 1), non_blocking=True)
        back = pinned.to(TPU, non_blocking=True)
        pinned.copy_(back * 10, non_blocking=True)
        again = pinned.to(TPU, dtype=torch.float64, non_blocking=True)  # converted on the host
        assert back.sum().item() == n * (step + 1) and again.sum().item() == n * (step + 1) * 10
    torch.tpu.synchronize()
    assert torch.equal(pinned, torch.full((n,), 40.0))
