"""A tpu storage's data pointer is an address in a reserved region that faults on any access
(never the engine's own state): a stray host read or write through it stops the process at
once with a message naming tpu memory, and live storages never share an address range."""
import signal
import subprocess
import sys
import textwrap

import torch
from helpers import TPU


def _run(code, *flags):
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def _faulted_in_tpu_memory(out):
    assert out.returncode == -signal.SIGSEGV, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "torchtpu: a kernel read or wrote the data of a tpu tensor as host memory" in out.stderr, out.stderr[-2000:]


def test_stray_host_read_faults_with_a_message():
    out = _run("""
        import ctypes, torch
        x = torch.arange(4.0, device="tpu")
        print("before", flush=True)
        print(ctypes.c_float.from_address(x.data_ptr()).value, flush=True)
        print("after", flush=True)
    """)
    _faulted_in_tpu_memory(out)
    assert out.stdout.split() == ["before"]


def test_stray_host_write_faults_with_a_message():
    out = _run("""
        import ctypes, torch
        x = torch.arange(4.0, device="tpu")
        ctypes.memset(x.data_ptr(), 0, 16)
        print("after", flush=True)
    """)
    _faulted_in_tpu_memory(out)
    assert "after" not in out.stdout


def test_faulthandler_still_prints_the_python_stack():
    # faulthandler enabled first (python -X faulthandler, pytest): torchtpu's handler runs
    # first, then hands the fault on.
    out = _run("""
        import ctypes, torch
        x = torch.ones(2, device="tpu")
        def stray_read():
            return ctypes.c_double.from_address(x.data_ptr()).value
        stray_read()
    """, "-X", "faulthandler")
    _faulted_in_tpu_memory(out)
    assert "stray_read" in out.stderr


def test_live_storages_have_disjoint_address_ranges():
    xs = [torch.empty(n, device=TPU) for n in (0, 1, 3, 64, 65, 1000, 4096)]
    xs += [x + 1 for x in xs]  # computed results get addresses too
    spans = sorted((x.untyped_storage().data_ptr(), x.untyped_storage().data_ptr() + max(x.untyped_storage().nbytes(), 1))
                   for x in xs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    assert len({x.untyped_storage().data_ptr() for x in xs}) == len(xs)


def test_views_point_into_their_storage():
    x = torch.arange(12.0, device=TPU).view(3, 4)
    assert x[1].data_ptr() == x.data_ptr() + 4 * 4
    assert x[:, 2].data_ptr() == x.data_ptr() + 2 * 4
    assert x.t().untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_resizing_past_the_range_moves_the_storage_and_keeps_the_data():
    x = torch.arange(4.0, device=TPU)
    before = x.data_ptr()
    y = x.view(2, 2)
    x.resize_(1000)
    assert x.data_ptr() != before  # 16 bytes -> 4000 bytes: a larger range
    assert x[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # views follow
    assert y.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    out = torch.empty(0, device=TPU)
    torch.add(torch.ones(300, device=TPU), 1, out=out)  # an out= tensor grown from empty
    assert out.cpu().eq(2).all()


def test_storage_copy_between_tpu_storages():
    a = torch.arange(6.0, device=TPU)
    b = torch.zeros(6, device=TPU)
    b.untyped_storage().copy_(a.untyped_storage())
    assert b.cpu().tolist() == a.cpu().tolist()
    c = a.untyped_storage().clone()
    assert c.data_ptr() != a.untyped_storage().data_ptr()
    assert torch.empty(0, device=TPU).set_(c).cpu().tolist() == a.cpu().tolist()
