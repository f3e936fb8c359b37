"""Control flow inside torch.compile graphs: torch.cond as one program with both branches
(stablehlo.case: only the taken branch runs, so only its checks can fail), with gradients;
while_loop (stablehlo.while); nested compile regions inlined."""
import pytest
import torch
from helpers import TPU, make
from torch._higher_order_ops.while_loop import while_loop


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu")


@pytest.fixture(autouse=True)
def no_eager_graphs(caplog):
    yield
    assert "runs eagerly" not in caplog.text, caplog.text


def test_cond_takes_either_branch_in_one_program():
    f = compiled(lambda x: torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y.sin() * 2, (x,)))
    for sign in (1, -1):
        x = make((4, 8), low=0.1, high=1.0) * sign
        before = torch.tpu.compile_stats()["executions"]
        got = f(x.to(TPU))
        assert torch.tpu.compile_stats()["executions"] - before == 1
        torch.testing.assert_close(got.cpu(), x + 1 if sign > 0 else x.sin() * 2)


def test_cond_with_several_operands_and_outputs():
    def f(p, x, y):
        return torch.cond(p, lambda x, y: (x @ y, x.sum(0)), lambda x, y: (x @ y.T.T * 0, x.amax(0)), (x, y))

    x, y = make((3, 4)), make((4, 5))
    g = compiled(f)
    for p in (True, False):
        got = g(torch.tensor(p, device=TPU), x.to(TPU), y.to(TPU))
        want = f(torch.tensor(p), x, y)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b)


def test_cond_gradients_through_both_branches():
    w = make((8,)).to(TPU).requires_grad_()

    def f(x):
        return torch.cond(x.sum() > 0, lambda x: (x * w).sin(), lambda x: x.cos() * w, (x,)).sum()

    g = compiled(f)
    for sign in (1, -1):
        x = (make((8,), low=0.1, high=1.0) * sign).to(TPU).requires_grad_()
        w.grad = None
        g(x).backward()
        xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
        ((xc * wc).sin() if sign > 0 else xc.cos() * wc).sum().backward()
        torch.testing.assert_close(x.grad.cpu(), xc.grad)
        torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_cond_checks_only_the_taken_branch():
    # The classic guard: the index is read only where it is in range.
    x = make((8, 4))

    def f(x, i, n):
        return torch.cond(i < n, lambda x, i: x.index_select(0, i.reshape(1)), lambda x, i: x[:1] * 0, (x, i))

    g = compiled(lambda x, i: f(x, i, 8))
    torch.testing.assert_close(g(x.to(TPU), torch.tensor(5, device=TPU)).cpu(), x[5:6])
    torch.testing.assert_close(g(x.to(TPU), torch.tensor(20, device=TPU)).cpu(), torch.zeros(1, 4))
    # A taken branch that reads out of range raises PyTorch's error.
    bad = compiled(lambda x, i: f(x, i, 30))
    with pytest.raises(IndexError, match="index out of range in self"):
        bad(x.to(TPU), torch.tensor(20, device=TPU)).cpu()


def test_while_loop_counts_and_carries():
    x = make((4, 4))
    f = compiled(lambda x: while_loop(lambda i, y: i < 5, lambda i, y: (i + 1, y * 2 + 1), (torch.tensor(0, device=TPU), x)))
    i, y = f(x.to(TPU))
    assert i.item() == 5
    want = x.clone()
    for _ in range(5):
        want = want * 2 + 1
    torch.testing.assert_close(y.cpu(), want)


def test_while_loop_with_a_data_dependent_trip_count_and_captured_inputs():
    # Newton's iteration for sqrt(a) until converged: the trip count depends on the data.
    a = make((16,), low=1.0, high=100.0)
    tol = torch.tensor(1e-6)

    def f(a, tol):
        def more(x, step):
            return step.abs().max() > tol

        def body(x, step):
            new = (x + a / x) / 2
            return new, new - x

        return while_loop(more, body, (a.clone(), torch.ones_like(a)))

    x, _ = compiled(f)(a.to(TPU), tol.to(TPU))
    torch.testing.assert_close(x.cpu(), a.sqrt())


def test_nested_compile_region_is_inlined():
    @torch.compiler.nested_compile_region
    def block(x, w):
        return (x @ w).relu()

    w = make((8, 8)).to(TPU).requires_grad_()
    x = make((4, 8))
    y = compiled(lambda x: block(block(x, w), w).sum())(x.to(TPU))
    y.backward()
    wc = w.detach().cpu().requires_grad_()
    want = ((x @ wc).relu() @ wc).relu().sum()
    want.backward()
    torch.testing.assert_close(y.cpu(), want.detach())
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_random_ops_in_a_while_loop_body_draw_anew_each_iteration():
    # Each iteration draws a row of uniform numbers and a dropout mask into row i of the carried
    # matrix; the program runs once (no eager fallback), and the seed decides the numbers.
    def f(x):
        def body(i, rows, kept):
            r = torch.rand_like(x)
            row = torch.nn.functional.dropout(torch.ones_like(x), p=0.5, training=True)
            return i + 1, rows.index_copy(0, i.view(1), r[None]), kept.index_copy(0, i.view(1), row[None])

        zeros = x.new_zeros(8, x.shape[0])
        return while_loop(lambda i, rows, kept: i < 8, body, (torch.tensor(0, device=x.device), zeros, zeros.clone()))

    g = compiled(f)
    x = torch.zeros(4096, device=TPU)
    torch.manual_seed(1)
    _, rows, kept = (t.cpu() for t in g(x))
    torch.manual_seed(1)
    before = torch.tpu.compile_stats()["executions"]
    _, again, kept_again = g(x)
    again, kept_again = again.cpu(), kept_again.cpu()
    assert torch.tpu.compile_stats()["executions"] - before == 1
    _, other, _ = (t.cpu() for t in g(x))
    assert torch.equal(rows, again) and torch.equal(kept, kept_again)
    assert not torch.equal(rows, other)
    # Every iteration's draws differ from every other's, and they are uniform on [0, 1).
    assert all(not torch.equal(rows[a], rows[b]) for a in range(8) for b in range(a))
    assert all(not torch.equal(kept[a], kept[b]) for a in range(8) for b in range(a))
    assert rows.min() >= 0 and rows.max() < 1 and abs(rows.mean().item() - 0.5) < 0.01
    # Dropout at p=0.5 keeps (and doubles) half: within 5 standard deviations of 8 x 4096 draws.
    assert set(kept.unique().tolist()) <= {0.0, 2.0}
    assert abs((kept > 0).float().mean().item() - 0.5) < 5 * (0.25 / kept.numel()) ** 0.5
