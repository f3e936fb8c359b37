"""nn.TransformerEncoder's nested-tensor fast path on tpu.

In eval mode without autograd, given a padding mask, TransformerEncoder (enable_nested_tensor
is its default) packs the tokens of each sequence into a nested tensor
(torch._nested_tensor_from_mask), runs its layers on that, and pads the result back with
zeros (to_padded_tensor) before its final norm. tpu has no nested tensors. When PyTorch's own
checks choose that path for a tpu batch, the encoder instead runs its layers on the padded
batch with the padding mask (each layer still takes its fused fast path) and zeroes the padded
positions: the values the nested path gives on CPU. Everything else is PyTorch's forward,
which also stays what TorchScript compiles.
"""
import threading
import types
from typing import Optional

import torch
from torch import Tensor
from torch.nn.modules import transformer as _transformer

_Encoder = _transformer.TransformerEncoder
_original_from_mask = torch._nested_tensor_from_mask
_state = threading.local()


class _NestedPathChosen(Exception):
    """PyTorch's forward is about to pack a tpu batch into a nested tensor."""

    def __init__(self, tokens):
        super().__init__()
        self.tokens = tokens


def _nested_tensor_from_mask(t, mask, mask_check=True):
    if getattr(_state, "intercept", False) and t.device.type == "tpu":
        raise _NestedPathChosen(mask)
    return _original_from_mask(t, mask, mask_check=mask_check)


@torch.jit.unused
def _tpu_forward(self, src: Tensor, mask: Optional[Tensor], src_key_padding_mask: Tensor,
                 is_causal: Optional[bool]) -> Tensor:
    previous = getattr(_state, "intercept", False)
    _state.intercept = True
    try:
        return self._torch_forward(src, mask, src_key_padding_mask, is_causal)
    except _NestedPathChosen as chosen:
        tokens = chosen.tokens
    finally:
        _state.intercept = previous
    # As _nested_tensor_from_mask and to_padded_tensor: a sequence is the first
    # tokens.sum(1) positions of its row; every other position is padding.
    lengths = tokens.sum(1)
    positions = torch.arange(src.size(1), device=src.device)
    padding = positions.unsqueeze(0) >= lengths.unsqueeze(1)
    causal = _transformer._detect_is_causal_mask(None, is_causal, src.size(1))
    output = src
    for mod in self.layers:
        output = mod(output, src_mask=None, is_causal=causal, src_key_padding_mask=padding)
    output = output.masked_fill(padding.unsqueeze(-1), 0.0)
    if self.norm is not None:
        output = self.norm(output)
    return output


def _forward(self, src: Tensor, mask: Optional[Tensor] = None, src_key_padding_mask: Optional[Tensor] = None,
             is_causal: Optional[bool] = None) -> Tensor:
    if not torch.jit.is_scripting():
        if src.device.type == "tpu" and src_key_padding_mask is not None and not torch.compiler.is_compiling():
            return self._tpu_forward(src, mask, src_key_padding_mask, is_causal)
    return self._torch_forward(src, mask, src_key_padding_mask, is_causal)


def _renamed(fn, name):
    """fn under another name (TorchScript names a compiled method after its function)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__.rsplit(".", 1)[0] + "." + name
    copy.__doc__ = fn.__doc__
    copy.__annotations__ = dict(fn.__annotations__)
    return copy


_forward.__doc__ = _Encoder.forward.__doc__
_Encoder._torch_forward = _renamed(_Encoder.forward, "_torch_forward")
_Encoder._tpu_forward = _tpu_forward
_Encoder.forward = _forward
torch._nested_tensor_from_mask = _nested_tensor_from_mask
# TorchScript compiles calls of it (PyTorch's forward) as the aten op, as before.
torch.jit._builtins._register_builtin(_nested_tensor_from_mask, "aten::_nested_tensor_from_mask")
