"""torch.compile(backend="tpu"): graphs lowered by the same Rust lowerings as eager mode."""
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, make


def test_function_matches_cpu():
    def f(x, y):
        return torch.relu(x * y + 1.0).sum(dim=1) - torch.tanh(x).mean()

    x, y = make((4, 5)), make((4, 5))
    got = torch.compile(f, backend="tpu")(x.to(TPU), y.to(TPU))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), f(x, y))


def test_default_backend_for_tpu_inputs_is_tpu():
    # torch.compile without a backend (inductor) compiles tpu graphs with backend "tpu".
    torch._dynamo.reset()

    def f(x):
        return torch.sin(x) * 2.0 + x.sum()

    x = make((3, 4))
    graphs = len(torch.tpu.compile_stats()["graphs"])
    got = torch.compile(f)(x.to(TPU))
    torch.testing.assert_close(got.cpu(), f(x))
    assert len(torch.tpu.compile_stats()["graphs"]) == graphs + 1


def test_module_forward_backward_matches_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    dev.load_state_dict(ref.state_dict())
    dev = dev.to(TPU)
    compiled = torch.compile(dev, backend="tpu")
    x = make((8, 6))
    target = torch.randint(0, 3, (8,))
    loss_ref = F.cross_entropy(ref(x), target)
    loss_ref.backward()
    loss = F.cross_entropy(compiled(x.to(TPU)), target.to(TPU))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), loss_ref, atol=1e-5, rtol=1e-5)
    for p_ref, p in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["mean", "sum", "none", "weight", "ignore_index", "label_smoothing", "3d"])
