"""Special and remaining elementwise math against PyTorch on CPU: values, dtypes, promotion,
views, 0-d/empty tensors, gradients and errors."""
import pytest
import torch
from helpers import TPU, assert_matches_cpu, check, check_error, check_inplace, check_or_error, make, to_cpu

SHAPES = [(), (0,), (7,), (3, 5)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]


def grads(fn, *inputs, atol=1e-5, rtol=1e-4):
    """Gradients of sum(fn(*inputs)) on CPU and on tpu."""
    cpu = [x.clone().requires_grad_() for x in inputs]
    dev = [x.to(TPU).requires_grad_() for x in inputs]
    fn(*cpu).sum().backward()
    fn(*dev).sum().backward()
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=atol, rtol=rtol, equal_nan=True)


UNARY = {
    "polygamma0": lambda x: torch.polygamma(0, x),
    "polygamma1": lambda x: torch.polygamma(1, x),
    "polygamma2": lambda x: torch.polygamma(2, x),
    "polygamma3": lambda x: torch.special.polygamma(3, x),
    "logit": torch.logit,
    "logit_eps": lambda x: torch.logit(x, eps=0.1),
    "ndtri": torch.special.ndtri,
    "log_ndtr": torch.special.log_ndtr,
    "erfcx": torch.special.erfcx,
    "i0": torch.i0,
    "special_i0": torch.special.i0,
    "i0e": torch.special.i0e,
    "i1": torch.special.i1,
    "i1e": torch.special.i1e,
    "modified_bessel_i0": torch.special.modified_bessel_i0,
    "modified_bessel_i1": torch.special.modified_bessel_i1,
    "sinc": torch.sinc,
    "entr": torch.special.entr,
    "angle": torch.angle,
    "signbit": torch.signbit,
    "nan_to_num": torch.nan_to_num,
    "frexp": torch.frexp,
}

# Inputs inside the interesting domain of each function.
DOMAIN = {
    "logit": (0.02, 0.98),
    "logit_eps": (-0.2, 1.2),
    "ndtri": (0.001, 0.999),
    "erfcx": (-5.0, 30.0),
    "log_ndtr": (-20.0, 6.0),
    "i0": (-12.0, 12.0),
    "i1": (-12.0, 12.0),
    "special_i0": (-12.0, 12.0),
    "modified_bessel_i0": (-12.0, 12.0),
    "modified_bessel_i1": (-12.0, 12.0),
    "i0e": (-20.0, 20.0),
    "i1e": (-20.0, 20.0),
    "polygamma0": (0.1, 9.0),
    "polygamma1": (-4.0, 9.0),
    "polygamma2": (0.1, 9.0),
    "polygamma3": (0.1, 9.0),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_unary(name, dtype, shape):
    lo, hi = DOMAIN.get(name, (-3.0, 3.0)) if dtype.is_floating_point else (None, None)
    x = make(shape, dtype, low=lo, high=hi)
    # i0/i1 in 16-bit floats overflow to large values: compare relatively.
    tol = dict(atol=1e-2, rtol=3e-2) if dtype in (torch.bfloat16, torch.float16) else {}
    check_or_error(UNARY[name], x, **tol)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_views(name):
    lo, hi = DOMAIN.get(name, (-3.0, 3.0))
    x = make((6, 4), low=lo, high=hi)
    check(lambda t: UNARY[name](t.t()), x)
    check(lambda t: UNARY[name](t[::2]), x)
    check(lambda t: UNARY[name](t[:1].expand(6, 4)), x)


def test_special_values():
    inf, nan = float("inf"), float("nan")
    # (no subnormals: XLA's CPU backend flushes them to zero)
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, inf, -inf, nan, 1e-30, -3e-32, 5e-9, 0.5, 2.0, 1e30, -2.0, 30.0])
    for fn in [torch.sinc, torch.special.entr, torch.special.erfcx, torch.special.log_ndtr, torch.special.ndtri,
               torch.special.i0e, torch.special.i1e, torch.signbit, torch.angle, torch.frexp, torch.logit,
               torch.nan_to_num, lambda t: torch.nan_to_num(t, nan=1.5, posinf=7.0, neginf=-2.0),
               lambda t: torch.polygamma(1, t), lambda t: torch.polygamma(2, t), torch.special.i0]:
        check(fn, x)
    check(torch.frexp, x.double())
    check(torch.frexp, x.half())
    check(torch.frexp, x.bfloat16())
    check(torch.signbit, torch.tensor([-0.0, 0.0, -nan, nan]).bfloat16())
    check(lambda t: torch.nan_to_num(t, posinf=1e39), torch.tensor([inf, -inf, nan]))
    # poles of polygamma and zeta at non-positive integers, and the reflection of trigamma
    p = torch.tensor([-3.0, -2.5, -0.5, 0.0, 0.25, -8.4783735, -8.0676])
    check(lambda t: torch.polygamma(1, t), p)
    check(lambda t: torch.polygamma(3, t), p)
    check(lambda t: torch.polygamma(4, t), p, rtol=1e-4, atol=1e-3)


