"""Float32 products on the CPU plugin run PyTorch's own CPU matmul, called from XLA's program
(the torchtpu.host_matmul custom call): each layout a contraction can have (transposed operands,
batch dims, several contracted dims, operands read through a transpose, broadcasts) against
torch on CPU, eager, compiled and under autograd; and which products stay XLA's."""
import os
import subprocess
import sys

import pytest
import torch

from helpers import TPU, make

M, K, N = 160, 144, 128  # above the call's size threshold (2**21 multiply-adds)

CASES = {
    "nn": (lambda a, b: a @ b, [(M, K), (K, N)]),
    "nt": (lambda a, b: a @ b.t(), [(M, K), (N, K)]),
    "tn": (lambda a, b: a.t() @ b, [(K, M), (K, N)]),
    "tt": (lambda a, b: a.t() @ b.t(), [(K, M), (N, K)]),
    "linear_3d": (lambda x, w: torch.nn.functional.linear(x, w), [(4, 40, K), (N, K)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 96, 80), (3, 80, 112)]),
    "bmm_transposed": (lambda a, b: a.transpose(1, 2) @ b.transpose(1, 2), [(3, 80, 96), (3, 112, 80)]),
    "two_batch_dims": (lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), [(2, 3, 128, 64), (2, 3, 96, 64)]),
    "inner_batch_dim": (lambda q, k: torch.einsum("bqhd,bkhd->bhqk", q, k), [(2, 128, 3, 64), (2, 96, 3, 64)]),
    "two_contracted_dims": (lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), [(M, 12, 12), (12, 12, N)]),
    "contracted_dims_swapped": (lambda a, b: torch.tensordot(a, b, dims=([1, 2], [1, 0])), [(M, 12, 16), (16, 12, N)]),
    "permuted_free_dims": (lambda x, w: x.permute(2, 1, 0) @ w, [(K, 24, 10), (K, N)]),
    "broadcast_batch": (lambda a, b: a @ b, [(2, 1, 64, 96), (3, 96, 120)]),
    "matrix_vector": (lambda a, v: a @ v, [(4096, 640), (640,)]),
    "noncontiguous_views": (lambda a, b: a[::2, 1:] @ b[:, ::3], [(2 * M, K + 1), (K, 3 * N)]),
}


@pytest.mark.parametrize("case", CASES)
def test_products_match_cpu(case):
    fn, shapes = CASES[case]
    args = [make(s) for s in shapes]
    expected = fn(*args)
    got = fn(*[a.to(TPU) for a in args]).cpu()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["nt", "tn", "bmm_transposed", "two_batch_dims", "two_contracted_dims"])
def test_compiled_products_and_gradients_match_cpu(case):
    fn, shapes = CASES[case]
    args = [make(s).requires_grad_() for s in shapes]
    (fn(*args) ** 2).sum().backward()
    devs = [a.detach().to(TPU).requires_grad_() for a in args]
    out = torch.compile(lambda *xs: (fn(*xs) ** 2).sum(), backend="tpu")(*devs)
    out.backward()
    torch.testing.assert_close(out.detach().cpu(), (fn(*args) ** 2).sum().detach(), rtol=1e-4, atol=1e-2)
    for d, a in zip(devs, args):
        torch.testing.assert_close(d.grad.cpu(), a.grad, rtol=1e-4, atol=1e-2)


def test_empty_and_small_products():
    for shapes in [((0, K), (K, N)), ((M, 0), (0, N)), ((M, K), (K, 0)), ((5, 7), (7, 3)), ((2, 3, 4), (2, 4, 5))]:
        a, b = make(shapes[0]), make(shapes[1])
        torch.testing.assert_close((a.to(TPU) @ b.to(TPU)).cpu(), a @ b, rtol=1e-5, atol=1e-5)


SCRIPT = r"""
import sys, torch
if sys.argv[1] != "default":
    torch.set_float32_matmul_precision(sys.argv[1])
x = torch.randn(160, 144, device="tpu")
w = torch.randn(128, 144, device="tpu")
(x @ w.t()).cpu()               # above the threshold
(x[:8, :8] @ w[:8, :8]).cpu()   # below it
(x.bfloat16() @ w.bfloat16().t()).cpu()
"""


def products(tmp_path, setting, **env):
    dump = tmp_path / setting
    r = subprocess.run([sys.executable, "-c", SCRIPT, setting], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TORCHTPU_DUMP_PROGRAMS=str(dump), **env))
    assert r.returncode == 0, r.stderr[-3000:]
    found = {}
    for p in dump.iterdir():
        t = p.read_text()
        if "aten__mm" not in p.name:
            continue
        shape = "small" if "tensor<8x8xf32>" in t else "large"
        kind = "host" if "torchtpu.host_matmul" in t else "xla" if "stablehlo.dot_general" in t else "?"
        found.setdefault(shape, set()).add((kind, "bf16" in t))
    return found


def test_which_products_are_calls_on_the_cpu_plugin(tmp_path):
    if torch.tpu.get_device_name() != "XLA CPU":
        pytest.skip("the call is registered with the CPU plugin only")
    # float32 at "highest" (the default) above the size threshold; bfloat16 and small ones stay XLA's.
    assert products(tmp_path, "default") == {"large": {("host", False), ("xla", True)}, "small": {("xla", False)}}
    # Other precisions keep their precision_config (test_precision.py); the switch turns it off.
    assert products(tmp_path, "high") == {"large": {("xla", False), ("xla", True)}, "small": {("xla", False)}}
    off = products(tmp_path, "off", TORCHTPU_HOST_MATMUL="0")
    assert off == {"large": {("xla", False), ("xla", True)}, "small": {("xla", False)}}