def test_compiled_cross_entropy_backward(case, dtype, monkeypatch):
    # Cross-entropy's backward (nll_loss_backward into _log_softmax_backward_data) is rewritten
    # as one expression (rewrites.fuse_cross_entropy_backward) for 2-d inputs: loss and
    # gradient against CPU, ignored targets, class weights, every reduction; 3-d inputs keep
    # the ops.
    import torchtpu.compile.rewrites as rewrites

    torch._dynamo.reset()
    left = []
    fuse = rewrites.fuse_cross_entropy_backward

    def spy(gm):
        gm = fuse(gm)
        left.extend(n for n in gm.graph.nodes if n.target in (torch.ops.aten.nll_loss_backward.default,
                                                               torch.ops.aten.nll_loss2d_backward.default))
        return gm

    monkeypatch.setattr(rewrites, "fuse_cross_entropy_backward", spy)
    g = torch.Generator().manual_seed(0)
    shape = (6, 11, 3) if case == "3d" else (13, 11)
    x = torch.randn(shape, generator=g).to(dtype)
    t = torch.randint(0, 11, (shape[0], *shape[2:]), generator=g)
    t[:4] = 2
    kw = {"reduction": case} if case in ("sum", "none") else {}
    if case == "weight":
        kw["weight"] = torch.rand(11, generator=g).to(dtype)
    if case in ("ignore_index", "weight"):
        kw["ignore_index"] = 2
    if case == "label_smoothing":
        kw["label_smoothing"] = 0.2
    xr = x.clone().requires_grad_()
    want = F.cross_entropy(xr, t, **kw)
    want.square().sum().backward()
    xt = x.to(TPU).requires_grad_()
    dev_kw = {k: v.to(TPU) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got = torch.compile(lambda x, t: F.cross_entropy(x, t, **dev_kw), backend="tpu")(xt, t.to(TPU))
    got.square().sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(xt.grad.cpu(), xr.grad, atol=tol, rtol=tol)
    assert bool(left) == (case in ("3d", "label_smoothing")), left


def test_recompiles_for_new_shapes_and_reuses_executables():
    f = torch.compile(lambda x: (x * 2).exp().sum(0), backend="tpu")
    for shape in [(3, 4), (5, 4), (3, 4)]:
        x = make(shape)
        torch.testing.assert_close(f(x.to(TPU)).cpu(), (x * 2).exp().sum(0))
    before = torch.tpu.compile_stats()["misses"]
    f(make((3, 4)).to(TPU))
    assert torch.tpu.compile_stats()["misses"] == before


def test_graph_returning_inputs_and_views():
    def f(x):
        return x, x.t() * 1.0, x[1:, ::2].sum()

    x = make((4, 6))
    got = torch.compile(f, backend="tpu")(x.to(TPU))
    for g, e in zip(got, f(x)):
        torch.testing.assert_close(g.cpu(), e)


def test_recompiles_are_explained_and_counted(caplog):
    import logging
    import warnings

    f = torch.compile(lambda x: torch.sin(x) * 3, backend="tpu")
    with caplog.at_level(logging.INFO, logger="torchtpu.compile"):
        f(make((2, 3)).to(TPU))
        f(make((4, 3)).to(TPU))
        f(make((4, 3), torch.float64).to(TPU))
    lines = [r.getMessage() for r in caplog.records if "compiles again" in r.getMessage()]
    # A new size makes dynamo trace the graph again with that dimension dynamic.
    assert any("shape [2, 3] -> [4, 3]: dims [0] are now dynamic" in m for m in lines), lines
    assert any("dtype torch.float32 -> torch.float64" in m for m in lines), lines
    graphs = [g for g in torch.tpu.compile_stats()["graphs"] if g["kind"] == "forward"]
    assert graphs[-1]["calls"] == 1 and graphs[-1]["first_call_seconds"] > 0
    assert graphs[-1]["frame_compiles"] >= 3

    import os
    os.environ["TORCHTPU_RECOMPILE_WARN"] = "2"
    try:
        g = torch.compile(lambda x: x.cos() + 1, backend="tpu")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
                g(make((3,), dtype).to(TPU))
        assert any("recompiled 2 times" in str(m.message) for m in w), [str(m.message) for m in w]
    finally:
        del os.environ["TORCHTPU_RECOMPILE_WARN"]


def test_graph_views_factories_and_scatters():
    def f(x, idx, table):
        a = x.permute(1, 0).unsqueeze(0).expand(2, -1, -1).squeeze(0)
        b = torch.cat(x.split([1, 2], dim=0), dim=0) + x.unbind(1)[0].sum()
        c = x.repeat(2, 1)[1:, ::2] * torch.arange(2, device=x.device)
        d = torch.full_like(x, 0.5) + torch.zeros(3, 4, device=x.device)
        e = torch.nn.functional.embedding(idx, table)
        y = x.clone()
        y[1] = 7.0
        y[:, 1:3] = y[:, 1:3] * 2
        return a.sum(0), b, c, d, e, y

    x, idx, table = make((3, 4)), torch.tensor([[0, 2], [1, 1]]), make((5, 3))
    got = torch.compile(f, backend="tpu")(x.to(TPU), idx.to(TPU), table.to(TPU))
    for g, e in zip(got, f(x, idx, table)):
        torch.testing.assert_close(g.cpu(), e)


def test_graph_constant_pad():
    f = lambda x: torch.nn.functional.pad(x, (1, 2, -1, 0), value=3.5).exp()  # noqa: E731
    x = make((3, 4))
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x.to(TPU)).cpu(), f(x))


def test_whole_training_step_compiles_and_matches_cpu():
    # zero_grad + forward + backward + AdamW step under one torch.compile: dynamo splits it at
    # backward; forward, backward and the optimizer update each run as one graph.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    losses, params = {}, {}
    before = len(torch.tpu.compile_stats()["graphs"])
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

        def step(xb, yb):
            opt.zero_grad()
            loss = F.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step()
            return loss

        run = torch.compile(step, backend="tpu") if device == "tpu" else step
        losses[device] = [run(x.to(device), y.to(device)).item() for _ in range(5)]
        params[device] = [p.detach().cpu() for p in m.parameters()]
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-5, abs=1e-5)
    for got, ref in zip(params["tpu"], params["cpu"]):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    graphs = torch.tpu.compile_stats()["graphs"][before:]
    assert {g["kind"] for g in graphs} == {"forward", "backward"} and len(graphs) >= 3
    assert all(g["calls"] == 5 for g in graphs), graphs


