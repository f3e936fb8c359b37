"""Out-of-range indices raise PyTorch's error instead of reading clamped values.

Every op that reads user-given indices checks them like PyTorch's CPU kernels: the same
exception class and message. With CPU index tensors (`x[[0, 10]]`, `x[cpu_index]`) the call
raises, as in PyTorch. With indices on tpu the check runs on the device and its error is raised
at the next synchronization (a read to the host, .item(), torch.tpu.synchronize()), the way
CUDA reports device-side errors; the message starts with PyTorch's text."""
import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, check, make, to_tpu

T = torch.tensor
L = torch.long


@pytest.fixture(autouse=True)
def _isolated():
    """A test that fails before reading its deferred error must not hand it to the next."""
    yield
    try:
        torch.tpu.synchronize()
    except Exception:  # noqa: BLE001
        pass


def cpu_error(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("expected the CPU call to raise")


def first_line(e):
    return str(e).splitlines()[0]


def clone_all(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


# Each case: (fn, make_args(bad)) where make_args returns CPU arguments holding the index
# value `bad` somewhere; BADS: out-of-range values for that case (positive and negative).
def _x(*shape):
    return make(shape)


CASES = {
    "index": (lambda x, i: x[i], lambda b: [_x(5), T([0, b])]),
    "index_dim1": (lambda x, i: x[:, i], lambda b: [_x(4, 5), T([[1], [b]])]),
    "index_two": (lambda x, i, j: x[i, j], lambda b: [_x(4, 5), T([0, 1]), T([2, b])]),
    "index_two_order": (lambda x, i, j: x[i, j], lambda b: [_x(4, 5), T([0, 7]), T([b, 1])]),
    "index_mask_and_int": (lambda x, m, i: x[m, i], lambda b: [_x(4, 5, 6), T([True, False, True, True]), T([b])]),
    "index_int32": (lambda x, i: x[i], lambda b: [_x(5, 2), T([b, 0], dtype=torch.int32)]),
    "index_put": (lambda x, i, v: x.index_put_((i,), v), lambda b: [_x(5), T([1, b]), T(2.0)]),
    "index_put_acc": (lambda x, i, v: x.index_put_((i,), v, accumulate=True), lambda b: [_x(5, 3), T([b, 1]), _x(3)]),
    "setitem": (lambda x, i: x.__setitem__(i, 1.0), lambda b: [_x(5), T([b])]),
    "index_select_1d": (lambda x, i: x.index_select(0, i), lambda b: [_x(5), T([0, b])]),
    "index_select_dim0": (lambda x, i: x.index_select(0, i), lambda b: [_x(5, 3), T([b])]),
    "index_select_dim1": (lambda x, i: x.index_select(1, i), lambda b: [_x(3, 5), T([0, b])]),
    "index_select_dim2": (lambda x, i: x.index_select(-1, i), lambda b: [_x(2, 3, 5), T([b, 1])]),
    "index_select_0d": (lambda x, i: x.index_select(0, i), lambda b: [_x(), T([b])]),
    "gather": (lambda x, i: x.gather(0, i), lambda b: [_x(5), T([3, b])]),
    "gather_dim1": (lambda x, i: torch.gather(x, 1, i), lambda b: [_x(3, 5), T([[0, 1], [b, 2]])]),
    "scatter": (lambda x, i, s: x.scatter_(0, i, s), lambda b: [_x(5), T([b, 1]), _x(2)]),
    "scatter_value": (lambda x, i: x.scatter(1, i, 1.5), lambda b: [_x(2, 5), T([[0, b]])]),
    "scatter_reduce_arg": (lambda x, i, s: x.scatter(0, i, s, reduce="add"), lambda b: [_x(5), T([b]), _x(1)]),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), lambda b: [_x(5, 2), T([[0, 1], [b, 0]]), _x(2, 2)]),
    "scatter_reduce": (lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), lambda b: [_x(5), T([1, b]), _x(2)]),
    "scatter_reduce_mean": (lambda x, i, s: x.scatter_reduce(1, i, s, "mean", include_self=False),
                            lambda b: [_x(2, 5), T([[0, b]]), _x(1, 2)]),
    "index_add_1d": (lambda x, i, s: x.index_add_(0, i, s), lambda b: [_x(5), T([b, 0]), _x(2)]),
    "index_add_dim0": (lambda x, i, s: x.index_add(0, i, s), lambda b: [_x(5, 3), T([1, b]), _x(2, 3)]),
    "index_add_alpha": (lambda x, i, s: x.index_add(0, i, s, alpha=2.0), lambda b: [_x(5, 3), T([1, b]), _x(2, 3)]),
    "index_add_mid": (lambda x, i, s: x.index_add(1, i, s), lambda b: [_x(2, 5, 3), T([b]), _x(2, 1, 3)]),
    "index_add_int32": (lambda x, i, s: x.index_add(1, i, s), lambda b: [_x(3, 5), T([b], dtype=torch.int32), _x(3, 1)]),
    "index_copy": (lambda x, i, s: x.index_copy_(0, i, s), lambda b: [_x(5), T([0, b]), _x(2)]),
    "index_copy_dim1": (lambda x, i, s: x.index_copy(1, i, s), lambda b: [_x(3, 5), T([b]), _x(3, 1)]),
    "index_fill": (lambda x, i: x.index_fill_(0, i, -1.0), lambda b: [_x(5), T([b, 2])]),
    "index_fill_dim1": (lambda x, i: x.index_fill(1, i, 3.0), lambda b: [_x(3, 5), T([1, b])]),
    "index_fill_0d_index": (lambda x, i: x.index_fill(1, i, 3.0), lambda b: [_x(3, 5), T(b)]),
    "index_reduce": (lambda x, i, s: x.index_reduce(0, i, s, "prod"), lambda b: [_x(5, 2), T([b]), _x(1, 2)]),
    "index_reduce_1d": (lambda x, i, s: x.index_reduce_(0, i, s, "amax"), lambda b: [_x(5), T([0, b]), _x(2)]),
    "index_reduce_exclude_self": (lambda x, i, s: x.index_reduce(0, i, s, "mean", include_self=False),
                                  lambda b: [_x(5, 2), T([b]), _x(1, 2)]),
    "take": (lambda x, i: x.take(i), lambda b: [_x(5), T([[0, b], [1, 2]])]),
    "take_2d_self": (lambda x, i: torch.take(x, i), lambda b: [_x(2, 3), T([b, 5])]),
    "put": (lambda x, i, s: x.put_(i, s), lambda b: [_x(5), T([b, 1]), _x(2)]),
    "put_acc": (lambda x, i, s: x.put(i, s, accumulate=True), lambda b: [_x(2, 3), T([1, b]), _x(2)]),
    "embedding": (lambda i, w: F.embedding(i, w), lambda b: [T([[0, 2], [b, 1]]), _x(5, 3)]),
    "embedding_padding": (lambda i, w: F.embedding(i, w, padding_idx=1), lambda b: [T([b, 1]), _x(5, 3)]),
    "embedding_bag_sum": (lambda i, w, o: F.embedding_bag(i, w, o, mode="sum"), lambda b: [T([0, b, 1]), _x(5, 3), T([0])]),
    "embedding_bag_mean": (lambda i, w, o: F.embedding_bag(i, w, o), lambda b: [T([1, 2, b]), _x(5, 3), T([0])]),
    "embedding_bag_max": (lambda i, w, o: F.embedding_bag(i, w, o, mode="max"), lambda b: [T([1, b, 0, 2]), _x(5, 3), T([0, 2])]),
    "embedding_bag_padding": (lambda i, w, o: F.embedding_bag(i, w, o, padding_idx=0),
                              lambda b: [T([1, b, 0, 2]), _x(5, 3), T([0, 2])]),
    "max_unpool2d": (lambda x, i: F.max_unpool2d(x, i, 2), lambda b: [_x(1, 2, 2, 2), T([[[[0, 1], [2, 3]], [[3 * b, 1], [2, 3]]]])]),
    "max_unpool3d": (lambda x, i: F.max_unpool3d(x, i, (1, 2, 2)), lambda b: [_x(1, 1, 1, 2, 2), T([[[[[1, 3 * b], [2, 3]]]]])]),
    "embedding_bag_f64": (lambda i, w, o: F.embedding_bag(i, w.double(), o), lambda b: [T([1, b]), _x(5, 3), T([0, 1])]),
}


