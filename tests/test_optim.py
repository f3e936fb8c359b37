"""What optimizers run: lerp/addcmul/addcdiv, the _foreach_* ops, the fused Adam(W)/SGD steps,
and torch.optim.SGD/Adam/AdamW end to end (foreach, for-loop and fused) against CPU."""
import copy

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from helpers import TPU, check, check_error, check_inplace, make, to_cpu, to_tpu
from torch.utils._python_dispatch import TorchDispatchMode

F32 = torch.float32


# ---- lerp, addcmul, addcdiv -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_lerp(dtype):
    a, b = make((3, 4), dtype), make((3, 4), dtype)
    for w in [0.3, 0.7, -0.2, 1.5, 0, 1]:
        check(torch.lerp, a, b, w)
    check(torch.lerp, a, b, make((3, 4), dtype, 0, 1))
    check(torch.lerp, a, b, make((4,), dtype, -1, 2))
    check(torch.lerp, a, make((2, 3, 4), dtype), 0.25)  # broadcasts
    check(torch.lerp, a, b, torch.tensor(0.75, dtype=torch.float64))  # 0-d weight of another dtype
    check(lambda x, y: torch.lerp(x.t(), y.t(), 0.6), a, b)
    check_inplace(lambda x, y: x.lerp_(y, 0.4), a, b)
    check(torch.lerp, make((), dtype), make((), dtype), 0.5)
    check(torch.lerp, make((0, 3), dtype), make((0, 3), dtype), 0.5)


def test_lerp_errors():
    f = make((3,))
    check_error(torch.lerp, f, make((3,), torch.float64), 0.5)
    check_error(torch.lerp, f, f, make((3,), torch.float64))
    check_error(torch.lerp, make((3,), torch.int64), make((3,), torch.int64), 0.5)
    check_error(lambda x, y: x.lerp_(y, 0.5), f, make((2, 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_addcmul_addcdiv(dtype):
    s, t1, t2 = make((3, 4), dtype), make((3, 4), dtype), make((3, 4), dtype)
    if dtype.is_floating_point:
        t2d = make((3, 4), dtype, 0.5, 2)
        for v in [1, 0.5, -2.25]:
            check(lambda a, b, c: torch.addcmul(a, b, c, value=v), s, t1, t2)
            check(lambda a, b, c: torch.addcdiv(a, b, c, value=v), s, t1, t2d)
        check(torch.addcdiv, s, make((4,), dtype), t2d)
        check_inplace(lambda a, b, c: a.addcdiv_(b, c, value=0.3), s, t1, t2d)
    else:
        check(lambda a, b, c: torch.addcmul(a, b, c, value=3), s, t1, t2)
        check(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), s, t1, t2)  # truncated to 0
    check(torch.addcmul, s, t1, make((4,), dtype))
    check_inplace(lambda a, b, c: a.addcmul_(b, c, value=2), s, t1, t2)


def test_addc_promotion_and_errors():
    f, d, i = make((3,)), make((3,), torch.float64), make((3,), torch.int64)
    check(torch.addcmul, f, d, i)
    check(torch.addcmul, i, i, f)
    check(torch.addcmul, f, torch.tensor(2.0, dtype=torch.float64), f)
    check(torch.addcdiv, i, f, make((3,), F32, 1, 2))
    check_error(torch.addcdiv, i, i, i)
    check_error(torch.addcdiv, f, i, i)
    b = make((3,), torch.bool)
    check_error(torch.addcmul, b, b, b)


# ---- _foreach_* ---------------------------------------------------------------------------------

def lists(dtypes=(F32, F32, F32), low=None, high=None):
    shapes = [(3, 4), (5,), ()]
    return [make(s, d, low, high) for s, d in zip(shapes, dtypes)]


BINARY = [torch._foreach_add, torch._foreach_sub, torch._foreach_mul, torch._foreach_div,
          torch._foreach_maximum, torch._foreach_minimum, torch._foreach_clamp_min, torch._foreach_clamp_max,
          torch._foreach_pow]


@pytest.mark.parametrize("fn", BINARY, ids=lambda f: f.__name__)
def test_foreach_binary(fn):
    xs = lists(low=0.5, high=2)
    ys = lists(low=0.5, high=2)
    check(fn, xs, ys)  # List
    check(fn, xs, 1.5)  # Scalar
    check(fn, xs, 2)
    check(fn, xs, [0.5, 2, -1.25])  # ScalarList
    if fn in (torch._foreach_add, torch._foreach_sub):
        check(lambda a, b: fn(a, b, alpha=-0.5), xs, ys)
    name = fn.__name__ + "_"
    inplace = getattr(torch, name)
    for other in [ys, 1.5, [0.5, 2, -1.25]]:
        cpu = [x.clone() for x in xs]
        dev = to_tpu(xs)
        inplace(cpu, other)
        inplace(dev, to_tpu(other))
        for c, d in zip(cpu, dev):
            torch.testing.assert_close(d.cpu(), c)


def test_foreach_tensor_overloads():
    xs = lists()
    check(torch._foreach_add, xs, torch.tensor(2.5))
    check(lambda a, t: torch._foreach_add(a, t, alpha=2), xs, torch.tensor(2.5))
    check(torch._foreach_mul, xs, torch.tensor(-0.5))
    check(torch._foreach_div, xs, torch.tensor(4.0))
    check_error(torch._foreach_add, xs, torch.tensor([2.5]))


UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
         "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
         "sinh", "sqrt", "tan", "tanh", "trunc"]


@pytest.mark.parametrize("name", UNARY)
def test_foreach_unary(name):
    low, high = (0.1, 0.9) if name in ("acos", "asin") else (0.2, 3)
    xs = lists(low=low, high=high)
    check(getattr(torch, "_foreach_" + name), xs)
    cpu = [x.clone() for x in xs]
    dev = to_tpu(xs)
    getattr(torch, "_foreach_" + name + "_")(cpu)
    getattr(torch, "_foreach_" + name + "_")(dev)
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.cpu(), c)


