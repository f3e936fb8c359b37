"""LAPACK results PyTorch returns as they are, reproduced on tpu: linalg.ldl_factor(_ex) and
linalg.ldl_solve (Bunch-Kaufman pivots, LD, info), and linalg.eig / linalg.eigvals for real
matrices (eigenvalues in LAPACK's order, eigenvectors with geev's normalization), against
PyTorch on CPU, with batches, empty and non-contiguous inputs, gradients and PyTorch's errors."""
import pytest
import torch
from helpers import TPU, check, check_error, to_cpu

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-9, rtol=1e-9),
       torch.complex64: dict(atol=1e-4, rtol=1e-4), torch.complex128: dict(atol=1e-9, rtol=1e-9)}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rnd(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, dtype=dtype, generator=gen(seed))


def symmetric(shape, dtype, hermitian=False, seed=0):
    a = rnd(shape, dtype, seed)
    return a + (a.mH if hermitian else a.mT)


def spd(shape, dtype, seed=0):
    a = rnd(shape, dtype, seed)
    n = shape[-1]
    return a @ a.mH / n + 0.1 * torch.eye(n, dtype=dtype)


# ---- LDL ----------------------------------------------------------------------------------------


def same_ldl(a, hermitian=False):
    ld, piv, info = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    ld2, piv2, info2 = to_cpu(torch.linalg.ldl_factor_ex(a.to(TPU), hermitian=hermitian))
    assert torch.equal(piv2, piv), (piv2, piv)
    assert torch.equal(info2, info)
    torch.testing.assert_close(ld2, ld, **TOL[a.dtype])
    return ld, piv


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_ldl_factor(dtype, n):
    # Indefinite symmetric matrices take 1x1 and 2x2 pivots with interchanges.
    same_ldl(symmetric((n, n), dtype, seed=n))
    same_ldl(symmetric((3, n, n), dtype, seed=n + 1))
    same_ldl(spd((2, n, n), dtype, seed=n + 2))
    if dtype.is_complex:
        same_ldl(symmetric((2, n, n), dtype, hermitian=True, seed=n + 3), hermitian=True)
        same_ldl(spd((n, n), dtype, seed=n + 4), hermitian=True)


