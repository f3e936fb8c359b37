"""Compiled flex attention on "tpu", in one run, for a causal, a sliding-window and a document
mask (causal within documents; the mask reads a tensor of document ids), against the dense
form: compiled SDPA with the same mask as a dense boolean matrix (every score at once, as
PyTorch's math form computes them). Flex attention runs in two forms: with a BlockMask of one
block (no lists to skip by: every key, in steps of 512), and with the default BlockMask of
128-blocks (each group of query rows visits only the key blocks its lists name). A forward
call, and a training step (forward and backward). Each form runs in a fresh process, compiled
first; prints ms per call and the peak resident (host) memory the timed calls took above what
the process held before them, and the ratios against the dense form (on a GPU the memory
column shows host memory only).

    python benches/flex_attention.py [--seq 4096] [--heads 8] [--window 512] [--doc 512]
"""
import argparse
import subprocess
import sys

CHILD = r"""
import sys, time, torch, torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
form, n, heads, train, window, doc = sys.argv[1], *(int(a) for a in sys.argv[2:7])
torch.tpu.set_fused_eager(False)  # each call runs when made
q, k, v = (torch.randn(1, heads, n, 64, device="tpu", requires_grad=bool(train)) for _ in range(3))
docs = torch.arange(n, device="tpu") // max(doc, 1)
if doc:
    mask_mod = lambda b, h, i, j: (docs[i] == docs[j]) & (i >= j)
elif window:
    mask_mod = lambda b, h, i, j: (i >= j) & (i - j < window)
else:
    mask_mod = lambda b, h, i, j: i >= j
if form == "dense":
    i = torch.arange(n, device="tpu")
    dense = mask_mod(0, 0, i[:, None], i[None, :])
    f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense), backend="tpu")
else:
    mask = create_block_mask(mask_mod, None, None, n, n, device="tpu", BLOCK_SIZE=n if form == "every" else 128)
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


def run(form, seq, heads, train, window, doc):
    out = subprocess.run([sys.executable, "-c", CHILD, form, *map(str, (seq, heads, int(train), window, doc))],
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
    print(f"flex attention, 1 x {a.heads} heads x {a.seq} tokens x 64, float32, compiled")
    print(f"{'run':<58}{'ms per call':>12}{'peak MiB':>10}")
    for window, doc in ((0, 0), (a.window, 0), (0, a.doc)):
        mask = f"documents of {doc}" if doc else f"sliding window {window}" if window else "causal"
        for train in (False, True):
            what = f"{mask}, " + ("forward + backward" if train else "forward")
            dense = run("dense", a.seq, a.heads, train, window, doc)
            every = run("every", a.seq, a.heads, train, window, doc)
            listed = run("listed", a.seq, a.heads, train, window, doc)
            print(f"{what + ', dense scores (SDPA, boolean mask)':<58}{dense[0]:>12.0f}{dense[1]:>10.0f}")
            for name, (ms, mib) in (("flex, one block: every key, 512 at a time", every),
                                    ("flex, blocks of 128: only the listed key blocks", listed)):
                print(f"{'  ' + name:<58}{ms:>12.0f}{mib:>10.0f}   {dense[0] / ms:.2f}x speed, "
                      f"{mib / max(dense[1], 1):.2f}x memory")


if __name__ == "__main__":
    main()