def test_foreach_ternary_and_misc():
    xs, ys, zs = lists(), lists(), lists(low=0.5, high=2)
    check(torch._foreach_addcmul, xs, ys, zs)
    check(lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.5), xs, ys, zs)
    check(torch._foreach_addcmul, xs, ys, zs, [1.0, -2.0, 0.5])
    check(torch._foreach_addcdiv, xs, ys, zs)
    check(torch._foreach_addcdiv, xs, ys, zs, [1.0, -2.0, 0.5])
    check(torch._foreach_lerp, xs, ys, 0.3)
    check(torch._foreach_lerp, xs, ys, lists(low=0, high=1))
    check(torch._foreach_lerp, xs, ys, [0.1, 0.6, 0.9])
    check(lambda a: torch._foreach_norm(a), xs)
    check(lambda a: torch._foreach_norm(a, 1), xs)
    check(lambda a: torch._foreach_norm(a, float("inf")), xs)
    check(torch._foreach_max, xs)
    check(torch._foreach_pow, 2.0, xs)  # ScalarAndTensor
    for op, args in [(torch._foreach_zero_, ()), (torch._foreach_copy_, (ys,)),
                     (torch._foreach_addcdiv_, (ys, zs, [0.5, 1.0, 2.0])), (torch._foreach_lerp_, (ys, 0.25)),
                     (torch._foreach_addcmul_, (ys, zs, 3.0))]:
        cpu = [x.clone() for x in xs]
        dev = to_tpu(xs)
        op(cpu, *args)
        op(dev, *to_tpu(args))
        for c, d in zip(cpu, dev):
            torch.testing.assert_close(d.cpu(), c)


def test_foreach_dtypes_and_views():
    xs = lists((F32, torch.int64, torch.bfloat16))
    check(torch._foreach_mul, xs, 2.5)
    check(torch._foreach_add, xs, 3)
    check(torch._foreach_sqrt, lists((F32, torch.int64, torch.bfloat16), low=0, high=5))
    base = make((6, 4))
    check(lambda b: torch._foreach_add([b.t(), b[::2]], [b.t(), b[1::2]]), base)
    dev = base.to(TPU)
    cpu = base.clone()
    torch._foreach_mul_([dev.t(), dev[0]], 3.0)
    torch._foreach_mul_([cpu.t(), cpu[0]], 3.0)
    torch.testing.assert_close(dev.cpu(), cpu)


def test_foreach_errors():
    xs = lists()
    check_error(torch._foreach_add, [], 1.0)
    check_error(torch._foreach_add, xs, xs[:2])
    check_error(torch._foreach_add, xs, [1.0, 2.0])
    check_error(torch._foreach_add, [make((2,))], [make((3,))])
    check_error(torch._foreach_add_, [make((2,), torch.int64)], 0.5)
    check_error(torch._foreach_lerp, xs, xs[:1], 0.5)


# ---- fused steps ----------------------------------------------------------------------------

