"""Module.to("tpu") keeps tied parameters tied.

PyTorch converts a parameter in place (keeping the Parameter object) only for its built-in
dense backends; for others Module._apply makes a new Parameter per module that holds it, so a
weight shared by two modules (an embedding tied to the output layer, as in most language
models) would become two independent weights. After a conversion, the modules that shared one
Parameter share the new one again.
"""
import threading

import torch

_original_apply = torch.nn.Module._apply
_state = threading.local()


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
    if getattr(_state, "active", False):  # a child of the module being converted
        return _original_apply(self, fn, *args, **kwargs)
    _state.active = True
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
        _state.active = False


torch.nn.Module._apply = _apply_keeping_ties
