"""Matrix products (mm, bmm, addmm, baddbmm, addbmm, dot, vdot, mv, addmv) and the composites
over them (matmul, linear, einsum) against PyTorch on CPU, with gradients."""
import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, check, check_error, make

MM_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32]


def data(shape, dtype):
    # Small integers keep integer products exact and 16-bit float sums well conditioned.
    if dtype.is_floating_point:
        return make(shape, dtype, -2, 2)
    return make(shape, dtype, -4, 5)


def check_grad(fn, *inputs, atol=None, rtol=None):
    """fn's output and the gradients of all float inputs agree on CPU and tpu."""
    cpu = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    dev = [x.to(TPU).requires_grad_(x.is_floating_point()) for x in inputs]
    out_c = fn(*cpu)
    out_d = fn(*dev)
    g = make(out_c.shape, out_c.dtype, -1, 1)
    out_c.backward(g)
    out_d.backward(g.to(TPU))
    tol = {} if atol is None else dict(atol=atol, rtol=rtol if rtol is not None else atol)
    if out_c.dtype == torch.bfloat16 and not tol:
        tol = dict(atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(out_d.detach().cpu(), out_c.detach(), **tol)
    for c, d in zip(cpu, dev):
        if c.requires_grad:
            assert d.grad is not None and d.grad.device.type == "tpu"
            torch.testing.assert_close(d.grad.cpu(), c.grad, **tol)


@pytest.mark.parametrize("dtype", MM_DTYPES)
@pytest.mark.parametrize("n,k,p", [(3, 4, 5), (1, 7, 1), (8, 1, 6), (0, 3, 2), (2, 0, 3), (16, 33, 9)])
def test_mm(dtype, n, k, p):
    check(torch.mm, data((n, k), dtype), data((k, p), dtype))


def test_mm_views_and_out():
    a = make((5, 4))
    b = make((6, 5))
    check(lambda x, y: x.t() @ y.t(), a, b)  # both transposed
    check(lambda x, y: x[::2] @ y[1:, ::2].t(), make((6, 3)), make((6, 6)))
    check(lambda x, y: x[:1].expand(3, 4) @ y, a, make((4, 2)))
    out = torch.empty(0, device=TPU)
    torch.mm(a.t().to(TPU), b.t().to(TPU), out=out)
    torch.testing.assert_close(out.cpu(), a.t() @ b.t())
    # int8 products wrap like PyTorch's.
    check(torch.mm, torch.full((2, 3), 100, dtype=torch.int8), torch.full((3, 2), 100, dtype=torch.int8))


def test_mm_bf16_accumulates_in_f32():
    # 256 products of size ~1: rounding each partial sum to bf16 would be far off.
    a = make((4, 256), torch.bfloat16, 0.5, 1.5)
    b = make((256, 3), torch.bfloat16, 0.5, 1.5)
    got = (a.to(TPU) @ b.to(TPU)).cpu()
    exact = (a.double() @ b.double())
    torch.testing.assert_close(got.double(), exact, atol=0, rtol=8e-3)
    torch.testing.assert_close(got, a @ b, atol=0, rtol=8e-3)


def test_mm_f32_is_precise():
    # TF32 / bf16 passes would leave ~1e-3 relative error here.
    a = make((64, 64))
    b = make((64, 64))
    got = (a.to(TPU) @ b.to(TPU)).cpu().double()
    torch.testing.assert_close(got, a.double() @ b.double(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_bmm(dtype):
    check(torch.bmm, data((3, 4, 5), dtype), data((3, 5, 2), dtype))
    check(torch.bmm, data((0, 4, 5), dtype), data((0, 5, 2), dtype))
    check(lambda x, y: torch.bmm(x.transpose(1, 2), y), data((2, 5, 4), dtype), data((2, 5, 3), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_addmm(dtype):
    a, b = data((3, 4), dtype), data((4, 5), dtype)
    for bias in [data((3, 5), dtype), data((5,), dtype), data((1, 5), dtype), data((3, 1), dtype), data((), dtype)]:
        check(torch.addmm, bias, a, b)
    if dtype.is_floating_point:
        check(lambda s, x, y: torch.addmm(s, x, y, beta=0.5, alpha=-1.5), data((5,), dtype), a, b)
        check(lambda s, x, y: torch.addmm(s, x, y, beta=2, alpha=3), data((3, 5), dtype), a, b)
    else:
        check(lambda s, x, y: torch.addmm(s, x, y, beta=2, alpha=-3), data((3, 5), dtype), a, b)
        # Integral kernels truncate float coefficients.
        check(lambda s, x, y: torch.addmm(s, x, y, beta=1.9, alpha=2.7), data((3, 5), dtype), a, b)


def test_addmm_beta_zero_ignores_nan():
    bias = torch.full((2, 2), float("nan"))
    a, b = make((2, 3)), make((3, 2))
    got = check(lambda s, x, y: torch.addmm(s, x, y, beta=0), bias, a, b)
    assert not got.isnan().any()
    got = check(lambda s, x, y: torch.addmm(s, x, y, beta=0.0, alpha=2.0), bias, a, b)
    assert not got.isnan().any()
    # A nonzero beta after a zero one must not reuse the program that ignored self.
    got = check(lambda s, x, y: torch.addmm(s, x, y, beta=1.0, alpha=2.0), bias, a, b)
    assert got.isnan().all()


def test_addmm_inplace_and_out():
    base = make((3, 5))
    a, b = make((3, 4)), make((4, 5))
    c = base.clone()
    c.addmm_(a, b, alpha=0.5)
    d = base.to(TPU)
    d.addmm_(a.to(TPU), b.to(TPU), alpha=0.5)
    torch.testing.assert_close(d.cpu(), c)
    out = torch.empty(3, 5, device=TPU)
    torch.addmm(base[0].to(TPU), a.to(TPU), b.to(TPU), out=out)
    torch.testing.assert_close(out.cpu(), torch.addmm(base[0], a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_baddbmm_addbmm(dtype):
    b1, b2 = data((2, 3, 4), dtype), data((2, 4, 5), dtype)
    for bias in [data((2, 3, 5), dtype), data((5,), dtype), data((3, 1), dtype)]:
        check(torch.baddbmm, bias, b1, b2)
    for bias in [data((3, 5), dtype), data((5,), dtype)]:
        check(torch.addbmm, bias, b1, b2)
    if dtype.is_floating_point:
        check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0.25, alpha=3.0), data((2, 3, 5), dtype), b1, b2)
        check(lambda s, x, y: torch.addbmm(s, x, y, beta=-1.0, alpha=0.5), data((3, 5), dtype), b1, b2)
        check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0), torch.full((2, 3, 5), float("nan"), dtype=dtype), b1, b2)


@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_dot_vdot_mv_addmv(dtype):
    x, y = data((7,), dtype), data((7,), dtype)
    check(torch.dot, x, y)
    check(torch.vdot, x, y)
    check(torch.dot, data((0,), dtype), data((0,), dtype))
    m = data((4, 7), dtype)
    check(torch.mv, m, x)
    check(lambda a, v: torch.mv(a.t(), v), data((7, 4), dtype), data((7,), dtype))
    check(torch.addmv, data((4,), dtype), m, x)
    check(torch.addmv, data((), dtype), m, x)
    check(torch.addmv, data((1,), dtype), m, x)
    if dtype.is_floating_point:
        check(lambda s, a, v: torch.addmv(s, a, v, beta=0.5, alpha=2.0), data((4,), dtype), m, x)


def test_matmul_shapes():
    cases = [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)),
             ((3,), (5, 3, 4)), ((5, 2, 3), (3,)), ((2, 1, 4, 3), (5, 3, 2)), ((1, 2, 3), (4, 3, 5)),
             ((0, 2, 3), (3, 4)), ((2, 3), (3, 0))]
    for sa, sb in cases:
        check(torch.matmul, make(sa), make(sb))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_grad(dtype):
    tol = dict(atol=5e-2, rtol=2e-2) if dtype == torch.bfloat16 else (dict(atol=5e-3, rtol=5e-3) if dtype == torch.float16 else {})
    check_grad(torch.matmul, data((3, 4), dtype), data((4, 5), dtype), **tol)
    check_grad(torch.matmul, data((2, 3, 4), dtype), data((2, 4, 5), dtype), **tol)
    check_grad(torch.matmul, data((4,), dtype), data((4,), dtype), **tol)
    check_grad(torch.matmul, data((3, 4), dtype), data((4,), dtype), **tol)
    check_grad(lambda a, b: a.t() @ b, data((4, 3), dtype), data((4, 5), dtype), **tol)


def test_matmul_grad_broadcast_batch():
    check_grad(torch.matmul, make((2, 1, 3, 4)), make((5, 4, 2)))
    check_grad(torch.matmul, make((2, 3, 4)), make((4, 5)))
    check_grad(torch.matmul, make((4,)), make((2, 4, 5)))


def test_linear():
    x, w, b = make((4, 3)), make((5, 3)), make((5,))
    check(F.linear, x, w, b)
    check(F.linear, x, w)
    check(F.linear, make((2, 4, 3)), w, b)
    check(F.linear, make((3,)), w, b)
    check_grad(F.linear, x, w, b)
    check_grad(F.linear, make((2, 4, 3)), w, b)
    check_grad(F.linear, x, w)
    check_grad(F.linear, x.bfloat16(), w.bfloat16(), b.bfloat16())


def test_addmm_grads():
    check_grad(lambda s, x, y: torch.addmm(s, x, y, beta=0.5, alpha=2.0), make((3, 5)), make((3, 4)), make((4, 5)))
    check_grad(lambda s, x, y: torch.baddbmm(s, x, y, beta=0.5, alpha=2.0), make((2, 3, 5)), make((2, 3, 4)), make((2, 4, 5)))
    check_grad(lambda s, x, y: torch.addbmm(s, x, y), make((3, 5)), make((2, 3, 4)), make((2, 4, 5)))
    check_grad(lambda s, m, v: torch.addmv(s, m, v, alpha=-1.0), make((3,)), make((3, 4)), make((4,)))
    check_grad(torch.dot, make((5,)), make((5,)))
    check_grad(torch.mv, make((3, 5)), make((5,)))
    check_grad(torch.bmm, make((2, 3, 5)), make((2, 5, 4)))


def test_einsum():
    check(lambda a, b: torch.einsum("bij,bjk->bik", a, b), make((2, 3, 4)), make((2, 4, 5)))
    check(lambda a, b: torch.einsum("ij,kj->ik", a, b), make((3, 4)), make((5, 4)))


def test_nn_linear_module():
    torch.manual_seed(1)
    m = torch.nn.Linear(6, 3)
    x = make((4, 6))
    md = torch.nn.Linear(6, 3).to(TPU)
    md.load_state_dict(m.state_dict())
    torch.testing.assert_close(md(x.to(TPU)).cpu(), m(x))


def test_errors_messages():
    def same(fn, *args, **kw):
        check_error(fn, *args, first_line=True, **kw)

    f = make
    d = lambda *s: make(s, torch.float64)  # noqa: E731
    same(torch.mm, f((2, 3)), f((4, 5)))
    same(torch.mm, f((2, 3)), f((3, 5), torch.bfloat16))
    same(torch.mm, f((2, 3), torch.int64), f((3, 5)))
    same(torch.mm, f((3,)), f((3, 5)))
    same(torch.mm, f((2, 3)), f((3, 5, 2)))
    same(torch.mm, f((2, 3), torch.bool), f((3, 2), torch.bool))
    same(torch.bmm, f((2, 2, 3)), f((2, 4, 5)))
    same(torch.bmm, f((2, 2, 3)), f((3, 3, 5)))
    same(torch.bmm, f((2, 3)), f((3, 5)))
    same(torch.bmm, f((2, 2, 3)), d(2, 3, 5))
    same(torch.dot, f((3,)), f((4,)))
    same(torch.dot, f((3, 1)), f((3,)))
    same(torch.dot, f((3,)), d(3))
    same(torch.mv, f((2, 3)), f((4,)))
    same(torch.mv, f((2, 3)), f((3, 1)))
    same(torch.mv, d(2, 3), f((3,)))
    same(torch.addmm, f((2, 5)), f((2, 3)), f((4, 5)))
    same(torch.addmm, f((3, 5)), f((2, 3)), f((3, 5)))
    same(torch.addmm, d(2, 5), f((2, 3)), f((3, 5)))
    same(torch.addmm, f((2, 2)), d(2, 3), f((3, 2)))
    same(torch.addmm, f((1, 2, 2)), f((2, 3)), f((3, 2)))
    same(torch.addmm, f((2, 2)), f((3,)), f((3, 2)))
    same(torch.addmv, f((3,)), f((2, 3)), f((3,)))
    same(torch.addmv, f((2, 1)), f((2, 3)), f((3,)))
    same(torch.baddbmm, f((2, 3, 5)), f((2, 3, 4)), f((2, 5, 5)))
    same(torch.baddbmm, f((2, 2, 5)), f((2, 3, 4)), f((2, 4, 5)))
    same(torch.baddbmm, d(2, 3, 5), f((2, 3, 4)), f((2, 4, 5)))
    same(torch.baddbmm, f((2, 2, 2)), f((2, 2, 3)), d(2, 3, 2))
    same(torch.addbmm, f((3, 5)), f((2, 3, 4)), f((2, 5, 5)))
    same(torch.addbmm, f((2, 2)), f((2, 2, 3)), f((3, 3, 2)))
    same(torch.addbmm, d(3, 5), f((2, 3, 4)), f((2, 4, 5)))
    same(torch.matmul, f(()), f((3,)))
    same(torch.matmul, f((2, 3)), f((4,)))
    same(torch.matmul, f((2, 2, 3)), f((3, 3, 5)))
    same(F.linear, f((2, 3)), f((4, 5)))
    same(F.linear, f((2, 3)), d(4, 3))
    check_error(torch.mm, f((2, 3)), f((4, 5)))
    check_error(torch.dot, f((3,), torch.bool), f((3,), torch.bool))


# ---- scaled_dot_product_attention (the math path: bmm, softmax, masks) ------------------------

def sdpa_check(q, k, v, atol=None, rtol=None, **kw):
    kw_dev = {a: (b.to(TPU) if isinstance(b, torch.Tensor) else b) for a, b in kw.items()}
    fn = lambda a, b, c, **w: F.scaled_dot_product_attention(a, b, c, **w)  # noqa: E731
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to(TPU).requires_grad_() for t in (q, k, v)]
    yc = fn(*cpu, **kw)
    yd = fn(*dev, **kw_dev)
    g = make(yc.shape, yc.dtype, -1, 1)
    yc.backward(g)
    yd.backward(g.to(TPU))
    tol = {} if atol is None else dict(atol=atol, rtol=rtol)
    torch.testing.assert_close(yd.detach().cpu(), yc.detach(), **tol)
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.grad.cpu(), c.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa(dtype):
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    q, k, v = make((2, 3, 5, 8), dtype, -1, 1), make((2, 3, 7, 8), dtype, -1, 1), make((2, 3, 7, 8), dtype, -1, 1)
    sdpa_check(q, k, v, **tol)
    sdpa_check(q, k, v, scale=0.3, **tol)
    sdpa_check(q, k[:, :, :5], v[:, :, :5], is_causal=True, **tol)
    sdpa_check(q, k, v, attn_mask=make((5, 7), torch.bool), **tol)
    sdpa_check(q, k, v, attn_mask=make((2, 1, 5, 7), dtype, -1, 1), **tol)
    # A row that masks every key gives zeros (the "safe" softmax), not NaN.
    mask = make((5, 7), torch.bool)
    mask[1] = False
    sdpa_check(q, k, v, attn_mask=mask, **tol)