def fused_state(n_amsgrad=True, seed=0):
    torch.manual_seed(seed)
    shapes = [(4, 3), (5,), ()]
    params = [make(s) for s in shapes]
    grads = [make(s) for s in shapes]
    m = [make(s) * 0.1 for s in shapes]
    v = [make(s, low=0, high=0.5) for s in shapes]
    mx = [vv + make(s, low=0, high=0.1) for vv, s in zip(v, shapes)] if n_amsgrad else []
    steps = [torch.tensor(float(k + 1)) for k in range(len(shapes))]
    return params, grads, m, v, mx, steps


@pytest.mark.parametrize("op", [torch._fused_adam_, torch._fused_adamw_])
@pytest.mark.parametrize("amsgrad,maximize,wd", [(False, False, 0.0), (True, True, 0.1), (False, False, 0.01)])
@pytest.mark.parametrize("scaled", [False, True])
def test_fused_adam_direct(op, amsgrad, maximize, wd, scaled):
    cpu = fused_state(amsgrad)
    dev = to_tpu(cpu)
    dev = dev[:5] + ([s.to(TPU) for s in cpu[5]],)
    kw = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=wd, eps=1e-8, amsgrad=amsgrad, maximize=maximize)
    op(*cpu, **kw, **(dict(grad_scale=torch.tensor(4.0), found_inf=torch.tensor(0.0)) if scaled else {}))
    op(*dev, **kw, **(dict(grad_scale=torch.tensor(4.0, device=TPU), found_inf=torch.tensor(0.0, device=TPU)) if scaled else {}))
    for lc, ld in zip(cpu[:5], dev[:5]):
        for c, d in zip(lc, ld):
            torch.testing.assert_close(d.cpu(), c, atol=1e-6, rtol=1e-5)


def test_fused_skips_on_found_inf():
    cpu = fused_state()
    dev = to_tpu(cpu)
    dev = dev[:5] + ([s.to(TPU) for s in cpu[5]],)
    before = [p.clone() for p in cpu[0]]
    kw = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=True, maximize=False)
    torch._fused_adam_(*cpu, **kw, grad_scale=torch.tensor(2.0), found_inf=torch.tensor(1.0))
    torch._fused_adam_(*dev, **kw, grad_scale=torch.tensor(2.0, device=TPU), found_inf=torch.tensor(1.0, device=TPU))
    for b, c, d in zip(before, cpu[0], dev[0]):
        torch.testing.assert_close(c, b)
        torch.testing.assert_close(d.cpu(), b)
    for c, d in zip(cpu[1], dev[1]):  # a skipped step leaves the grads scaled
        torch.testing.assert_close(d.cpu(), c)


@pytest.mark.parametrize("momentum,nesterov,wd,first,maximize", [(0.0, False, 0.0, False, False), (0.9, False, 0.0, True, False),
                                                                 (0.9, True, 0.1, False, True), (0.5, False, 0.01, False, False)])
def test_fused_sgd_direct(momentum, nesterov, wd, first, maximize):
    torch.manual_seed(0)
    shapes = [(4, 3), (5,)]
    params = [make(s) for s in shapes]
    grads = [make(s) for s in shapes]
    bufs = [make(s) for s in shapes] if momentum else []
    cpu = (params, grads, bufs)
    dev = to_tpu(cpu)
    kw = dict(weight_decay=wd, momentum=momentum, lr=0.1, dampening=0.2, nesterov=nesterov, maximize=maximize,
              is_first_step=first)
    torch._fused_sgd_(*cpu, **kw)
    torch._fused_sgd_(*dev, **kw)
    for lc, ld in zip(cpu, dev):
        for c, d in zip(lc, ld):
            torch.testing.assert_close(d.cpu(), c)


# ---- optimizers end to end ------------------------------------------------------------------

def train(make_opt, device, steps=5, dtype=F32, sched=False):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 4)).to(device, dtype)
    opt = make_opt(net.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7) if sched else None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=g).to(dtype)
    y = torch.randn(32, 4, generator=g).to(dtype)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((net(x.to(device)) - y.to(device)) ** 2).mean()
        loss.backward()
        opt.step()
        if scheduler:
            scheduler.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in net.parameters()]


