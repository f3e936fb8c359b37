"""Reductions on "tpu" against PyTorch on CPU: sum/mean/prod, extremes and their indices,
var/std, any/all, logsumexp, norms, cumulative ops, sort/argsort/topk, with gradients."""
import pytest
import torch
from helpers import FLOATS, INTS, TPU, check, check_error, make

SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)]


def dims_for(shape):
    """None, each single dim (positive and negative) and a pair, as the shape allows."""
    out = [None]
    nd = len(shape)
    for d in range(nd):
        out.append(d)
    if nd:
        out.append(-1)
    if nd >= 2:
        out.append((0, -1))
    if nd == 0:
        out.append(0)
    return out


def grad_check(fn, x, atol=None, rtol=None, grad_out=None):
    """fn(x) and d(sum(fn(x) * grad_out))/dx agree between CPU and tpu."""
    xc = x.clone().requires_grad_()
    xt = x.to(TPU).requires_grad_()
    yc = fn(xc)
    yt = fn(xt)
    if isinstance(yc, (tuple, list)):
        yc, yt = yc[0], yt[0]
    g = grad_out if grad_out is not None else make(yc.shape, yc.dtype)
    yc.backward(g)
    yt.backward(g.to(TPU))
    tol = {} if atol is None else dict(atol=atol, rtol=rtol if rtol is not None else atol)
    torch.testing.assert_close(yt.detach().cpu(), yc.detach(), equal_nan=True, **tol)
    assert xt.grad is not None, "no gradient reached the tpu input"
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, equal_nan=True, **tol)


# ---- sum / mean / prod ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool, torch.uint8])
def test_sum(shape, dtype):
    x = make(shape, dtype)
    for dim in dims_for(shape):
        if dim is None:
            check(torch.sum, x)
            continue
        for keepdim in (False, True):
            check(torch.sum, x, dim, keepdim=keepdim)


def test_sum_dtype_and_views():
    x = make((6, 8))
    check(lambda t: t.sum(0, dtype=torch.float64), x)
    check(lambda t: t.sum(dtype=torch.float16), x)
    check(lambda t: t.int().sum(1, dtype=torch.int32), make((6, 8), low=-5, high=5))
    check(lambda t: t.bfloat16().sum(1, dtype=torch.float32), x)
    check(lambda t: t.sum([]), x)  # empty list: every dim
    check(lambda t: t.t().sum(1, keepdim=True), x)
    check(lambda t: t[::2, 1::3].sum(0), x)
    check(lambda t: t[:1].expand(4, 8).sum(0), x)
    check(lambda t: t.sum((1, 0)), x)


def test_sum_bf16_accumulates_in_float():
    # 4096 ones plus a small value: rounding at each step in bf16 would stall at 256.
    x = torch.ones(4096, dtype=torch.bfloat16)
    check(torch.sum, x)
    check(torch.mean, x)


def test_sum_out():
    x = make((3, 4))
    for dt in (torch.float32, torch.float64, torch.int64):
        out_c = torch.empty(3, dtype=dt)
        out_t = torch.empty(3, dtype=dt, device=TPU)
        torch.sum(x, 1, out=out_c)
        torch.sum(x.to(TPU), 1, out=out_t)
        torch.testing.assert_close(out_t.cpu(), out_c)
    out_t = torch.empty(0, device=TPU)
    torch.sum(x.to(TPU), 0, out=out_t)
    torch.testing.assert_close(out_t.cpu(), x.sum(0))


