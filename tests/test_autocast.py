"""torch.autocast("tpu") follows CUDA's policy; torch.utils.checkpoint recomputes exactly."""
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, make


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmuls_run_in_the_autocast_dtype(dtype):
    x, w, b = make((5, 8)), make((3, 8)), make((3,))
    with torch.autocast("tpu", dtype=dtype):
        y = F.linear(x.to(TPU), w.to(TPU), b.to(TPU))
        z = x.to(TPU) @ w.to(TPU).T
    assert y.dtype == dtype and z.dtype == dtype
    # The same casts by hand on CPU.
    ref = F.linear(x.to(dtype), w.to(dtype), b.to(dtype))
    torch.testing.assert_close(y.cpu(), ref)
    torch.testing.assert_close(z.cpu(), x.to(dtype) @ w.to(dtype).T)


def test_reductions_and_softmax_run_in_float32_and_mixed_inputs_promote():
    x = make((4, 6)).bfloat16()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        s = torch.softmax(x.to(TPU), -1)
        total = x.to(TPU).sum()
        mixed = torch.addcmul(make((4, 6)).to(TPU), x.to(TPU), x.to(TPU))
        loss = F.mse_loss(x.to(TPU), make((4, 6)).bfloat16().to(TPU))
    assert s.dtype == torch.float32 and total.dtype == torch.float32 and loss.dtype == torch.float32
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(s.cpu(), torch.softmax(x.float(), -1))
    torch.testing.assert_close(total.cpu(), x.float().sum())


def test_disabled_and_nested_autocast():
    x = make((4, 4)).to(TPU)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tpu")
        with torch.autocast("tpu", enabled=False):
            assert (x @ x).dtype == torch.float32
        assert (x @ x).dtype == torch.bfloat16
    assert (x @ x).dtype == torch.float32


def test_mixed_precision_training_step_matches_cpu_casts():
    # Forward under autocast; parameters and their gradients stay float32.
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dev = copy.deepcopy(ref).to(TPU)
    x, y = make((6, 8)), torch.randint(0, 4, (6,))
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = dev(x.to(TPU))
        loss = F.cross_entropy(out, y.to(TPU))
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU's lists agree for these ops
        ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss, atol=2e-2, rtol=2e-2)
    for p, q in zip(dev.parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=3e-2, rtol=3e-2)


def test_bad_autocast_dtype_warns_and_disables():
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("tpu", dtype=torch.float64):
            assert not torch.is_autocast_enabled("tpu")


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputes_dropout_exactly(reentrant):
    # checkpoint saves the tpu RNG state and replays it in backward: gradients equal those of
    # the same forward without checkpointing.
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.GELU()).to(TPU)
    x = make((4, 8)).to(TPU)
    grads = []
    for use_checkpoint in (False, True):
        torch.tpu.manual_seed(7)
        xi = x.clone().requires_grad_()
        out = checkpoint(block, xi, use_reentrant=reentrant) if use_checkpoint else block(xi)
        out.square().sum().backward()
        grads.append((xi.grad.cpu(), [p.grad.cpu() for p in block.parameters()]))
        block.zero_grad()
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b)
