"""Views whose dtype differs from their storage's (view_as_real, view_as_complex,
Tensor.view(dtype)), writes through them, gradients that go through them (complex autograd,
FFTs of real input), and the constructors complex/polar, against PyTorch on CPU."""
import os
import subprocess
import sys

import pytest
import torch
from helpers import TPU, check, check_error, check_inplace, make

COMPLEX = [torch.complex64, torch.complex128]
TOL = dict(atol=1e-4, rtol=1e-4)


def cplx(shape, dtype=torch.complex64):
    return torch.randn(shape, dtype=dtype)


def non_contiguous_complex(dtype):
    # (base shape, view): transposed, stepped, offset and expanded views of a complex base.
    yield (4, 6), lambda z: z.t()
    yield (6, 5), lambda z: z[::2, 1:]
    yield (7,), lambda z: z[3:]
    yield (1, 5), lambda z: z.expand(3, 5)


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 4), (2, 3, 4), (0,), (2, 0, 3)])
def test_view_as_real_values(dtype, shape):
    z = cplx(shape, dtype)
    got = check(torch.view_as_real, z)
    assert got.shape == shape + (2,)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_view_as_real_non_contiguous(dtype):
    for shape, view in non_contiguous_complex(dtype):
        z = cplx(shape, dtype)
        check(lambda t: torch.view_as_real(view(t)), z)
        # The view keeps PyTorch's geometry (doubled strides and offset).
        a, b = torch.view_as_real(view(z)), torch.view_as_real(view(z.to(TPU)))
        assert (b.stride(), b.storage_offset()) == (a.stride(), a.storage_offset())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2,), (5, 2), (3, 4, 2), (0, 2)])
def test_view_as_complex_values(dtype, shape):
    x = make(shape, dtype)
    got = check(torch.view_as_complex, x)
    assert got.shape == shape[:-1]


def test_view_as_complex_non_contiguous():
    x = make((4, 6, 2))
    check(lambda t: torch.view_as_complex(t.transpose(0, 1)), x)  # strides (4, 12, 1)
    check(lambda t: torch.view_as_complex(t[::2]), x)
    check(lambda t: torch.view_as_complex(t[1:, 2:]), x)  # even offset
    check(lambda t: torch.view_as_complex(t.reshape(-1)[4:].view(-1, 2)), x)


def test_round_trip_and_real_imag():
    z = cplx((3, 5))
    check(lambda t: torch.view_as_complex(torch.view_as_real(t)), z)
    check(lambda t: torch.view_as_real(torch.view_as_complex(torch.view_as_real(t)[1:])), z)
    check(lambda t: t.real, z)
    check(lambda t: t.imag, z)
    check(lambda t: t.t().imag * 2 + t.t().real, z)


# ---- writes through the views reach the storage ----------------------------------------------


def test_write_through_view_as_real():
    z = cplx((4, 3))
    check_inplace(lambda t: torch.view_as_real(t).mul_(2), z)
    check_inplace(lambda t: torch.view_as_real(t)[..., 1].zero_(), z)  # only the imaginary parts
    check_inplace(lambda t: torch.view_as_real(t[1:3]).add_(1), z)  # a part of the storage
    check_inplace(lambda t: torch.view_as_real(t.t())[0].fill_(7), z)  # strided
    check_inplace(lambda t: t.real.copy_(torch.arange(12.0).view(4, 3)), z)
    check_inplace(lambda t: t.imag.neg_(), z)


def test_write_through_view_as_complex():
    x = make((4, 3, 2))
    check_inplace(lambda t: torch.view_as_complex(t).mul_(1j), x)
    check_inplace(lambda t: torch.view_as_complex(t)[2:].zero_(), x)
    check_inplace(lambda t: torch.view_as_complex(t.transpose(0, 1))[1].copy_(
        torch.tensor([2 - 3j, 1j, 4, -1], device=t.device)), x)


def test_writes_between_base_and_view():
    # Writes to the base show in a view taken before, and writes to the view show in the base.
    zc = cplx((5,))
    zt = zc.to(TPU)
    vc, vt = torch.view_as_real(zc), torch.view_as_real(zt)
    for c, t in [(zc, zt), (vc, vt)]:
        c.mul_(3)
        t.mul_(3)
        torch.testing.assert_close(vt.cpu(), vc)
        torch.testing.assert_close(zt.cpu(), zc)
    # A whole-storage upload through the float view, read back through the complex base.
    src = torch.randn(5, 2)
    vc.copy_(src)
    vt.copy_(src)
    torch.testing.assert_close(zt.cpu(), zc)
    # An odd float storage seen as complex: the last float keeps its value.
    xc = torch.randn(7)
    xt = xc.to(TPU)
    torch.view_as_complex(xc[:6].view(3, 2)).mul_(2j)
    torch.view_as_complex(xt[:6].view(3, 2)).mul_(2j)
    torch.testing.assert_close(xt.cpu(), xc)