def test_sum_errors():
    x = make((3, 4))
    check_error(torch.sum, x, (0, 0))
    check_error(torch.sum, x, 2)
    check_error(torch.sum, x, -3)
    check_error(torch.sum, make(()), 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_mean(shape, dtype):
    x = make(shape, dtype)
    for dim in dims_for(shape):
        if dim is None:
            check(torch.mean, x)
            continue
        for keepdim in (False, True):
            check(torch.mean, x, dim, keepdim=keepdim)


def test_mean_dtypes():
    check(lambda t: t.mean(dtype=torch.float64), make((4, 5), torch.int64))
    check(lambda t: t.mean(1, dtype=torch.float64), make((4, 5)))
    check(lambda t: t.mean(0, dtype=torch.bfloat16), make((4, 5)))
    check(lambda t: t.t().mean(0), make((4, 5)))
    e = check_error(torch.mean, make((4, 5), torch.int64))
    assert "mean(): could not infer output dtype" in str(e)
    check_error(torch.mean, make((4, 5), torch.bool), 0)
    check_error(lambda t: t.mean(dtype=torch.int64), make((4, 5)))
    out = torch.empty(3, dtype=torch.int64, device=TPU)
    with pytest.raises(RuntimeError):
        torch.mean(make((3, 4)).to(TPU), 1, out=out)


@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3)])
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_prod(shape, dtype):
    x = make(shape, dtype, low=-2, high=2) if not dtype.is_floating_point else make(shape, dtype, low=-1.5, high=1.5)
    check(torch.prod, x)
    for dim in dims_for(shape):
        if dim is None or isinstance(dim, tuple):
            continue
        for keepdim in (False, True):
            check(torch.prod, x, dim, keepdim=keepdim)
    check(lambda t: t.prod(dtype=torch.float64), x)


# Long rows: on the CPU plugin a float32 sum over a tensor's last dims of 64 to 1024 elements is a
# matrix-vector product with ones (XLA:CPU's reduction loops add one element at a time), a longer
# one sums pieces of a length dividing it, then their sums. Rows of mixed magnitudes, views,
# keepdim, infinities and NaNs; a column sum and a prime length keep XLA's reduction.
LONG_ROWS = [((64,), -1), ((3, 1000), 1), ((2, 3, 16, 8), (-2, -1)), ((5, 16384), -1), ((2, 20000), 1),
             ((256, 256), (0, 1)), ((2, 65537), -1), ((1000, 3), 0)]


@pytest.mark.parametrize("shape, dim", LONG_ROWS)
def test_long_row_sums(shape, dim):
    x = make(shape) * torch.logspace(-3, 3, shape[-1]).to(torch.float32)
    n = x.numel() // x.sum(dim).numel()
    # The order of the additions differs from CPU's: the bound is n rounding errors of the
    # largest term (the sums of float64 values rounded to float32 are the reference).
    tol = dict(atol=n * 2e-7 * x.abs().max().item(), rtol=1e-5)
    want = x.double().sum(dim).float()
    torch.testing.assert_close(x.to(TPU).sum(dim).cpu(), want, **tol)
    torch.testing.assert_close(x.to(TPU).sum(dim, keepdim=True).cpu(), want.reshape(x.double().sum(dim, keepdim=True).shape), **tol)
    torch.testing.assert_close(x.to(TPU).mean(dim).cpu(), x.double().mean(dim).float(), **tol)
    if x.dim() >= 2:
        t = x.transpose(0, -1).contiguous().transpose(0, -1)  # the same values, not contiguous
        assert not t.is_contiguous()
        torch.testing.assert_close(t.to(TPU).sum(dim).cpu(), want, **tol)
    special = x.clone().reshape(-1, x.shape[-1])
    special[0, 1] = float("inf")
    if special.shape[0] > 1:
        special[1, 2] = float("nan")
    check(lambda t: t.sum(-1).isfinite(), special)
    check(lambda t: t.sum(-1).isnan(), special)


def test_long_row_sums_are_products_on_the_cpu_plugin(tmp_path):
    """The rewrite is there: the program of a long row sum holds a dot_general, not a reduce."""
    import os
    import subprocess
    import sys

    script = "import torch, torchtpu; print(torch.randn(4, 512, device='tpu').sum(-1).cpu().shape)"
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TORCHTPU_DUMP_PROGRAMS=str(tmp_path)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = [p.read_text() for p in tmp_path.iterdir()]
    sums = [t for t in texts if "512xf32" in t and "tensor<4xf32>" in t]
    assert sums and all("stablehlo.dot_general" in t and "stablehlo.reduce" not in t for t in sums), sums


