"""Elementwise ops against PyTorch on CPU: dtypes, promotion, views, 0-d/empty, grads, errors."""
import math

import pytest
import torch
from helpers import ALL, FLOATS, INTS, TPU, check, check_error, check_inplace, make, to_tpu

SHAPES = [(), (0,), (5,), (3, 4), (2, 3, 4)]

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "remainder": torch.remainder,
    "floor_divide": torch.floor_divide,
    "fmod": torch.fmod,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
}
NO_BOOL = {"sub", "div_trunc", "div_floor", "remainder", "fmod", "floor_divide"}
NONZERO_DIVISOR = {"div", "div_trunc", "div_floor", "remainder", "fmod", "floor_divide"}


def divisor(shape, dtype):
    d = make(shape, dtype, low=1 if not dtype.is_floating_point else 0.5, high=5)
    return d


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", SHAPES)
def test_binary(name, dtype, shape):
    if dtype == torch.bool and name in NO_BOOL:
        return
    fn = BINARY[name]
    a = make(shape, dtype)
    b = divisor(shape, dtype) if name in NONZERO_DIVISOR else make(shape, dtype)
    if name in NONZERO_DIVISOR and dtype != torch.bool and not dtype.is_floating_point and len(shape) > 0:
        b = b * torch.where(torch.rand(shape) > 0.5, 1, -1).to(dtype)
    check(fn, a, b)


@pytest.mark.parametrize("name", ["add", "mul", "sub", "div", "maximum", "lt", "remainder"])
def test_binary_views_and_broadcast(name):
    fn = BINARY[name]
    a = make((4, 6))
    b = make((6, 4)).abs() + 0.5
    check(lambda x, y: fn(x.t(), y), b, a)
    check(lambda x, y: fn(x[::2], y[1::2]), a, b.t().contiguous() + 1)
    check(lambda x, y: fn(x[:1].expand(4, 6), y), a, a + 2)
    check(fn, a, make((6,)) + 5)          # broadcast
    check(fn, make((4, 1, 6)), make((3, 1)) + 5)


@pytest.mark.parametrize("a_dtype,b", [
    (torch.int64, 2.5), (torch.int32, 3), (torch.uint8, 7), (torch.bool, 2), (torch.float16, 2.0),
    (torch.bfloat16, 1e-3), (torch.float32, True),
])
def test_scalar_promotion(a_dtype, b):
    a = make((3, 4), a_dtype, low=0 if a_dtype == torch.uint8 else None)
    check(torch.add, a, b)
    check(torch.mul, a, b)


@pytest.mark.parametrize("a_dtype,b_dtype", [
    (torch.int64, torch.float16), (torch.int32, torch.int64), (torch.uint8, torch.int8),
    (torch.float16, torch.bfloat16), (torch.bool, torch.int32), (torch.float32, torch.float64),
])
def test_tensor_promotion(a_dtype, b_dtype):
    check(torch.add, make((3,), a_dtype, low=0), make((3,), b_dtype, low=0))
    # a 0-d tensor of a higher category promotes; of the same category it does not
    check(torch.mul, make((3,), a_dtype, low=0), make((), b_dtype, low=0))


def test_alpha_and_rsub():
    a, b = make((3, 4)), make((3, 4))
    check(lambda x, y: torch.add(x, y, alpha=2.5), a, b)
    check(lambda x, y: torch.sub(x, y, alpha=-3), a, b)
    check(lambda x, y: torch.rsub(x, y, alpha=2), a, b)
    check(lambda x: 1.5 - x, a)
    check(lambda x, y: torch.add(x, y, alpha=2), make((3,), torch.int64), make((3,), torch.int64))


def test_pow():
    check(torch.pow, make((3, 4), low=0.1), make((3, 4)))
    check(lambda x: x ** 2, make((3, 4)))
    check(lambda x: x ** 0.5, make((3, 4), low=0.1))
    check(lambda x: 2 ** x, make((3, 4)))
    check(lambda x: x ** 3, make((3, 4), torch.int64, low=-5, high=5))
    check_error(torch.pow, make((5,), torch.bool), make((5,), torch.bool))


