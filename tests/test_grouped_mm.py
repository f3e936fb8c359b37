"""torch._grouped_mm (mixture-of-experts matmuls) on tpu against PyTorch on CPU: the four
layouts, gradients, empty groups, rows past the last group, and PyTorch's errors."""
import pytest
import torch

from helpers import TPU

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def offsets(*ends):
    return torch.tensor(ends, dtype=torch.int32)


def run(a, b, offs, grad_rows=None):
    """Forward and input gradients on CPU and tpu for the same upstream gradient."""
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    at, bt = a.to(TPU).requires_grad_(), b.to(TPU).requires_grad_()
    ref = torch._grouped_mm(ac, bc, offs=offs)
    got = torch._grouped_mm(at, bt, offs=None if offs is None else offs.to(TPU))
    g = torch.randn(ref.shape).to(ref.dtype)
    if grad_rows is not None:
        g[grad_rows:] = 0  # CPU leaves rows past the last group uninitialized
    ref.backward(g)
    got.backward(g.to(TPU))
    return ref, got.cpu(), (ac.grad, bc.grad), (at.grad.cpu(), bt.grad.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_grouped_by_expert(dtype):
    torch.manual_seed(0)
    a, b = torch.randn(10, 16).to(dtype), torch.randn(4, 16, 8).to(dtype)
    offs = offsets(2, 5, 5, 9)  # an empty group; row 9 is in none
    ref, got, rg, gg = run(a, b, offs, grad_rows=9)
    torch.testing.assert_close(got[:9].float(), ref[:9].float(), **TOL[dtype])
    assert torch.equal(got[9], torch.zeros(8, dtype=dtype))
    torch.testing.assert_close(gg[0][:9].float(), rg[0][:9].float(), **TOL[dtype])
    torch.testing.assert_close(gg[1].float(), rg[1].float(), **TOL[dtype])


def test_shared_dim_grouped_and_columns_grouped():
    torch.manual_seed(1)
    a, b = torch.randn(6, 12), torch.randn(12, 8)
    ref, got, rg, gg = run(a, b, offsets(4, 4, 12))
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, rg):
        torch.testing.assert_close(x, y)
    a3, b2 = torch.randn(3, 6, 16), torch.randn(16, 12)
    ref, got, rg, gg = run(a3, b2, offsets(4, 8, 12))
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, rg):
        torch.testing.assert_close(x, y)


def test_batched_and_non_contiguous():
    torch.manual_seed(2)
    ref, got, rg, gg = run(torch.randn(3, 8, 4), torch.randn(3, 4, 8), None)
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, rg):
        torch.testing.assert_close(x, y)
    w = torch.randn(4, 8, 16).transpose(1, 2)  # column-major experts, as MoE layers pass them
    x = torch.randn(12, 16)
    ref = torch._grouped_mm(x, w, offs=offsets(3, 6, 9, 12))
    got = torch._grouped_mm(x.to(TPU), w.to(TPU), offs=offsets(3, 6, 9, 12).to(TPU))
    torch.testing.assert_close(got.cpu(), ref)


def test_errors():
    a, b = torch.randn(8, 16), torch.randn(4, 16, 8)
    with pytest.raises(RuntimeError, match="Offsets tensor not provided"):
        torch._grouped_mm(a.to(TPU), b.to(TPU))
    with pytest.raises(RuntimeError, match=r"must be integer \(int32\)"):
        torch._grouped_mm(a.to(TPU), b.to(TPU), offs=torch.tensor([2, 4, 6, 8], device=TPU))
    with pytest.raises(RuntimeError, match="matrix batch sizes have to match"):
        torch._grouped_mm(a.to(TPU), b.to(TPU), offs=offsets(4, 8).to(TPU))
    with pytest.raises(RuntimeError, match="contraction dimension"):
        torch._grouped_mm(a.to(TPU), torch.randn(4, 12, 8, device=TPU), offs=offsets(2, 4, 6, 8).to(TPU))
    with pytest.raises(RuntimeError, match="2D or 3D"):
        torch._grouped_mm(torch.randn(8, device=TPU), b.to(TPU), offs=offsets(2, 4, 6, 8).to(TPU))


def test_compiled_with_float32_and_unaligned_shapes():
    # PyTorch's meta function admits only bf16 with 16-byte aligned strides (its CUDA kernel's
    # limits); graphs on tpu take float32 and any shape.
    torch.manual_seed(3)
    x, w, offs = torch.randn(10, 12), torch.randn(3, 12, 5), offsets(3, 6, 10)

    def f(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs).sum(-1)

    ref = torch.cat([x[0:3] @ w[0], x[3:6] @ w[1], x[6:10] @ w[2]]).sum(-1)
    got = torch.compile(f, backend="tpu")(x.to(TPU), w.to(TPU), offs.to(TPU))
    torch.testing.assert_close(got.cpu(), ref)
