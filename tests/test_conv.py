"""Convolutions (convolution_overrideable and convolution_backward_overrideable) against
PyTorch on CPU: 1-3 spatial dims, stride, padding, dilation, groups, bias, transposed, with
gradients."""
import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, check, check_error, make

# PyTorch sends these two ops to a backend's own kernel only; the C++ shim must register the
# boxed fallback for them (see the shim's TORCH_LIBRARY_IMPL block).
ROUTED = all("fallback" not in line and "CompositeExplicitAutograd" not in line
             for line in torch._C._dispatch_dump_table("aten::convolution_overrideable").split("\n")
             if line.startswith("PrivateUse1:"))
pytestmark = pytest.mark.skipif(not ROUTED, reason="the C++ shim does not send convolution_overrideable to the engine")


def tol(dtype):
    if dtype == torch.bfloat16:
        return dict(atol=6e-2, rtol=3e-2)
    if dtype == torch.float16:
        return dict(atol=5e-3, rtol=5e-3)
    return dict(atol=2e-5, rtol=2e-5)


def grad_check(fn, *inputs, dtype=torch.float32):
    cpu = [None if x is None else x.clone().requires_grad_() for x in inputs]
    dev = [None if x is None else x.to(TPU).requires_grad_() for x in inputs]
    yc = fn(*cpu)
    yd = fn(*dev)
    g = make(yc.shape, yc.dtype, -1, 1)
    yc.backward(g)
    yd.backward(g.to(TPU))
    t = tol(dtype)
    torch.testing.assert_close(yd.detach().cpu(), yc.detach(), **t)
    # A weight gradient sums about a thousand products (batch x spatial positions) in another
    # order than PyTorch's: against float64, 20 draws of the 3-d grouped case gave errors up to
    # 8e-5 on tpu (either compile tier) and 1.8e-5 on CPU, so float32 gradients get 1e-4.
    g_tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else t
    for c, d in zip(cpu, dev):
        if c is not None:
            assert d.grad is not None, "missing gradient"
            torch.testing.assert_close(d.grad.cpu(), c.grad, **g_tol)


CASES = [
    # (spatial dims, in, out, kernel, stride, padding, dilation, groups)
    (1, 3, 4, 3, 1, 0, 1, 1),
    (1, 4, 6, 5, 2, 2, 1, 2),
    (1, 4, 4, 3, 3, 1, 2, 4),
    (2, 3, 5, 3, 1, 1, 1, 1),
    (2, 4, 6, 3, 2, 1, 2, 2),
    (2, 6, 6, 1, 1, 0, 1, 3),
    (2, 2, 4, 4, (2, 1), (1, 0), (1, 2), 1),
    (3, 2, 4, 3, 2, 1, 1, 1),
    (3, 4, 4, 2, 1, (0, 1, 0), 1, 2),
]


def conv_fn(nd):
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]