UNARY_FLOAT = ["exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal",
               "sin", "cos", "tan", "tanh", "sigmoid", "erf", "erfc", "erfinv", "lgamma", "digamma",
               "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"]
POSITIVE = {"log", "log1p", "log2", "log10", "sqrt", "rsqrt", "lgamma", "digamma", "acosh"}
UNIT = {"asin", "acos", "atanh", "erfinv"}


def domain(name, dtype, shape):
    if name in POSITIVE:
        return make(shape, dtype, low=1.1 if name == "acosh" else 0.1, high=4)
    if name in UNIT:
        return make(shape, dtype, low=-0.9, high=0.9)
    return make(shape, dtype, low=-2, high=2)


@pytest.mark.parametrize("name", UNARY_FLOAT)
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_unary_float(name, dtype):
    fn = getattr(torch, name)
    if dtype == torch.int64:
        if name in UNIT | {"acosh"}:
            return
        x = make((3, 5), dtype, low=1, high=4)
    else:
        x = domain(name, dtype, (3, 5))
    tol = dict(atol=1e-4, rtol=1e-4) if dtype in (torch.float32, torch.int64) else {}
    check(fn, x, **tol)
    check(lambda t: fn(t.t()), x, **tol)
    check(fn, domain(name, torch.float32, ()), atol=1e-4, rtol=1e-4)
    check(fn, domain(name, torch.float32, (0, 3)))


@pytest.mark.parametrize("name", ["neg", "abs", "sign", "floor", "ceil", "round", "trunc", "frac",
                                  "relu", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not"])
@pytest.mark.parametrize("dtype", ALL)
def test_unary_other(name, dtype):
    fn = getattr(torch, name)
    x = make((4, 3), dtype)
    try:
        expected = fn(x)
    except Exception:  # noqa: BLE001 - the op rejects this dtype on CPU: so must we
        check_error(fn, x)
        return
    check(fn, x)
    check(fn, make((), dtype))
    check(fn, make((0, 2), dtype))
    del expected


def test_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -2.5])
    y = torch.tensor([1.0, float("nan"), 2.0, -0.0, 0.0, float("inf"), 3.0])
    for fn in (torch.maximum, torch.minimum, torch.add, torch.mul, torch.div, torch.remainder, torch.atan2,
               lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda a, b: torch.div(a, b, rounding_mode="trunc")):
        check(fn, x, y)
    for fn in (torch.isnan, torch.isinf, torch.isposinf, torch.isneginf, torch.isfinite, torch.relu, torch.sign, torch.exp, torch.round,
               lambda t: torch.clamp(t, -1, 1)):
        check(fn, x)


def test_round_decimals():
    check(lambda t: torch.round(t, decimals=2), make((10,)) * 10)
    check(lambda t: torch.round(t, decimals=-1), make((10,)) * 100)


def test_where_clamp_masked_fill():
    c = make((3, 4), torch.bool)
    check(torch.where, c, make((3, 4)), make((3, 4)))
    check(torch.where, c, make((3, 4)), 2.0)
    check(torch.where, c, make((4,), torch.int64), make((3, 1)))
    check(lambda x: torch.clamp(x, -1, 0.5), make((3, 4)))
    check(lambda x: torch.clamp(x, min=0), make((3, 4), torch.int64))
    check(lambda x: torch.clamp(x, max=1.5), make((3, 4)))
    check(lambda x, lo, hi: torch.clamp(x, lo, hi), make((3, 4)), make((4,)) - 1, make((3, 1)) + 1)
    check(lambda x, m: x.masked_fill(m, -1.5), make((3, 4)), c)
    check(lambda x, m: x.masked_fill(m, torch.tensor(7)), make((3, 4), torch.int64), make((4,), torch.bool))
    check_error(lambda x, m: x.masked_fill(m, 1.0), make((3, 4)), make((3, 4), torch.int64))
    check_error(lambda x: torch.clamp(x), make((3,)))
    check_error(torch.where, make((3,)), make((3,)), make((3,)))


