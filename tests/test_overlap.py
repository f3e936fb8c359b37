"""Writes through memory that aliases itself or the call's inputs get PyTorch's CPU errors
("unsupported operation: ..."), in strict and fused eager mode; writes CPU allows give CPU's
values. Where PyTorch cannot tell and CPU's loops run over the aliased memory (an unfold), tpu
refuses with the same error rather than give another answer."""
import warnings

import pytest
import torch
from helpers import TPU

INTERNAL = "unsupported operation: more than one element of the written-to tensor refers to a single memory location"
PARTIAL = "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location"


def expanded(device):
    return torch.zeros(1, 4, device=device).expand(3, 4)


def span(device):
    return torch.arange(10.0, device=device)


CASES = {
    "add_ on expand": (lambda d: expanded(d).add_(1), INTERNAL),
    "copy_ into expand": (lambda d: expanded(d).copy_(torch.ones(3, 4, device=d)), INTERNAL),
    "copy_ from the host into expand": (lambda d: expanded(d).copy_(torch.ones(3, 4)), INTERNAL),
    "normal_ on expand": (lambda d: expanded(d).normal_(), INTERNAL),
    "scatter_ on expand": (lambda d: expanded(d).scatter_(0, torch.zeros(1, 4, dtype=torch.long, device=d), 1.0), INTERNAL),
    "addmm_ on expand": (lambda d: expanded(d).addmm_(torch.ones(3, 2, device=d), torch.ones(2, 4, device=d)), INTERNAL),
    "out= expand": (lambda d: torch.add(torch.ones(3, 4, device=d), 1, out=expanded(d)), INTERNAL),
    "mm out= expand": (lambda d: torch.mm(torch.ones(2, 2, device=d), torch.ones(2, 2, device=d),
                                        out=torch.zeros(1, 2, device=d).expand(2, 2)), INTERNAL),
    "out= partly over its input": (lambda d: (lambda x: torch.add(x[:8], 1, out=x[2:]))(span(d)), PARTIAL),
    "mul_ by a shifted view of itself": (lambda d: (lambda x: x[1:].mul_(x[:-1]))(span(d)), PARTIAL),
    "copy_ from a shifted view of itself": (lambda d: (lambda x: x[1:].copy_(x[:-1]))(span(d)), PARTIAL),
    "add_ of its own transpose": (lambda d: (lambda x: x.t().add_(x))(torch.ones(3, 3, device=d)), PARTIAL),
    "cat out= partly over its input": (lambda d: (lambda x: torch.cat([x[:2]], out=x[1:3]))(torch.ones(4, device=d)), PARTIAL),
    # Ops whose output elements are not their input's elements in place: out= the input itself
    # is refused too.
    "cat out= its input": (lambda d: (lambda x: torch.cat([x], out=x))(span(d)), PARTIAL),
    "gather out= its input": (lambda d: (lambda x: torch.gather(x, 0, torch.arange(10, device=d).flip(0), out=x))(span(d)), PARTIAL),
    "index_select out= its input": (lambda d: (lambda x: torch.index_select(x, 0, torch.arange(10, device=d), out=x))(span(d)), PARTIAL),
    "masked_select out= its input": (lambda d: (lambda x: torch.masked_select(x, x >= 0, out=x))(span(d)), PARTIAL),
    "take out= its input": (lambda d: (lambda x: torch.take(x, torch.arange(10, device=d), out=x))(span(d)), PARTIAL),
    "kthvalue out= its input": (lambda d: (lambda x: torch.kthvalue(x, 5, out=(x, torch.empty((), dtype=torch.long, device=d))))(span(d)), PARTIAL),
    # Allowed on CPU: each copy of an element gets one value, or the views are the same.
    "fill_ on expand": (lambda d: expanded(d).fill_(2.0), None),
    "zero_ on expand": (lambda d: expanded(d).zero_(), None),
    "threshold_ on expand": (lambda d: torch.nn.functional.threshold_(expanded(d), 0.5, 3.0), None),
    "out= its own input": (lambda d: (lambda x: torch.add(x, 1, out=x))(span(d)), None),
    "add_ of itself": (lambda d: (lambda x: x.add_(x))(span(d)), None),
    "add_ on disjoint halves": (lambda d: (lambda x: x[:5].add_(x[5:]))(span(d)), None),
    "setitem of a row of expand": (lambda d: (lambda x: (x.__setitem__(0, 1.0), x)[1])(expanded(d)), None),
}


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("name", list(CASES))
def test_overlapping_writes_match_cpu(name, mode):
    fn, error = CASES[name]
    with pytest.raises(RuntimeError, match=error) if error else warnings.catch_warnings():
        want = fn("cpu")
    was = torch.tpu.is_fused_eager()
    torch.tpu.set_fused_eager(mode == "fused")
    try:
        if error:
            with pytest.raises(RuntimeError, match=error):
                fn(TPU)
                torch.tpu.synchronize()
        else:
            torch.testing.assert_close(fn(TPU).cpu(), want)
    finally:
        torch.tpu.set_fused_eager(was)