OPTIMIZERS = {
    "sgd": lambda **kw: (lambda ps: torch.optim.SGD(ps, lr=0.1, **kw)),
    "sgd_momentum": lambda **kw: (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, **kw)),
    "sgd_nesterov_wd": lambda **kw: (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, **kw)),
    "sgd_dampening_maximize": lambda **kw: (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5, dampening=0.3, maximize=True, **kw)),
    "adam": lambda **kw: (lambda ps: torch.optim.Adam(ps, lr=0.01, **kw)),
    "adam_wd_amsgrad": lambda **kw: (lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, amsgrad=True, **kw)),
    "adamw": lambda **kw: (lambda ps: torch.optim.AdamW(ps, lr=0.01, **kw)),
    "adamw_amsgrad_maximize": lambda **kw: (lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True, maximize=True, **kw)),
    "adagrad": lambda **kw: (lambda ps: torch.optim.Adagrad(ps, lr=0.05, **kw)),
    "adagrad_decay_wd_maximize": lambda **kw: (lambda ps: torch.optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.01,
                                                                             maximize=True, **kw)),
}

# Optimizers PyTorch offers as foreach and for-loop implementations only.
UNFUSED_OPTIMIZERS = {
    "rmsprop": lambda **kw: (lambda ps: torch.optim.RMSprop(ps, lr=0.01, **kw)),
    # eps=1e-3: centered RMSprop divides g by about |g| / 10 on its first step, so with eps=1e-8
    # a gradient entry near zero steps by about 10 * lr with the sign of its rounding (2 of 60
    # seeds then differed from CPU by 1e-4, as CPU's own AVX-512 and scalar kernels differ).
    "rmsprop_centered_momentum": lambda **kw: (lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9, centered=True,
                                                                             weight_decay=0.01, eps=1e-3, **kw)),
    "adafactor": lambda **kw: (lambda ps: torch.optim.Adafactor(ps, lr=0.01, **kw)),
    "adamax": lambda **kw: (lambda ps: torch.optim.Adamax(ps, lr=0.01, **kw)),
    "nadam": lambda **kw: (lambda ps: torch.optim.NAdam(ps, lr=0.01, **kw)),
    "radam": lambda **kw: (lambda ps: torch.optim.RAdam(ps, lr=0.01, **kw)),
    "adadelta": lambda **kw: (lambda ps: torch.optim.Adadelta(ps, lr=0.5, **kw)),
    "asgd": lambda **kw: (lambda ps: torch.optim.ASGD(ps, lr=0.01, **kw)),
    "rprop": lambda **kw: (lambda ps: torch.optim.Rprop(ps, lr=0.01, **kw)),
}