def test_activations():
    x = make((4, 5))
    for fn in (torch.relu, torch.nn.functional.gelu, lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
               torch.nn.functional.silu, torch.sigmoid, torch.tanh):
        check(fn, x, atol=1e-5, rtol=1e-5)
        check(fn, x.to(torch.bfloat16))


@pytest.mark.parametrize("name", ["add_", "sub_", "mul_", "div_", "clamp_", "masked_fill_", "fill_", "zero_",
                                  "relu_", "exp_", "copy_"])
def test_inplace(name):
    base = make((4, 6))
    other = make((4, 6)).abs() + 0.5
    args = {
        "add_": (other,), "sub_": (other,), "mul_": (other,), "div_": (other,), "clamp_": (-0.5, 0.5),
        "masked_fill_": (other > 1, 2.0), "fill_": (3.25,), "zero_": (), "relu_": (), "exp_": (), "copy_": (other,),
    }[name]
    check_inplace(lambda t, *a: getattr(t, name)(*a), base, *args)
    # through a non-contiguous view of a larger storage
    def on_view(t, *a):
        getattr(t.t()[1:5], name)(*[x.t()[1:5] if isinstance(x, torch.Tensor) else x for x in a])
    check_inplace(on_view, make((6, 6)), *[make((6, 6)).abs() + 0.5 if isinstance(x, torch.Tensor) and x.dtype != torch.bool
                                          else (make((6, 6)) > 0 if isinstance(x, torch.Tensor) else x) for x in args])


def test_inplace_dtype_errors():
    check_error(lambda a, b: a.add_(b), make((3,), torch.int64), make((3,)))
    check_error(lambda a, b: a.mul_(b), make((3,), torch.bool), make((3,), torch.int64))
    check_error(lambda a, b: a.add_(b), make((3, 1)), make((3, 4)))


def test_binary_errors():
    check_error(torch.add, make((2, 3)), make((4,)))
    check_error(torch.sub, make((2,), torch.bool), make((2,), torch.bool))
    check_error(lambda a, b: torch.add(a, b, alpha=1.5), make((2,), torch.int64), make((2,), torch.int64))
    check_error(lambda a: -a, make((2,), torch.bool))
    check_error(lambda a, b: torch.bitwise_and(a, b), make((2,)), make((2,)))
    check_error(lambda a: torch.div(a, 2, rounding_mode="bad"), make((2,)))


def test_grads():
    for fn in (lambda a, b: (a * b + a / (b.abs() + 1)).sum(),
               lambda a, b: (torch.maximum(a, b) - torch.tanh(a) * torch.sigmoid(b)).sum(),
               lambda a, b: (torch.nn.functional.gelu(a) * torch.nn.functional.silu(b) + torch.exp(a.clamp(-1, 1))).sum(),
               lambda a, b: torch.where(a > b, a ** 2, b.abs().sqrt()).sum()):
        a, b = make((3, 4)), make((3, 4))
        ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
        fn(ac, bc).backward()
        at, bt = a.to(TPU).requires_grad_(), b.to(TPU).requires_grad_()
        fn(at, bt).backward()
        torch.testing.assert_close(at.grad.cpu(), ac.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bt.grad.cpu(), bc.grad, atol=1e-5, rtol=1e-5)


def test_complex_scalar_promotes():
    check(lambda t: t + 1j, make((2, 3)))
    check(lambda t: t * (2 - 1j), make((4,)))


def test_equal():
    a = make((3, 4))
    assert torch.equal(a.to(TPU), a.clone().to(TPU)) is True
    b = a.clone()
    b[1, 2] += 1
    assert torch.equal(a.to(TPU), b.to(TPU)) is False
    assert torch.equal(a.to(TPU), a[:2].to(TPU)) is False
    assert torch.equal(a.to(TPU).t(), a.t().contiguous().to(TPU)) is True
    n = torch.tensor([float("nan")])
    assert torch.equal(n.to(TPU), n.to(TPU)) == torch.equal(n, n)
    assert torch.equal(torch.empty(0, device="tpu"), torch.empty(0, device="tpu")) is True