BINARY = {
    "xlogy": torch.xlogy,
    "special_xlogy": torch.special.xlogy,
    "xlog1py": torch.special.xlog1py,
    "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2,
    "hypot": torch.hypot,
    "copysign": torch.copysign,
    "nextafter": torch.nextafter,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "heaviside": torch.heaviside,
    "gcd": torch.gcd,
    "lcm": torch.lcm,
    "lshift": lambda a, b: a << b.abs() % 8 if not a.is_floating_point() else a << b,
    "rshift": lambda a, b: a >> b.abs() % 8 if not a.is_floating_point() else a >> b,
    "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift,
    "igamma": torch.igamma,
    "igammac": torch.special.gammaincc,
    "zeta": torch.special.zeta,
}
POSITIVE = {"igamma": (0.1, 12.0), "igammac": (0.1, 12.0), "zeta": (1.1, 9.0), "xlogy": (-1.0, 5.0)}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 5)])
def test_binary(name, dtype, shape):
    lo, hi = POSITIVE.get(name, (None, None))
    a = make(shape, dtype, low=lo, high=hi)
    b = make(shape, dtype, low=lo, high=hi)
    if name == "zeta":
        b = make(shape, dtype, low=0.2, high=5.0)
    tol = dict(atol=1e-4, rtol=1e-4) if name in ("igamma", "igammac") and dtype == torch.float32 else {}
    check_or_error(BINARY[name], a, b, **tol)


@pytest.mark.parametrize("name", ["xlogy", "logaddexp", "hypot", "copysign", "fmax", "heaviside", "gcd", "zeta"])
def test_binary_broadcast_views(name):
    fn = BINARY[name]
    dtype = torch.int64 if name == "gcd" else torch.float32
    lo, hi = (1.5, 6.0) if name == "zeta" else (None, None)
    a = make((4, 6), dtype, low=lo, high=hi)
    b = make((6,), dtype, low=lo, high=hi)
    check(fn, a, b)
    check(lambda x, y: fn(x.t()[1::2], y[:4]), a, b)
    check(lambda x, y: fn(x, y.expand(4, 6)), a, b)