# ---- Tensor.view(dtype) -------------------------------------------------------------------------


@pytest.mark.parametrize("src,dst", [
    (torch.float32, torch.int32),
    (torch.float32, torch.float16),
    (torch.float16, torch.float32),
    (torch.float32, torch.uint8),
    (torch.int64, torch.float64),
    (torch.float32, torch.complex64),
    (torch.complex64, torch.float64),
    (torch.complex64, torch.int16),
    (torch.complex128, torch.complex64),
    (torch.bfloat16, torch.int16),
])
def test_view_dtype(src, dst):
    x = make((3, 8), src)
    check(lambda t: t.view(dst), x)
    check(lambda t: t[1:].view(dst) + 0, x)
    # Writes through the reinterpreted view.
    check_inplace(lambda t: t.view(dst)[1].zero_(), x)


def test_view_dtype_bool():
    x = torch.randint(0, 2, (6,), dtype=torch.uint8)
    check(lambda t: t.view(torch.bool), x)
    check(lambda t: t.view(torch.bool).view(torch.uint8), x)


def test_raw_byte_storage_used_as_floats():
    # vLLM's KV cache: a storage allocated as bytes and written through float views; the
    # engine keeps such a buffer in the writer's dtype. Reads through either dtype, writes
    # through either, and a byte storage of odd length (its tail bytes must keep their values).
    def run(raw):
        w = raw.view(torch.float32).view(-1, 4)
        w.index_copy_(0, torch.tensor([1, 5], device=raw.device), torch.arange(8.0, device=raw.device).view(2, 4))
        w[2:4].fill_(-1.5)
        w.mul_(3)
        snapshot = raw.clone()
        raw[7] = 0x41  # a byte written through the byte base, read back through the floats
        raw.view(torch.int16)[9] = -2
        return [snapshot, raw.clone(), w * 1, raw.view(torch.float32)[5:9] + 0]

    for n in (8 * 16, 8 * 16 + 3):
        cpu = torch.zeros(n, dtype=torch.int8)
        dev = cpu.to(TPU)
        head = (n // 4) * 4
        got, want = run(dev[:head] if n % 4 else dev), run(cpu[:head] if n % 4 else cpu)
        for g, e in zip(got, want):
            assert torch.equal(g.cpu().view(torch.int8), e.view(torch.int8))
        assert torch.equal(dev.cpu(), cpu)


def test_raw_byte_storage_writes_in_place(tmp_path):
    # After its first write through a float view, a byte storage's float writes are programs on
    # floats (no bitcast of the whole storage on every write, which made vLLM's KV-cache
    # writes copy the cache: 47 ms per write against 0.02).
    script = """
import torch
raw = torch.zeros(4096, dtype=torch.int8, device="tpu")
w = raw.view(torch.float32).view(-1, 4)
w[0] = 1.0
w.index_copy_(0, torch.tensor([3, 9], device="tpu"), torch.ones(2, 4, device="tpu"))
assert w.sum().item() == 12.0
"""
    dump = tmp_path / "programs"
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TORCHTPU_DUMP_PROGRAMS=str(dump)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = {p.name: p.read_text() for p in sorted(dump.iterdir())}
    index_copy = [t for name, t in texts.items() if "index_copy" in name]
    assert index_copy, sorted(texts)
    assert all("bitcast_convert" not in t for t in index_copy), index_copy


def test_view_dtype_errors():
    check_error(lambda t: t.view(torch.float64), make((3,)))  # size not divisible
    check_error(lambda t: t.t().view(torch.float64), make((4, 4)))  # last stride not 1


# ---- gradients ------------------------------------------------------------------------------


def grad_check(fn, *xs, **tol):
    cpu = [x.clone().requires_grad_() for x in xs]
    dev = [x.to(TPU).requires_grad_() for x in xs]
    ya, yb = fn(*cpu), fn(*dev)
    g = torch.randn(ya.shape, dtype=ya.dtype)
    ya.backward(g)
    yb.backward(g.to(TPU))
    torch.testing.assert_close(yb.detach().cpu(), ya.detach(), **tol)
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, **tol)


def test_grad_view_as_real_and_complex():
    grad_check(torch.view_as_real, cplx((3, 4)))
    grad_check(lambda t: torch.view_as_real(t.t() * 2), cplx((3, 4)))
    grad_check(torch.view_as_complex, make((3, 4, 2)))
    grad_check(lambda t: torch.view_as_complex(t.transpose(0, 1)) * (1 + 2j), make((3, 4, 2)))
    grad_check(lambda t: t.real * t.imag, cplx((5,)))
    grad_check(lambda t: t.abs(), cplx((2, 3)), **TOL)


