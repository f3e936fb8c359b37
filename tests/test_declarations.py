"""Each op is declared once, in its family's OPS table (crates/lowerings/src/decl.rs): the
declarations name real aten ops, and lowerings read only argument names their ops have."""
import os

import torch

from torchtpu import _C


def _dispatcher_ops():
    """The running torch's dispatcher ops as "ns::name" -> set of overload names ("" = default)."""
    ops = {}
    for full in torch._C._dispatch_get_all_op_names():
        name, _, overload = full.partition(".")
        ops.setdefault(name, set()).add(overload)
    return ops


# Declared for the older supported releases: (name, the first release without it).
REMOVED = {"cholesky": (2, 14)}


def test_every_declared_name_is_an_op_of_the_dispatcher():
    ops = _dispatcher_ops()
    running = tuple(int(x) for x in torch.__version__.split(".")[:2])
    # A declaration serves an op by its base name: `add` serves aten::add and aten::add_.
    missing = [n for n in _C.lowered_ops()
               if n not in ops and f"aten::{n}" not in ops and f"aten::{n}_" not in ops
               and not (n in REMOVED and running >= REMOVED[n])]
    assert not missing, f"declared names that are no op of torch {torch.__version__}: {missing}"


def test_every_routed_or_kept_overload_exists():
    ops = _dispatcher_ops()
    missing = []
    for base, kind, overload in _C.declared_overloads():
        name, _, over = overload.partition(".")
        if over not in ops.get(f"aten::{name}", ()):
            missing.append((base, kind, overload))
        # A routed overload belongs to its own declaration (by the base-name rule).
        assert _C.is_lowered(f"aten::{name}"), (base, overload)
    assert not missing, f"declared overloads that torch {torch.__version__} does not have: {missing}"


def test_lowerings_may_read_the_argument_names_of_every_overload_of_their_ops():
    # The check behind TORCHTPU_CHECK_ARGS=1 (set by conftest): a lowering reading a name that
    # none of its ops' overloads has raises. Its names come from the dispatcher's schemas.
    from torchtpu import _C
    assert os.environ.get("TORCHTPU_CHECK_ARGS") == "1"
    dispatcher_ops = set(torch._C._dispatch_get_all_op_names())
    expected = set()
    for name in ("add", "add_"):
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            if f"aten::{name}" + ("" if overload == "default" else f".{overload}") in dispatcher_ops:
                expected |= {a.name for a in getattr(packet, overload)._schema.arguments}
    # A lowering may read the names of every op of its family table (elementwise.rs): add's and
    # add_'s overloads' names, and its siblings' (where's `condition`), but not another family's.
    allowed = set(_C.lowering_arg_names("add"))
    assert expected <= allowed and {"alpha", "out", "condition"} <= allowed
    assert "align_corners" not in allowed
    assert "align_corners" in set(_C.lowering_arg_names("upsample_nearest2d"))
    assert _C.lowering_arg_names("no_such_op") is None