def test_a_write_through_overlapping_windows_is_refused():
    # CPU's loop multiplies the elements two windows share twice; a program computes the
    # windows whole, so tpu refuses (PyTorch's error) rather than give another answer.
    torch.arange(8.0).unfold(0, 4, 2).mul_(2)
    with pytest.raises(RuntimeError, match=INTERNAL):
        torch.arange(8.0, device=TPU).unfold(0, 4, 2).mul_(2)
    x = torch.arange(8.0, device=TPU)
    x.unfold(0, 4, 4).mul_(2)  # windows that do not overlap
    torch.testing.assert_close(x.cpu(), torch.arange(8.0) * 2)


def _inplace_samples():
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        # (Dropouts draw other numbers on each device; resizes leave new elements uninitialized.)
        if op.inplace_variant is None or op.name.startswith(("nn.functional.dropout", "nn.functional.alpha", "nn.functional.feature", "resize")):
            continue
        for s in op.sample_inputs("cpu", torch.float32):
            if isinstance(s.input, torch.Tensor) and s.input.dim() >= 1 and s.input.numel() >= 2:
                yield op, s
                break


def test_every_inplace_op_on_an_expanded_tensor_raises_cpus_error_or_gives_its_values():
    """Over PyTorch's OpInfo samples: an in-place op whose self is expanded raises CPU's error
    where CPU raises, and where CPU writes, tpu either gives CPU's values or refuses with
    PyTorch's overlap error (never another answer)."""
    from torch.utils._pytree import tree_map

    to_tpu = lambda x: x.to(TPU) if isinstance(x, torch.Tensor) else x  # noqa: E731
    checked, wrong = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, s in _inplace_samples():
            shape = (2,) + tuple(s.input.shape[1:])
            try:
                want = op.inplace_variant(s.input[:1].clone().expand(shape), *s.args, **s.kwargs)
                cpu_error = None
            except Exception as e:  # noqa: BLE001
                want, cpu_error = None, e
            if cpu_error is not None and INTERNAL not in str(cpu_error):
                continue  # another error (its sample does not broadcast to the expanded shape)
            args, kwargs = tree_map(to_tpu, s.args), tree_map(to_tpu, s.kwargs)
            try:
                got = op.inplace_variant(s.input[:1].clone().to(TPU).expand(shape), *args, **kwargs).cpu()
                tpu_error = None
            except Exception as e:  # noqa: BLE001
                got, tpu_error = None, e
            checked += 1
            if cpu_error is not None:
                if not (type(tpu_error) is type(cpu_error) and str(tpu_error) == str(cpu_error)):
                    wrong.append((op.name, "CPU raises", repr(tpu_error)[:200]))
            elif tpu_error is not None:
                if INTERNAL not in str(tpu_error):
                    wrong.append((op.name, "CPU writes", repr(tpu_error)[:200]))
            elif not torch.allclose(got, want, atol=1e-5, rtol=1e-5, equal_nan=True):
                wrong.append((op.name, "values differ"))
    assert checked > 100 and wrong == [], wrong


def test_stack_out_stacks():
    a = torch.randn(2, 3)
    want = torch.ops.aten._stack.out([a, a * 2], 0, out=torch.empty(0))
    got = torch.ops.aten._stack.out([a.to(TPU), a.to(TPU) * 2], 0, out=torch.empty(0, device=TPU))
    assert got.shape == (2, 2, 3)
    torch.testing.assert_close(got.cpu(), want)
    for dim in (-1, 1, 2):
        torch.testing.assert_close(torch.ops.aten._stack([a.to(TPU), a.to(TPU)], dim).cpu(), torch.ops.aten._stack([a, a], dim))
    with pytest.raises(RuntimeError, match=r"stack expects each tensor to be equal size, but got \[2, 3\] at entry 0 and \[3\] at entry 1"):
        torch.ops.aten._stack([a.to(TPU), torch.ones(3, device=TPU)], 0)


def test_nonzero_out_must_be_int64():
    x = torch.tensor([0.0, 1.0, 2.0])
    with pytest.raises(RuntimeError) as cpu:
        torch.nonzero(x, out=torch.empty(0))
    with pytest.raises(RuntimeError) as tpu:
        torch.nonzero(x.to(TPU), out=torch.empty(0, device=TPU))
    assert str(tpu.value) == str(cpu.value)
    out = torch.empty(0, dtype=torch.long, device=TPU)
    torch.nonzero(x.to(TPU), out=out)
    torch.testing.assert_close(out.cpu(), torch.nonzero(x))
