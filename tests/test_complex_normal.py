"""Complex normal draws on tpu (torch.randn, normal_, torch.normal with complex means): real
and imaginary parts independent normals of variance std**2 / 2, as PyTorch draws them on CPU.
Checked by dtype, shape and statistics over many samples."""
import pytest
import torch

from helpers import TPU, check_error

N = 200_000
# Standard errors for N samples: mean ~ sigma/sqrt(N), variance ~ sigma^2 * sqrt(2/N).
Z = 6.0


def assert_stats(x, mean, var):
    """x (complex, on tpu): both parts have the given means and variance, and are uncorrelated."""
    assert x.device.type == "tpu"
    x = x.cpu().reshape(-1).to(torch.complex128)
    re, im = x.real, x.imag
    n = re.numel()
    sd = var ** 0.5
    assert abs(re.mean().item() - mean.real) < Z * sd / n ** 0.5
    assert abs(im.mean().item() - mean.imag) < Z * sd / n ** 0.5
    assert abs(re.var().item() - var) < Z * var * (2 / n) ** 0.5
    assert abs(im.var().item() - var) < Z * var * (2 / n) ** 0.5
    corr = ((re - re.mean()) * (im - im.mean())).mean().item() / var
    assert abs(corr) < Z / n ** 0.5


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_randn(dtype):
    x = torch.randn(N, dtype=dtype, device=TPU)
    assert x.dtype == dtype and x.shape == (N,)
    assert_stats(x, 0j, 0.5)
    # Real and imaginary parts are not copies of each other, and draws differ.
    y = torch.randn(N, dtype=dtype, device=TPU)
    assert not torch.equal(x.cpu(), y.cpu())


def test_randn_shapes():
    for shape in [(), (0,), (3, 0, 2), (4, 5, 6)]:
        x = torch.randn(shape, dtype=torch.complex64, device=TPU)
        ref = torch.randn(shape, dtype=torch.complex64)
        assert x.shape == ref.shape and x.dtype == ref.dtype
    x = torch.randn(300, 700, dtype=torch.complex64, device=TPU)
    assert_stats(x, 0j, 0.5)


def test_randn_default_complex_dtype_and_like():
    x = torch.randn(N, dtype=torch.cfloat, device=TPU)
    y = torch.randn_like(x)
    assert y.dtype == torch.complex64 and y.device.type == "tpu"
    assert_stats(y, 0j, 0.5)


def test_generator_reproducible():
    torch.manual_seed(5)
    a = torch.randn(64, dtype=torch.complex64, device=TPU).cpu()
    torch.manual_seed(5)
    b = torch.randn(64, dtype=torch.complex64, device=TPU).cpu()
    assert torch.equal(a, b)


def test_normal_inplace():
    # normal_ fills view_as_real(self): the mean goes to both parts, std / sqrt(2) each.
    x = torch.empty(N, dtype=torch.complex64, device=TPU).normal_(2.0, 3.0)
    assert_stats(x, 2 + 2j, 4.5)
    x = torch.empty(N, dtype=torch.complex128, device=TPU).normal_(-1.0, 0.5)
    assert x.dtype == torch.complex128
    assert_stats(x, -1 - 1j, 0.125)


def test_normal_tensor_mean():
    # normal(mean_tensor, std): unit draws scaled by std, plus the (complex) mean.
    mean = torch.full((N,), 1 - 2j, dtype=torch.complex64)
    x = torch.normal(mean.to(TPU), 2.0)
    assert x.dtype == torch.complex64
    assert_stats(x, 1 - 2j, 2.0)
    std = torch.full((N,), 0.5)
    x = torch.normal(mean.to(TPU), std.to(TPU))
    assert x.dtype == torch.complex64
    assert_stats(x, 1 - 2j, 0.125)


def test_normal_errors():
    check_error(lambda x: x.normal_(0.0, -1.0), torch.empty(3, dtype=torch.complex64))
    e = check_error(torch.normal, 0.0, torch.ones(3, dtype=torch.complex64))
    assert "normal expects standard deviation to be non-complex" in str(e)


def test_real_dtypes_unchanged():
    x = torch.randn(N, device=TPU)
    assert x.dtype == torch.float32
    v = x.cpu().double()
    assert abs(v.mean().item()) < Z / N ** 0.5 and abs(v.var().item() - 1) < Z * (2 / N) ** 0.5