def bads(name):
    """Out-of-range values for the case: past the end, and below the valid negative range."""
    return [9, -7] if name != "index_select_0d" else [3, -2]


PARAMS = [(n, b) for n in CASES for b in bads(n)]


def run_tpu(fn, args):
    out = fn(*args)
    return out if isinstance(out, torch.Tensor) else args[0]


@pytest.mark.parametrize("name,bad", PARAMS, ids=[f"{n}[{b}]" for n, b in PARAMS])
def test_device_index_raises_at_next_sync(name, bad):
    fn, make_args = CASES[name]
    args = make_args(bad)
    expected = cpu_error(fn, *clone_all(args))
    dev = to_tpu(args)
    out = run_tpu(fn, dev)  # asynchronous: no error at the call
    with pytest.raises(type(expected)) as info:
        out.cpu()
    assert first_line(info.value) == first_line(expected)
    assert "asynchronously" in str(info.value)
    # The error is reported once: later reads work.
    assert torch.equal((dev[0] * 0).cpu(), torch.zeros_like(args[0]))


# Calls with index tensors fed from host memory raise at the call, exactly like PyTorch.
HOST_CASES = {
    "x[cpu_index]": (lambda x: x[T([0, 10])], [5]),
    "x[cpu_index] negative": (lambda x: x[T([-6])], [5]),
    "x[cpu_i, cpu_j]": (lambda x: x[T([0, 1]), T([9, 1])], [4, 5]),
    "x[:, cpu_index]": (lambda x: x[:, T([[2], [-6]])], [4, 5]),
    "x[cpu_index] = v": (lambda x: x.__setitem__(T([1, 7]), 2.0), [5]),
    "x[list] += v": (lambda x: x.index_put_((T([7]),), T(1.0), accumulate=True), [5, 2]),
    "index_select 0-d cpu index": (lambda x: x.index_select(0, T(5)), [5]),
    "take 0-d cpu index": (lambda x: x.take(T(-7)), [2, 3]),
    "index_fill 0-d cpu index": (lambda x: x.index_fill(0, T(8), 1.0), [4]),
}


