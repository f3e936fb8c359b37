"""Your own kernels on "tpu", as torch ops: StableHLO text, or a module serialized by
``jax.export`` (a Pallas kernel exported for the platform, for instance).

Both become ``torch.library`` ops (``torch.ops.<ns>.<name>``) with a fake kernel, so they run
in eager mode, trace into ``torch.compile`` graphs (StableHLO text joins the graph's program;
a serialized module runs as a program of its own between the graph's programs) and take a
backward formula with ``register_autograd``, as any custom op does::

    mysin = torchtpu.kernels.stablehlo_op("mylib::mysin", '''
      func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
        %0 = stablehlo.sine %x : tensor<4x8xf32>
        return %0 : tensor<4x8xf32>
      }''')
    y = mysin(torch.randn(4, 8, device="tpu"))

The text may also be a function of the inputs returning the text for their shapes and dtypes
(``mlir_type(t)`` spells a tensor's type), called once per new signature.
"""
from __future__ import annotations

import inspect
import os

import torch

from . import _C
from .jax_export import read_exported

__all__ = ["stablehlo_op", "jax_export_op", "mlir_type", "KernelOp"]

_MLIR_ELEMENTS = {
    torch.bool: "i1", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "ui8", torch.uint16: "ui16", torch.uint32: "ui32", torch.uint64: "ui64",
    torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
    torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
    torch.float8_e4m3fn: "f8E4M3FN", torch.float8_e5m2: "f8E5M2", torch.float8_e4m3fnuz: "f8E4M3FNUZ",
    torch.float8_e5m2fnuz: "f8E5M2FNUZ", torch.float8_e8m0fnu: "f8E8M0FNU",
}
_DTYPES = {code: getattr(torch, name) for code, name in _C.dtype_codes()}
_CODES = {d: c for c, d in _DTYPES.items()}
# torch.library.Library objects must outlive their registrations.
_LIBRARIES = []
# Ops whose kernel is StableHLO text, by qualified name: torch.compile inlines them.
_TEXT_OPS = {}


def mlir_type(t):
    """A tensor's StableHLO type: ``tensor<4x8xf32>``."""
    return "tensor<" + "".join(f"{d}x" for d in t.shape) + _MLIR_ELEMENTS[t.dtype] + ">"


def _describe(types):
    return ", ".join(f"{_DTYPES[code]}{list(dims)}" for dims, code in types)


class KernelOp:
    """A registered kernel op: call it like a function, or as ``torch.ops.<ns>.<name>``."""

    def __init__(self, qualname, schema, fake):
        self.qualname = qualname
        ns, name = qualname.split("::")
        self._lib = torch.library.Library(ns, "FRAGMENT")
        _LIBRARIES.append(self._lib)
        self._lib.define(name + schema)
        self._single = not schema.split("->", 1)[1].strip().startswith("(")
        self._user_fake = fake
        self._checked = set()  # signatures whose shape rule agreed with the kernel
        self._lib.impl(name, self._run, "PrivateUse1")
        torch.library.register_fake(qualname, self._fake, lib=self._lib)
        self.op = getattr(getattr(torch.ops, ns), name).default

    def __call__(self, *args):
        return self.op(*args)

    def register_autograd(self, backward, setup_context=None):
        """The backward formula (``torch.library.register_autograd``); it may call kernels too."""
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context, lib=self._lib)

    # -- subclasses say which kernel runs a signature --------------------------------------------

    def kernel(self, inputs):
        """(kernel id, result types [(dims, dtype code)]) for these inputs."""
        raise NotImplementedError

    def _prepare(self, inputs):
        return inputs

    def _run(self, *inputs):
        kernel, results = self.kernel(inputs)
        self._check_shape_rule(inputs, results)
        outs = torch.ops.torchtpu.stablehlo_kernel(kernel, list(self._prepare(inputs)))
        return outs[0] if self._single else tuple(outs)

    def _fake(self, *inputs):
        if self._user_fake is not None:
            return self._user_fake(*inputs)
        _, results = self.kernel(inputs)
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("tpu"))
        outs = [torch.empty(dims, dtype=_DTYPES[code], device=device) for dims, code in results]
        return outs[0] if self._single else tuple(outs)

    def _check_shape_rule(self, inputs, results):
        """A user's shape rule must say what the kernel returns: torch.compile plans with it."""
        if self._user_fake is None:
            return
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key in self._checked:
            return
        metas = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs]
        said = self._user_fake(*metas)
        said = [said] if isinstance(said, torch.Tensor) else list(said)
        said_types = [(list(t.shape), _CODES[t.dtype]) for t in said]
        real = [(list(dims), code) for dims, code in results]
        if said_types != real:
            raise RuntimeError(f"{self.qualname}: the shape rule says it returns {_describe(said_types)}, but the "
                               f"kernel returns {_describe(real)}")
        self._checked.add(key)


