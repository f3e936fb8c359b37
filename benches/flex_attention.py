"""Compiled flex attention on "tpu": the keys attended in blocks (FLEX_KV_BLOCK, the default)
against the dense form (every score at once, as PyTorch's math form computes them), causal
block mask, in one run: a forward call, and a training step (forward and backward). Each form
runs in a fresh process, compiled first; prints ms per call and the peak resident (host)
memory the timed calls took above what the process held before them, and the ratios (on a GPU
the memory column shows host memory only).

    python benches/flex_attention.py [--seq 4096] [--heads 8]
"""
import argparse
import subprocess
import sys

CHILD = r"""
import sys, time, torch, torchtpu.dynamo
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
block, n, heads, train = (int(a) for a in sys.argv[1:5])
torchtpu.dynamo.FLEX_KV_BLOCK = block
torch.tpu.set_fused_eager(False)  # each call runs when made
q, k, v = (torch.randn(1, heads, n, 64, device="tpu", requires_grad=bool(train)) for _ in range(3))
mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device="tpu")
f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=mask), backend="tpu")


def call():
    out = f(q, k, v)
    if train:
        out.square().sum().backward()
    torch.tpu.synchronize()


def status(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1]) / 1024


call()  # compiles
open("/proc/self/clear_refs", "w").write("5")  # the peak restarts from here
held = status("VmRSS")
t = time.perf_counter()
for _ in range(3):
    call()
print((time.perf_counter() - t) / 3 * 1e3, status("VmHWM") - held)
"""


def run(block, seq, heads, train):
    out = subprocess.run([sys.executable, "-c", CHILD, str(block), str(seq), str(heads), str(int(train))],
                         capture_output=True, text=True, check=True)
    ms, mib = out.stdout.split()[-2:]
    return float(ms), float(mib)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    a = p.parse_args()
    import torchtpu.dynamo

    block = torchtpu.dynamo.FLEX_KV_BLOCK
    print(f"flex attention, causal, 1 x {a.heads} heads x {a.seq} tokens x 64, float32, compiled")
    print(f"{'run':<44}{'ms per call':>12}{'peak MiB':>10}")
    for train in (False, True):
        what = "forward + backward" if train else "forward"
        dense = run(1 << 40, a.seq, a.heads, train)
        blocks = run(block, a.seq, a.heads, train)
        print(f"{what + ', dense scores':<44}{dense[0]:>12.0f}{dense[1]:>10.0f}")
        print(f"{what + f', keys in blocks of {block}':<44}{blocks[0]:>12.0f}{blocks[1]:>10.0f}")
        print(f"  blocks / dense: {dense[0] / blocks[0]:.2f}x speed, {blocks[1] / max(dense[1], 1):.2f}x peak memory")


if __name__ == "__main__":
    main()