def test_promotion_and_scalars():
    f = make((3, 4))
    i = make((3, 4), torch.int64)
    h = make((3, 4), torch.bfloat16)
    z = torch.tensor(2.5, dtype=torch.float64)
    for fn in [torch.xlogy, torch.copysign, torch.special.xlog1py, torch.special.zeta, torch.fmax, torch.logaddexp,
               torch.hypot, torch.nextafter]:
        for a, b in [(f, i), (h, i), (i, h), (h, f), (h, z), (i, z), (f.double(), h)]:
            check_or_error(fn, a.abs() + 1.1, b.abs() + 0.5)
    # Python numbers on either side
    check(lambda y: torch.xlogy(2, y), f.abs())
    check(lambda y: torch.xlogy(y, 3.5), f)
    check(lambda y: torch.special.xlog1py(0.5, y), f.abs())
    check(lambda y: torch.special.xlog1py(y, 2), f)
    check(lambda y: torch.special.zeta(y, 2.0), f.abs() + 1.5)
    check(lambda y: torch.special.zeta(3, y), f.abs() + 0.5)
    check(lambda y: torch.copysign(y, -1.0), f)
    check(lambda y: torch.copysign(y, 2), i)
    check(lambda y: y << 3, i)
    check(lambda y: y >> 2, i.int())
    check(lambda y: torch.bitwise_left_shift(5, y.abs()), i)
    check(lambda y: torch.bitwise_right_shift(y, 1), i.to(torch.uint8))
    # in-place shifts (x <<= n, x >>= t)
    def ilshift(a, b):
        a <<= b
    def irshift(a, b):
        a >>= b
    check_inplace(ilshift, i, 3)
    check_inplace(irshift, i.int(), torch.tensor(2))
    check_inplace(ilshift, i.int(), i.abs() % 5)
    check_inplace(lambda a, b: a.bitwise_right_shift_(b), i, 1)
    # out-of-range shift amounts
    sh = torch.tensor([-1, 0, 7, 8, 31, 32, 63, 64, 100])
    check(lambda a, b: a << b, torch.full((9,), -5), sh)
    check(lambda a, b: a >> b, torch.full((9,), -5), sh)
    check(lambda a, b: a >> b, torch.full((9,), 200, dtype=torch.uint8), sh.to(torch.uint8))


def test_nan_and_inf_binary():
    inf, nan = float("inf"), float("nan")
    v = torch.tensor([0.0, -0.0, 1.0, -2.0, inf, -inf, nan])
    a = v.repeat_interleave(7)
    b = v.repeat(7)
    for fn in [torch.xlogy, torch.special.xlog1py, torch.logaddexp, torch.logaddexp2, torch.hypot, torch.copysign,
               torch.nextafter, torch.fmax, torch.fmin, torch.heaviside, torch.igamma, torch.igammac,
               torch.special.zeta]:
        check(fn, a, b)
    check(torch.gcd, torch.tensor([0, 0, 12, -12, 7, 2**40]), torch.tensor([0, 5, 18, 18, -21, 2**20]))
    check(torch.lcm, torch.tensor([0, 0, 12, -12, 7, 2**20]), torch.tensor([0, 5, 18, 18, -21, 2**10]))


def test_out_and_inplace():
    x = make((3, 4)).abs() + 0.1
    y = make((3, 4))
    for fn in ["xlogy_", "logaddexp", "hypot_", "copysign_", "nextafter_", "fmax", "logit_", "i0_", "sinc_",
               "nan_to_num_", "heaviside_"]:
        c, d = x.clone(), x.to(TPU)
        if fn.endswith("_"):
            args = () if fn in ("logit_", "i0_", "sinc_", "nan_to_num_") else (y,)
            getattr(c, fn)(*args)
            getattr(d, fn)(*[a.to(TPU) for a in args])
            assert_matches_cpu(d.cpu(), c)
    out_c, out_d = torch.empty(3, 4), torch.empty(3, 4, device=TPU)
    torch.special.i1e(x, out=out_c)
    torch.special.i1e(x.to(TPU), out=out_d)
    assert_matches_cpu(out_d.cpu(), out_c)
    m_c, e_c = torch.empty(3, 4), torch.empty(3, 4, dtype=torch.int32)
    m_d, e_d = m_c.to(TPU), e_c.to(TPU)
    torch.frexp(x, out=(m_c, e_c))
    torch.frexp(x.to(TPU), out=(m_d, e_d))
    assert_matches_cpu((m_d.cpu(), e_d.cpu()), (m_c, e_c))
    # an int out= for a float result is refused
    check_error(lambda a, o: torch.xlogy(a, a, out=o), x, torch.empty(3, 4, dtype=torch.int64))