def test_mutated_inputs_are_written_in_place():
    # In-place updates of graph inputs (whole, through a slice, through index_put) land in the
    # caller's tensors, call after call, like eager on CPU.
    def f(x, cache, pos, new):
        x.add_(1.5)
        cache[:, 1:3].copy_(new)
        cache.index_put_((pos,), torch.ones_like(x) * x.sum())
        return x * 2

    compiled = torch.compile(f, backend="tpu")
    ref = [make((4,)), make((5, 4)), torch.tensor([0, 4]), make((5, 2))]
    dev = [t.to(TPU) for t in ref]
    for _ in range(3):
        torch.testing.assert_close(compiled(*dev).cpu(), f(*ref))
        for got, want in zip(dev, ref):
            torch.testing.assert_close(got.cpu(), want)


def test_mutated_inputs_reuse_their_memory():
    # The graph takes the state's buffer (donation) instead of holding an updated copy next to
    # it until AOTAutograd copies it back: an update of 64 MiB of state peaks near +0, not +64.
    @torch.compile(backend="tpu")
    def update(x):
        x.mul_(0.5).add_(1.0)

    x = torch.zeros(16, 1024, 1024, device=TPU)
    update(x)
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    update(x)
    torch.tpu.synchronize()
    assert torch.tpu.max_memory_allocated() - base < 4 * 2**20
    assert x[3, 5, 7].item() == 1.5


def test_peak_memory_stats():
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    base = torch.tpu.memory_allocated()
    x = torch.ones(1024, 1024, device=TPU)
    y = x * 2
    del y
    assert torch.tpu.memory_allocated() == base + 4 * 2**20
    assert torch.tpu.max_memory_allocated() == base + 8 * 2**20
    del x


def test_compiled_optimizer_step_is_one_program_and_matches_cpu():
    # AdamW's state (exp_avg, exp_avg_sq, params) is updated in place by the step's one
    # program; its step counts live on the CPU (capturable=False) and are copied back.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(3)]
    params = {}
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        step = torch.compile(opt.step, backend="tpu") if device == "tpu" else opt.step
        for k, gs in enumerate(grads):
            for p, g in zip(m.parameters(), gs):
                p.grad = g.to(device)
            before = torch.tpu.compile_stats()["executions"]
            step()
            if device == "tpu" and k > 0:
                assert torch.tpu.compile_stats()["executions"] - before == 1
        params[device] = [p.detach().cpu() for p in m.parameters()]
        params[device] += [opt.state[p]["exp_avg_sq"].cpu() for p in m.parameters()]
        assert all(opt.state[p]["step"].device.type == "cpu" and opt.state[p]["step"].item() == 3 for p in m.parameters())
    for got, ref in zip(params["tpu"], params["cpu"]):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_compiled_batch_norm_updates_running_stats():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6))
    dev = copy.deepcopy(ref).to(TPU)
    compiled = torch.compile(dev, backend="tpu")
    for _ in range(3):
        x = make((8, 4))
        ref(x).square().sum().backward()
        compiled(x.to(TPU)).square().sum().backward()
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(dev.state_dict()[name].cpu(), want, atol=1e-5, rtol=1e-5, msg=name)


def test_dynamic_shapes_trace_once_and_lower_per_size(caplog):
    # dynamic=True: dynamo traces one symbolic graph; it is lowered per concrete size on first
    # use (logged), and sizes met before reuse their lowering.
    def f(x, w):
        y = x.view(-1, x.shape[-1] * 2) @ w[: x.shape[-1] * 2]
        return torch.softmax(y, -1).sum(0), x.new_zeros(x.shape[0] + 1)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu", dynamic=True)
    before = len(torch.tpu.compile_stats()["graphs"])
    with caplog.at_level("INFO", logger="torchtpu.compile"):
        for shape in [(4, 6), (6, 4), (4, 6), (8, 2)]:
            x, w = make(shape), make((12, 3))
            wt = w.to(TPU).requires_grad_()
            w.requires_grad_()
            got = compiled(x.to(TPU), wt)
            want = f(x, w)
            for g, r in zip(got, want):
                torch.testing.assert_close(g.cpu(), r.detach())
            got[0].sum().backward()
            want[0].sum().backward()
            torch.testing.assert_close(wt.grad.cpu(), w.grad)
    graphs = torch.tpu.compile_stats()["graphs"][before:]
    assert [(g["kind"], g["specializations"], g["calls"]) for g in graphs] == [("forward", 3, 4), ("backward", 3, 4)]
    lowered = [r.getMessage() for r in caplog.records if "lowered for sizes" in r.getMessage()]
    assert len(lowered) == 6 and any("=8" in m and "=2" in m for m in lowered), lowered


