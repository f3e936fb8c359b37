"""Layouts tpu does not hold (sparse COO and compressed, quantized, strided nested) raise
NotImplementedError naming the op and the layout, never the dispatcher's list of backends; the
CPU keeps running them."""
import pytest
import torch
from helpers import TPU

INDICES, VALUES = torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])


def quantized():
    return torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)


@pytest.mark.parametrize("name,fn,layout", [
    ("sparse_coo_tensor", lambda: torch.sparse_coo_tensor(INDICES, VALUES, (2, 2), device=TPU), "sparse (torch.sparse_coo)"),
    ("coo.to", lambda: torch.randn(3, 3).to_sparse().to(TPU), "sparse (torch.sparse_coo)"),
    ("sparse_csr_tensor", lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), VALUES,
                                                         device=TPU), "sparse compressed"),
    ("csr.to(...).to_dense", lambda: torch.randn(3, 3).to_sparse_csr().to(TPU).to_dense(), "sparse compressed"),
    ("quantized.to", lambda: quantized().to(TPU), "quantized"),
    ("strided nested", lambda: torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], device=TPU)
     .to_padded_tensor(0.0), "strided nested"),
])
def test_layouts_tpu_does_not_hold_raise_naming_the_layout(name, fn, layout):
    with pytest.raises(NotImplementedError, match=r"torchtpu: aten::\w+.* with a " + layout.replace("(", r"\(")
                       .replace(")", r"\)")) as e:
        fn()
    assert "Could not run" not in str(e.value)


def test_the_cpu_keeps_its_layouts():
    # The refusals are registered for tpu's keys only.
    assert torch.equal(torch.sparse_coo_tensor(INDICES, VALUES, (2, 2)).to_dense(), torch.tensor([[0, 1.0], [2, 0]]))
    x = torch.randn(3, 3)
    assert torch.equal(x.to_sparse_csr().to_dense(), x)
    q = quantized()
    assert q.int_repr().dtype == torch.int8
    assert torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]).to_padded_tensor(0.0).shape == (2, 4, 3)