GRAD_UNARY = {
    "polygamma0": (lambda x: torch.polygamma(0, x), 0.5, 5.0),
    "polygamma1": (lambda x: torch.polygamma(1, x), 0.5, 5.0),
    "polygamma2": (lambda x: torch.polygamma(2, x), 0.5, 5.0),
    "logit": (torch.logit, 0.05, 0.95),
    "logit_eps": (lambda x: torch.logit(x, 0.2), 0.05, 0.95),
    "ndtri": (torch.special.ndtri, 0.05, 0.95),
    "log_ndtr": (torch.special.log_ndtr, -8.0, 4.0),
    "erfcx": (torch.special.erfcx, -2.0, 8.0),
    "i0": (torch.i0, -5.0, 5.0),
    "i0e": (torch.special.i0e, -5.0, 5.0),
    "i1": (torch.special.i1, -5.0, 5.0),
    "i1e": (torch.special.i1e, -5.0, 5.0),
    "sinc": (torch.sinc, -3.0, 3.0),
    "entr": (torch.special.entr, 0.1, 3.0),
    "frexp": (lambda x: torch.frexp(x)[0], -3.0, 3.0),
    "nan_to_num": (torch.nan_to_num, -3.0, 3.0),
}


@pytest.mark.parametrize("name", sorted(GRAD_UNARY))
def test_unary_grads(name):
    fn, lo, hi = GRAD_UNARY[name]
    grads(fn, make((4, 5), low=lo, high=hi))


@pytest.mark.parametrize("name", ["xlogy", "xlog1py", "logaddexp", "logaddexp2", "hypot", "copysign", "fmax", "fmin",
                                  "zeta", "igamma"])
def test_binary_grads(name):
    a = make((4, 5), low=0.5, high=3.0)
    b = make((4, 5), low=0.5, high=3.0)
    if name in ("zeta", "igamma"):
        # only the second argument is differentiable
        fn = BINARY[name]
        cpu_b = b.clone().requires_grad_()
        dev_b = b.to(TPU).requires_grad_()
        fn(a, cpu_b).sum().backward()
        fn(a.to(TPU), dev_b).sum().backward()
        torch.testing.assert_close(dev_b.grad.cpu(), cpu_b.grad, atol=1e-4, rtol=1e-4)
        return
    if name in ("copysign", "fmax", "fmin"):
        b = make((4, 5))
    grads(BINARY[name], a, b)


def test_errors():
    f = make((3,))
    i = make((3,), torch.int64)
    check_error(lambda x: torch.polygamma(-1, x), f)
    check_error(torch.heaviside, f, f.double())
    check_error(torch.gcd, f, f)
    check_error(torch.lcm, i, f)
    check_error(torch.logaddexp, i, i)
    check_error(torch.hypot, i, i)
    check_error(torch.nextafter, i, i)
    check_error(torch.igamma, i, i)
    check_error(torch.frexp, i)
    check_error(torch.special.zeta, f.bfloat16(), f.bfloat16())
    check_error(lambda x: x << 1, f)
    check_error(torch.bitwise_right_shift, i.bool(), i.bool())
    check_error(torch.xlogy, make((3, 4)), make((5,)))


