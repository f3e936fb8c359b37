"""Activations and their backward ops (threshold_backward, gelu/silu/sigmoid/tanh_backward,
leaky_relu, elu, hardtanh, softplus, hardsigmoid, hardswish, mish, log_sigmoid, shrink, glu,
prelu) against PyTorch on CPU, with gradients through autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import FLOATS, TPU, check, check_error, make

A = torch.ops.aten

ACTS = {
    "relu": F.relu,
    "relu6": F.relu6,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "leaky_relu": F.leaky_relu,
    "leaky_relu_0.2": lambda x: F.leaky_relu(x, 0.2),
    "elu": F.elu,
    "elu_0.5": lambda x: F.elu(x, alpha=0.5),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.5),
    "hardtanh": F.hardtanh,
    "hardtanh_range": lambda x: F.hardtanh(x, -0.5, 2.0),
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=3.0),
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "hardshrink": F.hardshrink,
    "softshrink": lambda x: F.softshrink(x, 0.7),
    "threshold": lambda x: F.threshold(x, 0.25, -2.0),
    "glu": lambda x: F.glu(x, -1),
    "softsign": F.softsign,
    "tanhshrink": F.tanhshrink,
}

SHAPES = [(), (0,), (7,), (4, 6), (2, 3, 8)]


def tol(dtype):
    if dtype == torch.bfloat16:
        return dict(atol=3e-2, rtol=3e-2)
    if dtype == torch.float16:
        return dict(atol=3e-3, rtol=3e-3)
    return dict(atol=2e-6, rtol=2e-6)


def grad_check(fn, x, dtype=None, g=None):
    """Forward values and the input gradient agree on CPU and tpu."""
    xc = x.clone().requires_grad_()
    xd = x.to(TPU).requires_grad_()
    yc = fn(xc)
    yd = fn(xd)
    g = make(yc.shape, yc.dtype, -1, 1) if g is None else g
    yc.backward(g)
    yd.backward(g.to(TPU))
    t = tol(x.dtype)
    torch.testing.assert_close(yd.detach().cpu(), yc.detach(), **t)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **t)


@pytest.mark.parametrize("name", sorted(ACTS))
@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
def test_forward_and_grad(name, dtype):
    fn = ACTS[name]
    for shape in SHAPES:
        if name == "glu" and (len(shape) == 0 or shape[-1] % 2):
            continue
        x = make(shape, dtype, -4, 4)
        check(fn, x, **tol(dtype))
        grad_check(fn, x)


@pytest.mark.parametrize("name", sorted(ACTS))
def test_non_contiguous(name):
    fn = ACTS[name]
    x = make((6, 8), torch.float32, -4, 4)
    check(lambda v: fn(v.t()), x)
    check(lambda v: fn(v[::2, 1:7]), x)
    grad_check(lambda v: fn(v.t()), x)


def test_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 20.0, 21.0, 50.0, -50.0])
    for name, fn in ACTS.items():
        # gelu: CPU's gelu(+-inf) is nan, so its special values are not compared here.
        if name in ("glu", "gelu", "gelu_tanh"):
            continue
        check(fn, x)
    finite = x[x.isfinite()]
    check(A.gelu_backward, torch.ones_like(finite), finite)
    check(lambda g, v: A.gelu_backward(g, v, approximate="tanh"), torch.ones_like(finite), finite)
    # softplus switches to the identity above threshold / beta.
    check(lambda v: F.softplus(v, beta=0.5, threshold=10.0), torch.linspace(-30, 30, 61))
    grad_check(lambda v: F.softplus(v, beta=0.5, threshold=10.0), torch.linspace(-30, 30, 61))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_inputs(dtype):
    x = make((3, 4), dtype)
    check(F.relu, x)
    check(F.hardtanh, x)
    check(lambda v: F.hardtanh(v, -2, 3), x)
    check(F.relu6, x)
    check(lambda v: F.threshold(v, 1, 7), x)
    check(torch.sigmoid, x)
    check(torch.tanh, x)


def test_inplace_variants():
    for fn in [lambda v: F.leaky_relu(v, 0.1, inplace=True), lambda v: F.elu(v, inplace=True),
               lambda v: F.hardtanh(v, inplace=True), lambda v: F.relu(v, inplace=True),
               lambda v: F.hardsigmoid(v, inplace=True), lambda v: F.hardswish(v, inplace=True),
               lambda v: F.silu(v, inplace=True), lambda v: F.mish(v, inplace=True),
               lambda v: F.threshold(v, 0.5, 0.0, inplace=True), lambda v: F.selu(v, inplace=True),
               lambda v: F.celu(v, inplace=True)]:
        x = make((4, 5))
        # Through a leaf's clone so that autograd uses the result-based backward formulas.
        grad_check(lambda v: fn(v * 1.0), x)


def test_out_variants():
    x = make((3, 4))
    out = torch.empty(3, 4, device=TPU)
    torch._C._nn.leaky_relu(x.to(TPU), 0.3, out=out)
    torch.testing.assert_close(out.cpu(), F.leaky_relu(x, 0.3))
    out = torch.empty(0, device=TPU)
    torch._C._nn.softplus(x.to(TPU), 2, 10, out=out)
    torch.testing.assert_close(out.cpu(), F.softplus(x, 2, 10))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_ops_direct(dtype):
    g = make((4, 5), dtype)
    x = make((4, 5), dtype, -4, 4)
    y = torch.sigmoid(x)
    t = tol(dtype)
    check(A.threshold_backward, g, x, 0.5, **t)
    check(A.threshold_backward, g, x, 0, **t)
    check(A.gelu_backward, g, x, **t)
    check(lambda a, b: A.gelu_backward(a, b, approximate="tanh"), g, x, **t)
    check(A.silu_backward, g, x, **t)
    check(A.sigmoid_backward, g, y, **t)
    check(A.tanh_backward, g, torch.tanh(x), **t)
    check(A.hardtanh_backward, g, x, -1.0, 2.0, **t)
    check(A.leaky_relu_backward, g, x, 0.3, False, **t)
    check(A.elu_backward, g, 1.0, 1.0, 1.0, False, x, **t)
    check(A.elu_backward, g, 1.5, 2.0, 0.5, True, F.elu(x, 1.5), **t)
    check(A.softplus_backward, g, x, 1.0, 20.0, **t)
    check(A.hardsigmoid_backward, g, x, **t)
    check(A.hardswish_backward, g, x, **t)
    check(A.mish_backward, g, x, **t)
    check(A.hardshrink_backward, g, x, 0.5, **t)
    check(A.softshrink_backward, g, x, 0.5, **t)
    out, buf = A.log_sigmoid_forward(x)
    check(A.log_sigmoid_forward, x, **t)
    check(A.log_sigmoid_backward, g, x, buf, **t)
    check(A.glu_backward, make((4, 2), dtype), x[:, :4], 1, **t)


def test_backward_ops_promote_and_broadcast():
    g = make((3,))
    x = make((2, 3))
    check(A.threshold_backward, g, x, 0)
    check(A.threshold_backward, g.double(), x, 0)
    check(A.threshold_backward, g.bfloat16(), x, 0)
    check(A.sigmoid_backward, g.double(), torch.sigmoid(x))
    check(A.tanh_backward, g, torch.tanh(x).double())
    check(A.threshold_backward, make((3,), torch.int64), make((3,), torch.int64), 0)


def test_prelu():
    x = make((2, 3, 4))
    for w in [torch.tensor([0.25]), make((3,))]:
        check(F.prelu, x, w)
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        xd, wd = x.to(TPU).requires_grad_(), w.to(TPU).requires_grad_()
        g = make(x.shape)
        F.prelu(xc, wc).backward(g)
        F.prelu(xd, wd).backward(g.to(TPU))
        torch.testing.assert_close(xd.grad.cpu(), xc.grad)
        torch.testing.assert_close(wd.grad.cpu(), wc.grad, atol=1e-5, rtol=1e-5)
    m = torch.nn.PReLU(3)
    md = torch.nn.PReLU(3).to(TPU)
    md.load_state_dict(m.state_dict())
    torch.testing.assert_close(md(x.to(TPU)).cpu(), m(x).detach())


def test_modules_end_to_end():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 8), torch.nn.SiLU(),
                              torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 8), torch.nn.Mish(), torch.nn.Linear(8, 8), torch.nn.Hardswish(),
                              torch.nn.Linear(8, 1), torch.nn.Sigmoid())
    dev = torch.nn.Sequential(*[type(m)(*([m.in_features, m.out_features] if isinstance(m, torch.nn.Linear) else []))
                                for m in net]).to(TPU)
    dev.load_state_dict(net.state_dict())
    x = make((5, 6))
    g = make((5, 1))
    net(x).backward(g)
    dev(x.to(TPU)).backward(g.to(TPU))
    for (n, p), q in zip(net.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_errors():
    L = make((3,), torch.int64)
    B = make((3,), torch.bool)
    x = make((3,))
    for fn in [F.leaky_relu, F.elu, F.softplus, F.hardsigmoid, F.hardswish, F.mish, F.logsigmoid, F.hardshrink,
               F.softshrink, F.silu, F.gelu]:
        check_error(fn, L)
        check_error(fn, B)
    check_error(F.relu, B)
    check_error(F.hardtanh, B)
    check_error(lambda v: F.threshold(v, 0, 1), B)
    check_error(lambda v: F.glu(v), x)
    check_error(lambda v: F.glu(v), make(()))
    check_error(lambda v: F.softshrink(v, -0.5), x)
    check_error(lambda g, v: A.gelu_backward(g, v, approximate="foo"), x, x)
    check_error(lambda g, v: A.leaky_relu_backward(g, v, -0.1, True), x, x)
    check_error(lambda g, v: A.elu_backward(g, -1.0, 1.0, 1.0, True, v), x, x)
    check_error(A.sigmoid_backward, L, L)
    check_error(A.tanh_backward, L, L)
    check_error(A.sigmoid_backward, B, B)
    check_error(A.threshold_backward, B, B, 0)
    check_error(A.threshold_backward, x, make((4,)), 0)
    # A cached program must not skip the value checks.
    A.leaky_relu_backward(x.to(TPU), x.to(TPU), 0.1, True)
    check_error(lambda g, v: A.leaky_relu_backward(g, v, -0.1, True), x, x)
    F.softshrink(x.to(TPU), 0.5)
    check_error(lambda v: F.softshrink(v, -0.5), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_scalar_boundaries(dtype):
    # Inputs exactly at the (dtype-rounded) scalar: each kernel rounds its scalar like PyTorch.
    s = 0.7
    r = torch.tensor(s, dtype=dtype)
    x = torch.stack([r, -r, r * 2, -r * 2, r / 2, torch.tensor(0.0, dtype=dtype)])
    cases = [
        lambda v: F.threshold(v, s, -2.0),
        lambda v: A.threshold_backward(torch.ones_like(v), v, s),
        lambda v: F.hardtanh(v, -s, s),
        lambda v: A.hardtanh_backward(torch.ones_like(v), v, -s, s),
        lambda v: F.softplus(v, 2.0, 2 * s),
        lambda v: A.softplus_backward(torch.ones_like(v), v, 1.0, s),
        lambda v: F.hardshrink(v, s),
        lambda v: A.hardshrink_backward(torch.ones_like(v), v, s),
        lambda v: F.softshrink(v, s),
        lambda v: A.softshrink_backward(torch.ones_like(v), v, s),
        lambda v: F.leaky_relu(v, s),
        lambda v: F.elu(v, s),
    ]
    for fn in cases:
        check(fn, x, atol=0, rtol=0)


# ---- dropout ---------------------------------------------------------------------------------

def _dropout_has_generator():
    try:
        A.native_dropout(torch.ones(2, device=TPU), 0.5, True)
    except NotImplementedError as e:
        if "needs the device generator" in str(e):
            return False
        raise
    return True


needs_rng = pytest.mark.skipif(not _dropout_has_generator(),
                               reason="the C++ shim does not pass the device generator to native_dropout yet")


@needs_rng
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_native_dropout(dtype, p):
    x = make((200, 300), dtype, 0.5, 2).to(TPU)
    out, mask = A.native_dropout(x, p, True)
    assert mask.dtype == torch.bool and mask.shape == x.shape and out.dtype == dtype
    out, mask, xc = out.cpu(), mask.cpu(), x.cpu()
    expected = (xc.float() * mask.float() * (1.0 / (1.0 - p))).to(dtype)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    dropped = 1.0 - mask.float().mean().item()
    assert abs(dropped - p) < 0.01, (dropped, p)
    # F.dropout takes the same road.
    y = torch.nn.functional.dropout(x, p, training=True).cpu()
    kept = y != 0
    assert abs((1.0 - kept.float().mean().item()) - p) < 0.01
    torch.testing.assert_close(y[kept], (xc[kept].float() * (1.0 / (1.0 - p))).to(dtype), atol=0, rtol=0)


@needs_rng
def test_dropout_seeding():
    x = torch.ones(64, 64, device=TPU)
    torch.manual_seed(123)
    a = torch.nn.functional.dropout(x, 0.5).cpu()
    b = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.manual_seed(123)
    a2 = torch.nn.functional.dropout(x, 0.5).cpu()
    b2 = torch.nn.functional.dropout(x, 0.5).cpu()
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)
    torch.manual_seed(124)
    assert not torch.equal(torch.nn.functional.dropout(x, 0.5).cpu(), a)


@needs_rng
def test_dropout_grad_and_modules():
    x = make((50, 40)).to(TPU).requires_grad_()
    g = make((50, 40))
    y = torch.nn.functional.dropout(x, 0.3, training=True)
    y.backward(g.to(TPU))
    mask = (y.detach().cpu() != 0)
    torch.testing.assert_close(x.grad.cpu(), g * mask / 0.7)
    m = torch.nn.Dropout(0.25).to(TPU)
    v = make((10, 10)).to(TPU)
    m.eval()
    torch.testing.assert_close(m(v).cpu(), v.cpu())
    m.train()
    out = m(v).cpu()
    assert ((out == 0) | torch.isclose(out, v.cpu() / 0.75)).all()
    # Edge probabilities and special values.
    out, mask = A.native_dropout(torch.tensor([1.0, -2.0, float("nan")], device=TPU), 1.0, True)
    assert not mask.cpu().any()
    assert torch.equal(out.cpu()[:2].abs(), torch.zeros(2)) and out.cpu()[2].isnan()
    out, mask = A.native_dropout(v, 0.5, False)
    assert mask.cpu().all() and torch.equal(out.cpu(), v.cpu())
    out, mask = A.native_dropout(torch.ones(0, 3, device=TPU), 0.5, True)
    assert out.shape == (0, 3) and mask.shape == (0, 3)
    check_error(lambda t: A.native_dropout(t, 1.5, True), make((3,)))
    check_error(lambda t: A.native_dropout(t, -0.5, True), make((3,)))


def test_native_dropout_backward():
    g = make((4, 5))
    mask = make((4, 5), torch.bool)
    check(A.native_dropout_backward, g, mask, 2.0)
    check(A.native_dropout_backward, g, mask, 1.0 / 0.3)
    check(A.native_dropout_backward, g.bfloat16(), mask, 1.25, **tol(torch.bfloat16))
    check(A.native_dropout_backward, g, mask[0], 2.0)  # broadcasts
    check(A.native_dropout_backward, g, mask.float(), 2.0)
    check(A.native_dropout_backward, make((3,), torch.int64), make((3,), torch.bool), 2.0)
    # Dropped NaN/inf gradients stay NaN and signs of zero are kept, as in grad * mask * scale.
    special = torch.tensor([float("nan"), float("inf"), -2.0, 3.0, float("nan")])
    check(A.native_dropout_backward, special, torch.tensor([False, False, False, False, True]), 2.0)


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
@pytest.mark.parametrize("dim", [0, -1])
def test_glu_jvp_and_backward_jvp(dtype, dim):
    A = torch.ops.aten
    x, dx = make((4, 6), dtype), make((4, 6), dtype)
    half = list(x.shape)
    half[dim] //= 2
    g, dg = make(half, dtype), make(half, dtype)
    tol = {} if dtype in (torch.float32, torch.float64) else dict(atol=5e-2, rtol=5e-2)
    check(lambda *a: A.glu_backward_jvp(*a, dim), x, g, x, dg, dx, **tol)
    if dtype in (torch.bfloat16, torch.float16):  # PyTorch's CPU glu_jvp kernel has no 16-bit floats
        check_error(lambda *a: A.glu_jvp(*a, dim), F.glu(x, dim), x, dx)
        return
    check(lambda *a: A.glu_jvp(*a, dim), F.glu(x, dim), x, dx, **tol)
    check(lambda *a: A.glu_jvp(*a, dim), F.glu(x.t(), dim), x.t(), dx.t(), **tol)
    check(lambda *a: A.glu_jvp.out(*a, dim, out=torch.empty(0, dtype=dtype, device=a[0].device)), F.glu(x, dim), x, dx, **tol)
    e = make((0, 6), dtype)
    check(lambda *a: A.glu_jvp(*a, 1), F.glu(e, 1), e, e)
    check_error(lambda *a: A.glu_jvp(*a, 0), make((), dtype), make((), dtype), make((), dtype))
    check_error(lambda *a: A.glu_jvp(*a, 1), make((4, 4), dtype), x, dx)  # narrow past the end
