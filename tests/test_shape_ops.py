"""Shape ops against PyTorch on CPU: cat/stack (promotion, empty tensors), flip, roll, tril/triu,
repeat, padding, unfold and its backward, and the view ops end to end (values, gradients and
writes through views)."""
import pytest
import torch
import torch.nn.functional as F
from helpers import ALL, TPU, check, check_error, check_inplace, make, to_tpu
from test_indexing import check_grad


# ---- cat / stack ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_cat(dtype):
    a, b = make((2, 3, 4), dtype), make((2, 5, 4), dtype)
    check(lambda a, b: torch.cat([a, b], 1), a, b)
    check(lambda a, b: torch.cat([a, a, b[:, :3]], 0), a, b)
    check(lambda a, b: torch.cat([a, b[:, :3]], -1), a, b)
    check(lambda a: torch.cat([a]), a)
    check(lambda a, b: torch.cat([a.transpose(0, 2), b.transpose(0, 2)], 1), a, b)   # non-contiguous
    check(lambda a, b: torch.cat([a[:, ::2], b[:, 1::2]], 1), a, b)


def test_cat_promotion_and_empty():
    f, d, i, b = make((2, 3)), make((1, 3), torch.float64), make((3, 3), torch.int32), make((2, 3), torch.bool)
    check(lambda f, d: torch.cat([f, d]), f, d)
    check(lambda i, b: torch.cat([i, b]), i, b)
    check(lambda f, i, b: torch.cat([b, i, f]), f, i, b)
    check(lambda x: torch.cat([x, x.half()]), make((2, 3), torch.bfloat16))
    e = torch.tensor([], dtype=torch.float64)
    check(lambda e, f: torch.cat([e, f]), e, f)                  # legacy 1-D empty: skipped, still promotes
    check(lambda e, f: torch.cat([f, e, f], 1), e, f)
    check(lambda e: torch.cat([e, e.float()]), e)
    check(lambda z, f: torch.cat([z, f]), torch.zeros(0, 3), f)
    check(lambda z: torch.cat([z, z], 1), torch.zeros(0, 3))
    check(lambda i: torch.cat([i, i], 0), torch.zeros(2, 0, dtype=torch.int64))


def test_cat_out_and_grad():
    a, b = make((2, 3)), make((4, 3))
    out = torch.empty(0, device=TPU)
    torch.cat([a.to(TPU), b.to(TPU)], out=out)
    torch.testing.assert_close(out.cpu(), torch.cat([a, b]))
    out = torch.empty(6, 3, dtype=torch.float64, device=TPU)
    torch.cat([a.to(TPU), b.to(TPU)], out=out)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), torch.cat([a, b]).double())
    check_grad(lambda a, b: torch.cat([a, b.t()], 0), make((2, 3)), make((3, 4)))
    check_grad(lambda a, b: torch.stack([a, b], 1), make((2, 3)), make((2, 3)))