def test_compiled_graphs():
    x = make((4, 6), low=0.1, high=3.0)
    i = make((4, 6), torch.int64, low=1, high=30)
    fns = [lambda t: torch.xlogy(t, t + 1), lambda t: torch.polygamma(2, t), lambda t: torch.special.i1e(t),
           lambda t: torch.special.erfcx(t), lambda t: torch.logaddexp(t, 2 * t), lambda t: torch.frexp(t),
           lambda t: torch.nan_to_num(t / 0), lambda t: torch.igamma(t, t + 0.5), lambda t: torch.special.zeta(t + 2, t),
           lambda t: torch.logit(t / 4, 0.05), lambda t: torch.hypot(t, t - 1)]
    for f in fns:
        expected = f(x)
        got = torch.compile(f, backend="tpu")(x.to(TPU))
        if isinstance(expected, tuple):
            got, expected = tuple(got), tuple(expected)
        assert_matches_cpu(to_cpu(got), expected, 1e-5, 1e-5)
    g = lambda a: torch.gcd(a, a + 6) << 1
    assert_matches_cpu(to_cpu(torch.compile(g, backend="tpu")(i.to(TPU))), g(i))


# ---- orthogonal polynomials, Bessel functions, Airy Ai --------------------------------------------

POLYS = {
    "chebyshev_t": torch.special.chebyshev_polynomial_t,
    "chebyshev_u": torch.special.chebyshev_polynomial_u,
    "chebyshev_v": torch.special.chebyshev_polynomial_v,
    "chebyshev_w": torch.special.chebyshev_polynomial_w,
    "shifted_chebyshev_t": torch.special.shifted_chebyshev_polynomial_t,
    "shifted_chebyshev_u": torch.special.shifted_chebyshev_polynomial_u,
    "shifted_chebyshev_v": torch.special.shifted_chebyshev_polynomial_v,
    "shifted_chebyshev_w": torch.special.shifted_chebyshev_polynomial_w,
    "legendre_p": torch.special.legendre_polynomial_p,
    "laguerre_l": torch.special.laguerre_polynomial_l,
    "hermite_h": torch.special.hermite_polynomial_h,
    "hermite_he": torch.special.hermite_polynomial_he,
}
POLY_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]


@pytest.mark.parametrize("name", sorted(POLYS))
@pytest.mark.parametrize("dtype", POLY_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_polynomial(name, dtype, shape):
    fn = POLYS[name]
    # x around the interval of orthogonality and beyond; n from -3 to 14, fractional for floats
    # (read by truncation), which covers the recurrence and the trigonometric forms.
    x = make(shape, dtype, low=-1.5, high=1.5) if dtype.is_floating_point else make(shape, dtype, low=-3, high=4)
    n = make(shape, dtype, low=-3.0, high=14.0) if dtype.is_floating_point else make(shape, dtype, low=-3, high=15)
    check_or_error(fn, x, n, atol=1e-5, rtol=2e-5)
    # wide x: values grow large (a 14-step recurrence: the last bits depend on how the code
    # rounds, fused multiply-adds or not, as on the narrow range)
    if dtype == torch.float32:
        check_or_error(fn, make(shape, dtype, low=-9.0, high=9.0), n, atol=1e-5, rtol=2e-5)


@pytest.mark.parametrize("name", sorted(POLYS))
def test_polynomial_edges(name):
    fn = POLYS[name]
    inf, nan = float("inf"), float("nan")
    xs = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-6, -1e-6, 0.99999994, -0.99999994, 1.0000001, 2.0, -2.0,
                       0.3, -0.7, 1e-30, 7.5, inf, -inf, nan])
    ns = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.9, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 20.0, 40.0, 2.9,
                       nan, inf, -inf, 1e20, -1e20])
    x = xs.repeat_interleave(len(ns))
    n = ns.repeat(len(xs))
    check(fn, x, n, atol=1e-5, rtol=2e-5)
    check(fn, x.double(), n.double())


