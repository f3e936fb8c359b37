"""Your own kernel on "tpu", two ways, in eager mode, under autograd and in torch.compile.

1. StableHLO text, here a fused "swish-glu" (silu(a) * b) written for the inputs' shapes, with
   a backward formula that is itself made of torch ops (it could call another kernel).
2. A module serialized by jax.export (made offline with JAX: tests/fixtures/custom_kernels/
   make_fixtures.py; a Pallas kernel exported in interpret mode for the CPU plugin). JAX is
   not needed here.

Run: python examples/custom_kernel.py
"""
import os

import torch

import torchtpu.kernels as kernels

DEVICE = "tpu"
HERE = os.path.dirname(os.path.abspath(__file__))


def swiglu_text(a, b):
    """StableHLO for silu(a) * b at the inputs' shapes and dtype."""
    t = kernels.mlir_type(a)
    return f"""
func.func @main(%a: {t}, %b: {t}) -> {t} {{
  %s = stablehlo.logistic %a : {t}
  %silu = stablehlo.multiply %a, %s : {t}
  %r = stablehlo.multiply %silu, %b : {t}
  return %r : {t}
}}"""


swiglu = kernels.stablehlo_op("example::swiglu", swiglu_text)


def swiglu_backward(ctx, grad):
    a, b = ctx.saved_tensors
    s = torch.sigmoid(a)
    silu = a * s
    return grad * b * (s + silu * (1 - s)), grad * silu


swiglu.register_autograd(swiglu_backward,
                         setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


def main():
    torch.manual_seed(0)
    a = torch.randn(16, 64, device=DEVICE, requires_grad=True)
    b = torch.randn(16, 64, device=DEVICE, requires_grad=True)

    # Eager, with its backward.
    out = swiglu(a, b)
    out.sum().backward()
    ref_a, ref_b = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_()
    (torch.nn.functional.silu(ref_a) * ref_b).sum().backward()
    print("eager  max |out - ref|:", (out.detach().cpu() - torch.nn.functional.silu(ref_a) * ref_b).abs().max().item())
    print("grad   max |da - ref|:", (a.grad.cpu() - ref_a.grad).abs().max().item())

    # Inside a compiled function: the kernel joins the graph's program.
    @torch.compile(backend="tpu")
    def mlp(x, w1, w2, w3):
        return swiglu(x @ w1, x @ w2) @ w3

    x = torch.randn(8, 32, device=DEVICE)
    w1, w2, w3 = (torch.randn(32, 64, device=DEVICE), torch.randn(32, 64, device=DEVICE),
                  torch.randn(64, 32, device=DEVICE))
    y = mlp(x, w1, w2, w3)
    ref = (torch.nn.functional.silu(x.cpu() @ w1.cpu()) * (x.cpu() @ w2.cpu())) @ w3.cpu()
    print("compiled max |y - ref|:", (y.cpu() - ref).abs().max().item())

    # A jax.export module (a Pallas kernel computing x * 2 + y), exported for the CPU plugin.
    module = os.path.join(HERE, "..", "tests", "fixtures", "custom_kernels", "pallas_add_one_cpu.jaxexport")
    if torch.tpu.get_device_name() == "XLA CPU":  # the module was exported for cpu only
        pallas = kernels.jax_export_op("example::pallas_axpy", module)
        p, q = torch.randn(8, 128, device=DEVICE), torch.randn(8, 128, device=DEVICE)
        print("pallas max |out - ref|:", (pallas(p, q).cpu() - (p.cpu() * 2 + q.cpu())).abs().max().item())


if __name__ == "__main__":
    main()
