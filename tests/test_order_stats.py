"""Order statistics, scans and the remaining reductions against PyTorch on CPU: nansum/nanmean,
median/nanmedian, kthvalue, mode, aminmax, cummax/cummin, logcumsumexp, renorm, logspace,
histogram/histogramdd."""
import pytest
import torch
from helpers import TPU, assert_matches_cpu, check, check_error, check_or_error, make, to_cpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]


def distinct(shape, dtype):
    """Data without ties (so that indices are unambiguous), in any dtype."""
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.bool:
        return make(shape, dtype)
    v = torch.randperm(max(n, 1))[:n].reshape(shape).to(torch.float64)
    if dtype.is_floating_point:
        v = v / 4 - n / 8
    return v.to(dtype)


def grads(fn, x, atol=1e-5, rtol=1e-4):
    c = x.clone().requires_grad_()
    d = x.to(TPU).requires_grad_()
    fn(c).sum().backward()
    fn(d).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), c.grad, atol=atol, rtol=rtol)


# ---- nansum / nanmean -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4)])
def test_nansum(dtype, shape):
    x = make(shape, dtype)
    if dtype.is_floating_point and x.numel() > 2:
        x.view(-1)[::3] = float("nan")
    check_or_error(torch.nansum, x)
    if len(shape) >= 1:
        check_or_error(lambda t: torch.nansum(t, 0), x)
        check_or_error(lambda t: torch.nansum(t, -1, keepdim=True), x)
        check_or_error(lambda t: torch.nansum(t, dim=0, dtype=torch.float64), x)
    if dtype.is_floating_point:
        check_or_error(torch.nanmean, x, atol=1e-2, rtol=1e-2)
        if len(shape) >= 2:
            check_or_error(lambda t: torch.nanmean(t, (0, 1), keepdim=True), x)


def test_nansum_views_grads_out():
    x = make((4, 6))
    x[1, 2] = float("nan")
    check(lambda t: torch.nansum(t.t(), 1), x)
    check(lambda t: torch.nansum(t[::2], 0), x)
    grads(lambda t: torch.nansum(t, 1), x)
    grads(lambda t: torch.nanmean(t, 0), x)
    out = torch.empty(4, dtype=torch.float64)
    check(lambda t, o: torch.nansum(t, 1, out=o), x, out)
    check_error(lambda t: torch.nansum(t, 2), x)


# ---- median, nanmedian, kthvalue ------------------------------------------------------------

@pytest.mark.parametrize("fn", ["median", "nanmedian"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (6,), (4, 5), (2, 3, 4)])
def test_median(fn, dtype, shape):
    f = getattr(torch, fn)
    x = distinct(shape, dtype)
    check_or_error(f, x)
    for d in range(-len(shape), max(len(shape), 1)):
        check_or_error(lambda t: f(t, d), x)
        check_or_error(lambda t: f(t, d, keepdim=True), x)


@pytest.mark.parametrize("fn", ["median", "nanmedian"])
def test_median_nan_and_ties(fn):
    f = getattr(torch, fn)
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 3.0, nan, 2.0], [nan, nan, nan, nan, nan], [4.0, 4.0, 1.0, 4.0, 1.0],
                      [2.0, 2.0, 2.0, 2.0, 2.0]])
    check(f, x)
    check(lambda t: f(t, 1), x)
    check(lambda t: f(t, 0), x)
    check(f, x[2:])
    check(lambda t: f(t, 1), torch.tensor([[3, 1, 3, 3, 1, 1], [5, 5, 5, 5, 5, 5]]))
    # rows of NaN only, of several lengths
    for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33, 100]:
        check(lambda t: f(t, 1), torch.full((2, n), nan))
    # empty inputs: NaN for all elements, an error for an empty reduced dim
    check(f, torch.empty(0))
    check(lambda t: f(t, 0), torch.empty(2, 0))
    check_error(lambda t: f(t, 1), torch.empty(2, 0))


def test_median_views_grads_errors():
    x = distinct((4, 6), torch.float32)
    check(lambda t: torch.median(t.t(), 1), x)
    check(lambda t: torch.nanmedian(t[::2], 1), x)
    grads(torch.median, x)
    grads(lambda t: torch.median(t, 1)[0], x)
    grads(lambda t: torch.nanmedian(t, 0)[0], x)
    grads(lambda t: torch.kthvalue(t, 3, 1)[0], x)
    vals, idx = torch.empty(0), torch.empty(0, dtype=torch.int64)
    got = torch.median(x.to(TPU), 1, out=(vals.to(TPU), idx.to(TPU)))
    assert_matches_cpu((got[0].cpu(), got[1].cpu()), tuple(torch.median(x, 1, out=(vals, idx))))
    check_error(torch.median, torch.tensor([True, False]))
    check_error(lambda t: torch.median(t, 2), x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (5,), (4, 6), (2, 3, 4)])