def test_polynomial_scalars_promotion_views_out():
    x = make((4, 6), low=-1.2, high=1.2)
    n = make((4, 6), low=0.0, high=12.0)
    ni = make((6,), torch.int64, low=-2, high=12)
    # torch's CPU kernel rounds the float32 recurrences differently by host CPU (1.8e-6 relative
    # against ours on an AMD EPYC): test_polynomial's tolerance.
    tol = dict(atol=1e-5, rtol=2e-5)
    for fn in POLYS.values():
        # Python numbers on either side (the x_scalar and n_scalar overloads)
        check(lambda t: fn(t, 3), x, **tol)
        check(lambda t: fn(t, 9.7), x, **tol)
        check(lambda t: fn(0.25, t), n, **tol)
        check(lambda t: fn(-1, t), ni, **tol)
        # promotion: int n with float x, a float64 0-d n (no promotion), float64 x, int x
        check(fn, x, ni, **tol)
        check(fn, x, torch.tensor(7.0, dtype=torch.float64), **tol)
        check(fn, x.double(), n)
        check(fn, ni, n, **tol)
        # broadcasting and non-contiguous views
        check(lambda a, b: fn(a.t()[1::2], b[:4]), x, ni, **tol)
        check(lambda a, b: fn(a[:1].expand(4, 6), b.t().t()), x, n, **tol)
        # out=, including an out of another float dtype
        for out_dtype in (torch.float32, torch.float64):
            oc, od = torch.empty(4, 6, dtype=out_dtype), torch.empty(4, 6, dtype=out_dtype, device=TPU)
            fn(x, n, out=oc)
            fn(x.to(TPU), n.to(TPU), out=od)
            # computed in float32 either way (the inputs' dtype), then written as out's dtype
            assert_matches_cpu(od.cpu(), oc, 1e-5, 2e-5)


def test_polynomial_long_recurrences():
    # |x| > 1 with a huge n: the recurrence overflows, turns NaN and stops (as on CPU) instead
    # of running n times; Hermite beyond its limit is NaN (128 in float32, 512 in float64).
    x = torch.tensor([1.5, -2.0, 3.0, -1.25])
    for name in ["chebyshev_t", "chebyshev_u", "chebyshev_v", "chebyshev_w", "legendre_p", "shifted_chebyshev_t"]:
        check(POLYS[name], x, torch.full((4,), 1e9))
    for name in ["hermite_h", "hermite_he"]:
        n = torch.tensor([127.0, 128.0, 129.0, 1000.0])
        check(POLYS[name], torch.tensor([0.1, -0.2, 0.3, 0.4]), n, rtol=1e-4, atol=1e-5)
        check(POLYS[name], torch.tensor([0.1, -0.2, 0.3, 0.4]).double(), torch.tensor([300.0, 512.0, 513.0, 1e6]).double(),
              rtol=1e-9, atol=1e-9)
    # Legendre and Laguerre with a large n inside [-1, 1] run the full recurrence
    check(POLYS["legendre_p"], torch.tensor([0.3, -0.9, 0.01]), torch.tensor([500.0, 1000.0, 3.0]), atol=1e-5, rtol=1e-4)
    check(POLYS["laguerre_l"], torch.tensor([0.3, 2.5, 0.01]), torch.tensor([300.0, 50.0, 3.0]), atol=1e-4, rtol=1e-4)


BESSEL = {
    "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0,
    "bessel_y1": torch.special.bessel_y1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "airy_ai": torch.special.airy_ai,
}


@pytest.mark.parametrize("name", sorted(BESSEL))
@pytest.mark.parametrize("dtype", POLY_DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(2, 3, 4)])
def test_bessel(name, dtype, shape):
    fn = BESSEL[name]
    x = make(shape, dtype, low=-12.0, high=12.0) if dtype.is_floating_point else make(shape, dtype, low=-9, high=12)
    check_or_error(fn, x)
    if dtype in (torch.float32, torch.float64):
        # both sides of each branch point (5 for J/Y, 2 for K, 0.5 for j0, +-2.09 for Ai)
        check_or_error(fn, make(shape, dtype, low=-0.5, high=6.0))