@pytest.mark.parametrize("name", list(HOST_CASES))
def test_host_index_raises_at_the_call(name):
    fn, shape = HOST_CASES[name]
    x = make(shape)
    expected = cpu_error(fn, x.clone())
    with pytest.raises(type(expected)) as info:
        fn(x.to(TPU))
    assert str(info.value).splitlines()[0] == first_line(expected)
    assert "asynchronously" not in str(info.value)
    torch.tpu.synchronize()  # nothing left pending


def test_host_index_put_raises_before_writing():
    x = make([5])
    d = x.to(TPU)
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        d[T([1, 7])] = 2.0
    torch.testing.assert_close(d.cpu(), x)


# ---- where the deferred error is raised --------------------------------------------------------

def bad_gather():
    x = torch.randn(5, device=TPU)
    return x.gather(0, T([1, 5], device=TPU))


GATHER_MSG = "index 5 is out of bounds for dimension 0 with size 5"


@pytest.mark.parametrize("sync", ["cpu", "item", "tolist", "print", "synchronize", "other tensor", "nonzero"])
def test_synchronization_points_raise(sync):
    y = bad_gather()
    other = torch.ones(3, device=TPU)
    with pytest.raises(RuntimeError, match=GATHER_MSG):
        if sync == "cpu":
            y.cpu()
        elif sync == "item":
            y.sum().item()
        elif sync == "tolist":
            y.tolist()
        elif sync == "print":
            repr(y)
        elif sync == "synchronize":
            torch.tpu.synchronize()
        elif sync == "other tensor":
            other.cpu()
        else:
            torch.nonzero(other)
    # Reported once: the same reads work now.
    assert other.cpu().tolist() == [1.0, 1.0, 1.0]
    torch.tpu.synchronize()