def test_long_row_sum_gradients():
    for shape, dim in [((8, 1000), -1), ((2, 4, 128), -1)]:
        grad_check(lambda t: t.sum(dim), make(shape), atol=2e-4, rtol=1e-5)  # n rounding errors
        grad_check(lambda t: torch.softmax(t, dim), make(shape), atol=1e-5)
        grad_check(lambda t: torch.log_softmax(t, dim), make(shape), atol=1e-5)


# ---- extremes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 0, 3), (2, 3, 4)])
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_amax_amin(shape, dtype):
    x = make(shape, dtype)
    for fn in (torch.amax, torch.amin):
        for dim in dims_for(shape):
            if dim is None:
                if x.numel():
                    check(fn, x)
                continue
            if x.numel() == 0 and 0 in [shape[d] for d in ((dim,) if isinstance(dim, int) else dim)] if shape else False:
                check_error(fn, x, dim)
                continue
            for keepdim in (False, True):
                check(fn, x, dim, keepdim=keepdim)


def test_amax_nan_and_errors():
    x = make((4, 6))
    x[1, 2] = float("nan")
    x[3, 0] = float("nan")
    check(torch.amax, x, 1)
    check(torch.amin, x, 0)
    check(torch.amax, x)
    e = check_error(torch.amax, make((0, 3)))
    assert "Expected reduction dim to be specified" in str(e)
    check_error(torch.amax, make((0, 3)), 0)
    check_error(torch.amin, make((2, 0)), -1)
    with pytest.raises(RuntimeError, match="Expected the dtype for input and out to match"):
        torch.amax(x.to(TPU), 1, out=torch.empty(4, dtype=torch.float64, device=TPU))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_max_min_full(dtype):
    for shape in [(), (7,), (3, 4)]:
        x = make(shape, dtype)
        check(torch.max, x)
        check(torch.min, x)
    check_error(torch.max, make((0, 3), dtype))
    check_error(torch.min, make((0,), dtype))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_max_min_dim(dtype):
    for shape in [(), (7,), (3, 4), (2, 3, 4), (3, 0)]:
        x = make(shape, dtype)
        for fn in (torch.max, torch.min):
            for dim in range(-max(len(shape), 1), max(len(shape), 1)):
                if shape and shape[dim] == 0:
                    check_error(fn, x, dim)
                    continue
                for keepdim in (False, True):
                    check(fn, x, dim, keepdim=keepdim)


def test_max_dim_first_index_and_nan():
    # Ties: the first index wins; NaN wins and the first NaN's index is returned.
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0], [2.0, 2.0, 2.0, 2.0]])
    for fn in (torch.max, torch.min, torch.argmax, torch.argmin):
        check(fn, x, 1)
    check(torch.max, x)
    check(torch.min, x)
    i = torch.tensor([[4, 1, 4], [0, 0, -3]])
    check(torch.max, i, 1)
    check(torch.min, i, 0)
    check(torch.argmax, i)
    check(torch.argmin, i)


def test_max_out_and_other():
    x, y = make((3, 4)), make((3, 4))
    v, i = torch.empty(3, device=TPU), torch.empty(3, dtype=torch.long, device=TPU)
    torch.max(x.to(TPU), 1, out=(v, i))
    ev, ei = torch.max(x, 1)
    torch.testing.assert_close(v.cpu(), ev)
    torch.testing.assert_close(i.cpu(), ei)
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype"):
        torch.max(x.to(TPU), 1, out=(torch.empty(3, dtype=torch.float64, device=TPU), i))
    check(torch.max, x, y)
    check(torch.min, x, make((4,)))
    out = torch.empty(3, 4, device=TPU)
    torch.max(x.to(TPU), y.to(TPU), out=out)
    torch.testing.assert_close(out.cpu(), torch.max(x, y))


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_argmax_argmin(dtype):
    for shape in [(), (7,), (3, 4), (2, 3, 4), (3, 0)]:
        x = make(shape, dtype)
        for fn in (torch.argmax, torch.argmin):
            if x.numel():
                check(fn, x)
                check(fn, x, keepdim=True)
            else:
                check_error(fn, x)
            for dim in range(-max(len(shape), 1), max(len(shape), 1)):
                if shape and shape[dim] == 0:
                    check_error(fn, x, dim)
                    continue
                check(fn, x, dim)
                check(fn, x, dim, keepdim=True)
    check_error(torch.argmax, make((3,), torch.bool))
    check(lambda t: t.t().argmax(0), make((4, 5), dtype))