def test_kthvalue(dtype, shape):
    x = distinct(shape, dtype)
    n = shape[-1] if shape else 1
    for k in sorted({1, (n + 1) // 2, n}):
        check_or_error(lambda t: torch.kthvalue(t, k), x)
        if len(shape) >= 2:
            check_or_error(lambda t: torch.kthvalue(t, k, 0, keepdim=True), x[:k] if x.shape[0] >= k else x)


def test_kthvalue_nan_and_errors():
    nan = float("nan")
    x = torch.tensor([[3.0, nan, 1.0, 2.0], [nan, nan, 0.0, 5.0]])
    for k in range(1, 5):
        check(lambda t: torch.kthvalue(t, k, 1), x)
    check_error(lambda t: torch.kthvalue(t, 5), x)
    check_error(lambda t: torch.kthvalue(t, 0), x)
    check_error(lambda t: torch.kthvalue(t, 1), torch.empty(0))
    check_error(lambda t: torch.kthvalue(t, 1), torch.tensor([True]))


# ---- mode ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (9,), (4, 10), (2, 3, 16)])
def test_mode(dtype, shape):
    # Few distinct values: real modes and ties; rows up to 16 long (PyTorch's CPU sort is
    # stable there, so the index of the mode is well defined).
    x = make(shape, dtype, low=0, high=4) if dtype != torch.bool else make(shape, dtype)
    check_or_error(torch.mode, x)
    for d in range(-len(shape), max(len(shape), 1)):
        check_or_error(lambda t: torch.mode(t, d), x)
        check_or_error(lambda t: torch.mode(t, d, keepdim=True), x)


def test_mode_views_grads_errors():
    x = make((6, 8), low=0, high=3).round()
    check(lambda t: torch.mode(t.t(), 1), x)
    check(lambda t: torch.mode(t[::2], 0), x)
    grads(lambda t: torch.mode(t, 1)[0], x)
    check(lambda t: torch.mode(t, 0), torch.empty(2, 0))
    check_error(lambda t: torch.mode(t, 0), torch.empty(0, 3))
    check_error(lambda t: torch.mode(t, 2), x)


# ---- aminmax --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4)])
def test_aminmax(dtype, shape):
    x = make(shape, dtype)
    check_or_error(torch.aminmax, x)
    check_or_error(lambda t: torch.aminmax(t, keepdim=True), x)
    for d in range(-len(shape), max(len(shape), 1)):
        check_or_error(lambda t: torch.aminmax(t, dim=d), x)
        check_or_error(lambda t: torch.aminmax(t, dim=d, keepdim=True), x)


def test_aminmax_nan_empty_errors():
    x = make((3, 5))
    x[1, 2] = float("nan")
    check(torch.aminmax, x)
    check(lambda t: torch.aminmax(t, dim=1), x)
    check(lambda t: torch.aminmax(t.t(), dim=1), x)
    check(lambda t: torch.aminmax(t, dim=0), torch.empty(2, 0))
    check_error(torch.aminmax, torch.empty(0))
    check_error(lambda t: torch.aminmax(t, dim=1), torch.empty(2, 0))


# ---- cummax, cummin, logcumsumexp -------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (9,), (4, 6), (2, 3, 5)])
def test_cummax_cummin(fn, dtype, shape):
    f = getattr(torch, fn)
    # small integers: plenty of ties (the later index wins)
    x = make(shape, dtype, low=0, high=4) if dtype != torch.bool else make(shape, dtype)
    if dtype.is_floating_point:
        x = x.round()
    for d in range(-len(shape), max(len(shape), 1)):
        check_or_error(lambda t: f(t, d), x)


@pytest.mark.parametrize("fn", ["cummax", "cummin"])
def test_cummax_nan_views_grads(fn):
    f = getattr(torch, fn)
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, 3.0, nan, 0.0, 5.0], [-inf, 2.0, inf, 2.0, inf, -1.0]])
    check(lambda t: f(t, 1), x)
    y = make((5, 7))
    check(lambda t: f(t.t(), 1), y)
    check(lambda t: f(t[::2], 0), y)
    grads(lambda t: f(t, 1)[0], y)
    grads(lambda t: f(t, 0)[0], y)
    check_error(lambda t: f(t, 2), y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (9,), (4, 6), (2, 3, 5)])
def test_logcumsumexp(dtype, shape):
    x = make(shape, dtype)
    for d in range(-len(shape), max(len(shape), 1)):
        check_or_error(lambda t: torch.logcumsumexp(t, d), x)


