"""The per-rank ops nn.SyncBatchNorm composes (PyTorch has CUDA kernels for them and no CPU
ones): composed as SyncBatchNorm composes them, over a batch cut into ranks of unequal sizes,
with the collectives done by hand (a cat for all_gather, a sum for all_reduce), they give CPU's
batch norm over the whole batch: output, running statistics and gradients."""
import pytest
import torch
import torch.nn.functional as F
from helpers import TPU

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


def sync_batch_norm(chunks, weight, bias, running_mean, running_var, momentum, eps, grad_chunks):
    """SyncBatchNorm's forward and backward (torch/nn/modules/_functions.py) for ranks holding
    `chunks`: returns each rank's output and input gradient, and the weight and bias gradients."""
    stats = []
    for x in chunks:
        mean, invstd = torch.batch_norm_stats(x, eps)
        count = torch.full((1,), x.numel() // x.size(1), dtype=mean.dtype, device=mean.device)
        stats.append(torch.cat([mean, invstd, count]))
    gathered = torch.stack(stats)  # all_gather
    c = chunks[0].size(1)
    mean_all, invstd_all, count_all = torch.split(gathered, c, dim=1)
    outs, reduced = [], []
    for i, x in enumerate(chunks):
        # Every rank updates its own copy of the running statistics the same way.
        rm, rv = (running_mean, running_var) if i == 0 else (running_mean.clone(), running_var.clone())
        mean, invstd = torch.batch_norm_gather_stats_with_counts(x, mean_all, invstd_all, rm, rv, momentum, eps, count_all.view(-1))
        outs.append(torch.batch_norm_elemt(x, weight, bias, mean, invstd, eps))
        reduced.append(torch.batch_norm_backward_reduce(grad_chunks[i], x, mean, invstd, weight, True, True, True))
    sum_dy = sum(r[0] for r in reduced)  # all_reduce
    sum_dy_xmu = sum(r[1] for r in reduced)
    counts = count_all.view(-1).to(torch.int32)
    grads = [torch.batch_norm_backward_elemt(g, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)
             for g, x in zip(grad_chunks, chunks)]
    return outs, grads, sum(r[2] for r in reduced), sum(r[3] for r in reduced)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,cuts", [((8, 3, 5, 4), (3, 5)), ((10, 6), (2, 5, 3)), ((6, 4, 7), (6,))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_composed_like_sync_batch_norm_it_is_batch_norm_over_the_whole_batch(dtype, shape, cuts, channels_last):
    if channels_last and len(shape) != 4:
        pytest.skip("channels_last is a 4-d layout")
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    c = shape[1]
    weight, bias = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    rm0, rv0 = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    momentum, eps = 0.1, 1e-5

    xr = x.float().requires_grad_()
    wr, br = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    rm, rv = rm0.clone(), rv0.clone()
    want = F.batch_norm(xr, rm, rv, wr, br, training=True, momentum=momentum, eps=eps)
    want.backward(dy.float())

    xt = x.to(TPU)
    if channels_last:
        xt = xt.contiguous(memory_format=torch.channels_last)
    chunks, grad_chunks = xt.split(list(cuts)), dy.to(TPU).split(list(cuts))
    trm, trv = rm0.to(TPU), rv0.to(TPU)
    outs, grads, gw, gb = sync_batch_norm(chunks, weight.to(TPU), bias.to(TPU), trm, trv, momentum, eps, grad_chunks)
    tol = TOL[dtype]
    assert all(o.dtype == dtype for o in outs + grads)
    torch.testing.assert_close(torch.cat(outs).cpu().float(), want.detach(), **tol)
    torch.testing.assert_close(torch.cat(grads).cpu().float(), xr.grad, **tol)
    torch.testing.assert_close(gw.cpu(), wr.grad, **tol)
    torch.testing.assert_close(gb.cpu(), br.grad, **tol)
    torch.testing.assert_close(trm.cpu(), rm, **tol)
    torch.testing.assert_close(trv.cpu(), rv, **tol)


def test_stats_dtypes_and_what_backward_reduce_leaves_out():
    x = torch.randn(4, 3, 5).to(torch.bfloat16).to(TPU)
    mean, invstd = torch.batch_norm_stats(x, 1e-5)
    assert mean.dtype == invstd.dtype == torch.float32 and mean.shape == (3,)
    xf = x.cpu().float()
    torch.testing.assert_close(mean.cpu(), xf.mean((0, 2)))
    torch.testing.assert_close(invstd.cpu(), (xf.var((0, 2), unbiased=False) + 1e-5).rsqrt())
    dy = torch.randn(4, 3, 5).to(torch.bfloat16).to(TPU)
    out = torch.batch_norm_backward_reduce(dy, x, mean, invstd, None, False, False, True)
    assert out[0] is None and out[1] is None and out[2] is None  # not asked for
    assert out[3].dtype == torch.float32
    torch.testing.assert_close(out[3].cpu(), dy.cpu().float().sum((0, 2)), atol=1e-2, rtol=1e-2)


def test_bad_input_raises():
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.batch_norm_stats(torch.ones(2, 3, dtype=torch.long, device=TPU), 1e-5)
    with pytest.raises(RuntimeError, match="at least 2 dims"):
        torch.batch_norm_stats(torch.ones(3, device=TPU), 1e-5)
    with pytest.raises(RuntimeError, match="weight should contain 3 elements not 2"):
        x = torch.ones(2, 3, device=TPU)
        torch.batch_norm_elemt(x, torch.ones(2, device=TPU), None, torch.zeros(3, device=TPU), torch.ones(3, device=TPU), 1e-5)