# ---- var / std ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
def test_var_std(dtype):
    for shape in [(), (0,), (1,), (7,), (3, 4), (2, 0, 3), (2, 3, 4)]:
        x = make(shape, dtype)
        for fn in (torch.var, torch.std):
            check(fn, x)
            check(fn, x, unbiased=False)
            for dim in dims_for(shape):
                if dim is None:
                    continue
                check(fn, x, dim)
                check(fn, x, dim, keepdim=True, correction=0)
                check(fn, x, dim, correction=2.5)
        for fn in (torch.var_mean, torch.std_mean):
            check(fn, x)
            if shape:
                check(fn, x, -1, keepdim=True, correction=0)


def test_var_std_views_and_errors():
    x = make((6, 8))
    check(lambda t: t.t().var(0), x)
    check(lambda t: t[::2].std(1), x)
    check(lambda t: t.var((0, 1), correction=3), x)
    check_error(torch.var, make((3,), torch.int64))
    check_error(torch.std, make((3,), torch.bool))
    check_error(torch.var, x, 2)


# ---- any / all ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8, torch.bfloat16])
def test_any_all(dtype):
    for shape in [(), (0,), (5,), (3, 4), (2, 0, 3)]:
        x = make(shape, dtype) if dtype != torch.float32 else (make(shape) > 0).float() * make(shape)
        for fn in (torch.any, torch.all):
            check(fn, x)
            for dim in range(-max(len(shape), 1), max(len(shape), 1)):
                check(fn, x, dim)
                check(fn, x, dim, keepdim=True)
            if len(shape) >= 2:
                check(fn, x, (0, 1))
                check(fn, x, (-1,), keepdim=True)
                check(fn, x, ())


def test_any_all_values():
    x = torch.tensor([[0.0, 0.0], [0.0, float("nan")], [1.0, 2.0]])
    check(torch.any, x, 1)
    check(torch.all, x, 1)
    out = torch.empty(3, dtype=torch.float32, device=TPU)
    with pytest.raises(RuntimeError, match="only supports bool tensor for result"):
        torch.any(x.to(TPU), 1, out=out)


# ---- logsumexp -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.bool])
def test_logsumexp(dtype):
    for shape in [(), (5,), (3, 4), (2, 0, 3), (2, 3, 4)]:
        x = make(shape, dtype)
        for dim in dims_for(shape):
            if dim is None:
                continue
            check(torch.logsumexp, x, dim)
            check(torch.logsumexp, x, dim, keepdim=True)


def test_logsumexp_inf_nan():
    inf = float("inf")
    x = torch.tensor([[-inf, -inf], [inf, 1.0], [float("nan"), 0.0], [100.0, 100.0], [-inf, 3.0]])
    check(torch.logsumexp, x, 1)
    check(torch.logsumexp, make((3, 4)), (0, 1))
    check_error(torch.logsumexp, make((3, 4)), ())


# ---- norms ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ord", [2, 1, float("inf"), -float("inf"), 0, 3, 0.5, -1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_vector_norm(ord, dtype):
    for shape in [(), (5,), (3, 4), (2, 3, 4)]:
        x = make(shape, dtype)
        if shape:
            x.view(-1)[0] = 0
        tol = dict(atol=2e-2, rtol=2e-2) if dtype != torch.float32 else {}
        check(torch.linalg.vector_norm, x, ord, **tol)
        if len(shape) >= 2:
            check(torch.linalg.vector_norm, x, ord, dim=1, keepdim=True, **tol)
            check(torch.linalg.vector_norm, x, ord, dim=(0, -1), **tol)


