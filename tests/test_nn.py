"""Softmax, normalization and losses on "tpu" against PyTorch on CPU, with gradients."""
import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import FLOATS, TPU, check, check_error, check_grads, make, tolerance

A = torch.ops.aten


def tol_for(dtype):
    return dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else (dict(atol=3e-3, rtol=3e-3) if dtype == torch.float16 else {})


# ---- softmax -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_softmax(fn, dtype):
    for shape in [(), (0,), (7,), (3, 4), (2, 0, 3), (2, 3, 5)]:
        x = make(shape, dtype)
        for dim in range(-max(len(shape), 1), max(len(shape), 1)):
            check(fn, x, dim)
    x = make((4, 6), dtype)
    check(lambda t: fn(t.t(), 1), x)
    check(lambda t: fn(t[::2], -1), x)


def test_softmax_special_values():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, 0.0, 1.0], [-inf, -inf, -inf], [1000.0, 1000.0, -1000.0], [nan, 1.0, 2.0], [inf, 1.0, 0.0]])
    check(torch.softmax, x, 1)
    check(torch.log_softmax, x, 1)


def test_softmax_dtype_arg_and_half_to_float():
    x = make((3, 5), torch.float16)
    check(lambda t: torch.softmax(t, 1, dtype=torch.float32), x)
    check(lambda t: torch.log_softmax(t, 0, dtype=torch.float64), x)
    # half_to_float is a CUDA feature (CPU refuses it): compare with the float computation.
    got = A._softmax(x.to(TPU), 1, True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), torch.softmax(x.float(), 1))
    got = A._log_softmax(x.to(TPU), 1, True)
    torch.testing.assert_close(got.cpu(), torch.log_softmax(x.float(), 1))
    with pytest.raises(RuntimeError):
        A._softmax(make((3, 5)).to(TPU), 1, True)


