"""Users' own kernels on tpu (torchtpu.kernels): StableHLO text and jax.export modules as torch
ops, in eager mode, inside torch.compile graphs and under autograd, against the same math in
PyTorch on CPU; malformed kernels and shape rules that disagree get clear errors."""
import os
import subprocess
import sys

import pytest
import torch

import torchtpu.kernels as K
from helpers import TPU

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "custom_kernels")

SCALED_SIN = """
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %s = stablehlo.sine %y : tensor<4x8xf32>
  %p = stablehlo.multiply %x, %s : tensor<4x8xf32>
  %one = stablehlo.constant dense<1.0> : tensor<4x8xf32>
  %r = stablehlo.add %p, %one : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""


def softplus_text(x):
    """Softplus for any shape and float dtype, through a helper function."""
    t = K.mlir_type(x)
    return f"""
module {{
  func.func public @main(%x: {t}) -> {t} {{
    %0 = call @softplus(%x) : ({t}) -> {t}
    return %0 : {t}
  }}
  func.func private @softplus(%x: {t}) -> {t} {{
    %e = stablehlo.exponential %x : {t}
    %l = stablehlo.log_plus_one %e : {t}
    return %l : {t}
  }}
}}"""


scaled_sin = K.stablehlo_op("ttk_test::scaled_sin", SCALED_SIN)
softplus = K.stablehlo_op("ttk_test::softplus", softplus_text)
softplus.register_autograd(
    lambda ctx, g: g * torch.sigmoid(ctx.saved_tensors[0]),
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def test_text_kernel_eager():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    got = scaled_sin(x.to(TPU), y.to(TPU))
    torch.testing.assert_close(got.cpu(), x * torch.sin(y) + 1)
    # Through torch.ops too, and on non-contiguous inputs.
    xt = torch.randn(8, 4)
    got = torch.ops.ttk_test.scaled_sin(xt.to(TPU).t(), y.to(TPU))
    torch.testing.assert_close(got.cpu(), xt.t() * torch.sin(y) + 1)


@pytest.mark.parametrize("shape, dtype", [((5,), torch.float32), ((2, 3, 4), torch.float32), ((), torch.float32),
                                          ((0, 3), torch.float32), ((6, 2), torch.bfloat16)], ids=str)
def test_text_kernel_from_a_function_of_the_inputs(shape, dtype):
    x = torch.randn(shape).to(dtype)
    got = softplus(x.to(TPU))
    ref = torch.nn.functional.softplus(x.float()).to(dtype)
    torch.testing.assert_close(got.cpu(), ref, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)))


def test_text_kernel_backward_matches_softplus_grad():
    x = torch.randn(3, 5, dtype=torch.float32)
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    g = torch.randn(3, 5)
    torch.nn.functional.softplus(xc).backward(g)
    softplus(xt).backward(g.to(TPU))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)


def test_text_kernel_passes_gradcheck():
    # The registered backward against finite differences of the kernel itself, in float64.
    x = torch.randn(2, 3, dtype=torch.float64).to(TPU).requires_grad_()
    assert torch.autograd.gradcheck(softplus, (x,), eps=1e-6, atol=1e-5)
    # A backward formula that is wrong is caught (the check can fail).
    wrong = K.stablehlo_op("ttk_test::softplus_wrong_grad", softplus_text)
    wrong.register_autograd(lambda ctx, g: g * 2 * torch.sigmoid(ctx.saved_tensors[0]),
                            setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))
    assert not torch.autograd.gradcheck(wrong, (x,), eps=1e-6, atol=1e-5, raise_exception=False)


def test_text_kernel_inside_a_compiled_graph():
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    def f(x, y):
        return torch.relu(scaled_sin(x * 2, y)) + softplus(y)

    ref = torch.relu(x * 2 * torch.sin(y) + 1) + torch.nn.functional.softplus(y)
    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(x.to(TPU), y.to(TPU)).cpu(), ref)


def test_text_kernel_compiled_training_step():
    w = torch.randn(6, 4)
    x = torch.randn(5, 6)

    def loss(w, x):
        return softplus(x @ w).sum()

    wc = w.clone().requires_grad_()
    torch.nn.functional.softplus(x @ wc).sum().backward()
    wt = w.to(TPU).requires_grad_()
    torch.compile(loss, backend="tpu")(wt, x.to(TPU)).backward()
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-5)


def test_inputs_that_disagree_with_the_kernel():
    with pytest.raises(RuntimeError, match=r"input 1 is float32 \[4, 7\], but the kernel takes float32 \[4, 8\]"):
        scaled_sin(torch.ones(4, 8, device=TPU), torch.ones(4, 7, device=TPU))
    with pytest.raises(RuntimeError, match="input 0 is bfloat16"):
        scaled_sin(torch.ones(4, 8, device=TPU, dtype=torch.bfloat16), torch.ones(4, 8, device=TPU))


def test_malformed_kernels_get_clear_errors():
    with pytest.raises(ValueError, match="no func.func @main"):
        K.stablehlo_op("ttk_test::nomain", "func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }")
    with pytest.raises(NotImplementedError, match="dynamic dimensions"):
        K.stablehlo_op("ttk_test::dyn", "func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { return %x : tensor<?xf32> }")
    # Text the compiler rejects: a RuntimeError naming the op, not a crash.
    bad = K.stablehlo_op("ttk_test::bad", "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
                         "  %0 = stablehlo.no_such_op %x : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}")
    with pytest.raises(RuntimeError, match="compiling"):
        bad(torch.ones(2, device=TPU))
    # The process is still fine.
    assert (torch.ones(2, device=TPU) + 1).cpu().tolist() == [2.0, 2.0]


def test_a_shape_rule_that_disagrees_with_the_kernel():
    op = K.stablehlo_op("ttk_test::lying", SCALED_SIN, fake=lambda x, y: torch.empty(4, 4, dtype=x.dtype, device=x.device))
    with pytest.raises(RuntimeError, match=r"the shape rule says it returns torch.float32\[4, 4\], but the kernel "
                                           r"returns torch.float32\[4, 8\]"):
        op(torch.ones(4, 8, device=TPU), torch.ones(4, 8, device=TPU))


# ---- jax.export modules -----------------------------------------------------------------------

def fixture(name):
    return os.path.join(FIXTURES, name)


def test_jax_export_module():
    op = K.jax_export_op("ttk_test::jax_scaled_sin", fixture("scaled_sin_cpu.jaxexport"))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(op(x.to(TPU), y.to(TPU)).cpu(), x * torch.sin(y) + 1)
    # A non-contiguous input is made dense for the module.
    xt = torch.randn(8, 4)
    torch.testing.assert_close(op(xt.to(TPU).t(), y.to(TPU)).cpu(), xt.t() * torch.sin(y) + 1)


def test_jax_export_module_under_autograd():
    # A jax.export module with a backward formula given in aten ops: gradients of both inputs
    # equal CPU autograd of the same math, eagerly and in a compiled graph.
    op = K.jax_export_op("ttk_test::jax_scaled_sin_grad", fixture("scaled_sin_cpu.jaxexport"))

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * torch.sin(y), g * x * torch.cos(y)

    op.register_autograd(backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    xc, yc = x.clone().requires_grad_(), y.clone().requires_grad_()
    (xc * torch.sin(yc) + 1).pow(2).sum().backward()
    for run in (lambda a, b: op(a, b).pow(2).sum(), torch.compile(lambda a, b: op(a, b).pow(2).sum(), backend="tpu")):
        xt, yt = x.to(TPU).requires_grad_(), y.to(TPU).requires_grad_()
        run(xt, yt).backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
        torch.testing.assert_close(yt.grad.cpu(), yc.grad)


def test_jax_export_pallas_kernel():
    op = K.jax_export_op("ttk_test::pallas_add", fixture("pallas_add_one_cpu.jaxexport"))
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    torch.testing.assert_close(op(x.to(TPU), y.to(TPU)).cpu(), x * 2 + y)


def test_jax_export_two_outputs_in_a_compiled_graph():
    op = K.jax_export_op("ttk_test::two_outputs", fixture("two_outputs_cpu.jaxexport"))
    x, n = torch.randn(3, 5), torch.randint(-4, 4, (3,), dtype=torch.int32)

    def f(x, n):
        s, m = op(x + 1, n)
        return s * 2, m

    s, m = torch.compile(f, backend="tpu")(x.to(TPU), n.to(TPU))
    torch.testing.assert_close(s.cpu(), ((x + 1).sum(1) + n.float()) * 2)
    torch.testing.assert_close(m.cpu(), torch.clamp(x + 1, min=0).bfloat16())


def test_jax_export_for_another_platform():
    with pytest.raises(RuntimeError, match=r"exported for cuda, not for cpu"):
        K.jax_export_op("ttk_test::cuda_only", fixture("scaled_sin_cuda.jaxexport"))


def test_not_a_jax_export_module(tmp_path):
    p = tmp_path / "bogus.jaxexport"
    p.write_bytes(b"\x10\x00\x00\x00garbage" * 3)
    with pytest.raises(ValueError, match="not a jax.export serialized module"):
        K.jax_export_op("ttk_test::bogus", p)


def test_a_corrupt_module_fails_cleanly_in_a_subprocess(tmp_path):
    """Damaged StableHLO bytes inside a valid container: an error, never a crash."""
    data = bytearray(open(fixture("scaled_sin_cpu.jaxexport"), "rb").read())
    from torchtpu.jax_export import read_exported
    mlir = read_exported(bytes(data)).mlir_module
    start = bytes(data).find(mlir)
    for i in range(start + 8, start + len(mlir), 7):
        data[i] ^= 0x5A
    p = tmp_path / "corrupt.jaxexport"
    p.write_bytes(bytes(data))
    script = (f"import torch, torchtpu.kernels as K\nop = K.jax_export_op('ttk_test::corrupt', {str(p)!r})\n"
              "try:\n    op(torch.ones(4, 8, device='tpu'), torch.ones(4, 8, device='tpu')).cpu()\n"
              "except Exception as e:\n    print('raised', type(e).__name__)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "raised" in r.stdout
