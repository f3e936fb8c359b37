"""Eager dispatch cost: microseconds per cached `x + y` on 2x2 tensors on "tpu" against the same
op in torch on CPU, measured in the same run, with the result dropped (fused eager mode then
has nothing to compute: the cost is the call's alone) and kept (`z = z + y`, a chain the fused
program computes); per `x[idx]` with the index on tpu (an op with a device-side bounds check);
and the compile time of a first-seen op."""
import time

import torch
import torchtpu  # noqa: F401


def per_op_us(fn, n):
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    torch.set_num_threads(1)
    n = 20000
    xc, yc = torch.randn(2, 2), torch.randn(2, 2)
    xt, yt = xc.to("tpu"), yc.to("tpu")
    cpu = per_op_us(lambda: xc + yc, n)
    tpu = per_op_us(lambda: xt + yt, n)

    def chain(x, y):
        z = x
        for _ in range(n):
            z = z + y
        return z

    cpu_chain = per_op_us(lambda: chain(xc, yc), 1) / n
    tpu_chain = per_op_us(lambda: chain(xt, yt), 1) / n
    xi, idx = torch.randn(100, 16, device="tpu"), torch.randint(0, 100, (8,), device="tpu")
    index = per_op_us(lambda: xi[idx], n)
    (xt + yt).cpu()  # drain
    t0 = time.perf_counter()
    z = torch.atan2(xt, yt * 3.0)  # an op this process has not compiled yet
    z.cpu()
    first = (time.perf_counter() - t0) * 1e3
    print(f"platform: {torch.tpu.get_device_name()}")
    print(f"x + y on 2x2, torch CPU eager : {cpu:7.2f} us/op")
    print(f"x + y on 2x2, torchtpu eager  : {tpu:7.2f} us/op")
    print(f"ratio tpu / cpu               : {tpu / cpu:7.2f}x")
    print(f"z = z + y chain, torch CPU    : {cpu_chain:7.2f} us/op")
    print(f"z = z + y chain, torchtpu     : {tpu_chain:7.2f} us/op ({tpu_chain / cpu_chain:.2f}x)")
    print(f"x[idx], 8 of 100 rows (tpu)   : {index:7.2f} us/op")
    if torch.cuda.is_available():  # on a GPU machine, torch's own CUDA eager path as a second baseline
        xg, yg = xc.cuda(), yc.cuda()
        gpu = per_op_us(lambda: xg + yg, n)
        torch.cuda.synchronize()
        print(f"x + y on 2x2, torch CUDA eager : {gpu:7.2f} us/op (tpu / cuda {tpu / gpu:.2f}x)")
    print(f"first-seen op (compile + run) : {first:7.1f} ms")
    stats = torch.tpu.compile_stats()
    print("cache:", {k: stats[k] for k in ("hits", "misses", "executions", "compile_seconds")}, "fused:", stats["fused"])


if __name__ == "__main__":
    main()
