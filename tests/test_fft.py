"""torch.fft (the _fft_r2c/_fft_c2r/_fft_c2c primitives) against PyTorch on CPU: every
transform, normalization mode, dims choice, sizes n/s, float32/float64/complex64 inputs,
non-contiguous views, gradients, and bad input."""
import pytest
import torch
from helpers import TPU, check, check_error

NORMS = [None, "ortho", "forward", "backward"]
TOL = dict(atol=1e-4, rtol=1e-4)


def real(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype)


def cplx(shape, dtype=torch.complex64):
    return torch.randn(shape, dtype=dtype)


ONE_D = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
N_D = ["fft2", "ifft2", "rfft2", "irfft2", "hfft2", "ihfft2", "fftn", "ifftn", "rfftn", "irfftn", "hfftn", "ihfftn"]
# Which input kind each transform takes: the r* and ih* forward transforms need real input.
REAL_ONLY = {"rfft", "ihfft", "rfft2", "ihfft2", "rfftn", "ihfftn"}


@pytest.mark.parametrize("name", ONE_D)
@pytest.mark.parametrize("norm", NORMS)
def test_1d(name, norm):
    fn = getattr(torch.fft, name)
    for shape, dim in [((16,), -1), ((5, 7), -1), ((4, 6, 5), 1), ((3, 8), 0), ((1,), 0)]:
        xs = [real(shape), real(shape, torch.float64)]
        if name not in REAL_ONLY:
            xs += [cplx(shape), cplx(shape, torch.complex128)]
        for x in xs:
            if name in ("irfft", "hfft") and x.shape[dim] == 1:
                continue  # CPU rejects n = 0 output points
            check(lambda t: fn(t, dim=dim, norm=norm), x, **TOL)


@pytest.mark.parametrize("name", ONE_D)
def test_1d_sizes(name):
    # n pads with zeros or trims the input.
    fn = getattr(torch.fft, name)
    x = cplx((3, 10)) if name not in REAL_ONLY else real((3, 10))
    for n in [4, 7, 10, 13]:
        check(lambda t: fn(t, n=n), x, **TOL)


@pytest.mark.parametrize("name", N_D)
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_nd(name, norm):
    fn = getattr(torch.fft, name)
    two = name.endswith("2")
    x = real((4, 6, 5)) if name in REAL_ONLY else cplx((4, 6, 5))
    check(lambda t: fn(t, norm=norm), x, **TOL)
    if two:
        check(lambda t: fn(t, dim=(0, 2), norm=norm), x, **TOL)
        check(lambda t: fn(t, dim=(2, 0), norm=norm), x, **TOL)  # the last listed dim is halved
        check(lambda t: fn(t, s=(5, 8), norm=norm), x, **TOL)
    else:
        check(lambda t: fn(t, dim=(1,), norm=norm), x, **TOL)
        check(lambda t: fn(t, s=(3, 4), dim=(0, 2), norm=norm), x, **TOL)


def test_more_than_three_dims():
    # stablehlo.fft handles at most three dims at once: the rest go in further passes.
    x = real((2, 3, 4, 5, 3))
    for name in ["fftn", "ifftn", "rfftn", "ihfftn"]:
        check(getattr(torch.fft, name), x, **TOL)
    c = cplx((2, 3, 4, 5, 4))
    for name in ["fftn", "ifftn", "irfftn", "hfftn"]:
        check(getattr(torch.fft, name), c, **TOL)


def test_views_and_real_promotion():
    x = real((6, 8))
    check(lambda t: torch.fft.fft(t.t()), x, **TOL)
    check(lambda t: torch.fft.rfft(t[::2, 1:]), x, **TOL)
    check(lambda t: torch.fft.fft(t[:1].expand(4, 8)), x, **TOL)
    c = cplx((6, 8))
    check(lambda t: torch.fft.ifft(t.t()), c, **TOL)
    check(lambda t: torch.fft.hfft(t.conj()), c, **TOL)  # a conjugate view as input
    check(lambda t: torch.fft.irfft(t[:, ::2]), c, **TOL)
    # Integer inputs are promoted to the default float dtype.
    check(torch.fft.fft, torch.arange(12).reshape(3, 4), **TOL)
    check(torch.fft.rfft, torch.arange(10), **TOL)