def test_no_error_before_synchronization():
    y = bad_gather()
    z = (y * 2).exp()  # later ops queue normally
    assert z.shape == (2,)
    with pytest.raises(RuntimeError, match=GATHER_MSG):
        torch.tpu.synchronize()


def test_first_failure_wins_and_later_ops_are_clean():
    x = torch.randn(5, device=TPU)
    x.index_select(0, T([0, 8], device=TPU))
    x[T([-9], device=TPU)]
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.tpu.synchronize()
    # No stale error: new ops (with and without checks) run and read back.
    i = T([4, -5, 2], device=TPU)
    torch.testing.assert_close(x[i].cpu(), x.cpu()[T([4, -5, 2])])
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)
    torch.tpu.synchronize()


def test_many_ops_without_synchronization():
    # A long loop that never synchronizes keeps the first failure, and only that.
    x = torch.randn(8, device=TPU)
    good = T([1, 2], device=TPU)
    x.take(T([0, 99], device=TPU))
    for _ in range(3000):
        x = x.index_fill(0, good, 0.5)
    x.gather(0, T([-1], device=TPU))
    with pytest.raises(IndexError, match=r"out of range: tried to access index 99 on a tensor of 8 elements\."):
        x.cpu()
    # And a long clean loop raises nothing.
    for _ in range(3000):
        x = x.index_fill(0, good, 0.25)
    torch.tpu.synchronize()
    assert x.cpu()[1].item() == 0.25


def test_message_keeps_pytorch_text_first():
    y = bad_gather()
    with pytest.raises(RuntimeError) as info:
        y.cpu()
    text = str(info.value)
    assert text.startswith(GATHER_MSG + "\n")
    assert "gather" in text.splitlines()[1]


def test_list_indices_are_device_indices():
    # PyTorch turns a list index into a tensor on the indexed tensor's device before the op
    # runs (as on CUDA): its error comes at the next synchronization.
    x = make([5])
    expected = cpu_error(lambda x: x[[0, 10]], x)
    out = x.to(TPU)[[0, 10]]
    with pytest.raises(IndexError) as info:
        out.cpu()
    assert first_line(info.value) == first_line(expected)


def test_unsafe_index_in_eager_checks_like_cpu():
    # In eager mode PyTorch's _unsafe_index / _unsafe_index_put run index / index_put (and
    # their checks); only compiled graphs skip them.
    x = make([5])
    for fn in [lambda x: torch.ops.aten._unsafe_index(x, [T([1, 9])]),
               lambda x: torch.ops.aten._unsafe_index_put(x, [T([9])], T(1.0))]:
        expected = cpu_error(fn, x)
        with pytest.raises(type(expected)) as info:
            fn(x.to(TPU))
        assert first_line(info.value) == first_line(expected)


def test_programs_without_checks_are_unaffected():
    x = torch.randn(4, 4, device=TPU)
    y = torch.randn(4, 4, device=TPU)
    bad_gather()
    with pytest.raises(RuntimeError, match=GATHER_MSG):
        torch.tpu.synchronize()
    for _ in range(10):
        z = (x + y) @ y
    torch.testing.assert_close(z.cpu(), (x.cpu() + y.cpu()) @ y.cpu())
    torch.tpu.synchronize()


def test_autograd_backward_after_a_clean_forward():
    w = torch.randn(6, 3, device=TPU, requires_grad=True)
    i = T([[0, 5], [2, -1]])
    wc = w.detach().cpu().requires_grad_()
    F.embedding(i.clamp(min=0), wc).sum().backward()
    F.embedding(i.clamp(min=0).to(TPU), w).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad)
    # The same forward with a bad index raises at the backward's read.
    w.grad = None
    F.embedding(i.to(TPU), w).sum().backward()
    with pytest.raises(IndexError, match="index out of range in self"):
        w.grad.cpu()