def test_mark_dynamic_batch_of_a_module():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.SiLU())
    dev = copy.deepcopy(ref).to(TPU)
    compiled = torch.compile(dev, backend="tpu")
    torch._dynamo.reset()
    before = len(torch.tpu.compile_stats()["graphs"])
    for batch in (3, 5, 9):
        x = make((batch, 5))
        xt = x.to(TPU)
        torch._dynamo.mark_dynamic(xt, 0)
        torch.testing.assert_close(compiled(xt).cpu(), ref(x), atol=1e-5, rtol=1e-5)
    graphs = torch.tpu.compile_stats()["graphs"][before:]
    assert len([g for g in graphs if g["kind"] == "forward"]) == 1 and graphs[0]["specializations"] == 3


def test_host_scalars_are_computed_on_the_host():
    # CPU 0-d tensors in a tpu graph (an optimizer's step counts): their arithmetic runs on the
    # host, the device program reads the results, and their updates land in place on the CPU.
    def f(steps, x):
        for s in steps:
            s.add_(1)
        scale = [1 - 0.9 ** s for s in steps]
        return x * scale[0] + x.sum() * scale[1], steps[0] * 2

    compiled = torch.compile(f, backend="tpu")
    ref_steps = [torch.tensor(0.0), torch.tensor(5.0)]
    steps = [t.clone() for t in ref_steps]
    x = make((3, 4))
    for _ in range(3):
        before = torch.tpu.compile_stats()["executions"]
        got, doubled = compiled(steps, x.to(TPU))
        assert torch.tpu.compile_stats()["executions"] - before == 1
        want, want_doubled = f(ref_steps, x)
        torch.testing.assert_close(got.cpu(), want)
        assert doubled.device.type == "cpu" and doubled.item() == want_doubled.item()
        assert [s.item() for s in steps] == [s.item() for s in ref_steps]


def test_graph_without_tensor_inputs():
    # Only factories: the graph reads no tensor, and its outputs still land on tpu.
    f = torch.compile(lambda: torch.zeros(3, device="tpu") + torch.arange(3, device="tpu"), backend="tpu")
    got = f()
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), torch.arange(3).float())


def test_ops_without_a_lowering_run_eagerly_between_programs(caplog):
    # A custom op implemented in Python has no lowering, nor has one that mutates its input
    # (auto_functionalized): the graph is split around them, they run eagerly, the rest compiles.
    @torch.library.custom_op("torchtpu_test::twice_plus", mutates_args=())
    def twice_plus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    twice_plus.register_fake(lambda x, y: torch.empty_like(x))

    @torch.library.custom_op("torchtpu_test::scale_", mutates_args=("x",))
    def scale_(x: torch.Tensor, k: float) -> None:
        x.mul_(k)

    def f(x, y):
        z = twice_plus(x.sin(), y) + 1
        scale_(z, 3.0)
        return z.cos()

    caplog.set_level("INFO", logger="torchtpu.compile")
    x, y = make((4, 8)), make((4, 8))
    got = torch.compile(f, backend="tpu")(x.to(TPU), y.to(TPU))
    assert "split around 2 run(s) of ops that run eagerly" in caplog.text, caplog.text
    assert "torchtpu_test.twice_plus" in caplog.text and "auto_functionalized" in caplog.text
    assert "runs eagerly, op by op" not in caplog.text
    torch.testing.assert_close(got.cpu(), ((x.sin() * 2 + y + 1) * 3).cos())
