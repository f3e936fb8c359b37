"""Complex Python numbers as op arguments (fill values, alpha, weights, bounds) and writes
through conjugate and negative views, against PyTorch on CPU: values where CPU runs, the same
error class and message where it raises."""
import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, make

MASK = torch.tensor([True, False, True, False])


def cplx(shape=(4,), dtype=torch.complex64):
    return torch.randn(shape, dtype=dtype)


CASES = {
    "full": lambda z, r: torch.full((2, 3), 1 + 2j, device=z.device),
    "full_float32": lambda z, r: torch.full((2,), 1j, dtype=torch.float32, device=z.device),
    "full_float32_real": lambda z, r: torch.full((2,), 3 + 0j, dtype=torch.float32, device=z.device),
    "full_like": lambda z, r: torch.full_like(z, 2 - 1j),
    "full_like_float": lambda z, r: torch.full_like(r, 2 - 1j),
    "scalar_tensor": lambda z, r: torch.scalar_tensor(1j, device=z.device),
    "scalar_tensor_complex": lambda z, r: torch.scalar_tensor(1j, dtype=torch.complex128, device=z.device),
    "fill": lambda z, r: z.clone().fill_(2 - 1j),
    "fill_transposed": lambda z, r: z.reshape(2, 2).t().clone().fill_(-1j),
    "fill_0d": lambda z, r: z[0].clone().fill_(0.5 + 0.25j),
    "fill_empty": lambda z, r: z[:0].clone().fill_(1j),
    "fill_float": lambda z, r: r.clone().fill_(2 - 1j),
    "fill_float_real": lambda z, r: r.clone().fill_(2 + 0j),
    "fill_bool": lambda z, r: (r > 0).fill_(1j),
    "fill_int64": lambda z, r: r.long().fill_(3 + 0j),
    "fill_int64_imaginary": lambda z, r: r.long().fill_(3 + 1j),
    "fill_half": lambda z, r: r.half().fill_(1j),
    "masked_fill": lambda z, r: z.masked_fill(MASK.to(z.device), 1j),
    "masked_fill_float": lambda z, r: r.masked_fill(MASK.to(z.device), 1j),
    "index_fill": lambda z, r: z.index_fill(0, torch.tensor([0, 2], device=z.device), 1 - 1j),
    "scatter": lambda z, r: z.scatter(0, torch.tensor([0, 2], device=z.device), 1 - 1j),
    "where": lambda z, r: torch.where(z.real > 0, z, 1j),
    "where_float": lambda z, r: torch.where(r > 0, r, 1j),
    "pow": lambda z, r: z ** (0.5 + 1j),
    "add_alpha": lambda z, r: torch.add(z, z.flip(0), alpha=1j),
    "sub_alpha": lambda z, r: torch.sub(z, 1j, alpha=2j),
    "add_alpha_float": lambda z, r: torch.add(r, r, alpha=1j),
    "mul_": lambda z, r: z.clone().mul_(1j),
    "mul_float_": lambda z, r: r.clone().mul_(1j),
    "eq": lambda z, r: z == 1j,
    "addmm": lambda z, r: torch.addmm(z.reshape(2, 2), z.reshape(2, 2), z.reshape(2, 2).t(), beta=1j, alpha=2 - 1j),
    "addmm_float": lambda z, r: torch.addmm(r.reshape(2, 2), r.reshape(2, 2), r.reshape(2, 2), beta=1j),
    "clamp_bound": lambda z, r: r.clamp(min=1j),
    "clamp_real_bound": lambda z, r: r.clamp(max=0.5 + 0j),
    "lerp": lambda z, r: torch.lerp(z, z * 2, 0.5 + 1j),
    "lerp_tensor_weight": lambda z, r: torch.lerp(z, z * 2, torch.full_like(z, 0.7 + 0.2j)),
    "lerp_float": lambda z, r: torch.lerp(r, r * 2, 1j),
}


def outcome(fn, *args):
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - the exception is the result compared
        return None, e


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_numbers_as_arguments(name, dtype):
    z, r = cplx(dtype=dtype), make((4,), torch.float32)
    expected, cpu_error = outcome(CASES[name], z, r)
    got, tpu_error = outcome(CASES[name], z.to(TPU), r.to(TPU))
    if cpu_error is not None:
        assert type(tpu_error) is type(cpu_error), (tpu_error, cpu_error)
        assert str(tpu_error).splitlines()[0] == str(cpu_error).splitlines()[0]
        return
    assert tpu_error is None, tpu_error
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected)


def test_complex_fill_values_change_without_wrong_reuse():
    # Complex numbers are compiled into the program: each value gets its own.
    z = torch.zeros(3, dtype=torch.complex64, device=TPU)
    for v in (1j, 2 - 1j, -0.5 + 3j, 1j):
        torch.testing.assert_close(z.fill_(v).cpu(), torch.full((3,), v, dtype=torch.complex64))


@pytest.mark.parametrize("view,dtype", [("conj", torch.complex64), ("neg", torch.complex64), ("neg", torch.float32)])
def test_copy_into_conjugate_and_negative_views(view, dtype):
    src = make((3, 4), dtype) if not dtype.is_complex else cplx((3, 4))

    def write(base, src):
        v = base.conj() if view == "conj" else torch._neg_view(base)
        v.copy_(src)  # stores conj(src) / -src
        v[1:, ::2].copy_(src[:2, :2])  # a strided view of the view
        v[0].copy_(src[2].conj() if view == "conj" else torch._neg_view(src[2]))  # a source with the bit set
        return base

    cpu = write(torch.zeros(3, 4, dtype=dtype), src)
    tpu = write(torch.zeros(3, 4, dtype=dtype, device=TPU), src.to(TPU))
    torch.testing.assert_close(tpu.cpu(), cpu)
    # From the host into a tpu view, too.
    host = write(torch.zeros(3, 4, dtype=dtype, device=TPU), src)
    torch.testing.assert_close(host.cpu(), cpu)


def test_unsupported_dtypes_are_named():
    with pytest.raises(NotImplementedError, match=r"torch\.complex32 is not supported on tpu"):
        torch.randn(3, device=TPU).chalf()
