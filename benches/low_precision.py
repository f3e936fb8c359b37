"""Custom kernels and float8 matmuls, timed in one run:

- a user's kernel call (StableHLO text, and a jax.export module) against the aten op doing the
  same work at the same size (`torch.sin`), microseconds per cached call;
- torch._scaled_mm (float8 operands, tensor-wise scales) and F.scaled_mm with MXFP8 block scales
  (one float8_e8m0fnu scale per 32 elements) and NVFP4 ones (float4 operands, one float8 e4m3
  scale per 16 elements and a global scale) against a bf16 matmul of the same size. On the CPU
  plugin float8 and float4 are emulated, so only the GPU/TPU figures say anything about speed.
"""
import argparse
import os
import time

import torch

import torchtpu.kernels as kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def per_call_us(fn, n):
    fn()
    torch.tpu.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn()
        out.cpu()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=1024, help="the matmuls' n (n x n by n x n)")
    args = p.parse_args()
    torch.set_num_threads(1)
    # Strict eager: each call runs its program (fused eager would run only the last of a loop's
    # matmuls, whose result alone is read).
    torch.tpu.set_fused_eager(False)
    print(f"platform: {torch.tpu.get_device_name()}")
    x = torch.randn(4, 8, device="tpu")
    sine = kernels.stablehlo_op("bench::sine", lambda t: f"""
func.func @main(%x: {kernels.mlir_type(t)}) -> {kernels.mlir_type(t)} {{
  %0 = stablehlo.sine %x : {kernels.mlir_type(t)}
  return %0 : {kernels.mlir_type(t)}
}}""")
    aten = per_call_us(lambda: torch.sin(x), 5000)
    text = per_call_us(lambda: sine(x), 5000)
    print(f"torch.sin on 4x8, aten op              : {aten:8.2f} us/call")
    print(f"sine on 4x8, StableHLO text kernel     : {text:8.2f} us/call  ({text / aten:.2f}x)")
    if torch.tpu.get_device_name() == "XLA CPU":
        module = os.path.join(ROOT, "tests", "fixtures", "custom_kernels", "scaled_sin_cpu.jaxexport")
        scaled_sin = kernels.jax_export_op("bench::scaled_sin", module)
        y = torch.randn(4, 8, device="tpu")
        fused = per_call_us(lambda: x * torch.sin(y) + 1, 3000)
        exported = per_call_us(lambda: scaled_sin(x, y), 3000)
        print(f"x * sin(y) + 1 on 4x8, three aten ops  : {fused:8.2f} us/call")
        print(f"the same as a jax.export module        : {exported:8.2f} us/call  ({exported / fused:.2f}x)")

    n = args.size
    a = torch.randn(n, n, device="tpu")
    b = torch.randn(n, n, device="tpu")
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.tensor(1.0, device="tpu")
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16 = per_call_us(lambda: a16 @ b16, 20)
    fp8 = per_call_us(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), 20)
    print(f"{n}x{n} matmul, bf16                   : {bf16:8.1f} us/call")
    print(f"{n}x{n} torch._scaled_mm, float8 e4m3  : {fp8:8.1f} us/call  ({bf16 / fp8:.2f}x the bf16 speed)")
    F = torch.nn.functional
    if hasattr(F, "ScalingType"):
        # MXFP8's scales, as many as cuBLAS's swizzled layout holds for an n x n operand.
        k_blocks = -(-n // 32)
        count = -(-n // 128) * 128 * (-(-k_blocks // 4) * 4)
        scales = torch.ones(count, device="tpu").to(torch.float8_e8m0fnu)
        block, swizzle = F.ScalingType.BlockWise1x32, F.SwizzleType.SWIZZLE_32_4_4
        mx = per_call_us(lambda: F.scaled_mm(a8, b8, scales, block, scales, block, swizzle_a=swizzle, swizzle_b=swizzle,
                                             output_dtype=torch.bfloat16), 20)
        print(f"{n}x{n} F.scaled_mm, MXFP8 1x32 blocks : {mx:8.1f} us/call  ({bf16 / mx:.2f}x the bf16 speed)")
        # NVFP4: float4 pairs (two values per byte along K), float8 e4m3 scales per 16 elements
        # in the swizzled layout, and a float32 global scale per operand.
        def float4(rows):
            return torch.randint(0, 256, (rows, n // 2), dtype=torch.uint8, device="tpu").view(torch.float4_e2m1fn_x2)

        a4, b4 = float4(n), float4(n).t()
        count16 = -(-n // 128) * 128 * (-(-(-(-n // 16)) // 4) * 4)
        s16 = torch.ones(count16, device="tpu").to(torch.float8_e4m3fn)
        recipe = [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        swizzles = [swizzle, F.SwizzleType.NO_SWIZZLE]
        nv = per_call_us(lambda: F.scaled_mm(a4, b4, [s16, one], recipe, [s16, one], recipe, swizzle_a=swizzles,
                                             swizzle_b=swizzles, output_dtype=torch.bfloat16), 20)
        print(f"{n}x{n} F.scaled_mm, NVFP4 1x16 blocks : {nv:8.1f} us/call  ({bf16 / nv:.2f}x the bf16 speed)")


if __name__ == "__main__":
    main()