def test_logcumsumexp_special_views_grads():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -inf, 0.0, inf, 1.0], [inf, inf, -inf, 2.0, nan], [1e4, 1e4, 1e4, -1e4, 0.0]])
    check(lambda t: torch.logcumsumexp(t, 1), x)
    y = make((5, 7))
    check(lambda t: torch.logcumsumexp(t.t(), 1), y)
    check(lambda t: torch.logcumsumexp(t[::2], 0), y)
    grads(lambda t: torch.logcumsumexp(t, 1), y)
    grads(lambda t: torch.logcumsumexp(t, 0), y)
    check_error(lambda t: torch.logcumsumexp(t, 0), torch.tensor([1, 2]))


def test_logcumsumexp_large_values_grad():
    """The backward divides by exp of the forward's values: float32 is scanned in double as on
    CPU, so that values near 1e4 (an ulp of 1e-3) round the same way."""
    x = make((5, 5, 5))
    x[0] = 10000
    g = make((5, 5, 5))
    for d in (0, 1):
        c = x.clone().requires_grad_()
        t = x.to(TPU).requires_grad_()
        torch.logcumsumexp(c, d).backward(g)
        torch.logcumsumexp(t, d).backward(g.to(TPU))
        torch.testing.assert_close(t.grad.cpu(), c.grad)


# ---- renorm ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3.5, float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_renorm(p, dtype):
    x = make((4, 5, 3), dtype)
    for dim in [0, 1, -1]:
        for maxnorm in [0.0, 1.5, 100.0]:
            check(lambda t: torch.renorm(t, p, dim, maxnorm), x)
    check(lambda t: torch.renorm(t.transpose(0, 2), p, 0, 2.0), x)


def test_renorm_grads_errors():
    x = make((4, 5))
    grads(lambda t: torch.renorm(t, 2, 0, 1.0), x)
    grads(lambda t: torch.renorm(t, 3, 1, 0.5), x)
    check_error(lambda t: torch.renorm(t, 0, 0, 1.0), x)
    check_error(lambda t: torch.renorm(t, -1, 0, 1.0), x)
    check_error(lambda t: torch.renorm(t, 2, 0, -1.0), x)
    check_error(lambda t: torch.renorm(t, 2, 0, 1.0), x.long())
    check_error(lambda t: torch.renorm(t, 2, 3, 1.0), x)


# ---- logspace ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32])
def test_logspace(dtype):
    for start, end, steps, base in [(0, 3, 4, 10.0), (-1.5, 2.5, 5, 2.0), (0, 1, 1, 10.0), (0, 1, 0, 10.0),
                                    (2, -2, 7, 3.0), (0.5, 4, 8, 10.0), (1, 10, 10, 2.0)]:
        kw = {} if dtype is None else {"dtype": dtype}
        e = torch.logspace(start, end, steps, base, **kw)
        g = torch.logspace(start, end, steps, base, device=TPU, **kw)
        assert_matches_cpu(g.cpu(), e)
    out = torch.empty(3, dtype=torch.float64)
    e = torch.logspace(0, 2, 6, out=out.clone())
    g = torch.logspace(0, 2, 6, out=out.to(TPU))
    assert_matches_cpu(g.cpu(), e)
    with pytest.raises(RuntimeError):
        torch.logspace(0, 1, -1, device=TPU)


def test_compiled_graphs():
    x = make((4, 6))
    fns = [lambda t: torch.cummax(t, 1), lambda t: torch.cummin(t, 0), lambda t: torch.median(t, 1),
           lambda t: torch.nanmedian(t), lambda t: torch.kthvalue(t, 2, 1), lambda t: torch.mode(t.round(), 1),
           lambda t: torch.aminmax(t, dim=0), lambda t: torch.nansum(t, 1), lambda t: torch.logcumsumexp(t, 1),
           lambda t: torch.renorm(t, 2, 0, 1.0)]
    for f in fns:
        expected = f(x)
        got = torch.compile(f, backend="tpu")(x.to(TPU))
        got = tuple(got) if isinstance(expected, tuple) else got
        assert_matches_cpu(to_cpu(got), tuple(expected) if isinstance(expected, tuple) else expected, 1e-5, 1e-5)


# ---- histogram, histogramdd ------------------------------------------------------------------------


def _hist(x, bins, weight=None, **kw):
    return torch.histogram(x, bins, weight=weight, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (7,), (5, 5), (5, 1, 5), (5, 0, 5)])
