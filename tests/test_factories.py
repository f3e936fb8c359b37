"""Factories, casts and random fills on "tpu"."""
import pytest
import torch
from helpers import ALL, TPU, check, make


@pytest.mark.parametrize("dtype", ALL + [torch.float64, torch.int8, torch.uint8])
def test_constant_factories(dtype):
    for shape in [(), (0,), (3,), (2, 3)]:
        torch.testing.assert_close(torch.zeros(shape, dtype=dtype, device="tpu").cpu(), torch.zeros(shape, dtype=dtype))
        torch.testing.assert_close(torch.ones(shape, dtype=dtype, device="tpu").cpu(), torch.ones(shape, dtype=dtype))
        v = True if dtype == torch.bool else 3
        torch.testing.assert_close(torch.full(shape, v, dtype=dtype, device="tpu").cpu(), torch.full(shape, v, dtype=dtype))
    e = torch.empty(4, 5, dtype=dtype, device="tpu")
    assert e.shape == (4, 5) and e.dtype == dtype and e.device.type == "tpu"
    assert torch.empty_strided((2, 3), (1, 2), device="tpu").stride() == (1, 2)


def test_like_factories():
    x = make((3, 4)).to(TPU)
    assert torch.zeros_like(x).cpu().sum() == 0
    torch.testing.assert_close(torch.ones_like(x, dtype=torch.int32).cpu(), torch.ones(3, 4, dtype=torch.int32))
    torch.testing.assert_close(torch.full_like(x, 2.5).cpu(), torch.full((3, 4), 2.5))


@pytest.mark.parametrize("args", [(5,), (2, 9), (0, 1, 0.25), (10, 0, -3), (-2.5, 2.5, 0.5), (1, 1)])
def test_arange(args):
    torch.testing.assert_close(torch.arange(*args, device="tpu").cpu(), torch.arange(*args))
    torch.testing.assert_close(torch.arange(*args, dtype=torch.float32, device="tpu").cpu(),
                               torch.arange(*args, dtype=torch.float32))


@pytest.mark.parametrize("args", [(0, 1, 5), (-3, 7, 11), (2, 2, 1), (0, 1, 0), (0, 10, 4)])
def test_linspace(args):
    torch.testing.assert_close(torch.linspace(*args, device="tpu").cpu(), torch.linspace(*args))
    torch.testing.assert_close(torch.linspace(*args, dtype=torch.int64, device="tpu").cpu(),
                               torch.linspace(*args, dtype=torch.int64))


def test_arange_errors():
    for args in [(0, 5, 0), (5, 0, 1)]:
        with pytest.raises(RuntimeError):
            torch.arange(*args)
        with pytest.raises(RuntimeError):
            torch.arange(*args, device="tpu")


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool,
                                 torch.uint8, torch.float64])
@pytest.mark.parametrize("dst", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool,
                                 torch.uint8, torch.float64])
def test_casts(src, dst):
    x = make((4, 5), src, low=0 if src == torch.uint8 else None)
    if src.is_floating_point and not dst.is_floating_point and dst != torch.bool:
        x = x.trunc()  # float->int of fractional values is exact either way; keep in range for uint8
        if dst == torch.uint8:
            x = x.abs()
    check(lambda t: t.to(dst), x)
    check(lambda t: t.t().to(dst), x)


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.int64])
def test_float_to_integer_keeps_the_low_bits_as_cpu(src, dst):
    # Negative and out-of-range values: uint8 goes through int64 (c10), the others through int32,
    # keeping the low bits; beyond the intermediate's range, and NaN, give its minimum (x86).
    v = torch.tensor([-2.5, 300.2, 3.7, -0.5, -129.0, 1e10, -1e10, float("nan"), float("inf"), float("-inf"),
                      70000.0, -70000.0, 3e9, 5e9, 2e19, -1.0])
    x = v.to(src).reshape(4, 4)
    check(lambda t: t.to(dst), x)
    check(lambda t: t.t().to(dst), x)
    check(lambda t: t[0, 0].to(dst), x)


def test_random_distributions():
    torch.manual_seed(0)
    n = 20000
    u = torch.rand(n, device="tpu").cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    g = torch.randn(n, device="tpu").cpu()
    assert abs(g.mean()) < 0.03 and abs(g.std() - 1) < 0.03
    g16 = torch.randn(n, device="tpu", dtype=torch.bfloat16)
    assert g16.dtype == torch.bfloat16
    r = torch.randint(3, 9, (n,), device="tpu").cpu()
    assert r.dtype == torch.int64 and r.min() == 3 and r.max() == 8
    b = torch.empty(n, device="tpu").bernoulli_(0.25).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.25) < 0.02
    p = torch.full((n,), 0.75, device="tpu")
    assert abs(torch.bernoulli(p).cpu().mean() - 0.75) < 0.02
    nrm = torch.empty(n, device="tpu").normal_(5, 2).cpu()
    assert abs(nrm.mean() - 5) < 0.06 and abs(nrm.std() - 2) < 0.06
    un = torch.empty(n, device="tpu").uniform_(-3, -1).cpu()
    assert un.min() >= -3 and un.max() < -1
    # independent draws differ; a generator object works too
    assert not torch.equal(torch.rand(8, device="tpu").cpu(), torch.rand(8, device="tpu").cpu())
    gen = torch.Generator(device="tpu")
    gen.manual_seed(7)
    a = torch.rand(4, device="tpu", generator=gen).cpu()
    gen.manual_seed(7)
    assert torch.equal(torch.rand(4, device="tpu", generator=gen).cpu(), a)


