"""A few ops on "tpu" against torch on CPU, for a machine where the device is a GPU or TPU
(paths the CPU plugin does not take: chlo.ragged_dot for grouped matmuls). Prints one line
per check and exits non-zero when one fails."""
import sys

import torch
import torch.nn.functional as F
import torchtpu  # noqa: F401  (explicit: autoload is off where torch's CUDA works)


def close(name, got, ref, atol, rtol=None):
    err = (got.cpu().float() - ref.float()).abs().max().item() if ref.numel() else 0.0
    ok = torch.allclose(got.cpu().float(), ref.float(), atol=atol, rtol=rtol if rtol is not None else atol)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max abs err {err:.3g}")
    return ok


def main():
    print("device:", torch.tpu.get_device_name())
    torch.manual_seed(0)
    ok = True
    a, b = torch.randn(64, 96), torch.randn(96, 32)
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        ok &= close(f"matmul {dt}", a.to(dt).to("tpu") @ b.to(dt).to("tpu"), a.to(dt).float() @ b.to(dt).float(), tol)
    x = torch.randn(5, 7)
    ok &= close("softmax of a transposed view", torch.softmax(x.to("tpu").t(), 0), torch.softmax(x.t(), 0), 1e-6)
    # Fused attention, forward and backward.
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    qc, qt = q.clone().requires_grad_(), q.to("tpu").requires_grad_()
    ref = F.scaled_dot_product_attention(qc, k, v, is_causal=True)
    got = F.scaled_dot_product_attention(qt, k.to("tpu"), v.to("tpu"), is_causal=True)
    ref.sum().backward()
    got.sum().backward()
    ok &= close("sdpa forward", got, ref, 1e-4) & close("sdpa grad q", qt.grad, qc.grad, 1e-4)
    # Grouped matmuls in their three ragged layouts, and the gradients (ragged contracting).
    offs = torch.tensor([4, 8, 8, 12], dtype=torch.int32)
    xa, w = torch.randn(12, 16), torch.randn(4, 16, 8)
    xc, xt = xa.clone().requires_grad_(), xa.to("tpu").requires_grad_()
    wc, wt = w.clone().requires_grad_(), w.to("tpu").requires_grad_()
    ref = torch._grouped_mm(xc, wc, offs=offs)
    got = torch._grouped_mm(xt, wt, offs=offs.to("tpu"))
    g = torch.randn(ref.shape)  # dense: CPU's kernel rejects an expanded gradient
    ref.backward(g)
    got.backward(g.to("tpu"))
    ok &= close("grouped_mm rows", got, ref, 1e-4) & close("grouped_mm grad x", xt.grad, xc.grad, 1e-4)
    ok &= close("grouped_mm grad w", wt.grad, wc.grad, 1e-4)
    a3, b2 = torch.randn(4, 8, 16), torch.randn(16, 12)
    ok &= close("grouped_mm columns", torch._grouped_mm(a3.to("tpu"), b2.to("tpu"), offs=offs.to("tpu")),
                torch._grouped_mm(a3, b2, offs=offs), 1e-4)
    xs = [torch.randn(3) for _ in range(4)]
    ts = [t.to("tpu") for t in xs]
    torch._foreach_mul_(ts, 3.0)
    ok &= close("foreach mul_", torch.stack(ts), torch.stack(xs) * 3.0, 1e-6)
    print("all ok" if ok else "some checks FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