def test_cat_errors():
    check_error(lambda: torch.cat([]))
    check_error(lambda a, b: torch.cat([a, b]), make(()), make(()))
    check_error(lambda a, b: torch.cat([a, b]), make((3, 4)), make((3, 5)))
    check_error(lambda a, b: torch.cat([a, b]), make((3, 4)), make((3,)))
    check_error(lambda a, b: torch.cat([a, b], 2), make((3, 4)), make((3, 4)))
    check_error(lambda a: torch.cat([a, a], out=torch.empty(0, dtype=torch.long, device=a.device)), make((2,)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_stack_family(dtype):
    a, b = make((3, 4), dtype), make((3, 4), dtype)
    for dim in (0, 1, 2, -1):
        check(lambda a, b: torch.stack([a, b], dim), a, b)
    check(lambda a, b: torch.hstack([a, b]), a, b)
    check(lambda a, b: torch.vstack([a, b]), a, b)
    check(lambda a, b: torch.dstack([a, b]), a, b)
    check(lambda a, b: torch.column_stack([a[0], b[0]]), a, b)
    check(lambda a: torch.stack([a[0, 0], a[1, 1]]), a)     # 0-d items
    check_error(lambda a, b: torch.stack([a, b]), make((3,)), make((4,)))


# ---- flip / roll / rot90 / tril / triu ------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_flip_roll(dtype):
    x = make((3, 4, 5), dtype)
    for dims in [(0,), (1, 2), (0, 1, 2), (-1,), ()]:
        check(lambda a: a.flip(dims), x)
    check(lambda a: a.t().flip(0), x[0])
    check(torch.fliplr, x)
    check(torch.flipud, x)
    check(lambda a: a.flip(0), make((), dtype))
    check(lambda a: a.flip(0), make((0, 3), dtype))
    for shifts, dims in [(1, 0), (-2, 1), ((1, 3), (0, 2)), (7, -1), (0, 0), (12, 0)]:
        check(lambda a: a.roll(shifts, dims), x)
    check(lambda a: a.roll(5), x)
    check(lambda a: a.roll(-3), x.transpose(0, 2))
    check(lambda a: a.roll(2, 0), make((0, 3), dtype))
    check(lambda a: torch.rot90(a, 1, (0, 1)), x)
    check(lambda a: torch.rot90(a, -1, (1, 2)), x)


def test_flip_roll_grad_errors():
    check_grad(lambda a: a.flip(0, 1), make((3, 4)))
    check_grad(lambda a: a.roll((1, -1), (0, 1)), make((3, 4)))
    check_error(lambda a: a.flip(0, 0), make((3, 4)))
    check_error(lambda a: a.flip(2), make((3, 4)))
    check_error(lambda a: a.roll((1, 2), (0,)), make((3, 4)))
    check_error(lambda a: a.roll((1, 2)), make((3, 4)))


@pytest.mark.parametrize("dtype", ALL)
def test_tril_triu(dtype):
    x = make((5, 6), dtype)
    for k in (-7, -2, 0, 1, 3, 8):
        check(lambda a: a.tril(k), x)
        check(lambda a: a.triu(k), x)
    check(lambda a: a.tril(), make((2, 3, 4), dtype))
    check(lambda a: a.t().triu(1), x)
    check(lambda a: a.tril(), make((0, 3), dtype))
    check_inplace(lambda a: a.tril_(-1), x)
    check_inplace(lambda a: a.triu_(2), x)
    out = torch.empty(0, dtype=dtype, device=TPU)
    torch.triu(x.to(TPU), 1, out=out)
    torch.testing.assert_close(out.cpu(), x.triu(1))


def test_tril_triu_grad_errors():
    check_grad(lambda a: a.tril(1), make((4, 4)))
    check_grad(lambda a: a.triu(-1), make((3, 5)))
    check_error(lambda a: a.tril(), make((3,)))
    check_error(lambda a: a.triu(), make(()))


# ---- repeat / pad / expand ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_repeat_tile_pad(dtype):
    x = make((2, 3), dtype)
    check(lambda a: a.repeat(2, 3), x)
    check(lambda a: a.repeat(2, 1, 2), x)
    check(lambda a: a.t().repeat(1, 2), x)
    check(lambda a: a.tile((2,)), x)
    if dtype != torch.bool:
        check(lambda a: F.pad(a, (1, 2)), x)
        check(lambda a: F.pad(a, (1, 0, 0, 2), value=3), x)
        check(lambda a: F.pad(a, (-1, 1)), x)
        check(lambda a: torch.constant_pad_nd(a, (0, 0, 1, 1)), x)


def test_repeat_pad_grad():
    check_grad(lambda a: a.repeat(2, 3), make((2, 3)))
    check_grad(lambda a: F.pad(a, (1, 2, 0, 1), value=0.5), make((2, 3)))
    check_grad(lambda a: a.expand(4, 2, 3) * 1.0, make((2, 3)))


# ---- views end to end -----------------------------------------------------------------------

VIEWS = {
    "view": lambda a: a.view(4, 6),
    "reshape_t": lambda a: a.t().reshape(-1),
    "transpose": lambda a: a.transpose(0, 1),
    "permute": lambda a: a.view(2, 3, 4).permute(2, 0, 1),
    "t": lambda a: a.t(),
    "expand": lambda a: a[:1].expand(5, 6),
    "narrow": lambda a: a.narrow(1, 2, 3),
    "slice_step": lambda a: a[1::2, ::3],
    "select": lambda a: a[2],
    "select_col": lambda a: a[:, 4],
    "squeeze": lambda a: a[:1].squeeze(0),
    "unsqueeze": lambda a: a.unsqueeze(1),
    "unfold": lambda a: a.unfold(1, 3, 2),
    "unfold_overlap": lambda a: a.unfold(0, 2, 1),
    "unfold_disjoint": lambda a: a.unfold(1, 2, 3),
    "split": lambda a: a.split(2, 1)[1],
    "chunk": lambda a: a.chunk(3, 1)[2],
    "unbind": lambda a: a.unbind(1)[3],
    "diagonal": lambda a: a.diagonal(1),
    "movedim": lambda a: a.view(2, 2, 6).movedim(2, 0),
    "as_strided": lambda a: a.as_strided((3, 3), (6, 1), 2),
    "flatten": lambda a: a.view(2, 2, 6).flatten(1),
    "unflatten": lambda a: a.unflatten(1, (2, 3)),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_values_and_grads(name):
    fn = VIEWS[name]
    x = make((4, 6))
    check(lambda a: fn(a).contiguous(), x)
    check(lambda a: fn(a) * 2 + 1, x)
    check_grad(lambda a: fn(a) * 1.0, x)


@pytest.mark.parametrize("name", sorted(set(VIEWS) - {"expand", "unfold", "unfold_overlap", "as_strided"}))
def test_writes_through_views(name):
    fn = VIEWS[name]
    x = make((4, 6))
    a, b = x.clone(), x.to(TPU)
    fn(a).mul_(3).add_(1)
    fn(b).mul_(3).add_(1)
    torch.testing.assert_close(b.cpu(), a)
    v = make(fn(a).shape)
    fn(a).copy_(v)
    fn(b).copy_(v.to(TPU))
    torch.testing.assert_close(b.cpu(), a)


def test_unfold_backward_direct():
    g = make((4, 3, 2))
    for size, step in [(2, 1), (2, 2), (2, 3)]:
        n = (6 - size) // step + 1
        g = make((n, 3, size))
        check(lambda g: torch.ops.aten.unfold_backward(g, [6, 3], 0, size, step), g)
    check(lambda g: torch.ops.aten.unfold_backward(g, [3, 7], 1, 3, 2), make((3, 3, 3)))
    check_grad(lambda a: a.unfold(2, 4, 3) * 1.0, make((2, 3, 10)))


def test_select_slice_backward():
    check(lambda g: torch.ops.aten.select_backward(g, [3, 4], 0, 1), make((4,)))
    check(lambda g: torch.ops.aten.slice_backward(g, [5, 4], 0, 1, 5, 2), make((2, 4)))
    check_grad(lambda a: a[1:4:2, 1] * 1.0, make((5, 4)))


def test_tril_triu_indices():
    for r, c, off in [(3, 4, 0), (4, 3, 1), (5, 5, -2), (0, 3, 0), (3, 3, 10), (3, 3, -10), (1, 6, 2)]:
        for fn in (torch.tril_indices, torch.triu_indices):
            expected = fn(r, c, off)
            got = fn(r, c, off, device=TPU)
            assert got.device.type == "tpu"
            torch.testing.assert_close(got.cpu(), expected)
    got = torch.triu_indices(4, 5, 1, dtype=torch.int32, device=TPU)
    torch.testing.assert_close(got.cpu(), torch.triu_indices(4, 5, 1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="row must be non-negative"):
        torch.tril_indices(-1, 3, device=TPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_channel_shuffle(dtype):
    check(lambda a: F.channel_shuffle(a, 2), make((2, 6, 3, 2), dtype))
    check(lambda a: F.channel_shuffle(a, 3), make((1, 6, 4), dtype))
    check(lambda a: torch.nn.ChannelShuffle(2)(a.transpose(2, 3)), make((2, 4, 3, 5), dtype))
    check_error(lambda a: F.channel_shuffle(a, 2), make((1, 5, 2), dtype))
    check_error(lambda a: F.channel_shuffle(a, 2), make((1, 4), dtype))


# ---- narrow_copy.out, _chunk_cat --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_narrow_copy_out(dtype):
    x = make((5, 6), dtype)
    f = lambda a, d, s, n: torch.narrow_copy(a, d, s, n, out=torch.empty(0, dtype=dtype, device=a.device))
    for args in ((1, 1, 3), (0, -3, 2), (-1, 0, 0), (0, 5, 0)):
        check(f, x, *args)
        check(f, x.t(), *args)
    check(f, make((0, 3), dtype), 1, 1, 2)
    check_error(f, make((), dtype), 0, 0, 1)
    check_error(f, x, 1, 7, 1)
    check_error(f, x, 1, 4, 3)
    check_error(lambda a: torch.narrow_copy(a, 0, 0, 1, out=torch.empty(0, dtype=torch.float64, device=a.device)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_chunk_cat(dtype):
    ts = [make((5, 3), dtype), make((2, 3), dtype), make((7, 3), dtype).t().t()]
    for n in (1, 2, 3, 8):
        check(lambda xs: torch._chunk_cat(xs, 0, n), ts)
        check(lambda xs: torch._chunk_cat(xs, 1, n), [make((3, 5), dtype), make((3, 2), dtype).t().contiguous().t()])
        check(lambda xs: torch._chunk_cat(xs, -1, n), [make((4, 5), dtype).t()])
    mixed = [make((2, 5), dtype), make((2, 3, 4), dtype)]  # different ndims, same leading dims
    check(lambda xs: torch._chunk_cat(xs, 1, 2), mixed)
    # FSDP2's use: out= a view of a flat buffer, and an up-cast out.
    for odt in (dtype, torch.float32):
        check(lambda xs: torch._chunk_cat(xs, 0, 2, out=torch.empty(2 * 3 * 8, dtype=odt, device=xs[0].device).view(2, -1)),
              ts)


def test_chunk_cat_errors_like_pytorch():
    x = make((4, 3))
    for bad in (lambda d: torch._chunk_cat([x.to(d)], 0, 0), lambda d: torch._chunk_cat([], 0, 2),
                lambda d: torch._chunk_cat([x.to(d), make((0, 3)).to(d)], 0, 2),
                lambda d: torch._chunk_cat([x.to(d), x.long().to(d)], 0, 2),
                lambda d: torch._chunk_cat([x.to(d), make((5, 3)).to(d)], 1, 2),
                lambda d: torch._chunk_cat([x.to(d), make((4, 3, 2)).to(d)], -1, 2),
                lambda d: torch._chunk_cat([x.to(d)], 2, 2)):
        with pytest.raises(Exception) as cpu:
            bad("cpu")
        with pytest.raises(type(cpu.value)):
            bad(TPU)
    # A 0-d input: PyTorch's kernel reads past its sizes (it crashes on CPU); tpu raises
    # the IndexError of size(dim).
    with pytest.raises(IndexError, match="no dimensions"):
        torch._chunk_cat([torch.tensor(1.0, device=TPU)], 0, 2)