def test_histogram(dtype, shape):
    x = make(shape, dtype)
    w = make(shape, dtype)
    for bins in (1, 3, 4, 10):
        for density in (False, True):
            check(_hist, x, bins, None, density=density)
            check(_hist, x, bins, w, density=density)
            check(_hist, x, bins, None, range=(-1.0, 2.0), density=density)
            edges = torch.sort(make((bins + 1,), dtype)).values
            check(_hist, x, edges, w, density=density)
    # Bin edges that are not sorted: the binary search of the CPU kernel, reproduced.
    check(_hist, x, make((6,), dtype))


def test_histogram_edges_views_errors():
    # Points on the bin edges, the right edge, outside the range and NaN.
    x = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.5, -0.5, float("nan"), 0.1, 0.3])
    check(_hist, x, 4, None, range=(0.0, 1.0))
    check(_hist, x, torch.tensor([0.0, 0.25, 0.5, 1.0]))
    check(_hist, torch.full((4,), 2.5), 3)
    check(_hist, x, 4, None, range=(1.0, 1.0))
    y = make((6, 4))
    check(lambda t: torch.histogram(t.t(), 5), y)
    check(lambda t: torch.histogram(t[::2], 5, weight=t[1::2]), y)
    check_error(_hist, torch.tensor([1.0, float("inf")]), 3)
    check_error(_hist, torch.tensor([1.0, float("nan")]), 3)
    check_error(_hist, make((5,)), 0)
    check_error(_hist, make((5,)), 3, None, range=(2.0, 1.0))
    check_error(_hist, make((5,)), 3, None, range=(1.0, 2.0, 3.0))
    check_error(_hist, make((5,)), 3, make((5,), torch.float64))
    check_error(_hist, make((5,)), torch.tensor([1.0]))
    check_error(_hist, make((5,)), torch.tensor([[1.0, 2.0]]))
    check_error(_hist, make((5,)), torch.tensor([1.0, 2.0], dtype=torch.float64))
    check_error(_hist, make((5,), torch.bfloat16), 3)
    check_error(_hist, torch.arange(5), 3)


def _histdd(x, bins, weight=None, **kw):
    return torch.histogramdd(x, bins, weight=weight, **kw)


@pytest.mark.parametrize("shape", [(5, 5), (5, 5, 5), (5, 1, 5), (5, 0, 5), (7, 2)])
def test_histogramdd(shape):
    x = make(shape)
    w = make(shape[:-1])
    n = shape[-1]
    for pattern in ((1, 1, 1, 1, 1), (2, 3, 2, 3, 2), (3, 2, 3, 2, 3)):
        bins = list(pattern[:n])
        for density in (False, True):
            check(_histdd, x, bins, None, density=density)
            check(_histdd, x, bins, w, density=density)
            edges = [make((b + 1,)) for b in bins]  # unsorted, as the OpInfo makes them
            check(lambda t, *e, **kw: torch.histogramdd(t, list(e), **kw), x, *edges, density=density)
    check(_histdd, x, [2] * n, None, range=[-1.0, 1.0] * n)
    check(_histdd, x, 3)


def test_histogramdd_errors():
    check_error(_histdd, make((5, 2)), [2])
    check_error(_histdd, make((5,)), [2])
    check_error(_histdd, make((5, 2)), [2, 2], make((4,)))
    check_error(_histdd, torch.tensor([[1.0, float("inf")]]), [2, 2])
    check_error(_histdd, make((5, 2)), [2, 2], None, range=[0.0, 1.0])
    check_error(lambda t, a, b: torch.histogramdd(t, [a, b]), make((5, 2)), make((3,)), make((3,), torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_underscore_aminmax_and_aminmax_overloads(dtype):
    A = torch.ops.aten
    x = make((4, 5), dtype)
    for v in (x, x.t(), make((), dtype)):
        check(A._aminmax, v)
        check(lambda a: A._aminmax(a, 0), v)
        check(lambda a: A._aminmax(a, -1, True), v)
        check(A.aminmax, v)
        check(lambda a: A.aminmax(a, dim=0, keepdim=True), v)
    check(lambda a: A.aminmax.out(a, dim=1, min=torch.empty(0, dtype=dtype, device=a.device),
                                  max=torch.empty(0, dtype=dtype, device=a.device)), x)
    check(lambda a: A._aminmax.out(a, out0=torch.empty(0, dtype=dtype, device=a.device),
                                   out1=torch.empty(0, dtype=dtype, device=a.device)), x)
    check(lambda a: A._aminmax.dim_out(a, 1, out0=torch.empty(0, dtype=dtype, device=a.device),
                                       out1=torch.empty(0, dtype=dtype, device=a.device)), x)
    check(lambda a: A._aminmax(a, 1), make((0, 3), dtype))
    check_error(A._aminmax, make((0, 3), dtype))
    check_error(lambda a: A._aminmax(a, 0), make((0, 3), dtype))
    check_error(lambda a: A._aminmax(a, 2), x)