# ---- compiled graphs ----------------------------------------------------------------------------

def test_compiled_graph_raises_at_next_read():
    def f(x, i):
        return torch.gather(x, 1, i) * 2 + 1

    compiled = torch.compile(f, backend="tpu")
    x = make([3, 4])
    good = T([[0, 3], [1, 2], [0, 1]])
    torch.testing.assert_close(compiled(x.to(TPU), good.to(TPU)).cpu(), f(x, good))
    bad = T([[0, 3], [1, 4], [2, 1]])
    expected = cpu_error(f, x, bad)
    out = compiled(x.to(TPU), bad.to(TPU))
    with pytest.raises(RuntimeError) as info:
        out.cpu()
    assert first_line(info.value) == first_line(expected)
    assert "compiled graph" in str(info.value)
    torch.tpu.synchronize()


def test_compiled_graph_indexing_and_embedding():
    def f(w, i, j):
        return F.embedding(i, w).sum(-1) + w[j].sum()

    compiled = torch.compile(f, backend="tpu")
    w = make([6, 3])
    i, j = T([[0, 5], [2, 3]]), T([1, -6])
    torch.testing.assert_close(compiled(w.to(TPU), i.to(TPU), j.to(TPU)).cpu(), f(w, i, j), atol=1e-5, rtol=1e-5)
    for bi, bj in [(T([[0, 6], [2, 3]]), j), (i, T([1, -7]))]:
        expected = cpu_error(f, w, bi, bj)
        out = compiled(w.to(TPU), bi.to(TPU), bj.to(TPU))
        with pytest.raises(type(expected)) as info:
            out.cpu()
        assert first_line(info.value) == first_line(expected)


# ---- in-range values ------------------------------------------------------------------------------

def good_index(name):
    """The case's arguments with its index at the edges of the valid range."""
    fn, make_args = CASES[name]
    args = make_args(0)
    # The largest valid value, and the most negative one where PyTorch wraps negatives.
    for b in ([4, -5] if "0d" not in name else [0]):
        try:
            fn(*clone_all(make_args(b)))
        except Exception:  # noqa: BLE001  (this op forbids negatives)
            continue
        yield make_args(b)
    yield args


VALUE_PARAMS = [n for n in CASES if "order" not in n]


@pytest.mark.parametrize("name", VALUE_PARAMS)
def test_in_range_values_match_cpu(name):
    fn, _ = CASES[name]
    for args in good_index(name):
        cpu = clone_all(args)
        expected = fn(*cpu)
        expected = expected if isinstance(expected, torch.Tensor) else cpu[0]
        dev = to_tpu(args)
        got = run_tpu(fn, dev)
        torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    torch.tpu.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_random_gathers_and_scatters_match_cpu(dtype):
    x = make((6, 7), dtype)
    i = torch.randint(-6, 6, (10,))
    check(lambda x, i: x[i], x, i)
    check(lambda x, i: x[:, i.clamp(min=-7)], x, i)
    check(lambda x, i: x.index_select(1, i.abs()), x, i)
    check(lambda x, i: x.gather(0, (i.abs() % 6).view(2, 5)), x, i)
    check(lambda x, i: x.take(i * 7), x, i)
    check(lambda x, i: x.index_fill(0, i, True if dtype == torch.bool else 2), x, i)
    if dtype != torch.bool:
        check(lambda x, i, v: x.index_put((i,), v, accumulate=True), x, i, make((10, 7), dtype))
    torch.tpu.synchronize()


def test_non_contiguous_index_views():
    x = make((6, 5))
    i = torch.randint(0, 6, (4, 3)).t()  # transposed view
    check(lambda x, i: x[i], x, i)
    bad = i.clone()
    bad[2, 1] = 6
    bad = bad.t().contiguous().t()
    expected = cpu_error(lambda x, i: x[i], x, bad)
    out = x.to(TPU)[bad.to(TPU)]
    with pytest.raises(IndexError) as info:
        out.cpu()
    assert first_line(info.value) == first_line(expected)


