"""nn.TransformerEncoder's nested-tensor fast path on tpu.

In eval mode without autograd, given a padding mask, TransformerEncoder (enable_nested_tensor
is its default) packs the tokens of each sequence into a nested tensor
(torch._nested_tensor_from_mask), runs its layers on that, and pads the result back with
zeros (to_padded_tensor) before its final norm. tpu has no nested tensors. When PyTorch's own
checks choose that path for a tpu batch, the encoder instead runs its layers on the padded
batch with the padding mask (each layer still takes its fused fast path) and zeroes the padded
positions: the values the nested path gives on CPU. Everything else is PyTorch's forward.
"""
import threading

import torch
from torch.nn.modules import transformer as _transformer

_original_forward = _transformer.TransformerEncoder.forward
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


def _forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
    if src.device.type != "tpu" or src_key_padding_mask is None or torch.compiler.is_compiling():
        return _original_forward(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
    previous = getattr(_state, "intercept", False)
    _state.intercept = True
    try:
        return _original_forward(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
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


_forward.__doc__ = _original_forward.__doc__
_transformer.TransformerEncoder.forward = _forward
torch._nested_tensor_from_mask = _nested_tensor_from_mask
