"""Distances, margin and CTC losses, rrelu, group norm and _batch_norm_with_update on "tpu"
against PyTorch on CPU, with gradients."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, check, check_error, check_grads, make

A = torch.ops.aten
INF = float("inf")


def dev(x):
    return x.to(TPU) if isinstance(x, torch.Tensor) else x


# ---- cdist ---------------------------------------------------------------------------------------

P_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, INF]


@pytest.mark.parametrize("p", P_VALUES)
def test_cdist(p):
    for a, b in [((3, 4), (5, 4)), ((2, 3, 4), (2, 5, 4)), ((2, 1, 3, 4), (3, 5, 4)), ((1, 7), (2, 7))]:
        check(torch.cdist, make(a), make(b), p)
    # Repeated points: zero differences and zero distances.
    x = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0.0, 2.0, -1.0]])
    check(torch.cdist, x, x, p)
    # Non-contiguous inputs.
    check(lambda u, v: torch.cdist(u.t(), v[::2], p), make((4, 3)), make((10, 4)))
    check(torch.cdist, make((3, 4), torch.float64), make((2, 4), torch.float64), p)


def test_cdist_compute_modes():
    x, y = make((30, 5)), make((7, 5))
    for mode in ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"]:
        check(torch.cdist, x, y, 2.0, mode, atol=1e-4, rtol=1e-4)
        check(torch.cdist, make((3, 5)), y, 2.0, mode, atol=1e-4, rtol=1e-4)
    # The matrix-multiplication form, called directly: also for bfloat16 and batches.
    check(A._cdist_forward, make((3, 6)), make((4, 6)), 2.0, 1, atol=1e-4, rtol=1e-4)
    check(A._cdist_forward, make((2, 3, 6)), make((1, 4, 6)), 2.0, 1, atol=1e-4, rtol=1e-4)
    check(A._cdist_forward, make((3, 6), torch.bfloat16), make((4, 6), torch.bfloat16), 2.0, 1)
    check(A._cdist_forward, make((40, 6)), make((4, 6)), 2.0, None, atol=1e-4, rtol=1e-4)


def test_cdist_empty():
    check(torch.cdist, make((0, 4)), make((5, 4)))
    check(torch.cdist, make((3, 4)), make((0, 4)), 1.0)
    check(torch.cdist, make((3, 0)), make((2, 0)), 3.0)
    check(torch.cdist, make((0, 3, 4)), make((1, 2, 4)))
    check(A._cdist_forward, make((3, 0), torch.bfloat16), make((2, 0), torch.bfloat16), 3.0, None)


@pytest.mark.parametrize("p", P_VALUES)
def test_cdist_backward(p):
    check_grads(lambda a, b: torch.cdist(a, b, p), make((3, 4)), make((5, 4)), needs=[True, True], atol=1e-4)
    check_grads(lambda a, b: torch.cdist(a, b, p), make((2, 1, 3, 4)), make((3, 5, 4)), needs=[True, True], atol=1e-4)
    # Some zero distances (p = 2's gradient is 0 there) and zero differences.
    x = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0.0, 2.0, -1.0]])
    y = torch.tensor([[1.0, 2.0, 3.0], [1.0, 0.5, 3.0]])
    check_grads(lambda a, b: torch.cdist(a, b, p), x, y, needs=[True, True], atol=1e-4)
    g, a, b = make((3, 5)), make((3, 4)), make((5, 4))
    d = torch.cdist(a, b, p)
    check(A._cdist_backward, g, a, b, p, d, atol=1e-4, rtol=1e-4)


def test_cdist_backward_empty():
    check(A._cdist_backward, make((0, 5)), make((0, 4)), make((5, 4)), 2.0, make((0, 5)))
    check(A._cdist_backward, make((3, 2)), make((3, 0)), make((2, 0)), 1.0, make((3, 2)))


def test_cdist_errors():
    check_error(torch.cdist, make((3, 4), torch.int64), make((5, 4), torch.int64))
    check_error(torch.cdist, make((3, 4)), make((5, 3)))
    check_error(torch.cdist, make((4,)), make((5, 4)))
    check_error(torch.cdist, make((3, 4)), make((5, 4)), -1.0)
    check_error(torch.cdist, make((2, 3, 4)), make((3, 5, 4)))
    check_error(torch.cdist, make((3, 4)), make((5, 4), torch.float64))
    e = check_error(torch.cdist, make((3, 4), torch.bfloat16), make((5, 4), torch.bfloat16))
    assert "not implemented for 'BFloat16'" in str(e)
    e = check_error(A._cdist_forward, make((3, 4)), make((5, 4)), 2.0, 3)
    assert "possible modes" in str(e)


# ---- pdist ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", P_VALUES + [10.0])
def test_pdist(p):
    for shape in [(1, 1), (1, 5), (5, 1), (6, 4), (0, 3), (4, 0), (2, 3), (41, 3)]:
        check(F.pdist, make(shape), p)
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, -1.0], [1.0, 0.0]])
    check(F.pdist, x, p)
    check(lambda t: F.pdist(t.t(), p), make((4, 6)))
    check(F.pdist, make((5, 3), torch.float64), p)


@pytest.mark.parametrize("p", P_VALUES + [10.0])
def test_pdist_backward(p):
    check_grads(lambda t: F.pdist(t, p), make((6, 4)), atol=1e-4)
    check_grads(lambda t: F.pdist(t, p), make((2, 3)), atol=1e-4)
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, -1.0], [1.0, 0.0]])
    check_grads(lambda t: F.pdist(t, p), x, atol=1e-4)
    x = make((5, 3))
    d = F.pdist(x, p)
    check(A._pdist_backward, make(d.shape), x, p, d, atol=1e-4, rtol=1e-4)
    check(A._pdist_backward, make((0,)), make((1, 3)), p, make((0,)))


def test_pdist_errors():
    check_error(F.pdist, make((4,)))
    check_error(F.pdist, make((4, 3), torch.int64))
    check_error(F.pdist, make((4, 3)), -1.0)
    e = check_error(F.pdist, make((4, 3), torch.bfloat16))
    assert "not implemented for 'BFloat16'" in str(e)


# ---- multi_margin_loss -----------------------------------------------------------------------------


def _targets(n, c):
    return torch.randint(0, c, (n,))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss(p, reduction):
    for n, c in [(5, 10), (1, 3), (7, 1)]:
        x, t = make((n, c)), _targets(n, c)
        check(F.multi_margin_loss, x, t, p=p, reduction=reduction)
        check(F.multi_margin_loss, x, t, p=p, margin=-0.7, reduction=reduction)
        check(lambda u, v, w: F.multi_margin_loss(u, v, p=p, margin=2.5, weight=w, reduction=reduction), x, t,
              make((c,), low=0))
    check(F.multi_margin_loss, make(()), torch.tensor(0), p=p, reduction=reduction)
    check(F.multi_margin_loss, make((6,)), torch.tensor(3), p=p, reduction=reduction)
    check(F.multi_margin_loss, make((6,)), torch.tensor([2]), p=p, reduction=reduction)
    check(lambda u, t: F.multi_margin_loss(u.t(), t, p=p, reduction=reduction), make((4, 6)), _targets(6, 4))
    check(F.multi_margin_loss, make((3, 4), torch.float64), _targets(3, 4), p=p, reduction=reduction)


def test_multi_margin_loss_empty_batch():
    x, t = make((0, 5)), torch.zeros(0, dtype=torch.int64)
    check(F.multi_margin_loss, x, t, reduction="none")
    # CPU leaves the sum and mean of an empty batch uninitialized: compare the shapes only.
    for reduction in ("sum", "mean"):
        got = F.multi_margin_loss(x.to(TPU), t.to(TPU), reduction=reduction)
        assert got.shape == () and got.dtype == torch.float32


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss_backward(p, reduction):
    x, t, w = make((6, 5)), _targets(6, 5), make((5,), low=0)
    check_grads(lambda u, v: F.multi_margin_loss(u, v, p=p, reduction=reduction), x, t)
    check_grads(lambda u, v, w_: F.multi_margin_loss(u, v, p=p, margin=0.5, weight=w_, reduction=reduction), x, t, w,
          needs=[True, False, False])
    check_grads(lambda u, v: F.multi_margin_loss(u, v, p=p, reduction=reduction), make((5,)), torch.tensor(2))
    check_grads(lambda u, v: F.multi_margin_loss(u, v, p=p, reduction=reduction), make(()), torch.tensor(0))
    go = make(() if reduction != "none" else (6,))
    check(A.multi_margin_loss_backward, go, x, t, p, 1.0, w, {"none": 0, "mean": 1, "sum": 2}[reduction])


def test_multi_margin_loss_errors():
    x, t = make((4, 5)), _targets(4, 5)
    check_error(F.multi_margin_loss, x, t, p=3)
    check_error(A.multi_margin_loss, x, t, 3, 1.0)
    check_error(F.multi_margin_loss, x, t[:3])
    check_error(F.multi_margin_loss, x, t.int())
    check_error(lambda u, v, w: F.multi_margin_loss(u, v, weight=w), x, t, make((4,)))
    check_error(A.multi_margin_loss, x, t, 1, 1.0, make((1, 5)))
    check_error(lambda u, v, w: F.multi_margin_loss(u, v, weight=w), x, t, make((5,), torch.float64))
    check_error(F.multi_margin_loss, make((4, 0)), t)
    check_error(F.multi_margin_loss, make((4, 5, 2)), t)
    check_error(F.multi_margin_loss, make((4, 5), torch.bfloat16), t)
    check_error(F.multi_margin_loss, x, t, reduction="bad")


# ---- multilabel_margin_loss ------------------------------------------------------------------------


def _multilabel_targets(n, c):
    """Class lists ended by -1 (some full, some empty, some with repeats)."""
    t = torch.randint(0, c, (n, c))
    for i in range(n):
        end = torch.randint(0, c + 1, ()).item()
        if end < c:
            t[i, end] = -1
        if i % 3 == 2 and end < c - 1:
            t[i, end + 1:] = torch.randint(-1, c, (c - end - 1,))
    return t


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(reduction):
    for n, c in [(6, 5), (1, 4), (3, 1), (9, 7)]:
        x, t = make((n, c)), _multilabel_targets(n, c)
        check(F.multilabel_margin_loss, x, t, reduction=reduction)
    check(F.multilabel_margin_loss, make(()), torch.tensor(0), reduction=reduction)
    check(F.multilabel_margin_loss, make(()), torch.tensor(-1), reduction=reduction)
    check(F.multilabel_margin_loss, make((5,)), torch.tensor([3, 1, 1, -1, 2]), reduction=reduction)
    check(lambda u, t: F.multilabel_margin_loss(u.t(), t, reduction=reduction), make((5, 4)), _multilabel_targets(4, 5))
    check(F.multilabel_margin_loss, make((3, 4), torch.float64), _multilabel_targets(3, 4), reduction=reduction)
    # The op itself also returns which classes are targets.
    x, t = make((4, 6)), _multilabel_targets(4, 6)
    check(A.multilabel_margin_loss_forward, x, t, {"none": 0, "mean": 1, "sum": 2}[reduction])


def test_multilabel_margin_loss_empty_batch():
    x, t = make((0, 5)), torch.zeros(0, 5, dtype=torch.int64)
    check(F.multilabel_margin_loss, x, t, reduction="none")
    # CPU leaves the sum and mean of an empty batch uninitialized: compare the shapes only.
    assert F.multilabel_margin_loss(x.to(TPU), t.to(TPU), reduction="sum").shape == ()
    out, is_target = A.multilabel_margin_loss_forward(x.to(TPU), t.to(TPU), 1)
    assert out.shape == () and is_target.shape == (0, 5) and is_target.dtype == torch.float32


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_backward(reduction):
    x, t = make((6, 5)), _multilabel_targets(6, 5)
    check_grads(lambda u, v: F.multilabel_margin_loss(u, v, reduction=reduction), x, t)
    check_grads(lambda u, v: F.multilabel_margin_loss(u, v, reduction=reduction), make((4,)), torch.tensor([2, 2, 0, -1]))
    check_grads(lambda u, v: F.multilabel_margin_loss(u, v, reduction=reduction), make(()), torch.tensor(0))
    red = {"none": 0, "mean": 1, "sum": 2}[reduction]
    _, is_target = A.multilabel_margin_loss_forward(x, t, red)
    check(A.multilabel_margin_loss_backward, make(() if red else (6,)), x, t, red, is_target)


def test_multilabel_margin_loss_errors():
    x, t = make((4, 5)), _multilabel_targets(4, 5)
    check_error(F.multilabel_margin_loss, x, t[:, :3])
    check_error(F.multilabel_margin_loss, x, t[0])
    check_error(F.multilabel_margin_loss, x, t.int())
    check_error(F.multilabel_margin_loss, make((4, 0)), t[:, :0])
    check_error(F.multilabel_margin_loss, make((4, 5), torch.bfloat16), t)
    check_error(A.multilabel_margin_loss_backward, make(()), x, t, 1, make((4, 4)))


# ---- ctc_loss --------------------------------------------------------------------------------------


def _ctc_case(t=12, n=4, c=6, s=5, blank=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(t, n, c, generator=g).log_softmax(2)
    tl = torch.randint(0, s + 1, (n,), generator=g)
    tl[0] = s
    il = torch.randint(max(1, t // 2), t + 1, (n,), generator=g)
    il[0] = t
    labels = [i for i in range(c) if i != blank]
    targets = torch.tensor(labels)[torch.randint(0, len(labels), (n, s), generator=g)]
    # Some repeated labels (paths need a blank between them).
    targets[0, 1] = targets[0, 0]
    return lp, targets, il, tl


def _concat(targets, tl):
    return torch.cat([targets[i, :k] for i, k in enumerate(tl.tolist())])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss(reduction, zero_infinity):
    lp, targets, il, tl = _ctc_case()
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    check(F.ctc_loss, lp, targets, il.tolist(), tl.tolist(), **kw)
    check(F.ctc_loss, lp, targets, il, tl, **kw)
    check(F.ctc_loss, lp, _concat(targets, tl), il.tolist(), tl.tolist(), **kw)
    check(F.ctc_loss, lp, targets.int(), il, tl, **kw)
    # Another blank, float64, an unbatched input.
    lp2, t2, il2, tl2 = _ctc_case(blank=3, seed=1)
    check(F.ctc_loss, lp2.double(), t2, il2, tl2, blank=3, **kw)
    check(F.ctc_loss, lp[:, 0], targets[0], [12], [5], **kw)
    # Impossible alignments (a target longer than its input), empty targets, no input steps.
    check(F.ctc_loss, lp, targets, [3, 12, 0, 0], [5, 0, 0, 2], **kw)
    # Non-contiguous log_probs.
    lpt = lp.transpose(0, 1).contiguous().transpose(0, 1)
    check(F.ctc_loss, lpt[:, ::2], targets[::2], il[::2], tl[::2], **kw)


def test_ctc_loss_op_outputs():
    lp, targets, il, tl = _ctc_case()
    for tgt in (targets, _concat(targets, tl)):
        for lengths in ((il.tolist(), tl.tolist()), (il, tl)):
            op = A._ctc_loss if isinstance(lengths[0], list) else A._ctc_loss.Tensor
            nll_c, alpha_c = op(lp, tgt, *lengths)
            nll_t, alpha_t = op(lp.to(TPU), tgt.to(TPU), *[dev(x) for x in lengths])
            assert alpha_t.shape == alpha_c.shape == (4, 12, 11)
            torch.testing.assert_close(nll_t.cpu(), nll_c)
            # CPU leaves log_alpha uninitialized outside t < input_length, s <= 2 target_length.
            for b in range(4):
                ti, si = il[b].item(), 2 * tl[b].item() + 1
                torch.testing.assert_close(alpha_t[b, :ti, :si].cpu(), alpha_c[b, :ti, :si])
    # int32 targets.
    nll_c, _ = A._ctc_loss(lp, targets.int(), il.tolist(), tl.tolist())
    nll_t, _ = A._ctc_loss(lp.to(TPU), targets.int().to(TPU), il.tolist(), tl.tolist())
    torch.testing.assert_close(nll_t.cpu(), nll_c)
    # The Tensor overload sizes log_alpha by the data.
    _, alpha = A._ctc_loss.Tensor(lp.to(TPU), targets.to(TPU), il.to(TPU), torch.tensor([2, 1, 0, 2]).to(TPU))
    assert alpha.shape == (4, 12, 5)


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_loss_backward(reduction, zero_infinity):
    lp, targets, il, tl = _ctc_case()
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    check_grads(lambda x: F.ctc_loss(x, targets, il, tl, **kw), lp, atol=1e-4)
    check_grads(lambda x: F.ctc_loss(x, _concat(targets, tl), il.tolist(), tl.tolist(), **kw), lp, atol=1e-4)
    check_grads(lambda x: F.ctc_loss(x.log_softmax(-1), targets[:, :3], [12, 10, 2, 7], [3, 0, 3, 1], **kw), make((12, 4, 6)),
          atol=1e-4)
    if zero_infinity:
        # With zero_infinity the impossible samples get zero gradients; without, PyTorch's are NaN.
        check_grads(lambda x: F.ctc_loss(x, targets, [3, 12, 0, 5], [5, 0, 2, 2], **kw), lp, atol=1e-4)
    nll, alpha = A._ctc_loss(lp, targets, il.tolist(), tl.tolist())
    g = make((4,))
    check(A._ctc_loss_backward, g, lp, targets, il.tolist(), tl.tolist(), nll, alpha, 0, zero_infinity, atol=1e-4, rtol=1e-4)
    check(A._ctc_loss_backward.Tensor, g, lp, targets, il, tl, nll, alpha, 0, zero_infinity, atol=1e-4, rtol=1e-4)


def test_ctc_loss_errors():
    lp, targets, il, tl = _ctc_case()
    il_, tl_ = il.tolist(), tl.tolist()
    check_error(A._ctc_loss, lp.bfloat16(), targets, il_, tl_)
    check_error(A._ctc_loss, lp, targets.float(), il_, tl_)
    check_error(A._ctc_loss, lp, targets.short(), il_, tl_)
    check_error(A._ctc_loss, lp[0], targets, il_, tl_)
    check_error(A._ctc_loss, lp, targets[:, :, None], il_, tl_)
    check_error(A._ctc_loss, lp, targets, il_, tl_, 6)
    check_error(A._ctc_loss, lp, targets, il_[:3], tl_)
    check_error(A._ctc_loss, lp, targets, il_, tl_[:3])
    check_error(A._ctc_loss, lp, targets, [13] + il_[1:], tl_)
    check_error(A._ctc_loss, lp, targets, [-1] + il_[1:], tl_)
    check_error(A._ctc_loss, lp, targets, il_, [-1] + tl_[1:])
    check_error(A._ctc_loss, lp, targets, il_, [6] + tl_[1:])
    check_error(A._ctc_loss, lp, targets[:3], il_, tl_)
    check_error(A._ctc_loss, lp, _concat(targets, tl)[1:], il_, tl_)
    check_error(A._ctc_loss, lp[:, :0], targets[:0], [], [])
    e = check_error(F.ctc_loss, lp, targets, il.float(), tl)
    assert "must be integral" in str(e)


# ---- rrelu -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_rrelu_eval(dtype):
    for shape in [(), (0,), (7,), (3, 5)]:
        x = make(shape, dtype)
        check(F.rrelu, x)
        check(F.rrelu, x, 0.2, 0.6)
        check(F.rrelu, x, 1, 3, False)
    check(lambda t: F.rrelu(t.t(), 0.1, 0.4), make((4, 5), dtype))
    check_grads(lambda t: F.rrelu(t, 0.1, 0.4), make((4, 5)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rrelu_training(dtype):
    lower, upper = 0.1, 0.4
    x = make((2000,), dtype)
    x[:3] = torch.tensor([0.0, -0.0, 1.0])
    noise = torch.zeros_like(x).to(TPU)
    y = A.rrelu_with_noise(x.to(TPU), noise, lower, upper, True).cpu()
    noise = noise.cpu()
    assert y.dtype == dtype and noise.dtype == dtype
    neg = x <= 0
    assert torch.equal(y[~neg], x[~neg]) and torch.all(noise[~neg] == 1)
    slopes = noise[neg].double()
    lo, hi = (lower - 1e-2, upper + 1e-2) if dtype == torch.bfloat16 else (lower, upper)
    assert slopes.min() >= lo and slopes.max() <= hi
    # Uniform on [lower, upper]: the mean and spread of 1000 draws are close to the law's.
    assert abs(slopes.mean().item() - (lower + upper) / 2) < 0.02
    assert abs(slopes.std().item() - (upper - lower) / math.sqrt(12)) < 0.02
    torch.testing.assert_close(y[neg], (x[neg].double() * slopes).to(dtype), atol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    # Reproducible under manual_seed, different from one call to the next.
    torch.manual_seed(5)
    a = F.rrelu(x.to(TPU), lower, upper, training=True).cpu()
    b = F.rrelu(x.to(TPU), lower, upper, training=True).cpu()
    torch.manual_seed(5)
    c = F.rrelu(x.to(TPU), lower, upper, training=True).cpu()
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_rrelu_training_gradient_and_edges():
    x = make((50,))
    xt = x.to(TPU).requires_grad_()
    y = F.rrelu(xt, 0.2, 0.5, training=True)
    g = make((50,))
    y.backward(g.to(TPU))
    slope = (y.detach().cpu() / x)
    expected = torch.where(x > 0, g, g * slope)
    torch.testing.assert_close(xt.grad.cpu(), expected, atol=1e-5, rtol=1e-5)
    # Empty and 0-d inputs; equal bounds give a fixed slope.
    assert F.rrelu(make((0, 3)).to(TPU), training=True).shape == (0, 3)
    check(lambda t: F.rrelu(t, 0.3, 0.3, training=True), torch.tensor(-2.0))
    check(lambda t: F.rrelu(t, 0.25, 0.25, training=True), make((4, 3)), atol=1e-6, rtol=1e-6)


@pytest.mark.xfail(strict=True, reason="engine: a lowering cannot tell rrelu_with_noise_ (which writes self and noise) "
                                       "from rrelu_with_noise (which writes noise), so the in-place form writes noise into self")
def test_rrelu_inplace():
    x = make((20,))
    check(lambda t: F.rrelu(t.clone(), 0.3, 0.3, training=True, inplace=True), x, atol=1e-6, rtol=1e-6)


def test_rrelu_errors():
    x = make((3, 4))
    check_error(F.rrelu, x.long())
    check_error(F.rrelu, x.long(), training=True)
    check_error(F.rrelu, x.half(), training=True)
    check_error(F.rrelu, x, 0.5, 0.1, True)
    check_error(F.rrelu, x, 0.5, 0.1, False)
    check_error(A.rrelu_with_noise, x, torch.zeros(2), 0.1, 0.3, True)
    check_error(A.rrelu_with_noise, x, torch.zeros(3, 4, dtype=torch.float64), 0.1, 0.3, True)


# ---- group norm ------------------------------------------------------------------------------------


GN_SHAPES = [((2, 6, 3), 2), ((2, 6, 4, 5), 3), ((3, 4), 2), ((1, 8, 2, 2, 2), 1), ((0, 6, 3), 3), ((2, 6, 0), 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_group_norm(dtype):
    tol = dict(atol=3e-2, rtol=3e-2) if dtype in (torch.bfloat16, torch.float16) else dict(atol=1e-5, rtol=1e-5)
    for shape, g in GN_SHAPES:
        x = make(shape, dtype)
        c = shape[1]
        try:
            F.group_norm(x, g)
        except RuntimeError:  # torch 2.14 rejects inputs without spatial elements
            check_error(F.group_norm, x, g)
            continue
        check(F.group_norm, x, g, **tol)
        check(F.group_norm, x, g, make((c,), dtype), make((c,), dtype), 1e-3, **tol)
        check(F.group_norm, x, g, make((c,), dtype), None, **tol)
        n, hw = shape[0], math.prod(shape[2:])
        check(A.native_group_norm, x, make((c,), dtype), None, n, c, hw, g, 1e-5, **tol)
    check(lambda t: F.group_norm(t.transpose(0, 1), 2), make((4, 3, 5), dtype), **tol)
    # Groups of one element normalize to 0 (with weights, CPU's rounding noise is ~1e-5 there).
    check(F.group_norm, make((3, 4), dtype), 4, **tol)


def test_group_norm_mixed_dtypes():
    x = make((2, 6, 5), torch.bfloat16)
    w, b = make((6,)), make((6,))
    check(A.native_group_norm, x, w, b, 2, 6, 5, 3, 1e-5, atol=3e-2, rtol=3e-2)
    check(F.group_norm, x, 3, w, b, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_group_norm_backward(dtype):
    tol = dict(atol=6e-2, rtol=6e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    for shape, g in [((2, 6, 3), 2), ((3, 4, 2, 5), 4), ((2, 6), 3), ((4, 4, 3), 1)]:
        c = shape[1]
        x, w, b = make(shape, dtype), make((c,), dtype), make((c,), dtype)
        check_grads(lambda t: F.group_norm(t, g), x, **tol)
        check_grads(lambda t, w_, b_: F.group_norm(t, g, w_, b_), x, w, b, needs=[True, True, True], **tol)
        check_grads(lambda t, w_: F.group_norm(t, g, w_), x, w, needs=[False, True], **tol)
    x = make((2, 6, 3))
    y, mean, rstd = A.native_group_norm(x, None, None, 2, 6, 3, 3, 1e-5)
    check(A.native_group_norm_backward, make((2, 6, 3)), x, mean, rstd, make((6,)), 2, 6, 3, 3, [True, True, True],
          atol=1e-4, rtol=1e-4)
    e = make((0, 6, 3))
    check(A.native_group_norm_backward, e, e, make((0, 3)), make((0, 3)), make((6,)), 0, 6, 3, 3, [True, True, True])


def test_group_norm_errors():
    x = make((2, 6, 3))
    check_error(F.group_norm, x, 4)
    check_error(F.group_norm, x, 2, make((5,)))
    check_error(F.group_norm, x, 2, None, make((4,)))
    check_error(F.group_norm, x.long(), 2)
    check_error(A.native_group_norm, x, None, None, 2, 6, 3, 0, 1e-5)
    check_error(A.native_group_norm, x.bfloat16(), make((6,), torch.float64), None, 2, 6, 3, 2, 1e-5)
    check_error(A.native_group_norm_backward, x, x.double(), make((2, 2)), make((2, 2)), None, 2, 6, 3, 2, [True] * 3)


# ---- _batch_norm_with_update ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_with_update(dtype):
    for shape in [(4, 3, 5), (6, 2), (2, 3, 2, 2)]:
        c = shape[1]
        x, w, b = make(shape, dtype), make((c,), dtype), make((c,), dtype)
        rm, rv = make((c,), dtype), make((c,), dtype, low=0.5)
        for weight, bias in [(w, b), (None, None)]:
            rm_c, rv_c = rm.clone(), rv.clone()
            rm_t, rv_t = rm.to(TPU), rv.to(TPU)
            exp = A._batch_norm_with_update(x, weight, bias, rm_c, rv_c, 0.3, 1e-4)
            got = A._batch_norm_with_update(x.to(TPU), dev(weight), dev(bias), rm_t, rv_t, 0.3, 1e-4)
            assert len(got) == 4 and got[3].dtype == torch.uint8 and got[3].shape == (0,)
            for g, e in zip(got[:3], exp[:3]):
                torch.testing.assert_close(g.cpu(), e)
            torch.testing.assert_close(rm_t.cpu(), rm_c)
            torch.testing.assert_close(rv_t.cpu(), rv_c)
        exp = A._batch_norm_with_update_functional(x, w, b, rm, rv, 0.1, 1e-5)
        got = A._batch_norm_with_update_functional(x.to(TPU), w.to(TPU), b.to(TPU), rm.to(TPU), rv.to(TPU), 0.1, 1e-5)
        assert len(got) == 6 and got[3].dtype == torch.uint8
        for i in (0, 1, 2, 4, 5):
            torch.testing.assert_close(got[i].cpu(), exp[i])


def test_batch_norm_with_update_backward():
    x, w, b = make((5, 3, 4)), make((3,)), make((3,))
    rm, rv = make((3,)), make((3,), low=0.5)

    def f(t, w_, b_):
        return A._batch_norm_with_update(t, w_, b_, rm.clone() if t.device.type == "cpu" else rm.to(TPU),
                                         rv.clone() if t.device.type == "cpu" else rv.to(TPU), 0.1, 1e-5)[0]

    check_grads(f, x, w, b, needs=[True, True, True], atol=1e-4)
    out, mean, invstd, reserve = A._batch_norm_with_update(x, w, b, rm.clone(), rv.clone(), 0.1, 1e-5)
    g = make(out.shape)
    check(A.batch_norm_backward, g, x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True], reserve, atol=1e-4, rtol=1e-4)
    check(A.batch_norm_backward, g, x, w, rm, rv, None, None, False, 1e-5, [True, True, True], reserve, atol=1e-4, rtol=1e-4)


def test_batch_norm_with_update_errors():
    x = make((4, 3, 5))
    check_error(A._batch_norm_with_update, x.long(), None, None, torch.zeros(3), torch.ones(3), 0.1, 1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_mse_and_smooth_l1_backward_integers(dtype, reduction):
    # PyTorch's CPU kernels run integers (the norm and beta truncated to the dtype). beta 1
    # makes its scalar and vectorized loops agree (a beta under 1 divides by zero on CPU).
    A = torch.ops.aten
    x, y, g = make((5, 7), dtype), make((5, 7), dtype), make((5, 7), dtype)
    for args in ((g, x, y), (g.t(), x.t(), y.t()), (make((), dtype), x, y), (make((), dtype), make((), dtype), make((), dtype))):
        check(lambda *a: A.mse_loss_backward(*a, reduction), *args)
        for beta in (1.0,):
            check(lambda *a: A.smooth_l1_loss_backward(*a, reduction, beta), *args)
    e = make((0, 3), dtype)
    if reduction == 1:  # the norm 2 / 0 does not convert to an integer
        check_error(lambda *a: A.mse_loss_backward(*a, reduction), e, e, e)
    else:
        check(lambda *a: A.mse_loss_backward(*a, reduction), e, e, e)
    check(lambda *a: A.mse_loss_backward(*a, reduction, grad_input=torch.empty(0, dtype=dtype, device=a[0].device)), g, x, y)
    b = make((3,), torch.bool)
    check_error(lambda *a: A.mse_loss_backward(*a, reduction), b, b, b)