def test_ldl_factor_special():
    # Small diagonals force interchanges and 2x2 blocks; zero columns set info.
    a = torch.tensor([[0.1, 0.5, 2.0], [0.5, 10.0, 0.3], [2.0, 0.3, 0.01]])
    same_ldl(a)
    same_ldl(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    same_ldl(torch.zeros(3, 3))
    same_ldl(torch.zeros(0, 0))
    same_ldl(torch.zeros(0, 2, 2))
    # Only the lower triangle is read.
    a = rnd((5, 5), seed=3)
    same_ldl(a)
    same_ldl(a.mT)  # a non-contiguous view
    check(torch.linalg.ldl_factor, symmetric((4, 4), torch.float32, seed=9))


def test_ldl_factor_errors():
    check_error(torch.linalg.ldl_factor_ex, rnd((3, 4)))
    check_error(torch.linalg.ldl_factor_ex, rnd((3,)))
    check_error(torch.linalg.ldl_factor_ex, torch.ones(3, 3, dtype=torch.int64))
    check_error(torch.linalg.ldl_factor_ex, torch.ones(3, 3, dtype=torch.bfloat16))
    # A zero pivot: ldl_factor and check_errors raise (PyTorch has no message for it).
    check_error(torch.linalg.ldl_factor, torch.zeros(3, 3))
    check_error(lambda a: torch.linalg.ldl_factor_ex(a, check_errors=True), torch.zeros(2, 3, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("n", [1, 3, 6, 9])
def test_ldl_solve(dtype, n):
    for hermitian in ([False, True] if dtype.is_complex else [False]):
        a = symmetric((2, n, n), dtype, hermitian=hermitian, seed=n) + 4 * torch.eye(n, dtype=dtype)
        ld, piv, _ = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
        for bshape in [(2, n, 3), (n, 2), (1, n, 1)]:
            b = rnd(bshape, dtype, seed=7)
            check(lambda l, p, x: torch.linalg.ldl_solve(l, p, x, hermitian=hermitian), ld, piv, b, **TOL[dtype])
    # Non-contiguous right-hand side.
    a = symmetric((n, n), dtype, seed=11) + 4 * torch.eye(n, dtype=dtype)
    ld, piv, _ = torch.linalg.ldl_factor_ex(a)
    b = rnd((3, n), dtype, seed=12)
    check(lambda l, p, x: torch.linalg.ldl_solve(l, p, x.mT), ld, piv, b, **TOL[dtype])


def test_ldl_solve_empty_and_errors():
    ld, piv, _ = torch.linalg.ldl_factor_ex(torch.zeros(0, 0))
    check(torch.linalg.ldl_solve, ld, piv, torch.zeros(0, 3))
    ld, piv, _ = torch.linalg.ldl_factor_ex(torch.zeros(0, 2, 2))
    check(torch.linalg.ldl_solve, ld, piv, torch.zeros(0, 2, 3))
    a = symmetric((3, 3), torch.float32) + 4 * torch.eye(3)
    ld, piv, _ = torch.linalg.ldl_factor_ex(a)
    check_error(torch.linalg.ldl_solve, ld, piv, rnd((4, 2)))
    check_error(torch.linalg.ldl_solve, ld, piv, rnd((3,)))
    check_error(torch.linalg.ldl_solve, ld, piv[:2], rnd((3, 2)))
    check_error(torch.linalg.ldl_solve, ld, piv.float(), rnd((3, 2)))
    check_error(torch.linalg.ldl_solve, ld, piv, rnd((3, 2), torch.float64))
    check_error(torch.linalg.ldl_solve, ld[:, :2], piv, rnd((3, 2)))


# ---- eig, eigvals ----------------------------------------------------------------------------------


SIGNS = {"same": 0, "flipped": 0}


def same_eig(a):
    """Eigenvalues equal, in LAPACK's order; each eigenvector equal up to the sign of the whole
    vector (which follows rounding-level details of the Householder and QR steps, as it does
    between LAPACK implementations); the count of sign flips is kept in SIGNS."""
    w, v = torch.linalg.eig(a)
    w2, v2 = to_cpu(torch.linalg.eig(a.to(TPU)))
    tol = TOL[w.dtype]
    torch.testing.assert_close(w2, w, **tol)
    assert v2.dtype == v.dtype and v2.shape == v.shape
    if v.numel() == 0:
        return
    scale = 1e-3 if w.dtype == torch.complex64 else 1e-8
    same = (v2 - v).abs().amax(-2) < scale
    flipped = (v2 + v).abs().amax(-2) < scale
    assert bool((same | flipped).all()), (v2, v)
    SIGNS["same"] += int(same.sum())
    SIGNS["flipped"] += int((flipped & ~same).sum())
    # The normalization: unit norm, the largest component of each vector real.
    torch.testing.assert_close(torch.linalg.vector_norm(v2, dim=-2), torch.ones(w.shape, dtype=w.real.dtype), **tol)
    k = v2.abs().argmax(-2, keepdim=True)
    assert bool((torch.gather(v2, -2, k).imag.abs() < 1e-6).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 10, 16])
def test_eig(dtype, n):
    for seed in range(3):
        same_eig(rnd((n, n), dtype, seed=seed + 10 * n))
    same_eig(rnd((2, 3, n, n), dtype, seed=n))
    # Rows of very different sizes: the balancing scales them.
    same_eig(rnd((n, n), dtype, seed=n) * (4.0 ** (torch.arange(n, dtype=dtype) % 4)).unsqueeze(-1))


def test_eig_signs_follow_lapack():
    """Eigenvector signs follow LAPACK's steps: on random matrices, nearly all match MKL's."""
    SIGNS.update(same=0, flipped=0)
    for seed in range(40):
        same_eig(rnd((6, 6), torch.float64, seed=100 + seed))
        same_eig(rnd((5, 5), torch.float32, seed=200 + seed))
    assert SIGNS["flipped"] <= 0.1 * (SIGNS["same"] + SIGNS["flipped"]), SIGNS


def test_eig_structured():
    # Triangular and block structures: the balancing's permutations isolate eigenvalues.
    a = rnd((5, 5), seed=1)
    same_eig(torch.triu(a))
    same_eig(torch.tril(a))
    same_eig(torch.diag(torch.tensor([3.0, -1.0, 2.0, 0.5])))
    b = a.clone()
    b[:, 0] = 0
    b[0, 0] = 1.5
    same_eig(b)
    c = a.clone()
    c[2, :] = 0
    c[2, 2] = -2.0
    same_eig(c)
    same_eig(torch.zeros(3, 3))
    same_eig(torch.tensor([[0.0, -1.0], [1.0, 0.0]]))  # a rotation: +-i
    same_eig(torch.tensor([[2.0, 1.0], [0.0, 2.0]]))  # a Jordan block
    same_eig(a.mT)  # a non-contiguous view
    same_eig(torch.zeros(0, 0))
    same_eig(torch.zeros(2, 0, 0))
    same_eig(torch.zeros(0, 3, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eigvals(dtype):
    for n in [1, 2, 5, 9]:
        check(torch.linalg.eigvals, rnd((n, n), dtype, seed=n), **TOL[dtype.to_complex()])
    check(torch.linalg.eigvals, rnd((3, 4, 4), dtype, seed=5), **TOL[dtype.to_complex()])
    check(torch.linalg.eigvals, torch.zeros(0, 2, 2, dtype=dtype))
    # LAPACK gives NaNs for non-finite input (eigvals does not check).
    a = rnd((3, 3), dtype)
    a[1, 2] = float("inf")
    check(torch.linalg.eigvals, a)


def test_eig_grads():
    # eigvals, and a loss of eig that does not depend on the eigenvectors' phases.
    a = rnd((2, 4, 4), torch.float64, seed=3)
    wts = rnd((4, 4), torch.float64, seed=4)
    for fn in [torch.linalg.eigvals,
               lambda t: torch.linalg.eig(t)[0],
               lambda t: (torch.linalg.eig(t)[1].abs() ** 2 * wts.to(t.device)).sum() + torch.linalg.eig(t)[0].real.sum()]:
        c = a.clone().requires_grad_()
        d = a.to(TPU).requires_grad_()
        yc, yd = fn(c), fn(d)
        g = torch.randn(yc.shape, dtype=yc.dtype, generator=gen(5))
        yc.backward(g)
        yd.backward(g.to(TPU))
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=1e-7, rtol=1e-7)


def test_eig_errors():
    check_error(torch.linalg.eig, rnd((2, 3)))
    check_error(torch.linalg.eig, rnd((3,)))
    check_error(torch.linalg.eig, torch.ones(3, 3, dtype=torch.int64))
    check_error(torch.linalg.eig, torch.ones(3, 3, dtype=torch.bfloat16))
    check_error(torch.linalg.eigvals, torch.ones(3, 3, dtype=torch.float16))
    a = rnd((2, 3, 3))
    a[1, 0, 0] = float("nan")
    check_error(torch.linalg.eig, a)


def test_compile_graph():
    # Compiled graphs run the same lowerings (without the data-dependent checks).
    def g(x):
        return torch.linalg.eigvals(x), torch.linalg.eig(x)[0], torch.linalg.ldl_factor(x + x.mT)[0]
    x = rnd((4, 4), seed=21)
    got = torch.compile(g, backend="tpu")(x.to(TPU))
    for a, e in zip(got, g(x)):
        torch.testing.assert_close(a.cpu(), e, **TOL[torch.float32])
