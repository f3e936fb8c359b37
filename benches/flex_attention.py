"""Compiled flex attention on "tpu": the keys attended in blocks (FLEX_KV_BLOCK, the default)
against the dense form (every score at once, as PyTorch's math form computes them), causal
block mask, in one run. Each form runs in a fresh process; prints ms per call and the peak
resident memory its calls added, and the ratios.

    python benches/flex_attention.py [--seq 4096] [--heads 8]
"""
import argparse
import subprocess
import sys

CHILD = r"""
import resource, sys, time, torch, torchtpu.dynamo
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
block, n, heads = (int(a) for a in sys.argv[1:4])
torchtpu.dynamo.FLEX_KV_BLOCK = block
torch.tpu.set_fused_eager(False)  # each call runs when made
q, k, v = (torch.randn(1, heads, n, 64, device="tpu") for _ in range(3))
mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device="tpu")
f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=mask), backend="tpu")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
f(q, k, v)
torch.tpu.synchronize()
t = time.perf_counter()
for _ in range(3):
    f(q, k, v)
torch.tpu.synchronize()
ms = (time.perf_counter() - t) / 3 * 1e3
added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(ms, added)
"""


def run(block, seq, heads):
    out = subprocess.run([sys.executable, "-c", CHILD, str(block), str(seq), str(heads)], capture_output=True, text=True,
                         check=True)
    ms, mib = out.stdout.split()[-2:]
    return float(ms), float(mib)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    a = p.parse_args()
    import torchtpu.dynamo

    dense = run(1 << 40, a.seq, a.heads)
    blocks = run(torchtpu.dynamo.FLEX_KV_BLOCK, a.seq, a.heads)
    print(f"flex attention, causal, 1 x {a.heads} heads x {a.seq} tokens x 64, float32, compiled")
    print(f"{'form':<28}{'ms per call':>12}{'peak MiB added':>16}")
    print(f"{'dense scores':<28}{dense[0]:>12.0f}{dense[1]:>16.0f}")
    print(f"{'keys in blocks of ' + str(torchtpu.dynamo.FLEX_KV_BLOCK):<28}{blocks[0]:>12.0f}{blocks[1]:>16.0f}")
    print(f"blocks / dense: {dense[0] / blocks[0]:.2f}x speed, {blocks[1] / max(dense[1], 1):.2f}x peak memory added")


if __name__ == "__main__":
    main()