def test_max_unpool_reports_the_last_bad_index_like_cpu():
    # (Across planes PyTorch's threads race for which bad index it reports.)
    x = make([1, 2, 2, 2])
    i = T([[[[0, 20], [30, 1]], [[0, 1], [2, 3]]]])
    expected = cpu_error(lambda x, i: F.max_unpool2d(x, i, 2), x, i)
    out = F.max_unpool2d(x.to(TPU), i.to(TPU), 2)
    with pytest.raises(RuntimeError) as info:
        out.cpu()
    assert first_line(info.value) == first_line(expected)


# ---- edge cases: empty tensors, 0-d tensors, size-0 dims ----------------------------------------

def same_outcome(fn, *args):
    """fn on tpu raises what it raises on CPU (at the call or at the next read), or returns
    the same values."""
    cpu = clone_all(args)
    try:
        out = fn(*cpu)
        expected = None
    except Exception as e:  # noqa: BLE001
        expected = e
    dev = to_tpu(args)
    try:
        got = fn(*dev)
        got = (got if isinstance(got, torch.Tensor) else dev[0]).cpu()
        torch.tpu.synchronize()  # reading an empty result reads nothing
    except Exception as e:  # noqa: BLE001
        assert expected is not None, f"tpu raised {type(e).__name__}: {e}; CPU did not"
        assert type(e) is type(expected) and first_line(e) == first_line(expected), f"tpu: {e!r}; CPU: {expected!r}"
        return
    assert expected is None, f"tpu did not raise; CPU raised {expected!r}"
    torch.testing.assert_close(got, out if isinstance(out, torch.Tensor) else cpu[0])