def test_sdpa_gqa_and_module():
    q, k, v = make((1, 4, 6, 8), low=-1, high=1), make((1, 2, 6, 8), low=-1, high=1), make((1, 2, 6, 8), low=-1, high=1)
    sdpa_check(q, k, v, enable_gqa=True, is_causal=True, atol=1e-5, rtol=1e-5)
    sdpa_check(q[0], k[0, :1].expand(4, 6, 8), v[0, :1].expand(4, 6, 8), atol=1e-5, rtol=1e-5)  # 3-d, broadcast views
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    md = torch.nn.MultiheadAttention(16, 4, batch_first=True).to(TPU)
    md.load_state_dict(m.state_dict())
    x = make((2, 5, 16), low=-1, high=1)
    yc, _ = m(x, x, x, need_weights=False)
    yd, _ = md(x.to(TPU), x.to(TPU), x.to(TPU), need_weights=False)
    torch.testing.assert_close(yd.detach().cpu(), yc.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8])
def test_trace(dtype):
    for shape in [(4, 4), (3, 5), (6, 2), (0, 3), (1, 1)]:
        check(torch.trace, data(shape, dtype) if dtype != torch.uint8 else make(shape, dtype))
    check(lambda x: torch.trace(x.t()), data((3, 5), dtype) if dtype != torch.uint8 else make((3, 5), dtype))
    if dtype.is_floating_point:
        check_grad(torch.trace, data((4, 3), dtype))


def test_trace_errors():
    check_error(torch.trace, make((3,)))
    check_error(torch.trace, make((3, 3), torch.bool))
    for dtype in (torch.bfloat16, torch.float16):
        try:
            torch.trace(make((3, 3), dtype))
        except NotImplementedError:  # torch before 2.13
            check_error(torch.trace, make((3, 3), dtype))
        else:
            check(torch.trace, make((5, 5), dtype))
