"""Compiled flex attention on "tpu", in one run, for a causal, a sliding-window and a document
mask (causal within documents; the mask reads a tensor of document ids): the dense form (every
score at once, as PyTorch's math form computes them), the keys attended in blocks
(FLEX_KV_BLOCK, the default) over every key, and in blocks over only the keys the mask reaches
(the default: block sparsity; for the position masks found when the graph compiles, for the
document mask at run time from the BlockMask's lists); a forward call, and a training step
(forward and backward). Each form runs in a fresh process, compiled first; prints ms per call
and the peak resident (host) memory the timed calls took above what the process held before
them, and the ratios against the dense form (on a GPU the memory column shows host memory only).

    python benches/flex_attention.py [--seq 4096] [--heads 8] [--window 512] [--doc 512]
"""
import argparse
import subprocess
import sys

CHILD = r"""
import sys, time, torch, torchtpu.compile.flex_attention as flex
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
block, sparse, n, heads, train, window, doc = (int(a) for a in sys.argv[1:8])
flex.FLEX_KV_BLOCK = block
if not sparse:  # every key block attended
    flex.FLEX_SPARSE_BLOCK = 1 << 40
    flex.FLEX_ROW_GROUPS = 1
torch.tpu.set_fused_eager(False)  # each call runs when made
q, k, v = (torch.randn(1, heads, n, 64, device="tpu", requires_grad=bool(train)) for _ in range(3))
docs = torch.arange(n, device="tpu") // max(doc, 1)
if doc:
    mask_mod = lambda b, h, i, j: (docs[i] == docs[j]) & (i >= j)
elif window:
    mask_mod = lambda b, h, i, j: (i >= j) & (i - j < window)
else:
    mask_mod = lambda b, h, i, j: i >= j
mask = create_block_mask(mask_mod, None, None, n, n, device="tpu")
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


def run(block, sparse, seq, heads, train, window, doc):
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, (block, int(sparse), seq, heads, int(train), window, doc))],
                         capture_output=True, text=True, check=True)
    ms, mib = out.stdout.split()[-2:]
    return float(ms), float(mib)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--doc", type=int, default=512, help="tokens per document of the document mask")
    a = p.parse_args()
    import torchtpu.compile.flex_attention as flex

    block = flex.FLEX_KV_BLOCK
    print(f"flex attention, 1 x {a.heads} heads x {a.seq} tokens x 64, float32, compiled")
    print(f"{'run':<58}{'ms per call':>12}{'peak MiB':>10}")
    for window, doc in ((0, 0), (a.window, 0), (0, a.doc)):
        mask = f"documents of {doc}" if doc else f"sliding window {window}" if window else "causal"
        for train in (False, True):
            what = f"{mask}, " + ("forward + backward" if train else "forward")
            dense = run(1 << 40, False, a.seq, a.heads, train, window, doc)
            every = run(block, False, a.seq, a.heads, train, window, doc)
            sparse = run(block, True, a.seq, a.heads, train, window, doc)
            print(f"{what + ', dense scores':<58}{dense[0]:>12.0f}{dense[1]:>10.0f}")
            for name, (ms, mib) in ((f"keys in blocks of {block}, every block", every),
                                    ("keys in blocks, masked-out blocks skipped", sparse)):
                print(f"{'  ' + name:<58}{ms:>12.0f}{mib:>10.0f}   {dense[0] / ms:.2f}x speed, "
                      f"{mib / max(dense[1], 1):.2f}x memory")


if __name__ == "__main__":
    main()