def test_bessel_edges_views_out():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, 1e-6, -1e-6, 9e-6, 1e-5, 0.25, 0.49, 0.5, -0.5, 1.0, -1.0, 1.99, 2.0, 2.01, -2.0, 2.08,
                      2.09, -2.09, -2.1, 4.99, 5.0, 5.01, -5.0, 8.0, 8.32, 8.33, -8.0, 30.0, -30.0, 103.0, 103.9, 1e4,
                      -1e4, 1e30, 1e-30, inf, -inf, nan])
    for name, fn in BESSEL.items():
        check(fn, x, atol=1e-6, rtol=2e-6)
        check(fn, x.double())
        v = make((6, 5), low=0.1, high=10.0)
        check(lambda t: fn(t.t()), v)
        check(lambda t: fn(t[::2, 1:]), v)
        check(lambda t: fn(t[:1].expand(6, 5)), v)
        oc, od = torch.empty(6, 5), torch.empty(6, 5, device=TPU)
        fn(v, out=oc)
        fn(v.to(TPU), out=od)
        assert_matches_cpu(od.cpu(), oc)
        # not differentiable in PyTorch: no graph on either device
        r = fn(v.to(TPU).requires_grad_())
        assert r.requires_grad == fn(v.clone().requires_grad_()).requires_grad


def test_polynomial_and_bessel_errors():
    f = make((3,))
    h = f.bfloat16()
    # PyTorch's CPU kernels exist for float32 and float64 only
    check_error(torch.special.chebyshev_polynomial_t, h, h)
    check_error(torch.special.hermite_polynomial_h, f.half(), f.half())
    check_error(lambda t: torch.special.legendre_polynomial_p(t, 2), h)
    check_error(torch.special.bessel_j0, h)
    check_error(torch.special.airy_ai, f.half())
    check_error(torch.special.scaled_modified_bessel_k1, h)
    # shapes that do not broadcast; an int out= for a float result
    check_error(torch.special.laguerre_polynomial_l, make((3, 4)), make((5,)))
    check_error(lambda a, o: torch.special.chebyshev_polynomial_u(a, a, out=o), f, torch.empty(3, dtype=torch.int64))
    check_error(lambda a, o: torch.special.bessel_y0(a, out=o), f, torch.empty(3, dtype=torch.int64))


def test_polynomial_and_bessel_compiled():
    x = make((4, 6), low=-1.5, high=1.5)
    n = make((4, 6), low=0.0, high=12.0)
    fns = [lambda a, b: torch.special.chebyshev_polynomial_t(a, b) + torch.special.legendre_polynomial_p(a, b),
           lambda a, b: torch.special.hermite_polynomial_h(a, b) * torch.special.shifted_chebyshev_polynomial_v(a, 8),
           lambda a, b: torch.special.bessel_j1(a * b) + torch.special.modified_bessel_k0(b + 0.1),
           lambda a, b: torch.special.airy_ai(a * 3) - torch.special.spherical_bessel_j0(b),
           lambda a, b: torch.special.laguerre_polynomial_l(b, 5) + torch.special.bessel_y1(b + 1)]
    for f in fns:
        expected = f(x, n)
        got = torch.compile(f, backend="tpu")(x.to(TPU), n.to(TPU))
        assert_matches_cpu(to_cpu(got), expected, 1e-5, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("p", [1, 3])
def test_mvlgamma_out_and_inplace(dtype, p):
    x = make((4, 5), dtype, low=2, high=6)
    odt = dtype if dtype.is_floating_point else torch.float32
    for v in (x, x.t(), make((), dtype, low=2, high=6), make((0, 3), dtype)):
        check(lambda a: torch.mvlgamma(a, p, out=torch.empty(0, dtype=odt, device=a.device)), v)
        check(lambda a: torch.special.multigammaln(a, p, out=torch.empty(0, dtype=odt, device=a.device)), v)
    if dtype.is_floating_point:
        check_inplace(lambda a: a.mvlgamma_(p), x)
    check_error(lambda a: torch.mvlgamma(a, 0, out=torch.empty(0, device=a.device)), x)
    check_error(lambda a: torch.mvlgamma(a, p, out=torch.empty(0, device=a.device)), make((3,), torch.bool))