@pytest.mark.parametrize("impl", ["foreach", "for_loop"])
@pytest.mark.parametrize("name", sorted(UNFUSED_OPTIMIZERS))
def test_unfused_optimizer_matches_cpu(name, impl):
    make_opt = UNFUSED_OPTIMIZERS[name](foreach=impl == "foreach")
    lc, pc = train(make_opt, "cpu")
    lt, pt = train(make_opt, TPU)
    torch.testing.assert_close(torch.tensor(lt), torch.tensor(lc), atol=1e-5, rtol=1e-5)
    for c, t in zip(pc, pt):
        torch.testing.assert_close(t, c, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["foreach", "for_loop", "fused"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_cpu(name, impl):
    kw = {"foreach": dict(foreach=True), "for_loop": dict(foreach=False), "fused": dict(fused=True)}[impl]
    make_opt = OPTIMIZERS[name](**kw)
    lc, pc = train(make_opt, "cpu")
    lt, pt = train(make_opt, TPU)
    torch.testing.assert_close(torch.tensor(lt), torch.tensor(lc), atol=1e-5, rtol=1e-5)
    for c, t in zip(pc, pt):
        torch.testing.assert_close(t, c, atol=1e-5, rtol=1e-4)


def test_adamw_mlp_default_is_foreach():
    ops = set()

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.add(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2).to(TPU)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    net(torch.randn(3, 4, device=TPU)).sum().backward()
    with Log():
        opt.step()
    assert "aten._foreach_lerp_.Scalar" in ops and "aten._foreach_addcdiv_.ScalarList" in ops, ops
    # And the five-step losses of an MLP match CPU.
    make_opt = lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05)  # noqa: E731
    lc, pc = train(make_opt, "cpu")
    lt, pt = train(make_opt, TPU)
    torch.testing.assert_close(torch.tensor(lt), torch.tensor(lc), atol=1e-6, rtol=1e-5)
    for c, t in zip(pc, pt):
        torch.testing.assert_close(t, c, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kw", [dict(foreach=True), dict(fused=True)], ids=["foreach", "fused"])
def test_lr_schedule_reuses_programs(kw):
    make_opt = lambda ps: torch.optim.AdamW(ps, lr=0.01, **kw)  # noqa: E731
    lc, pc = train(make_opt, "cpu", steps=6, sched=True)
    train(make_opt, TPU, steps=3, sched=True)
    before = torchtpu._C.compile_stats()["misses"]
    lt, pt = train(make_opt, TPU, steps=6, sched=True)
    # Steps 4-6 run new learning rates and step counts with the programs of steps 1-3.
    assert torchtpu._C.compile_stats()["misses"] == before
    torch.testing.assert_close(torch.tensor(lt), torch.tensor(lc), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", [dict(foreach=True), dict(fused=True)], ids=["foreach", "fused"])
def test_bf16_params(impl):
    make_opt = lambda ps: torch.optim.AdamW(ps, lr=0.01, **impl)  # noqa: E731
    lc, pc = train(make_opt, "cpu", dtype=torch.bfloat16)
    lt, pt = train(make_opt, TPU, dtype=torch.bfloat16)
    torch.testing.assert_close(torch.tensor(lt), torch.tensor(lc), atol=3e-2, rtol=3e-2)
    for c, t in zip(pc, pt):
        torch.testing.assert_close(t, c, atol=3e-2, rtol=3e-2)


def test_clip_grad_norm_foreach():
    torch.manual_seed(0)
    ps = [make((4, 3)), make((5,))]
    gs = [make((4, 3)), make((5,))]
    cpu = [p.clone().requires_grad_() for p in ps]
    dev = [p.to(TPU).requires_grad_() for p in ps]
    for p, g in zip(cpu, gs):
        p.grad = g.clone()
    for p, g in zip(dev, gs):
        p.grad = g.to(TPU)
    nc = torch.nn.utils.clip_grad_norm_(cpu, 1.0, foreach=True)
    nd = torch.nn.utils.clip_grad_norm_(dev, 1.0, foreach=True)
    torch.testing.assert_close(nd.cpu(), nc)
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.grad.cpu(), c.grad)


def test_foreach_ops_run_one_program_per_list():
    xs = [torch.randn(3, 2, device=TPU) for _ in range(6)]
    ys = [x.clone() for x in xs]
    before = torch.tpu.compile_stats()["executions"]
    torch._foreach_add_(xs, ys, alpha=2.0)
    torch._foreach_mul_(xs, 0.5)
    assert torch.tpu.compile_stats()["executions"] - before == 2
    # An AdamW step (foreach by default) takes as many programs for 12 parameters as for 3.
    def step_programs(n):
        params = [torch.nn.Parameter(torch.randn(4, device=TPU)) for _ in range(n)]
        for p in params:
            p.grad = torch.randn(4, device=TPU)
        opt = torch.optim.AdamW(params)
        opt.step()
        start = torch.tpu.compile_stats()["executions"]
        opt.step()
        return torch.tpu.compile_stats()["executions"] - start
    assert step_programs(12) == step_programs(3)


@pytest.mark.parametrize("use_foreach", [True, False])
def test_grad_scaler_matches_cpu_through_an_overflow(use_foreach):
    # GradScaler: unscale with the non-finite check, skip the step on overflow, back off and
    # grow the scale (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_).
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(16, 6), torch.randn(16, 3)
    runs = {}
    for dev in ("cpu", TPU):
        m = copy.deepcopy(base).to(dev)
        opt = torch.optim.Adam(m.parameters(), lr=0.01, foreach=use_foreach)
        scaler = torch.amp.GradScaler(torch.device(dev).type, init_scale=2.0**10, growth_interval=2)
        scales = []
        for i in range(6):
            opt.zero_grad()
            loss = F.mse_loss(m(x.to(dev)), y.to(dev))
            if i == 3:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        runs[str(dev)] = (scales, [p.detach().cpu() for p in m.parameters()])
    (sc, pc), (st, pt) = runs["cpu"], runs[str(TPU)]
    assert st == sc and 1024.0 in st[3:5]
    for c, t in zip(pc, pt):
        torch.testing.assert_close(t, c, atol=1e-6, rtol=1e-5)


def test_grad_scaler_state_errors():
    g = [torch.ones(3, device=TPU)]
    with pytest.raises(RuntimeError, match="found_inf must be a float tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_(g, torch.zeros(1, dtype=torch.int32, device=TPU),
                                                         torch.ones(1, device=TPU))
    with pytest.raises(RuntimeError, match="inv_scale must be a 1-element tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_(g, torch.zeros(1, device=TPU), torch.ones(2, device=TPU))