def test_empty_batch():
    # CPU's MKL rejects an empty batch; the device answers like CUDA: an empty result.
    cases = [(torch.fft.fft, real((0, 8)), (0, 8), torch.complex64),
             (torch.fft.rfft, real((0, 8)), (0, 5), torch.complex64),
             (torch.fft.irfft, cplx((0, 5)), (0, 8), torch.float32),
             (torch.fft.fft2, cplx((0, 4, 4)), (0, 4, 4), torch.complex64)]
    for fn, x, shape, dtype in cases:
        y = fn(x.to(TPU))
        assert y.device.type == "tpu" and y.shape == shape and y.dtype == dtype


def test_helpers():
    # fftfreq/fftshift are composites over ops the device has.
    x = cplx((5, 6))
    check(torch.fft.fftshift, x)
    check(torch.fft.ifftshift, x)
    check(lambda t: torch.fft.fftshift(torch.fft.fft2(t)), x, **TOL)


def grad_check(fn, x, **tol):
    a = x.clone().requires_grad_()
    b = x.to(TPU).requires_grad_()
    ya, yb = fn(a), fn(b)
    g = torch.randn(ya.shape, dtype=ya.dtype)
    ya.backward(g)
    yb.backward(g.to(TPU))
    torch.testing.assert_close(yb.detach().cpu(), ya.detach(), **tol)
    torch.testing.assert_close(b.grad.cpu(), a.grad, **tol)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_grad_complex_input(norm):
    c = cplx((4, 6))
    for fn in [torch.fft.fft, torch.fft.ifft, torch.fft.fft2, torch.fft.ifftn]:
        grad_check(lambda t: fn(t, norm=norm), c, **TOL)
    grad_check(lambda t: torch.fft.irfft(t, norm=norm), c, **TOL)
    grad_check(lambda t: torch.fft.irfft(t, n=9, norm=norm), c, **TOL)
    grad_check(lambda t: torch.fft.hfft(t, norm=norm), c, **TOL)
    grad_check(lambda t: torch.fft.irfft2(t, norm=norm), c, **TOL)


def test_grad_real_input():
    # The backward of real-input transforms calls at::real (view_as_real of a complex gradient).
    grad_check(torch.fft.rfft, real((4, 6)), **TOL)
    grad_check(torch.fft.fft, real((4, 6)), **TOL)
    grad_check(torch.fft.ihfft, real((3, 8)), **TOL)
    grad_check(lambda t: torch.fft.rfftn(t, dim=(0, 1)), real((4, 6)), **TOL)


def test_errors():
    check_error(torch.fft.fft, real((4,)), dim=2)
    check_error(torch.fft.fft, real((4,)), norm="bad")
    check_error(torch.fft.rfft, cplx((4,)))
    check_error(torch.fft.irfft, cplx((1,)))  # n = 0 output points
    check_error(torch.fft.fftn, real((4, 4)), dim=(0, 0))
    check_error(torch.fft.fft, real((4,)), n=0)
    check_error(torch.fft.fft2, real((4,)))


def test_stft():
    # stft frames the signal and runs _fft_r2c over the frames.
    x, w = real((2, 400)), torch.hann_window(64)
    check(lambda t, win: torch.stft(t, 64, hop_length=16, window=win, return_complex=True), x, w, **TOL)
    check(lambda t, win: torch.stft(t, 64, hop_length=16, window=win, center=False, onesided=False,
                                    return_complex=True), x, w, **TOL)


def test_compile_graph():
    def f(t):
        return torch.fft.irfft(torch.fft.rfft(t) * 2, n=t.shape[-1]), torch.fft.fft2(t)
    x = real((3, 10))
    got = torch.compile(f, backend="tpu")(x.to(TPU))
    for g, e in zip(got, f(x)):
        torch.testing.assert_close(g.cpu(), e, **TOL)