def test_vector_norm_dtype_and_errors():
    x = make((3, 4))
    check(torch.linalg.vector_norm, x, dtype=torch.float64)
    check(torch.linalg.vector_norm, x.bfloat16(), 1, dtype=torch.float32)
    check(torch.norm, x)
    check(lambda t: t.norm(p=1, dim=1), x)
    check(torch.linalg.vector_norm, make((0, 3)), 2)
    check(torch.linalg.vector_norm, make((0, 3)), -1, dim=1)
    A = torch.ops.aten
    check(A.norm.Scalar, x, 3)
    check(A.norm.ScalarOpt_dim, x, 1, [1], True)
    check(A.norm.ScalarOpt_dim, x, None, [0, 1])
    check(A.norm.ScalarOpt_dim_dtype, x, float("inf"), [1], False, dtype=torch.float64)
    check_error(A.norm.Scalar, make((3,), torch.int64), 2)
    check_error(torch.linalg.vector_norm, make((3,), torch.int64))
    check_error(torch.linalg.vector_norm, x, dtype=torch.int64)
    check_error(torch.linalg.vector_norm, x, dtype=torch.bfloat16)
    e = check_error(torch.linalg.vector_norm, make((0, 3)), float("inf"))
    assert "does not have an identity" in str(e)
    check_error(torch.linalg.vector_norm, make((0, 3)), -1, dim=0)


# ---- cumulative --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_cumsum_cumprod(dtype):
    for shape in [(), (0,), (1,), (7,), (3, 5), (2, 0, 3), (2, 3, 17)]:
        x = make(shape, dtype, low=-2, high=3) if not dtype.is_floating_point else make(shape, dtype, low=-1.2, high=1.2)
        for dim in range(-max(len(shape), 1), max(len(shape), 1)):
            check(torch.cumsum, x, dim, atol=5e-2 if dtype == torch.bfloat16 else None)
            check(torch.cumprod, x, dim, atol=5e-2 if dtype == torch.bfloat16 else None)
    check(lambda t: t.cumsum(0, dtype=torch.float64), make((5, 3), dtype))
    check(lambda t: t.t().cumsum(1), make((5, 3), dtype))


def test_cumsum_long_and_errors():
    check(torch.cumsum, make((1000,)), 0, atol=1e-4, rtol=1e-4)
    check(torch.cumsum, make((3, 1000), torch.int64), 1)
    check_error(torch.cumsum, make((3, 4)), 2)
    check_error(torch.cumprod, make(()), 1)


# ---- sorting ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_sort(dtype):
    for shape in [(), (0,), (9,), (3, 5), (2, 3, 4)]:
        # Distinct float values so that the indices are unambiguous even for unstable sorts.
        n = torch.Size(shape).numel()
        if dtype.is_floating_point and n:
            x = torch.randperm(n).reshape(shape).to(dtype)
        else:
            x = make(shape, dtype)
        for dim in range(-max(len(shape), 1), max(len(shape), 1)):
            for desc in (False, True):
                check(lambda t: torch.sort(t, dim=dim, descending=desc, stable=True), x)
                check(lambda t: torch.argsort(t, dim=dim, descending=desc, stable=True), x)


def test_sort_nan_ties_and_views():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[3.0, nan, -inf, 1.0, nan, 1.0, inf, -0.0, 0.0]])
    for desc in (False, True):
        check(lambda t: torch.sort(t, descending=desc, stable=True), x)
    i = torch.tensor([[2, 1, 2, 0, 1, 2, 0]])
    for desc in (False, True):
        check(lambda t: torch.sort(t, descending=desc, stable=True), i)
    check(lambda t: t.t().sort(dim=0, stable=True), make((4, 6), torch.int64))
    check(lambda t: t.sort(), torch.randperm(20).float())


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_topk(dtype):
    x = torch.randperm(60).reshape(3, 4, 5).to(dtype)
    for dim in (-1, 0, 1):
        for k in (0, 1, 3):
            for largest in (True, False):
                check(torch.topk, x, k, dim, largest)
    check(torch.topk, make(()), 1)
    check(lambda t: t.t().topk(2, 0), torch.randperm(12).reshape(3, 4).to(dtype))
    check_error(torch.topk, x, 6)
    check_error(torch.topk, x, -1)
    check_error(torch.topk, make((4,), torch.bool), 2)


