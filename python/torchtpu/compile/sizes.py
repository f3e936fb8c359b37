"""Symbolic sizes (dynamic=True, mark_dynamic): which graphs have them, and their values for
one call's inputs."""
import torch

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def number_meta(node):
    """The value of a node that computes a number (a size, `sym_size`, arithmetic on sizes)."""
    v = node.meta.get("val")
    return v if isinstance(v, (*_SYM_TYPES, int, float, bool)) else None


def is_symbolic(nodes):
    import sympy

    def sym(v):
        return isinstance(v, _SYM_TYPES) and not sympy.sympify(v.node.expr).is_number

    for n in nodes:
        v = n.meta.get("val")
        if sym(v) or (isinstance(v, torch.Tensor) and any(sym(d) for d in (*v.shape, *v.stride()))):
            return True
    return False


def concrete(v, bindings):
    """A number or symbolic number, evaluated with the sizes in `bindings` (symbol -> int)."""
    if not isinstance(v, _SYM_TYPES):
        return v
    import sympy

    expr = sympy.sympify(sympy.sympify(v.node.expr).xreplace(bindings))
    if not expr.is_number:
        raise NotImplementedError(f"torchtpu.compile: the size {v.node.expr} depends on {sorted(map(str, expr.free_symbols))}, "
                                  "which no graph input determines")
    return bool(expr) if isinstance(v, torch.SymBool) else float(expr) if isinstance(v, torch.SymFloat) else int(expr)


def lookup(by_sizes, placeholders, args, specialize):
    """The specialization of a symbolic graph for the sizes of these inputs (made on first use)."""
    import sympy

    bindings = {}

    def bind(sym, value):
        if isinstance(sym, torch.SymInt) and isinstance(sym.node.expr, sympy.Symbol):
            bindings[sym.node.expr] = int(value)

    for node, a in zip(placeholders, args):
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor):
            for sym, n in zip((*meta.shape, *meta.stride(), meta.storage_offset()), (*a.shape, *a.stride(), a.storage_offset())):
                bind(sym, n)
        else:
            bind(meta, a)
    key = tuple(bindings.items())
    found = by_sizes.get(key)
    if found is None:
        found = by_sizes[key] = specialize(bindings)
    return found
