"""Reading modules serialized by ``jax.export`` (``Exported.serialize()``).

JAX is not needed at run time: the file is a flatbuffer (JAX's serialization.fbs, root table
``Exported``, no file identifier) and this module reads the few fields torchtpu needs with its
own minimal table reader. The StableHLO itself stays opaque bytes (a portable artifact, MLIR
bytecode) that is handed to the PJRT plugin for compilation.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_NOT_EXPORTED = "not a jax.export serialized module"

# JAX bumps its serialization version on every schema change, all of them so far backwards
# compatible (1..11 as of JAX 0.10). It still writes 3 into the file so that old readers,
# which accepted only 2 and 3, keep working; accept what is documented up to 11.
_VERSIONS = range(1, 12)

# Field ids of table Exported; a field's vtable slot is 4 + 2 * id.
_EX_VERSION = 0            # uint16
_EX_FUN_NAME = 1           # string
_EX_IN_AVALS = 3           # [AbstractValue], older writers
_EX_OUT_AVALS = 5          # [AbstractValue], older writers
_EX_NR_DEVICES_SHORT = 6   # int16, older writers
_EX_PLATFORMS = 9          # [string]
_EX_ORDERED_EFFECTS = 10   # [Effect]
_EX_UNORDERED_EFFECTS = 11  # [Effect]
_EX_MLIR_MODULE = 13       # [ubyte]
_EX_CALLING_CONVENTION = 14  # uint16
_EX_KEPT_VAR_IDX = 15      # [uint16]
_EX_NR_DEVICES = 18        # uint32, since serialization version 5
_EX_UNIQUE_AVALS = 19      # [AbstractValue], since version 10, indexed by the two below
_EX_IN_AVALS_IDXS = 22     # [uint32]
_EX_OUT_AVALS_IDXS = 23    # [uint32]

# Field ids of table AbstractValue.
_AV_KIND = 0    # int8: 0 shapedArray, 1 abstractToken
_AV_SHAPE = 1   # [string], str() of each dimension, so symbolic ones read "b", "2*b", ...
_AV_DTYPE = 2   # int8, enum DType

# enum DType -> name of the torch dtype. Names, not dtypes, so that torch is imported only
# when a module is actually read.
_DTYPES = {
    0: "bool", 1: "int8", 2: "int16", 3: "int32", 4: "int64",
    5: "uint8", 6: "uint16", 7: "uint32", 8: "uint64",
    9: "float16", 10: "float32", 11: "float64", 12: "complex64", 13: "complex128",
    14: "bfloat16", 18: "float8_e4m3fn", 19: "float8_e4m3fnuz", 20: "float8_e5m2",
    21: "float8_e5m2fnuz", 25: "float8_e8m0fnu",
}
# The rest of the enum, for the error message: no torch dtype holds these one element apiece.
_JAX_ONLY_DTYPES = {
    15: "int4", 16: "uint4", 17: "float8_e4m3b11fnuz", 22: "float0", 23: "float8_e4m3",
    24: "float8_e3m4", 26: "float4_e2m1fn", 27: "key<fry>", 28: "key<rbg>",
    29: "key<unsafe_rbg>",
}

# Every StableHLO portable artifact is MLIR bytecode, which starts with this magic.
_MLIR_BYTECODE_MAGIC = b"ML\xefR"


@dataclasses.dataclass(frozen=True)
class ExportedModule:
    fun_name: str
    platforms: tuple[str, ...]
    in_avals: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    out_avals: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    mlir_module: bytes
    calling_convention_version: int
    nr_devices: int
    has_effects: bool
    # Indices of the inputs the module still takes: JAX drops unused ones from `main`.
    module_kept_var_idx: tuple[int, ...]


def _bad(why):
    return ValueError(f"{_NOT_EXPORTED}: {why}")


class _Table:
    """A flatbuffer table, every read bounds-checked so that bad input ends in ValueError."""

    def __init__(self, buf, pos):
        self.buf = buf
        self.pos = pos
        self.vtable = pos - self._get("<i", pos)
        self.vtable_size = self._get("<H", self.vtable)
        self.object_size = self._get("<H", self.vtable + 2)
        if self.vtable_size < 4 or self.vtable_size % 2:
            raise _bad(f"vtable at {self.vtable} has size {self.vtable_size}")

    def _get(self, fmt, off):
        if off < 0 or off + struct.calcsize(fmt) > len(self.buf):
            raise _bad(f"offset {off} is outside the {len(self.buf)} bytes")
        return struct.unpack_from(fmt, self.buf, off)[0]

    def _field(self, fid):
        # Absolute position of a field, None when absent (fields past the vtable's end are
        # fields this writer did not know about; a slot of 0 is a field left at its default).
        slot = 4 + 2 * fid
        if slot >= self.vtable_size:
            return None
        rel = self._get("<H", self.vtable + slot)
        if rel == 0:
            return None
        if rel >= self.object_size:
            raise _bad(f"field {fid} lies outside its table")
        return self.pos + rel

    def scalar(self, fid, fmt, default=0):
        at = self._field(fid)
        return default if at is None else self._get(fmt, at)

    def _deref(self, at):
        return at + self._get("<I", at)

    def _vector(self, fid, elem_size):
        """(start, length) of a vector field, (0, 0) when absent."""
        at = self._field(fid)
        if at is None:
            return 0, 0
        vec = self._deref(at)
        n = self._get("<I", vec)
        if vec + 4 + n * elem_size > len(self.buf):
            raise _bad(f"vector of {n} in field {fid} runs past the end")
        return vec + 4, n

    def count(self, fid):
        return self._vector(fid, 4)[1]

    def _string_at(self, at):
        s = self._deref(at)
        n = self._get("<I", s)
        if s + 4 + n > len(self.buf):
            raise _bad(f"string at {s} runs past the end")
        try:
            return bytes(self.buf[s + 4:s + 4 + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"string at {s} is not UTF-8") from None

    def string(self, fid):
        at = self._field(fid)
        return None if at is None else self._string_at(at)

    def strings(self, fid):
        start, n = self._vector(fid, 4)
        return [self._string_at(start + 4 * i) for i in range(n)]

    def tables(self, fid):
        start, n = self._vector(fid, 4)
        return [_Table(self.buf, self._deref(start + 4 * i)) for i in range(n)]

    def scalars(self, fid, fmt):
        size = struct.calcsize(fmt)
        start, n = self._vector(fid, size)
        return [struct.unpack_from(fmt, self.buf, start + size * i)[0] for i in range(n)]

    def bytes(self, fid):
        start, n = self._vector(fid, 1)
        return bytes(self.buf[start:start + n])


def _aval(table, what):
    import torch

    kind = table.scalar(_AV_KIND, "<b")
    if kind != 0:
        raise ValueError(f"{what} is a token (kind {kind}), which is not supported")
    shape = []
    for i, dim in enumerate(table.strings(_AV_SHAPE)):
        # JAX writes str(d): digits for a known size, an expression for a symbolic one.
        if not (dim.isascii() and dim.isdigit()):
            raise ValueError(
                f"{what} dimension {i} is symbolic ({dim!r}): shape polymorphism is not "
                "supported yet")
        shape.append(int(dim))
    code = table.scalar(_AV_DTYPE, "<b")
    name = _DTYPES.get(code)
    if name is None or not hasattr(torch, name):  # hasattr: an older torch may lack a float8
        name = name or _JAX_ONLY_DTYPES.get(code, f"unknown dtype code {code}")
        raise ValueError(f"{what} has dtype {name}, which torch does not support")
    return tuple(shape), getattr(torch, name)


def _avals(ex, direct_fid, idxs_fid, unique, what):
    # Writers since serialization version 10 store each distinct aval once and index it;
    # they still fill the old per-argument vector, which later writers may leave out.
    idxs = ex.scalars(idxs_fid, "<I")
    if idxs:
        if max(idxs) >= len(unique):
            raise _bad(f"{what} index {max(idxs)} but only {len(unique)} avals")
        tables = [unique[i] for i in idxs]
    else:
        tables = ex.tables(direct_fid)
    return tuple(_aval(t, f"{what}[{i}]") for i, t in enumerate(tables))


def read_exported(data: bytes) -> ExportedModule:
    """Reads the bytes of ``jax.export.Exported.serialize()``.

    Raises ValueError for anything that is not such a module, for a serialization version
    this reader does not know, for symbolic shapes and for dtypes torch lacks.
    """
    buf = memoryview(data).cast("B")
    if len(buf) < 8:
        raise _bad(f"{len(buf)} bytes")
    ex = _Table(buf, struct.unpack_from("<I", buf, 0)[0])

    version = ex.scalar(_EX_VERSION, "<H")
    if version == 0:
        raise _bad("no serialization version")
    if version not in _VERSIONS:
        raise ValueError(
            f"jax.export serialization version {version} is not supported (this reader "
            f"knows {_VERSIONS.start}..{_VERSIONS.stop - 1}); re-export with an older JAX or "
            "update torchtpu")

    fun_name = ex.string(_EX_FUN_NAME)
    mlir_module = ex.bytes(_EX_MLIR_MODULE)
    platforms = tuple(ex.strings(_EX_PLATFORMS))
    if fun_name is None or not platforms or not mlir_module.startswith(_MLIR_BYTECODE_MAGIC):
        raise _bad("function name, platforms or StableHLO bytecode missing")
    nr_devices = ex.scalar(_EX_NR_DEVICES, "<I") or ex.scalar(_EX_NR_DEVICES_SHORT, "<h")
    if nr_devices < 1:
        raise _bad(f"{nr_devices} devices")

    unique = ex.tables(_EX_UNIQUE_AVALS)
    return ExportedModule(
        fun_name=fun_name,
        platforms=platforms,
        in_avals=_avals(ex, _EX_IN_AVALS, _EX_IN_AVALS_IDXS, unique, "in_avals"),
        out_avals=_avals(ex, _EX_OUT_AVALS, _EX_OUT_AVALS_IDXS, unique, "out_avals"),
        mlir_module=mlir_module,
        calling_convention_version=ex.scalar(_EX_CALLING_CONVENTION, "<H"),
        nr_devices=nr_devices,
        has_effects=bool(ex.count(_EX_ORDERED_EFFECTS) or ex.count(_EX_UNORDERED_EFFECTS)),
        module_kept_var_idx=tuple(ex.scalars(_EX_KEPT_VAR_IDX, "<H")),
    )