def test_topk_nan():
    x = torch.tensor([1.0, float("nan"), 3.0, -1.0])
    check(torch.topk, x, 2)
    check(torch.topk, x, 2, largest=False)


# ---- gradients -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients(dtype):
    x = make((3, 4, 5), dtype)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    grad_check(lambda t: t.sum(), x, **tol)
    grad_check(lambda t: t.sum((0, 2), keepdim=True), x, **tol)
    grad_check(lambda t: t.mean(1), x, **tol)
    grad_check(lambda t: t.mean(), x, **tol)
    grad_check(lambda t: t.prod(1), make((3, 4, 5), dtype, low=0.5, high=1.5), **tol)
    grad_check(lambda t: t.prod(), make((3, 4), dtype, low=0.8, high=1.2), **tol)
    grad_check(lambda t: t.amax(2), x, **tol)
    grad_check(lambda t: t.amin((0, 1)), x, **tol)
    grad_check(lambda t: t.var(1), x, **tol)
    grad_check(lambda t: t.std(2, correction=0), x, **tol)
    grad_check(lambda t: t.logsumexp(1), x, **tol)
    grad_check(lambda t: torch.linalg.vector_norm(t, 2, dim=-1), x, **tol)
    grad_check(lambda t: t.norm(), x, **tol)
    grad_check(lambda t: t.cumsum(1), x, **tol)


def test_gradients_selecting():
    """Gradients that scatter back through indices (max.dim, sort, topk)."""
    x = torch.randperm(60).reshape(3, 4, 5).float() / 7
    grad_check(lambda t: t.max(1)[0], x)
    grad_check(lambda t: t.min(2, keepdim=True)[0], x)
    grad_check(lambda t: t.max(), x)
    grad_check(lambda t: t.sort(1)[0], x)
    grad_check(lambda t: t.topk(2, -1)[0], x)


# ---- hash_tensor -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4), (0, 3)])
def test_hash_tensor(dtype, shape):
    x = make(shape, dtype)
    for dim in dims_for(shape):
        if dim is None:
            if x.numel() == 0:
                continue
            check(torch.hash_tensor, x)
            continue
        dims = dim if isinstance(dim, tuple) else (dim,)
        if any(shape and shape[d] == 0 for d in dims):
            check_error(torch.hash_tensor, x, dim=dim)
            continue
        check(torch.hash_tensor, x, dim=dim)
        check(torch.hash_tensor, x, dim=dim, keepdim=True)


def test_hash_tensor_special_values_views_errors():
    x = torch.tensor([1.5, -0.0, float("nan"), float("inf"), -float("inf"), 0.0])
    check(torch.hash_tensor, x)
    check(torch.hash_tensor, torch.tensor([-1, 2, -128], dtype=torch.int8))
    y = make((4, 6))
    check(lambda t: torch.hash_tensor(t.t(), dim=1), y)
    check(lambda t: torch.hash_tensor(t[:, ::2], dim=0), y)
    check_error(torch.hash_tensor, make((0, 3)))
    check_error(torch.hash_tensor, make((3,)), mode=1)
    check_error(torch.hash_tensor, make((3,), torch.complex64))
    check_error(torch.hash_tensor, make((3, 2)), dim=[0, 0])
    check_error(torch.hash_tensor, make((3,)), dim=2)
    check_error(lambda t: torch.hash_tensor(t, out=torch.empty((), dtype=torch.int64, device=t.device)), make((3,)))


# ---- segment_reduce ------------------------------------------------------------------------------

REDUCES = ["sum", "mean", "max", "min", "prod", "amax", "amin"]


def _segment(data, reduce, lengths=None, offsets=None, **kw):
    return torch.segment_reduce(data, reduce, lengths=lengths, offsets=offsets, **kw)


def _offsets(lengths, axis):
    z = list(lengths.shape)
    z[axis] = 1
    return torch.cat((lengths.new_zeros(z), lengths), axis).cumsum(axis)


