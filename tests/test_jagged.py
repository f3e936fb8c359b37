"""Jagged nested tensors (layout=torch.jagged) to and from dense ones on "tpu" against PyTorch
on CPU: to_padded_tensor, its gradient, and the aten ops under them, with their errors."""
import pytest
import torch
from helpers import TPU, check, check_error, make

A = torch.ops.aten


def njt(lengths, width=3, device="cpu", requires_grad=False):
    torch.manual_seed(0)
    parts = [make((n, width)) for n in lengths]
    return torch.nested.nested_tensor(parts, layout=torch.jagged, device=device, requires_grad=requires_grad)


@pytest.mark.parametrize("lengths", [(2, 4), (1,), (3, 0, 5), (4, 4)])
@pytest.mark.parametrize("padding", [0.0, -1.5])
def test_to_padded_tensor(lengths, padding):
    cpu, tpu = njt(lengths), njt(lengths, device=TPU)
    torch.testing.assert_close(tpu.to_padded_tensor(padding).cpu(), cpu.to_padded_tensor(padding))


def test_to_padded_tensor_gradient():
    cpu, tpu = njt((2, 5, 1), requires_grad=True), njt((2, 5, 1), device=TPU, requires_grad=True)
    for x in (cpu, tpu):
        x.to_padded_tensor(0.0).pow(2).sum().backward()
    torch.testing.assert_close(tpu.grad.values().cpu(), cpu.grad.values())


@pytest.mark.parametrize("max_length", [1, 3, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_jagged_to_padded_dense(max_length, dtype):
    values, offsets = make((9, 2), dtype), torch.tensor([0, 2, 2, 9])
    check(lambda v, o: A._jagged_to_padded_dense_forward(v, [o], [max_length], 7.0), values, offsets)
    check(lambda v, o: A._jagged_to_padded_dense_forward(v, [o], [max_length], 0.0), values[:, 0], offsets)
    check(lambda v, o: A._jagged_to_padded_dense_forward(v, [o], [max_length], 1.0), values[:, ::2], offsets)
    check(lambda v, o: A._jagged_to_padded_dense_forward(v, [o], [max_length], 1.0), values[:0],
          torch.tensor([0, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_padded_dense_to_jagged(dtype):
    dense, offsets = make((3, 5, 2), dtype), torch.tensor([0, 2, 2, 7])
    check(lambda d, o: A._padded_dense_to_jagged_forward(d, [o]), dense, offsets)
    check(lambda d, o: A._padded_dense_to_jagged_forward(d, [o], 7), dense, offsets)
    check(lambda d, o: A._padded_dense_to_jagged_forward(d, [o]), dense[..., 0], offsets)
    check(lambda d, o: A._padded_dense_to_jagged_forward(d, [o]), dense.transpose(0, 1).contiguous().transpose(0, 1),
          offsets)


def test_errors():
    values, offsets = make((6, 3)), torch.tensor([0, 2, 6])
    check_error(lambda v, o: A._jagged_to_padded_dense_forward(v, [o, o], [3], 0.0), values, offsets)
    check_error(lambda v, o: A._jagged_to_padded_dense_forward(v, [o], [3, 4], 0.0), values, offsets)
    dense = make((2, 4, 3))
    check_error(lambda d, o: A._padded_dense_to_jagged_forward(d, [o, o]), dense, offsets)
    check_error(lambda d, o: A._padded_dense_to_jagged_forward(d, [o], 3), dense, offsets)