def convt_fn(nd):
    return {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_forward_backward(case, bias):
    nd, cin, cout, k, stride, padding, dilation, groups = case
    size = [9, 8, 7][:nd]
    x = make((2, cin, *size))
    w = make((cout, cin // groups, *([k] * nd)))
    b = make((cout,)) if bias else None
    fn = lambda x, w, b: conv_fn(nd)(x, w, b, stride, padding, dilation, groups)  # noqa: E731
    check(fn, x, w, b, **tol(torch.float32))
    grad_check(fn, x, w, b)


TRANSPOSED = [
    # (spatial dims, in, out, kernel, stride, padding, output_padding, dilation, groups)
    (1, 3, 4, 3, 1, 0, 0, 1, 1),
    (1, 4, 6, 3, 2, 1, 1, 1, 2),
    (1, 2, 2, 3, 3, 2, 1, 2, 1),
    (2, 4, 6, 3, 2, 1, 1, 1, 2),
    (2, 3, 2, 4, (2, 3), (1, 0), (0, 2), 1, 1),
    (2, 2, 3, 3, 2, 0, 1, 2, 1),
    (3, 2, 4, 3, 2, 1, 1, 1, 2),
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose(case, bias):
    nd, cin, cout, k, stride, padding, out_pad, dilation, groups = case
    size = [7, 6, 5][:nd]
    x = make((2, cin, *size))
    w = make((cin, cout // groups, *([k] * nd)))
    b = make((cout,)) if bias else None
    fn = lambda x, w, b: convt_fn(nd)(x, w, b, stride, padding, out_pad, groups, dilation)  # noqa: E731
    check(fn, x, w, b, **tol(torch.float32))
    grad_check(fn, x, w, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_conv_dtypes(dtype):
    x = make((2, 4, 8, 8), dtype, -1, 1)
    w = make((6, 2, 3, 3), dtype, -1, 1)
    b = make((6,), dtype, -1, 1)
    fn = lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2)  # noqa: E731
    check(fn, x, w, b, **tol(dtype))
    grad_check(fn, x, w, b, dtype=dtype)
    fn = lambda x, w, b: F.conv_transpose1d(x[..., 0], w[..., 0], None, 2, 1, 1)  # noqa: E731
    check(fn, x, make((4, 3, 3, 3), dtype, -1, 1), b, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_conv_integers(dtype):
    x = make((2, 3, 6, 6), dtype, -3, 4)
    w = make((4, 3, 3, 3), dtype, -3, 4)
    check(F.conv2d, x, w, make((4,), dtype))
    check(lambda a, b: F.conv1d(a, b, stride=2, padding=1), x[..., 0], w[..., 0])


def test_conv_views_and_shapes():
    x = make((2, 3, 8, 8))
    w = make((4, 3, 3, 3))
    check(lambda a, b: F.conv2d(a.transpose(2, 3), b), x, w)  # non-contiguous input
    check(lambda a, b: F.conv2d(a.to(memory_format=torch.channels_last), b, padding=1), x, w)
    check(lambda a, b: F.conv2d(a[:, :, ::2], b.transpose(2, 3)), x, w)
    check(F.conv2d, x[0], w)  # unbatched input
    grad_check(F.conv2d, x[0], w)
    check(lambda a, b: F.conv2d(a, b, padding="same"), x, w)
    check(lambda a, b: F.conv2d(a, b, padding="valid"), x, w)
    check(F.conv2d, make((0, 3, 8, 8)), w)  # empty batch
    check(lambda a, b: F.conv2d(a, b, padding=1), make((1, 3, 1, 1)), w)


def test_conv_modules_train():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, stride=2, groups=2), torch.nn.Tanh(),
                              torch.nn.ConvTranspose2d(8, 4, 2, stride=2), torch.nn.Flatten())
    dev = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, stride=2, groups=2), torch.nn.Tanh(),
                              torch.nn.ConvTranspose2d(8, 4, 2, stride=2), torch.nn.Flatten()).to(TPU)
    dev.load_state_dict(net.state_dict())
    oc = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    od = torch.optim.SGD(dev.parameters(), lr=0.05, momentum=0.9)
    x = make((4, 3, 9, 9))
    for _ in range(3):
        for m, o, inp in [(net, oc, x), (dev, od, x.to(TPU))]:
            o.zero_grad()
            loss = (m(inp) ** 2).mean()
            loss.backward()
            o.step()
    for (n, p), q in zip(net.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-4, msg=n)


def test_conv_only_some_grads():
    x = make((2, 3, 6, 6))
    w = make((4, 3, 3, 3))
    wd = w.to(TPU).requires_grad_()
    wc = w.clone().requires_grad_()
    F.conv2d(x, wc).sum().backward()
    F.conv2d(x.to(TPU), wd).sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), wc.grad, atol=2e-5, rtol=2e-5)
    xd = x.to(TPU).requires_grad_()
    xc = x.clone().requires_grad_()
    F.conv2d(xc, w, make((4,))).sum().backward()
    F.conv2d(xd, w.to(TPU), make((4,)).to(TPU)).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, atol=2e-5, rtol=2e-5)


def test_conv_errors():
    x = make((1, 2, 5, 5))
    check_error(F.conv2d, x, make((3, 3, 3, 3)))
    check_error(F.conv2d, x, make((3, 2, 7, 7)))
    check_error(F.conv2d, x, make((3, 2, 3, 3), torch.float64))
    check_error(lambda a, b: F.conv2d(a, b, groups=3), x, make((3, 2, 3, 3)))
    check_error(lambda a, b: F.conv2d(a, b, stride=0), x, make((3, 2, 3, 3)))
    check_error(lambda a, b: F.conv_transpose2d(a, b, stride=1, output_padding=2), x, make((2, 3, 3, 3)))