def test_random_errors():
    with pytest.raises(RuntimeError):
        torch.empty(3, device="tpu").normal_(0, -1)
    with pytest.raises(RuntimeError):
        torch.empty(3, device="tpu").bernoulli_(1.5)
    with pytest.raises(RuntimeError):
        torch.randint(5, 2, (3,), device="tpu")


def test_normal_with_tensor_mean_and_std():
    torch.manual_seed(0)
    mean = torch.full((4000,), 3.0, device="tpu")
    std = torch.full((4000,), 0.5, device="tpu")
    for sample in (torch.normal(mean, std), torch.normal(mean, 2.0), torch.normal(-1.0, std)):
        assert sample.shape == (4000,) and sample.device.type == "tpu"
    a = torch.normal(mean, std).cpu()
    assert abs(a.mean() - 3.0) < 0.05 and abs(a.std() - 0.5) < 0.05
    b = torch.normal(mean[:1].expand(3, 4000), std).cpu()
    assert b.shape == (3, 4000)


# ---- range (torch.range: arange with the end included) ------------------------------------------

A = torch.ops.aten


@pytest.mark.parametrize("args,kw", [
    ((0, 5), {}), ((1, -1, -0.5), {}), ((0, 1, 0.1), {}), ((0.5, 3.7), dict(dtype=torch.int64)),
    ((-3, 7, 2), dict(dtype=torch.int32)), ((0, 2, 0.3), dict(dtype=torch.float16)),
    ((0, 2, 0.25), dict(dtype=torch.bfloat16)), ((0, 3, 2), dict(dtype=torch.float64)), ((0, 0), {}),
    ((0, 2), dict(dtype=torch.uint8)),
])
def test_range_matches_cpu(args, kw):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exp = torch.range(*args, **kw)
        got = torch.range(*args, device=TPU, **kw)
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), exp)


def test_range_overloads_and_out():
    exp = A.range.default(0, 3)
    torch.testing.assert_close(A.range.default(0, 3, device=TPU).cpu(), exp)
    torch.testing.assert_close(A.range.step(0, 3, 2, device=TPU).cpu(), A.range.step(0, 3, 2))
    # range.out_: its composite calls the CPU kernel on raw data; routed to the lowering.
    for out in (torch.empty(0), torch.empty(7, dtype=torch.int32), torch.empty(2, 2), torch.empty(3, 2)[:, 0]):
        cpu = out.clone()
        A.range.out_(0, 3, out=cpu)
        dev = out.to(TPU) if out.is_contiguous() else torch.empty(3, 2, device=TPU)[:, 0]
        r = A.range.out_(0, 3, out=dev)
        assert r is dev
        torch.testing.assert_close(dev.cpu(), cpu)
    cpu, dev = torch.empty(2, 2), torch.empty(2, 2, device=TPU)  # same numel: keeps its shape
    A.range.out(0, 1.5, 0.5, out=cpu)
    A.range.out(0, 1.5, 0.5, out=dev)
    torch.testing.assert_close(dev.cpu(), cpu)


@pytest.mark.parametrize("args,kw", [
    ((5, 0), {}), ((0, float("inf")), {}), ((0, 2), dict(dtype=torch.bool)), ((0, 2), dict(dtype=torch.complex64)),
])
def test_range_errors_like_cpu(args, kw):
    with pytest.warns(UserWarning):
        with pytest.raises(Exception) as cpu:
            torch.range(*args, **kw)
    with pytest.warns(UserWarning):
        with pytest.raises(type(cpu.value), match=str(cpu.value)[:20].replace("(", r"\(")):
            torch.range(*args, device=TPU, **kw)


# ---- window functions and the _cast_* family (composites over lowered ops) ----------------------

@pytest.mark.parametrize("fn,kw", [
    (torch.hann_window, {}), (torch.hamming_window, {}), (torch.blackman_window, {}),
    (torch.bartlett_window, {}), (torch.kaiser_window, {}), (torch.kaiser_window, dict(beta=5.0)),
    (torch.hamming_window, dict(alpha=0.5, beta=0.4)),
])
@pytest.mark.parametrize("n", [0, 1, 7, 16])
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_window_functions(fn, kw, n, periodic, dtype):
    exp = fn(n, periodic=periodic, dtype=dtype, **kw)
    got = fn(n, periodic=periodic, dtype=dtype, device=TPU, **kw)
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), exp, **({} if dtype != torch.bfloat16 else dict(atol=1e-2, rtol=1e-2)))


def test_window_function_errors():
    with pytest.raises(RuntimeError, match="floating point"):
        torch.hann_window(4, dtype=torch.int64, device=TPU)


@pytest.mark.parametrize("name,dtype", [
    ("_cast_Float", torch.float32), ("_cast_Double", torch.float64), ("_cast_Half", torch.float16),
    ("_cast_Long", torch.int64), ("_cast_Int", torch.int32), ("_cast_Short", torch.int16),
    ("_cast_Char", torch.int8), ("_cast_Byte", torch.uint8),
])
@pytest.mark.parametrize("src", [torch.float32, torch.int64, torch.bool])
def test_cast_family(name, dtype, src):
    for x in (make((3, 4), src), make((), src), make((0, 2), src), make((4, 3), src).t()):
        got = check(getattr(torch, name), x)
        assert got.dtype == dtype