CASES = [
    # data shape, axis, lengths, unsafe
    ((5,), 0, [0, 1, 2, 2], False),
    ((5,), 0, [2, 0, 3, 0], True),
    ((7, 3), 0, [3, 0, 4], False),
    ((10, 2, 3), 0, [1, 2, 0, 6, 0], True),
    ((4, 6), 1, [[1, 2, 3], [0, 6, 0], [2, 2, 2], [6, 0, 0]], False),
    ((2, 5, 3), 1, [[2, 0, 3], [1, 1, 3]], False),
    ((0,), 0, [0, 0], False),
]


@pytest.mark.parametrize("mode", ["lengths", "offsets"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_segment_reduce(mode, dtype, case):
    shape, axis, lengths, unsafe = case
    lengths = torch.tensor(lengths)
    x = make(shape, dtype)
    for reduce in REDUCES:
        for initial in (None, -1.5):
            kw = dict(axis=axis, unsafe=unsafe, initial=initial)
            if mode == "lengths":
                check(_segment, x, reduce, lengths, None, **kw)
                check(_segment, x, reduce, lengths.int(), None, **kw)
            else:
                check(_segment, x, reduce, None, _offsets(lengths, axis), **kw)


def test_segment_reduce_nan_ties_views():
    x = torch.tensor([1.0, float("nan"), 3.0, 3.0, 0.5, -2.0, 0.0, 4.0])
    lengths = torch.tensor([3, 2, 3])
    for reduce in REDUCES:
        check(_segment, x, reduce, lengths)
        check(_segment, x.double(), reduce, lengths, initial=2)
    y = make((6, 4))
    check(lambda t: _segment(t.t(), "sum", lengths=torch.tensor([[2, 4]] * 4).to(t.device), axis=1), y)
    check(lambda t: _segment(t[::2], "max", lengths=torch.tensor([1, 2]).to(t.device)), y)


@pytest.mark.parametrize("mode", ["lengths", "offsets"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_grad(mode, reduce):
    # Ties (max/min) and zeros (prod) exercise the kernel's special cases.
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0, -1.0, 0.0, 0.0, 5.0],
                      [2.0, 2.0, -2.0, 1.5, 0.0, 4.0, 4.0, 1.0, -3.0]])
    lengths = torch.tensor([[3, 2, 0, 4], [2, 3, 1, 3]])
    for initial in (None, 2.0):
        kw = dict(axis=1, initial=initial)
        if mode == "lengths":
            fn = lambda t: _segment(t, reduce, lengths=lengths.to(t.device), **kw)  # noqa: E731
        else:
            fn = lambda t: _segment(t, reduce, offsets=_offsets(lengths, 1).to(t.device), **kw)  # noqa: E731
        grad_check(fn, x, grad_out=torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 2.5, 1.0, -0.5]]))
        grad_check(fn, make((2, 9)))


def test_segment_reduce_errors():
    x = make((5,))
    lengths = torch.tensor([2, 0, 3])
    check_error(_segment, x, "foo", lengths)
    check_error(_segment, x, "sum")
    check_error(_segment, x, "sum", torch.tensor([2, -1, 4]))
    check_error(_segment, x, "sum", torch.tensor([2, 1]))
    check_error(_segment, x.long(), "sum", lengths)
    check_error(_segment, x, "sum", lengths.float())
    check_error(_segment, x, "sum", lengths, axis=1)
    check_error(_segment, make((2, 5)), "sum", torch.tensor([2, 3]), axis=1)
    check_error(_segment, make(()), "sum", torch.tensor([1]))
    check_error(lambda t, l: torch.segment_reduce(t, "sum", lengths=l, indices=l), x, lengths)


def test_hash_segment_reduce_compiled():
    def f(x, lengths):
        return (torch.hash_tensor(x, dim=0),
                torch.segment_reduce(x, "mean", lengths=lengths, unsafe=True),
                torch.segment_reduce(x, "max", lengths=lengths, axis=0, initial=0.5))
    x = make((5, 3))
    lengths = torch.tensor([2, 0, 3])
    got = torch.compile(f, backend="tpu")(x.to(TPU), lengths.to(TPU))
    for a, e in zip(got, f(x, lengths)):
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)