def test_softmax_errors():
    check_error(torch.softmax, make((3, 4), torch.int64), 1)
    check_error(torch.log_softmax, make((3, 4), torch.bool), 0)
    check_error(torch.softmax, make((3, 4)), 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_backward(dtype):
    for shape, dim in [((7,), 0), ((3, 4), 1), ((3, 4), 0), ((2, 3, 5), 1), ((), 0)]:
        x = make(shape, dtype)
        check_grads(lambda t: torch.softmax(t, dim), x, **tol_for(dtype))
        check_grads(lambda t: torch.log_softmax(t, dim), x, **tol_for(dtype))
    g, x = make((3, 4)), make((3, 4))
    for op in (A._softmax_backward_data, A._log_softmax_backward_data):
        out = torch.softmax(x, 1) if op is A._softmax_backward_data else torch.log_softmax(x, 1)
        check(op, g, out, 1, torch.float32)
        check(op, g.bfloat16(), out.bfloat16(), -1, torch.bfloat16)


# ---- layer norm / rms norm / batch norm -------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype):
    for shape, norm in [((4, 6), (6,)), ((2, 3, 5), (5,)), ((2, 3, 5), (3, 5)), ((5,), (5,)), ((0, 4), (4,))]:
        x = make(shape, dtype)
        w = make(norm, dtype)
        b = make(norm, dtype)
        tol = tol_for(dtype)
        check(F.layer_norm, x, norm, **tol)
        check(F.layer_norm, x, norm, w, None, **tol)
        check(F.layer_norm, x, norm, None, b, **tol)
        check(F.layer_norm, x, norm, w, b, 1e-3, **tol)
    check(lambda t: F.layer_norm(t.t(), (4,)), make((4, 6)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_backward(dtype):
    tol = tol_for(dtype) if dtype != torch.bfloat16 else dict(atol=6e-2, rtol=6e-2)
    x = make((4, 3, 6), dtype)
    w = make((6,), dtype)
    b = make((6,), dtype)
    check_grads(lambda t: F.layer_norm(t, (6,)), x, **tol)
    check_grads(lambda t, w_, b_: F.layer_norm(t, (6,), w_, b_), x, w, b, needs=[True, True, True], **tol)
    check_grads(lambda t, w_: F.layer_norm(t, (3, 6), w_), x, make((3, 6), dtype), needs=[True, True], **tol)
    check_grads(lambda t, b_: F.layer_norm(t, (6,), None, b_), x, b, needs=[False, True], **tol)


def test_layer_norm_module_and_errors():
    torch.manual_seed(1)
    m = torch.nn.LayerNorm(8)
    x = make((5, 8))
    mt = torch.nn.LayerNorm(8).to(TPU)
    mt.load_state_dict(m.state_dict())
    yc, yt = m(x), mt(x.to(TPU))
    torch.testing.assert_close(yt.detach().cpu(), yc.detach())
    yc.sum().backward()
    yt.sum().backward()
    torch.testing.assert_close(mt.weight.grad.cpu(), m.weight.grad)
    torch.testing.assert_close(mt.bias.grad.cpu(), m.bias.grad)
    check_error(F.layer_norm, make((3, 4)), (5,))
    check_error(F.layer_norm, make((3, 4)), (4,), make((3,)))


@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_norm(dtype):
    tol = tol_for(dtype)
    x = make((4, 3, 6), dtype)
    w = make((6,), dtype)
    check(F.rms_norm, x, (6,), **tol)
    check(F.rms_norm, x, (3, 6), None, 1e-3, **tol)
    check(F.rms_norm, x, (6,), w, **tol)
    if dtype != torch.float16:
        gtol = tol if dtype == torch.float32 else dict(atol=6e-2, rtol=6e-2)
        check_grads(lambda t: F.rms_norm(t, (6,)), x, **gtol)
        check_grads(lambda t, w_: F.rms_norm(t, (6,), w_, 1e-5), x, w, needs=[True, True], **gtol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm(dtype):
    tol = tol_for(dtype)
    for shape in [(4, 3), (4, 3, 5), (2, 3, 4, 4)]:
        x = make(shape, dtype)
        w, b = make((3,), dtype), make((3,), dtype)
        rm, rv = make((3,)), make((3,), low=0.5, high=2.0)  # float32: mixed with 16-bit inputs
        rmd, rvd = rm.to(dtype), rv.to(dtype)
        # Training without running statistics (batch statistics only).
        check(lambda t, w_, b_: F.batch_norm(t, None, None, w_, b_, training=True), x, w, b, **tol)
        check(lambda t: F.batch_norm(t, None, None, training=True, eps=1e-3), x, **tol)
        # Evaluation with running statistics (float32 statistics with 16-bit inputs: mixed).
        check(lambda t, m_, v_: F.batch_norm(t, m_, v_, training=False), x, rm, rv, **tol)
        check(lambda t, m_, v_, w_, b_: F.batch_norm(t, m_, v_, w_, b_, training=False), x, rmd, rvd, w, b, **tol)
        check(lambda t, m_, v_, w_, b_: F.batch_norm(t, m_, v_, w_, b_, training=False), x, rm, rv, w.float(), b.float(), **tol)


def test_batch_norm_backward():
    x = make((4, 3, 5))
    w, b = make((3,)), make((3,))
    rm, rv = make((3,)), make((3,), low=0.5, high=2.0)
    check_grads(lambda t, w_, b_: F.batch_norm(t, None, None, w_, b_, training=True), x, w, b, needs=[True, True, True])
    check_grads(lambda t: F.batch_norm(t, None, None, training=True), make((6, 2)))
    check_grads(lambda t, w_, b_: F.batch_norm(t, rm.to(t.device), rv.to(t.device), w_, b_, training=False), x, w, b,
          needs=[True, True, True])
    check_grads(lambda t: F.batch_norm(t, rm.to(t.device), rv.to(t.device), training=False), make((2, 3, 4, 4)))


def test_batch_norm_running_stats_updated():
    # native_batch_norm updates running statistics without declaring the write in its schema;
    # the lowering is registered as writing them, so they match CPU after each training step.
    for momentum in (0.1, None):
        ref = torch.nn.BatchNorm1d(3, momentum=momentum)
        dev = torch.nn.BatchNorm1d(3, momentum=momentum).to(TPU)
        for _ in range(3):
            x = make((6, 3))
            torch.testing.assert_close(dev(x.to(TPU)).detach().cpu(), ref(x).detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dev.running_mean.cpu(), ref.running_mean, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(dev.running_var.cpu(), ref.running_var, atol=1e-6, rtol=1e-5)
        assert dev.num_batches_tracked.item() == 3
    rm, rv = torch.zeros(3), torch.ones(3)
    rmt, rvt = rm.to(TPU), rv.to(TPU)
    x = make((4, 3))
    F.batch_norm(x, rm, rv, training=True)
    F.batch_norm(x.to(TPU), rmt, rvt, training=True)
    torch.testing.assert_close(rmt.cpu(), rm)
    torch.testing.assert_close(rvt.cpu(), rv)
    m = torch.nn.BatchNorm1d(3, track_running_stats=False).to(TPU)
    torch.testing.assert_close(m(x.to(TPU)).detach().cpu(), torch.nn.BatchNorm1d(3, track_running_stats=False)(x).detach())


def test_batch_norm_errors():
    check_error(lambda t: A.native_batch_norm(t, None, None, None, None, True, 0.1, 1e-5), make((4, 3), torch.int64))
    check_error(lambda t: A.native_layer_norm_backward(t, t, [5], t, t, None, None, [True, False, False]),
                make((3, 4)))


# ---- nll_loss / cross_entropy ---------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", FLOATS + [torch.float64])
def test_nll_loss(reduction, dtype):
    tol = tol_for(dtype)
    x = torch.log_softmax(make((6, 5)), 1).to(dtype)
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    w = make((5,), dtype, low=0.1, high=2.0)
    check(F.nll_loss, x, t, reduction=reduction, **tol)
    check(F.nll_loss, x, t, w, reduction=reduction, **tol)
    check(F.nll_loss, x, torch.tensor([0, -100, 2, -100, 1, 3]), w, reduction=reduction, **tol)
    check(F.nll_loss, x, t, w, ignore_index=2, reduction=reduction, **tol)
    check(F.nll_loss, x[0], t[0], reduction=reduction, **tol)  # unbatched
    check(F.nll_loss, x[:0], t[:0], reduction=reduction, **tol)  # empty batch: NaN mean
    check(F.nll_loss, x, torch.full((6,), -100), reduction=reduction, **tol)  # all ignored


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_backward(reduction):
    x = torch.log_softmax(make((6, 5)), 1)
    t = torch.tensor([0, 4, 2, -100, 1, 3])
    w = make((5,), low=0.1, high=2.0)
    check_grads(lambda a: F.nll_loss(a, t.to(a.device), reduction=reduction), x)
    check_grads(lambda a: F.nll_loss(a, t.to(a.device), w.to(a.device), reduction=reduction), x)
    check_grads(lambda a: F.nll_loss(a, t[1].to(a.device), reduction=reduction), x[0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss2d(reduction):
    x = torch.log_softmax(make((2, 4, 3, 5)), 1)
    t = torch.randint(0, 4, (2, 3, 5))
    t[0, 1, 2] = -100
    w = make((4,), low=0.1, high=2.0)
    check(F.nll_loss, x, t, reduction=reduction)
    check(F.nll_loss, x, t, w, reduction=reduction)
    check(F.nll_loss, x.bfloat16(), t, w.bfloat16(), reduction=reduction, atol=3e-2, rtol=3e-2)
    check_grads(lambda a: F.nll_loss(a, t.to(a.device), w.to(a.device), reduction=reduction), x)


def test_nll_loss_errors():
    x = make((3, 4))
    check_error(F.nll_loss, x, torch.tensor([0, 1]))
    check_error(F.nll_loss, x, torch.tensor([0, 1, 2]), make((3,)))
    check_error(F.nll_loss, x, torch.tensor([0, 1, 2], dtype=torch.int32))
    check_error(lambda a, t: A.nll_loss_forward(a, t, None, 1, -100), make((2, 3, 4)), torch.tensor([0, 1]))
    check_error(lambda a, t: A.nll_loss2d_forward(a, t, None, 1, -100), make((2, 3, 4, 4)), torch.zeros(2, 4, 5, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy(dtype):
    tol = tol_for(dtype) if dtype != torch.bfloat16 else dict(atol=6e-2, rtol=6e-2)
    x = make((6, 5), dtype)
    t = torch.tensor([0, 4, 2, -100, 1, 3])
    w = make((5,), dtype, low=0.1, high=2.0)
    check_grads(lambda a: F.cross_entropy(a, t.to(a.device)), x, **tol)
    check_grads(lambda a: F.cross_entropy(a, t.to(a.device), w.to(a.device), reduction="sum"), x, **tol)
    check_grads(lambda a: F.cross_entropy(a, t.to(a.device), label_smoothing=0.1), x, **tol)
    check_grads(lambda a: F.cross_entropy(a, t.to(a.device), reduction="none"), x, **tol)
    probs = torch.softmax(make((6, 5)), 1).to(dtype)
    check_grads(lambda a: F.cross_entropy(a, probs.to(a.device)), x, **tol)
    x4 = make((2, 4, 3, 3), dtype)
    t4 = torch.randint(0, 4, (2, 3, 3))
    check_grads(lambda a: F.cross_entropy(a, t4.to(a.device)), x4, **tol)


def test_cross_entropy_module_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).to(TPU)
    dev.load_state_dict(model.state_dict())
    x, t = make((10, 8)), torch.randint(0, 4, (10,))
    lc = F.cross_entropy(model(x), t)
    lt = F.cross_entropy(dev(x.to(TPU)), t.to(TPU))
    lc.backward()
    lt.backward()
    torch.testing.assert_close(lt.detach().cpu(), lc.detach())
    for pc, pt in zip(model.parameters(), dev.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-4)


# ---- mse / bce -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_mse_loss(reduction, dtype):
    tol = tol_for(dtype)
    for shape in [(), (0,), (7,), (3, 4)]:
        x, y = make(shape, dtype), make(shape, dtype)
        check(F.mse_loss, x, y, reduction=reduction, **tol)
        if dtype != torch.float16 and shape != (0,):
            check_grads(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, y, needs=[True, True],
                  **(tol if dtype == torch.float32 else dict(atol=6e-2, rtol=6e-2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(F.mse_loss, make((3, 4), dtype), make((4,), dtype), reduction=reduction, **tol)  # broadcast
    check(A.mse_loss, make((3, 4), dtype), make((3, 4)), 1, **tol)  # promotes to float32


def test_mse_loss_errors():
    check_error(F.mse_loss, make((3,), torch.int64), make((3,), torch.int64))
    check_error(lambda a, b: A.mse_loss(a, b, 1), make((3,)), make((4,)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_binary_cross_entropy(reduction, dtype):
    tol = tol_for(dtype) if dtype != torch.bfloat16 else dict(atol=6e-2, rtol=6e-2)
    x = torch.sigmoid(make((4, 5))).to(dtype)
    x[0, 0], x[0, 1] = 0.0, 1.0  # clamped logs
    y = torch.rand(4, 5).to(dtype)
    y[0, 0], y[0, 1] = 1.0, 0.0
    w = make((5,), dtype, low=0.1, high=2.0)
    check(F.binary_cross_entropy, x, y, reduction=reduction, **tol)
    check(F.binary_cross_entropy, x, y, w, reduction=reduction, **tol)
    xs = torch.sigmoid(make((4, 5))).to(dtype)
    check_grads(lambda a: F.binary_cross_entropy(a, y.to(a.device), reduction=reduction), xs, **tol)
    check_grads(lambda a: F.binary_cross_entropy(a, y.to(a.device), w.to(a.device), reduction=reduction), xs, **tol)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_binary_cross_entropy_out_equals_the_functional_form(reduction):
    # CPU's out= kernel reduces into an out it has resized to the unreduced shape (a 0-d out
    # gives the first element, an empty one NaN), so the reference here is the functional form.
    x, y = torch.sigmoid(make((5,))), torch.rand(5)
    expected = torch.ops.aten.binary_cross_entropy(x, y, None, reduction)
    for out in (torch.empty(0, device=TPU), torch.empty(expected.shape, device=TPU)):
        got = torch.ops.aten.binary_cross_entropy.out(x.to(TPU), y.to(TPU), None, reduction, out=out)
        assert got is out
        torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(reduction):
    x, y = make((4, 5)), torch.rand(4, 5)
    w, pw = make((5,), low=0.1, high=2.0), make((5,), low=0.5, high=3.0)
    check(F.binary_cross_entropy_with_logits, x, y, reduction=reduction)
    check(lambda a, b, w_, p_: F.binary_cross_entropy_with_logits(a, b, w_, pos_weight=p_, reduction=reduction), x, y, w, pw)
    check_grads(lambda a: F.binary_cross_entropy_with_logits(a, y.to(a.device), w.to(a.device), pos_weight=pw.to(a.device),
                                                       reduction=reduction), x)


def test_binary_cross_entropy_errors():
    x = torch.sigmoid(make((3, 4)))
    check_error(lambda a, b: A.binary_cross_entropy(a, b, None, 1), x.long(), x.long())
    check_error(lambda a, b: A.binary_cross_entropy(a, b, None, 1), x, x.double())


# ---- the same lowerings inside torch.compile graphs --------------------------------------------------


def test_native_batch_norm_legit_writes_running_stats():
    x = make((6, 3, 4))
    rm_c, rv_c = make((3,)), make((3,), low=0.5, high=2.0)
    rm_t, rv_t = rm_c.to(TPU), rv_c.to(TPU)
    ec = A._native_batch_norm_legit(x, None, None, rm_c, rv_c, True, 0.2, 1e-5)
    et = A._native_batch_norm_legit(x.to(TPU), None, None, rm_t, rv_t, True, 0.2, 1e-5)
    for g, e in zip(et, ec):
        torch.testing.assert_close(g.cpu(), e)
    torch.testing.assert_close(rm_t.cpu(), rm_c)
    torch.testing.assert_close(rv_t.cpu(), rv_c)
    check(lambda t: A._native_batch_norm_legit(t, None, None, True, 0.1, 1e-5), x)
    check(lambda t, m_, v_: A._native_batch_norm_legit_no_training(t, None, None, m_, v_, 0.1, 1e-5), x, rm_c, rv_c)
    check(lambda t, m_, v_: A._native_batch_norm_legit_functional(t, None, None, m_, v_, True, 0.1, 1e-5), x, rm_c, rv_c)


def _compiled_step(make_model, x, *extra):
    torch.manual_seed(0)
    ref = make_model()
    dev = make_model().to(TPU)
    dev.load_state_dict(ref.state_dict())
    compiled = torch.compile(dev, backend="tpu")
    yc = ref(x, *extra)
    yt = compiled(x.to(TPU), *[e.to(TPU) for e in extra])
    torch.testing.assert_close(yt.detach().cpu(), yc.detach(), atol=1e-5, rtol=1e-4)
    yc.backward()
    yt.backward()
    for (name, pc), pt in zip(ref.named_parameters(), dev.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-4, msg=name)
    for (name, bc), bt in zip(ref.named_buffers(), dev.buffers()):
        torch.testing.assert_close(bt.cpu(), bc, msg=name)


@contextlib.contextmanager
def factories_in_graphs():
    """The backward graphs of cross_entropy, binary_cross_entropy and logsumexp build constants
    with full/full_like/scalar_tensor, which the graph compiler may not lower yet."""
    try:
        yield
    except NotImplementedError as e:
        if any(f"no lowering for aten::{op} " in str(e) for op in ("full", "full_like", "scalar_tensor")):
            pytest.xfail(str(e))
        raise


class _Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(8)
        self.ln = torch.nn.LayerNorm(8)
        self.lin = torch.nn.Linear(8, 5)

    def forward(self, x, q):
        h = self.lin(self.ln(self.bn(x)))
        return (F.mse_loss(torch.softmax(h, 1), q) + h.var(0).sum() + F.log_softmax(h, 0).amax()
                + F.rms_norm(h, (5,)).sum())


def test_compiled_norms():
    x, q = make((6, 8)), torch.rand(6, 5)
    _compiled_step(_Norms, x, q)
    _compiled_step(lambda: _Norms().eval(), x, q)


class _NormLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(8)
        self.ln = torch.nn.LayerNorm(8)
        self.lin = torch.nn.Linear(8, 5)

    def forward(self, x, t, q):
        h = self.lin(self.ln(self.bn(x)))
        p = torch.softmax(h, 1)
        return (F.cross_entropy(h, t) + F.mse_loss(p, q) + F.binary_cross_entropy(p, q)
                + h.var(0).sum() + h.logsumexp(1).mean() + F.log_softmax(h, 0).amax())


def test_compiled_norms_and_losses():
    x, t, q = make((6, 8)), torch.tensor([0, 4, 2, 1, 1, 3]), torch.rand(6, 5)
    with factories_in_graphs():
        _compiled_step(_NormLoss, x, t, q)
        _compiled_step(lambda: _NormLoss().eval(), x, t, q)


# ---- the backward ops called directly, absent optional tensors as None --------------------------------------


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_backward_direct(reduction):
    x = torch.log_softmax(make((6, 5)), 1)
    t = torch.tensor([0, 4, 2, -100, 1, 3])
    w = make((5,), low=0.1, high=2.0)
    for weight in (None, w):
        out, total = A.nll_loss_forward(x, t, weight, reduction, -100)
        g = make(out.shape)
        check(lambda g_, x_, t_, tw: A.nll_loss_backward(g_, x_, t_, weight if weight is None else weight.to(x_.device),
                                                         reduction, -100, tw), g, x, t, total)
    x4 = torch.log_softmax(make((2, 4, 3, 5)), 1)
    t4 = torch.randint(0, 4, (2, 3, 5))
    out, total = A.nll_loss2d_forward(x4, t4, None, reduction, 1)
    check(lambda g_, x_, t_, tw: A.nll_loss2d_backward(g_, x_, t_, None, reduction, 1, tw), make(out.shape), x4, t4, total)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_backward_direct(dtype):
    tol = dict(atol=6e-2, rtol=6e-2) if dtype == torch.bfloat16 else {}
    x = make((4, 3, 6), dtype)
    w, b = make((6,), dtype), make((6,), dtype)
    for norm, weight, bias in [([6], w, b), ([6], None, None), ([3, 6], make((3, 6), dtype), None)]:
        out, mean, rstd = A.native_layer_norm(x, norm, weight, bias, 1e-5)
        g = make(out.shape, dtype)
        mask = [True, weight is not None, bias is not None]
        expected = A.native_layer_norm_backward(g, x, norm, mean, rstd, weight, bias, mask)
        got = A.native_layer_norm_backward(g.to(TPU), x.to(TPU), norm, mean.to(TPU), rstd.to(TPU),
                                           None if weight is None else weight.to(TPU), None if bias is None else bias.to(TPU), mask)
        for m, e, r in zip(mask, expected, got):
            if m:
                torch.testing.assert_close(r.cpu(), e, **tol)


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_direct(train):
    x = make((4, 3, 5))
    w, b = make((3,)), make((3,))
    rm, rv = make((3,)), make((3,), low=0.5, high=2.0)
    for weight, bias in [(w, b), (None, None)]:
        stats = (None, None) if train else (rm, rv)
        check(lambda t: A.native_batch_norm(t, weight if weight is None else weight.to(t.device),
                                            bias if bias is None else bias.to(t.device),
                                            *[s if s is None else s.to(t.device) for s in stats], train, 0.1, 1e-5), x)
        out, sm, si = A.native_batch_norm(x, weight, bias, *stats, train, 0.1, 1e-5)
        g = make(out.shape)
        mask = [True, weight is not None, weight is not None]
        expected = A.native_batch_norm_backward(g, x, weight, rm, rv, sm, si, train, 1e-5, mask)
        dev = lambda t: None if t is None else t.to(TPU)  # noqa: E731
        got = A.native_batch_norm_backward(dev(g), dev(x), dev(weight), dev(rm), dev(rv), dev(sm), dev(si), train, 1e-5, mask)
        for m, e, r in zip(mask, expected, got):
            if m:
                torch.testing.assert_close(r.cpu(), e, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_bce_backward_direct(reduction):
    x = torch.sigmoid(make((4, 5)))
    y = torch.rand(4, 5)
    w = make((4, 5), low=0.1, high=2.0)
    g = make(() if reduction else (4, 5))
    check(lambda g_, x_, y_: A.binary_cross_entropy_backward(g_, x_, y_, None, reduction), g, x, y)
    check(lambda g_, x_, y_, w_: A.binary_cross_entropy_backward(g_, x_, y_, w_, reduction), g, x, y, w)
    check(lambda g_, x_, y_: A.mse_loss_backward(g_, x_, y_, reduction), g, x, y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_rounding_like_cpu(dtype):
    """PyTorch's CPU kernels round some intermediates to the 16-bit dtype; the lowerings round
    the same ones, so these results agree to the last bit."""
    x, y = (make((6, 9)) * 2).to(dtype), make((6, 9)).to(dtype)
    exact = dict(atol=0, rtol=0)
    check(torch.softmax, x, 1, **exact)
    check(torch.softmax, x, 0, **exact)
    check(torch.log_softmax, x, 0, **exact)
    check(torch.log_softmax, x, 1, atol=1e-2, rtol=8e-3)  # one ulp at most
    for reduction in ("none", "mean", "sum"):
        check(F.mse_loss, x, y, reduction=reduction, **exact)
        p, q = torch.sigmoid(x), torch.sigmoid(y)
        check(F.binary_cross_entropy, p, q, reduction=reduction, **exact)
        check(F.binary_cross_entropy, p, q, torch.sigmoid(y * 3), reduction=reduction, **exact)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss,kw", [(F.huber_loss, {"delta": 0.7}), (F.huber_loss, {}),
                                     (F.smooth_l1_loss, {"beta": 0.5}), (F.smooth_l1_loss, {"beta": 0.0})])
def test_robust_losses(reduction, loss, kw):
    x, y = make((4, 5)), make((4, 5))
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    lc = loss(xc, y, reduction=reduction, **kw)
    lt = loss(xt, y.to(TPU), reduction=reduction, **kw)
    torch.testing.assert_close(lt.detach().cpu(), lc.detach(), atol=1e-5, rtol=1e-5)
    lc.sum().backward()
    lt.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, atol=1e-5, rtol=1e-5)
    bf = loss(x.to(torch.bfloat16).to(TPU), y.to(torch.bfloat16).to(TPU), reduction=reduction, **kw)
    torch.testing.assert_close(bf.cpu(), loss(x.to(torch.bfloat16), y.to(torch.bfloat16), reduction=reduction, **kw),
                               atol=2e-2, rtol=2e-2)


def test_robust_loss_errors():
    check_error(lambda a, b: F.huber_loss(a, b, delta=0.0), make((3,)), make((3,)))
    check_error(lambda a, b: F.smooth_l1_loss(a, b, beta=-1.0), make((3,)), make((3,)))


# ---- weight norm (_weight_norm_interface: nn.utils.weight_norm, wav2vec2's positional conv) ----

WN_CASES = [((4, 3, 5), 0, (4, 1, 1)), ((4, 3, 5), 2, (1, 1, 5)), ((7,), 0, (7,)), ((6, 2), 1, (1, 2)),
            ((5, 3), 0, (5,))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape,dim,gshape", WN_CASES)
def test_weight_norm_interface(shape, dim, gshape, dtype):
    w, norms = check(torch.ops.aten._weight_norm_interface, make(shape, dtype), make(gshape, dtype), dim)
    assert norms.dtype == (torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype)


def test_weight_norm_interface_noncontiguous_and_empty():
    # PyTorch's CPU kernel reads its operands as contiguous (torch._weight_norm makes them so):
    # the reference is the op on contiguous copies.
    op = torch.ops.aten._weight_norm_interface
    v = make((5, 4))
    for x, g, dim in [(v.t(), make((4, 1)), 0), (v[:, ::2], make((1, 2)), 1), (v[::2], make((3, 1))[:, :1], 0)]:
        ref = op(x.contiguous(), g.contiguous(), dim)
        got = op(x.to(TPU), g.to(TPU), dim)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a.cpu(), b)
    # Empty slices have norm 0 (PyTorch's CPU kernel divides by zero rows itself: not tested).
    check(torch.ops.aten._weight_norm_interface, make((2, 0)), make((2, 1)), 0)
    check(torch.ops.aten._weight_norm_interface, make((0, 3)), make((1, 3)), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,dim,gshape", WN_CASES)
def test_weight_norm_grads(shape, dim, gshape, dtype):
    # torch._weight_norm takes the fused op for the first and last dims; its backward is
    # _weight_norm_interface_backward.
    check_grads(torch._weight_norm, make(shape, dtype), make(gshape, dtype), dim, needs=[True, True, False])


def test_weight_norm_interface_backward_direct():
    v, g, gw = make((4, 3, 5)), make((1, 1, 5)), make((4, 3, 5))
    _, n = torch.ops.aten._weight_norm_interface(v, g, 2)
    check(torch.ops.aten._weight_norm_interface_backward, gw, v, g, n, 2)
    # A non-contiguous grad_w (the CPU kernel wants a contiguous one: autograd passes one).
    nc = gw.transpose(0, 1).contiguous().transpose(0, 1)
    ref = torch.ops.aten._weight_norm_interface_backward(nc.contiguous(), v, g, n, 2)
    got = torch.ops.aten._weight_norm_interface_backward(nc.to(TPU), v.to(TPU), g.to(TPU), n.to(TPU), 2)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.cpu(), b)


def test_weight_norm_conv_module():
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(6, 6, 5, padding=2, groups=2), name="weight", dim=2)
    x = make((2, 6, 9))
    dev = __import__("copy").deepcopy(conv).to(TPU)
    torch.testing.assert_close(dev(x.to(TPU)).cpu(), conv(x))
    conv(x).sum().backward()
    dev(x.to(TPU)).sum().backward()
    for (name, p), q in zip(conv.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)


def test_weight_norm_interface_errors():
    op = torch.ops.aten._weight_norm_interface
    check_error(op, make((4, 3), torch.int64), make((4, 1), torch.int64), 0)  # no integer kernel
    check_error(op, make((4, 3, 5)), make((1, 3, 1)), 1)  # a middle dim
    check_error(op, make((4, 3, 5)), make((1, 1, 5)), -1)  # dim is not wrapped
    check_error(op, make((4, 3), torch.bfloat16), make((4, 1)), 0)  # g's dtype differs
    check_error(op, make(()), make(()), 0)  # 0-d: no dim 0
    bw = torch.ops.aten._weight_norm_interface_backward
    v, g = make((4, 3)), make((4, 1))
    _, n = op(v, g, 0)
    check_error(bw, make((4, 3), torch.float64), v, g, n, 0)  # grad_w's dtype differs
    check_error(bw, make((4, 3)), v, g, n.double(), 0)  # norms' dtype differs


@pytest.mark.parametrize("dtype,stat", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                        (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_batch_norm_update_stats(dtype, stat):
    A = torch.ops.aten
    for shape in ((6, 3), (4, 3, 5), (2, 3, 4, 4)):
        x = make(shape, dtype)
        for xv in (x, x.transpose(0, -1).contiguous().transpose(0, -1)):
            rm, rv = make((3,), stat), make((3,), stat, low=0.5)
            trm, trv = rm.to(TPU), rv.to(TPU)
            exp = A.batch_norm_update_stats(xv, rm, rv, 0.1)
            got = A.batch_norm_update_stats(xv.to(TPU), trm, trv, 0.1)
            tol = dict(atol=2e-2, rtol=2e-2) if torch.bfloat16 in (dtype, stat) else {}
            for g, e in zip((*got, trm, trv), (*exp, rm, rv)):
                torch.testing.assert_close(g.cpu(), e, **tol)
    x = make((4, 3))
    check(lambda a: A.batch_norm_update_stats(a, None, None, 0.1), x)
    check_error(lambda a: A.batch_norm_update_stats(a, None, None, 0.1), make(()))
    check_error(lambda a: A.batch_norm_update_stats(a, None, None, 0.1), make((4, 3), torch.int64))


MASKED_SOFTMAX_CASES = [
    # (input shape, mask shape, dim, mask_type)
    ((2, 3, 5, 5), (2, 3, 5, 5), None, None),
    ((2, 3, 5, 5), (2, 3, 5, 5), 1, None),
    ((2, 3, 5, 5), (5, 5), 3, 0),
    ((2, 3, 5, 5), (5, 5), 2, 0),
    ((2, 3, 5, 5), (2, 5), 3, 1),
    ((2, 3, 5, 5), (2, 5), 1, 1),
    ((2, 3, 5, 5), (2, 3, 5, 5), 3, 7),
    ((4, 6), (4, 6), 0, None),
    ((3, 4, 6), (3, 4, 6), -1, 2),
    ((), (), None, None),
    ((0, 4), (0, 4), None, None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,mask_shape,dim,mask_type", MASKED_SOFTMAX_CASES)
def test_masked_softmax_and_its_backward(shape, mask_shape, dim, mask_type, dtype):
    # nn.MultiheadAttention's fast path and the transformer layers' call it; a fully masked row
    # gives NaN as on CPU. On tpu its input is a transposed view when it has 2 dims or more (CPU's
    # kernel reads such a view as if it were contiguous, so its reference takes a copy).
    g = torch.Generator().manual_seed(len(shape) + (dim or 0))
    x = torch.randn(shape, generator=g).to(dtype)
    if len(shape) >= 2:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    mask = torch.rand(mask_shape, generator=g) > 0.6
    if len(mask_shape) >= 2 and mask_shape[0] > 0:
        mask[0] = True  # whole rows masked
    want = torch._masked_softmax(x.contiguous(), mask, dim, mask_type)
    got = torch._masked_softmax(x.to(TPU), mask.to(TPU), dim, mask_type)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **tolerance(dtype))
    if shape == mask_shape:
        dy = torch.randn(shape, generator=g).to(dtype)
        want_g = torch.ops.aten._masked_softmax_backward(dy, want, mask, dim)
        got_g = torch.ops.aten._masked_softmax_backward(dy.to(TPU), got, mask.to(TPU), dim)
        torch.testing.assert_close(got_g.cpu(), want_g, equal_nan=True, **tolerance(dtype))


@pytest.mark.parametrize("mask_shape,mask_type", [((4, 4), None), ((3, 3), 0), ((3, 5), 1), ((2, 3, 5, 1), 2), ((2, 3, 5, 5), None)])
def test_masked_softmax_errors_match_cpu(mask_shape, mask_type):
    x = torch.randn(2, 3, 5, 5)
    mask = torch.zeros(mask_shape, dtype=torch.bool) if mask_shape != (2, 3, 5, 5) else torch.zeros(mask_shape)
    e = check_error(torch._masked_softmax, x, mask, 3, mask_type)
    with pytest.raises(type(e), match=str(e).splitlines()[0][:40].replace("(", r"\(").replace(")", r"\)")):
        torch._masked_softmax(x, mask, 3, mask_type)
    check_error(torch._masked_softmax, x.long(), torch.zeros(2, 3, 5, 5, dtype=torch.bool))