# ---- _add_relu (add then clamp at 0, PyTorch's fused kernel for mobile/JIT) ----------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8])
def test_add_relu(dtype):
    A = torch.ops.aten
    x, y = make((5, 6), dtype), make((5, 6), dtype)
    check(A._add_relu, x, y)
    check(lambda a, b: A._add_relu(a, b, alpha=2), x, y)
    check(A._add_relu, x.t(), y.t()[:1])  # non-contiguous, broadcast
    check(A._add_relu, make((), dtype), make((), dtype))
    check(A._add_relu, make((0, 3), dtype), make((0, 3), dtype))
    check(lambda a: A._add_relu(a, 2, 3), x)  # .Scalar
    check_inplace(lambda a, b: A._add_relu_(a, b), x, y)
    check_inplace(lambda a: A._add_relu_(a, -1), x)
    check(lambda a, b: A._add_relu(a, b, out=torch.empty(0, dtype=dtype, device=a.device)), x, y)


def test_add_relu_promotion_and_limits():
    A = torch.ops.aten
    check(lambda a: A._add_relu(a, 2.5), torch.tensor([1, -5, 2]))  # int + float number -> float
    check(lambda a, b: A._add_relu(a, b, alpha=2.5), torch.tensor([1, -2, 3]), torch.tensor([1, 2, -3]))  # alpha truncated
    check(A._add_relu, torch.tensor([float("inf"), -float("inf"), 1.0]), torch.tensor([1.0, 1.0, -3.0]))
    check(A._add_relu, torch.tensor([100, 20], dtype=torch.int8), torch.tensor([100, 3]))  # clamped at int8's max
    for dt in (torch.bool, torch.float16, torch.bfloat16, torch.uint8):
        e = check_error(A._add_relu, make((3,), dt), make((3,), dt))
        assert "Unsupported datatype for add_relu" in str(e)
    check_error(lambda a, b: A._add_relu(a, b, out=torch.empty(2, dtype=torch.int64, device=a.device)),
                torch.randn(2), torch.randn(2))


def test_clamp_min_max_bool_tensors():
    b, c = make((4, 5), torch.bool), make((4, 5), torch.bool)
    for f in (torch.clamp_min, torch.clamp_max):
        check(f, b, c)
        check(f, b.t(), c[:1].t())
        check(f, make((), torch.bool), make((), torch.bool))
        check(f, make((0, 2), torch.bool), make((0, 2), torch.bool))
        check(f, b, make((4, 5), torch.int64))  # promotes to int64
        check_error(f, b, True)  # the number overloads still raise
    check_inplace(lambda a, m: a.clamp_min_(m), b, c)
    check_inplace(lambda a, m: a.clamp_max_(m), b, c)
    check(lambda xs, ys: torch._foreach_clamp_min(xs, ys), [b, b[:2]], [c, c[:2]])
    check(lambda xs, ys: torch._foreach_clamp_max(xs, ys), [b, b[:2]], [c, c[:2]])
    xs = [b.clone(), b[:2].clone()]
    ts = [x.to(TPU) for x in xs]
    torch._foreach_clamp_max_(xs, [c, c[:2]])
    torch._foreach_clamp_max_(ts, [c.to(TPU), c[:2].to(TPU)])
    for x, t in zip(xs, ts):
        assert torch.equal(t.cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_log2_is_exact_at_powers_of_two(dtype):
    # floor and ceil of log2 pick exponents (MX recipes' block scales): log(x) / ln 2 gave
    # log2(8) = 2.9999998. Normal numbers: powers of two and their neighbours, as CPU.
    info = torch.finfo(dtype)
    k = torch.arange(math.frexp(info.tiny)[1] - 1, math.frexp(info.max)[1], dtype=torch.float64)
    x = (2.0 ** k).to(dtype)
    near = torch.cat([x, torch.nextafter(x, x * 2), torch.nextafter(x, x / 2)])
    near = near[(near >= info.tiny) & near.isfinite()]
    got = torch.log2(near.to(TPU)).cpu()
    assert torch.equal(got[: len(x)], k.to(dtype))
    assert torch.equal(got.floor(), torch.log2(near).floor()) and torch.equal(got.ceil(), torch.log2(near).ceil())
