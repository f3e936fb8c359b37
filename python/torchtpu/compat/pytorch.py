"""Patches of PyTorch itself, installed when torchtpu loads.

Module.to("tpu") keeps tied parameters tied. PyTorch converts a parameter in place (keeping
the Parameter object) only for its built-in dense backends; for others Module._apply makes a
new Parameter per module that holds it, so a weight shared by two modules (an embedding tied
to the output layer, as in most language models) would become two independent weights. After
a conversion, the modules that shared one Parameter share the new one again.

nn.TransformerEncoder's nested-tensor fast path on tpu. In eval mode without autograd, given a
padding mask, TransformerEncoder (enable_nested_tensor is its default) packs the tokens of each
sequence into a nested tensor (torch._nested_tensor_from_mask), runs its layers on that, and
pads the result back with zeros (to_padded_tensor) before its final norm. tpu has no strided
nested tensors. When PyTorch's own checks choose that path for a tpu batch, the encoder instead
runs its layers on the padded batch with the padding mask (each layer still takes its fused
fast path) and zeroes the padded positions: the values the nested path gives on CPU.
Everything else is PyTorch's forward, which also stays what TorchScript compiles.

FlexAttention on tpu: torch's device check lists the devices it knows and refuses others; on
tpu flex attention runs its eager implementation (score and mask functions applied to the
dense scores, with backward), so tpu inputs are let through the check.
"""
import threading
import types
from typing import Optional

import torch
from torch import Tensor
from torch.nn.modules import transformer as _transformer


def install():
    torch.nn.Module._apply = _apply_keeping_ties
    _take_the_encoder_nested_path()
    _let_tpu_through_flex_attention()


# ---- Module.to keeps ties -------------------------------------------------------------------

_original_apply = torch.nn.Module._apply
_apply_state = threading.local()


def _shared_parameters(module):
    groups = {}
    for sub in module.modules(remove_duplicate=False) if _has_remove_duplicate() else module.modules():
        for name, p in sub._parameters.items():
            if p is not None:
                groups.setdefault(id(p), []).append((sub, name))
    return [g for g in groups.values() if len(g) > 1]


def _has_remove_duplicate():
    return "remove_duplicate" in torch.nn.Module.modules.__code__.co_varnames


def _apply_keeping_ties(self, fn, *args, **kwargs):
    if getattr(_apply_state, "active", False):  # a child of the module being converted
        return _original_apply(self, fn, *args, **kwargs)
    _apply_state.active = True
    try:
        shared = _shared_parameters(self)
        out = _original_apply(self, fn, *args, **kwargs)
        for group in shared:
            first_module, first_name = group[0]
            p = first_module._parameters[first_name]
            for module, name in group[1:]:
                if module._parameters[name] is not p:
                    module._parameters[name] = p
        return out
    finally:
        _apply_state.active = False


# ---- TransformerEncoder's nested fast path ---------------------------------------------------

_Encoder = _transformer.TransformerEncoder
_original_from_mask = torch._nested_tensor_from_mask
_encoder_state = threading.local()


class _NestedPathChosen(Exception):
    """PyTorch's forward is about to pack a tpu batch into a nested tensor."""

    def __init__(self, tokens):
        super().__init__()
        self.tokens = tokens


def _nested_tensor_from_mask(t, mask, mask_check=True):
    if getattr(_encoder_state, "intercept", False) and t.device.type == "tpu":
        raise _NestedPathChosen(mask)
    return _original_from_mask(t, mask, mask_check=mask_check)


@torch.jit.unused
def _tpu_forward(self, src: Tensor, mask: Optional[Tensor], src_key_padding_mask: Tensor,
                 is_causal: Optional[bool]) -> Tensor:
    previous = getattr(_encoder_state, "intercept", False)
    _encoder_state.intercept = True
    try:
        return self._torch_forward(src, mask, src_key_padding_mask, is_causal)
    except _NestedPathChosen as chosen:
        tokens = chosen.tokens
    finally:
        _encoder_state.intercept = previous
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


def _take_the_encoder_nested_path():
    if getattr(_Encoder.forward, "_torchtpu", False):
        return
    _forward.__doc__ = _Encoder.forward.__doc__
    _Encoder._torch_forward = _renamed(_Encoder.forward, "_torch_forward")
    _Encoder._tpu_forward = _tpu_forward
    _Encoder.forward = _forward
    torch._nested_tensor_from_mask = _nested_tensor_from_mask
    # TorchScript compiles calls of it (PyTorch's forward) as the aten op, as before.
    torch.jit._builtins._register_builtin(_nested_tensor_from_mask, "aten::_nested_tensor_from_mask")
    _forward._torchtpu = True


# ---- flex attention's device check -----------------------------------------------------------

def _let_tpu_through_flex_attention():
    try:
        import torch.nn.attention.flex_attention as flex
    except ImportError:
        return
    check = getattr(flex, "_validate_device", None)
    if check is None or getattr(check, "_lets_tpu_through", False):
        return

    def validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return check(query, key, value)

    validate_device._lets_tpu_through = True
    flex._validate_device = validate_device