class _TextKernelOp(KernelOp):
    def __init__(self, qualname, text, schema, fake):
        self._text = text
        self._kernels = {}  # signature -> (id, results)
        super().__init__(qualname, schema, fake)
        _TEXT_OPS[qualname] = self

    def kernel(self, inputs):
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key not in self._kernels:
            text = self._text(*inputs) if callable(self._text) else self._text
            kid, _params, results = _C.register_text_kernel(self.qualname, text)
            self._kernels[key] = (kid, results)
        return self._kernels[key]


class _ModuleKernelOp(KernelOp):
    def __init__(self, qualname, kernel_id, results, schema, leading, fake):
        self._kernel_id, self._results, self._leading = kernel_id, results, leading
        super().__init__(qualname, schema, fake)

    def kernel(self, inputs):
        return self._kernel_id, self._results

    def _prepare(self, inputs):
        # The module's @main takes the tensors as they are: dense, whole storages.
        dense = [t if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes
                 else t.clone(memory_format=torch.contiguous_format) for t in inputs]
        return [*(x.to(inputs[0].device if inputs else "tpu") for x in self._leading), *dense]


def _text_schema(qualname, text):
    """`(Tensor x0, ...) -> Tensor` (or a tuple) from the kernel's @main (errors name the op)."""
    _id, params, results = _C.register_text_kernel(qualname, text)
    return _schema(len(params), len(results))


def _schema(n_in, n_out):
    args = ", ".join(f"Tensor x{i}" for i in range(n_in))
    outs = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return f"({args}) -> {outs}"


def stablehlo_op(qualname, text, *, schema=None, fake=None):
    """Registers StableHLO text as the op ``qualname`` ("namespace::name") on tpu.

    `text` has a ``func.func @main`` (other functions it calls may follow; a ``module`` around
    them is fine), or is a function of the op's inputs returning such text for their shapes
    and dtypes. `schema` is the op's torch schema, ``"(Tensor x, Tensor y) -> Tensor"``; by
    default one Tensor per parameter and result of @main (needed when `text` is a function:
    then it is one Tensor per parameter of the function, and one result). `fake` is a shape rule
    ``fake(*inputs) -> outputs`` (empty tensors of the results' shapes and dtypes); by default
    the kernel's own result types. Returns the op (a `KernelOp`)."""
    if schema is None:
        if callable(text):
            schema = _schema(len(inspect.signature(text).parameters), 1)
        else:
            schema = _text_schema(qualname, text)
    return _TextKernelOp(qualname, text, schema, fake)


def _platform():
    """The platform name jax.export uses for the plugin behind "tpu"."""
    name = _C.platform()[0].lower()
    return {"cuda": "cuda", "gpu": "cuda", "rocm": "rocm", "tpu": "tpu", "cpu": "cpu"}.get(name, name)


def jax_export_op(qualname, module, *, fake=None):
    """Registers a module serialized by ``jax.export`` (``Exported.serialize()``: a path or
    the bytes) as the op ``qualname`` on tpu. The op takes the exported function's arguments
    (the ones the module keeps) and returns its results. The module must have been exported
    for the platform behind "tpu" (``cpu`` on the CPU plugin, ``cuda`` on the GPU one,
    ``tpu`` on TPUs), for one device, with static shapes and no effects."""
    if isinstance(module, (str, os.PathLike)):
        with open(module, "rb") as f:
            module = f.read()
    exported = read_exported(bytes(module))
    platform = _platform()
    if platform not in exported.platforms:
        raise RuntimeError(f"{qualname}: the module was exported for {', '.join(exported.platforms)}, not for "
                           f"{platform} (the platform behind tpu here); export it with platforms=[{platform!r}]")
    if exported.nr_devices != 1:
        raise NotImplementedError(f"{qualname}: the module was exported for {exported.nr_devices} devices; "
                                  "kernels run on one")
    if exported.has_effects:
        raise NotImplementedError(f"{qualname}: modules with effects (host callbacks, ordered effects) are not "
                                  "supported")
    avals = [exported.in_avals[i] for i in exported.module_kept_var_idx]
    params = [(list(shape), _CODES[dtype]) for shape, dtype in avals]
    results = [(list(shape), _CODES[dtype]) for shape, dtype in exported.out_avals]
    leading = []
    if len(exported.platforms) > 1:
        # A multi-platform module takes the index of the platform it runs on first.
        leading = [torch.tensor(exported.platforms.index(platform), dtype=torch.int32)]
        params = [([], _CODES[torch.int32]), *params]
    kid = _C.register_module_kernel(qualname, exported.mlir_module, params, results)
    return _ModuleKernelOp(qualname, kid, results, _schema(len(avals), len(results)), leading, fake)