E = torch.empty(0, dtype=L)
EDGES = {
    "index 0-d index": (lambda x, i: x[i], [_x(5), T(7)]),
    "index empty result dim": (lambda x, i: x[i], [_x(5, 0), T([10])]),
    "index size-0 dim": (lambda x, i: x[i], [_x(0, 3), T([0])]),
    "index empty index": (lambda x, i: x[i], [_x(0, 3), E]),
    "index_put 0-d index": (lambda x, i: x.index_put_((i,), T(1.0)), [_x(5), T(7)]),
    "index_select 0-d self ok": (lambda x, i: x.index_select(0, i), [_x(), T([0])]),
    "index_select 0-d self -1": (lambda x, i: x.index_select(0, i), [_x(), T([-1])]),
    "index_select empty self 1-d": (lambda x, i: x.index_select(0, i), [_x(0), T([0])]),
    "index_select empty self 2-d": (lambda x, i: x.index_select(0, i), [_x(5, 0), T([0, 9])]),
    "index_select size-0 axis": (lambda x, i: x.index_select(0, i), [_x(0, 4), T([0])]),
    "index_select empty index": (lambda x, i: x.index_select(1, i), [_x(3, 4), E]),
    "gather 0-d": (lambda x, i: x.gather(0, i), [_x(), T(3)]),
    "gather size-0 dim": (lambda x, i: x.gather(0, i), [_x(0, 3), T([[0, 0]])]),
    "gather empty": (lambda x, i: x.gather(0, i), [_x(3, 0), torch.zeros(1, 0, dtype=L)]),
    "scatter 0-d": (lambda x, i: x.scatter(0, i, 2.0), [_x(), T(1)]),
    "scatter size-0 dim": (lambda x, i, s: x.scatter(0, i, s), [_x(0, 3), T([[0, 0]]), _x(1, 2)]),
    "index_add 0-d": (lambda x, i, s: x.index_add(0, i, s), [_x(), T([3]), _x()]),
    "index_add empty 1-d": (lambda x, i, s: x.index_add(0, i, s), [_x(0), T([3]), _x(1)]),
    "index_add empty 2-d": (lambda x, i, s: x.index_add(0, i, s), [_x(5, 0), T([9]), _x(1, 0)]),
    "index_copy 0-d": (lambda x, i, s: x.index_copy(0, i, s), [_x(), T([3]), _x()]),
    "index_copy empty slices": (lambda x, i, s: x.index_copy(1, i, s), [_x(0, 2), T([3]), _x(0, 1)]),
    "index_fill 0-d -1": (lambda x, i: x.index_fill(0, i, 2.0), [_x(), T([-1])]),
    "index_fill 0-d -2": (lambda x, i: x.index_fill(0, i, 2.0), [_x(), T([-2])]),
    "index_fill empty slices": (lambda x, i: x.index_fill(0, i, 2.0), [_x(2, 0), T([3])]),
    "index_reduce empty slices": (lambda x, i, s: x.index_reduce(0, i, s, "prod"), [_x(2, 0), T([3]), _x(1, 0)]),
    "index_reduce exclude -1": (lambda x, i, s: x.index_reduce(0, i, s, "prod", include_self=False), [_x(5), T([-1]), _x(1)]),
    "index_reduce exclude -9": (lambda x, i, s: x.index_reduce(0, i, s, "amin", include_self=False), [_x(5), T([-9]), _x(1)]),
    "take 0-d self": (lambda x, i: x.take(i), [_x(), T([-1, 0])]),
    "take 0-d self -2": (lambda x, i: x.take(i), [_x(), T([-2])]),
    "take empty index": (lambda x, i: x.take(i), [_x(0), E]),
    "put empty self": (lambda x, i, s: x.put(i, s), [_x(0), T([0]), _x(1)]),
    "embedding empty weight": (lambda i, w: F.embedding(i, w), [T([0]), _x(0, 3)]),
    "embedding 0-width weight": (lambda i, w: F.embedding(i, w), [T([7]), _x(5, 0)]),
    "embedding empty index": (lambda i, w: F.embedding(i, w), [E, _x(5, 3)]),
    "embedding_bag empty index": (lambda i, w, o: F.embedding_bag(i, w, o), [E, _x(5, 3), T([0])]),
}


@pytest.mark.parametrize("name", list(EDGES))
def test_edge_cases_match_cpu(name):
    fn, args = EDGES[name]
    same_outcome(fn, *args)


# ---- _assert_async: data assertions, raised at the next synchronization like CUDA's ------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_assert_async(dtype):
    A = torch.ops.aten
    one_, zero = torch.ones((), dtype=dtype, device=TPU), torch.zeros((1,), dtype=dtype, device=TPU)
    A._assert_async(one_)
    A._assert_async.msg(one_.reshape(1, 1), "fine")
    torch.tpu.synchronize()
    A._assert_async(zero)
    with pytest.raises(RuntimeError, match="Expected Tensor with single nonzero value, but got zero"):
        torch.tpu.synchronize()
    A._assert_async.msg(zero, "my check failed")
    with pytest.raises(RuntimeError, match="my check failed"):
        zero.cpu()
    torch.tpu.synchronize()  # reported once
    for bad in (torch.ones(2, device=TPU), torch.ones(0, device=TPU)):
        with pytest.raises(RuntimeError, match="Boolean value of Tensor") as e:
            A._assert_async(bad)
        with pytest.raises(RuntimeError, match=str(e.value)):
            A._assert_async(bad.cpu())


def test_functional_assert_async_and_dep_token():
    A = torch.ops.aten
    tok = A._make_dep_token(device=TPU)
    assert tok.device.type == "tpu" and tok.shape == () and tok.dtype == torch.float32
    t2 = A._functional_assert_async.msg(torch.tensor(True, device=TPU), "ok", tok)
    assert t2.device.type == "tpu" and t2.shape == ()
    A._functional_assert_async.msg(torch.tensor(0.0, device=TPU), "functional check failed", tok)
    with pytest.raises(RuntimeError, match="functional check failed"):
        torch.tpu.synchronize()