def test_grad_fft_of_real_input():
    x = make((8,))
    for fn in [torch.fft.fft, torch.fft.rfft, torch.fft.ihfft, torch.fft.fft2, torch.fft.rfftn]:
        if fn in (torch.fft.fft2,):
            grad_check(lambda t: fn(t.view(2, 4)).abs(), x, **TOL)
        else:
            grad_check(lambda t: fn(t).abs(), x, **TOL)
    # The brief's example: a scalar loss.
    a = x.clone().requires_grad_()
    b = x.to(TPU).requires_grad_()
    torch.fft.fft(a).abs().sum().backward()
    torch.fft.fft(b).abs().sum().backward()
    torch.testing.assert_close(b.grad.cpu(), a.grad, **TOL)


def test_grad_stft():
    x, w = make((300,)), torch.hann_window(32)
    grad_check(lambda t: torch.stft(t, 32, hop_length=8, window=w.to(t.device), return_complex=True).abs(),
               x, **TOL)


def test_grad_sgn_real():
    # sgn's backward gives real inputs an efficient zero tensor.
    grad_check(torch.sgn, make((4, 3)))
    grad_check(torch.sgn, cplx((4, 3)), **TOL)


# ---- complex / polar ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_complex_values(dtype):
    for sa, sb in [((), ()), ((5,), (5,)), ((2, 3), (3,)), ((4, 1), (1, 5)), ((0, 3), (3,))]:
        check(torch.complex, make(sa, dtype), make(sb, dtype))
    x = make((4, 6), dtype)
    check(lambda a, b: torch.complex(a.t(), b[::2].t()), x, make((8, 6), dtype))
    check(lambda a, b: torch.complex(a, b, out=torch.empty(0, dtype=a.dtype.to_complex(), device=a.device)),
          make((3,), dtype), make((3,), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polar_values(dtype):
    for sa, sb in [((), ()), ((5,), (5,)), ((2, 3), (3,)), ((0,), (0,))]:
        check(torch.polar, make(sa, dtype, low=0), make(sb, dtype), **TOL)
    x = make((4, 6), dtype, low=0)
    check(lambda a, b: torch.polar(a.t(), b.t()), x, make((4, 6), dtype), **TOL)
    inf = torch.tensor([float("inf"), 0.0, 2.0], dtype=dtype)
    check(torch.polar, inf, torch.tensor([0.0, 1.0, float("nan")], dtype=dtype))


def test_grad_complex_polar():
    grad_check(torch.complex, make((3, 4)), make((4,)))
    grad_check(torch.polar, make((3, 4), low=0.1), make((3, 4)), **TOL)


def test_errors():
    # view_as_complex: last dim not 2, last stride not 1, odd strides, odd offset, 0-d, dtype.
    check_error(torch.view_as_complex, make((3, 3)))
    check_error(lambda t: torch.view_as_complex(t.t()), make((2, 3)))
    check_error(lambda t: torch.view_as_complex(t[:, :2]), make((4, 3)))
    check_error(lambda t: torch.view_as_complex(t[1:].view(2, 2)), make((5,)))
    check_error(torch.view_as_complex, make(()))
    check_error(torch.view_as_complex, make((3, 2), torch.bfloat16))
    check_error(torch.view_as_complex, make((3, 2), torch.int64))
    # view_as_real: real input, unresolved conjugate.
    check_error(torch.view_as_real, make((3,)))
    check_error(lambda t: torch.view_as_real(t.conj()), cplx((3,)))
    # complex / polar: dtypes of the parts and of out=.
    check_error(torch.complex, make((3,)), make((3,), torch.float64))
    check_error(torch.complex, make((3,), torch.int64), make((3,), torch.int64))
    check_error(torch.complex, make((3,), torch.bfloat16), make((3,), torch.bfloat16))
    check_error(torch.complex, make((3,)), make((4,)))
    check_error(lambda a, b: torch.complex(a, b, out=torch.empty(3, device=a.device)), make((3,)), make((3,)))
    check_error(lambda a, b: torch.polar(a, b, out=torch.empty(3, dtype=torch.complex128, device=a.device)),
                make((3,)), make((3,)))
    half = make((3,), torch.float16), make((3,), torch.float16)
    try:
        torch.polar(*half)
    except NotImplementedError:  # torch before 2.14: no Half polar on CPU
        check_error(torch.polar, *half)
    else:  # torch 2.14 gives complex32, which is not a tpu dtype
        with pytest.raises(NotImplementedError, match="not supported on tpu"):
            torch.polar(*(t.to(TPU) for t in half))


def test_compiled_graph():
    # In a compiled graph the views are values: view_as_real/view_as_complex/complex/polar lower
    # as functional ops.
    def f(z, a, b):
        r = torch.view_as_real(z) * 2
        c = torch.view_as_complex(r * 3) + torch.complex(a, b) * torch.polar(a.abs(), b)
        return torch.view_as_real(c) + r, z.imag.sum()

    torch._dynamo.reset()
    z, a, b = cplx((3, 4)), make((3, 4)), make((4,))
    got = torch.compile(f, backend="tpu")(z.to(TPU), a.to(TPU), b.to(TPU))
    want = f(z, a, b)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, **TOL)
