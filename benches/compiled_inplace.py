"""Compiled updates of graph inputs in place: a torch.compile'd AdamW step over a stack of
Linear layers, with the state written by the graph itself (donation, the default) against
AOTAutograd's copy-back (the graph returns new values, then one copy_ per mutated tensor).
Prints step time, programs run per step and peak memory over the state, both ways, in one run.

    python benches/compiled_inplace.py [--layers 24] [--width 512] [--steps 20]
"""
import argparse
import contextlib
import time

import torch
import torch._dynamo.backends.common as common

import torchtpu  # noqa: F401


@contextlib.contextmanager
def copy_back():
    """Makes the tpu backend leave input mutations to AOTAutograd's runtime copy_."""
    original = common.aot_autograd

    def without_in_graph_writes(**kwargs):
        kwargs["keep_inference_input_mutations"] = False
        return original(**kwargs)

    common.aot_autograd = without_in_graph_writes
    try:
        yield
    finally:
        common.aot_autograd = original


def measure(args):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    step = torch.compile(opt.step, backend="tpu")
    step()
    step()
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    runs = torch.tpu.compile_stats()["executions"]
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.tpu.synchronize()
    seconds = (time.perf_counter() - t0) / args.steps
    programs = (torch.tpu.compile_stats()["executions"] - runs) / args.steps
    peak = torch.tpu.max_memory_allocated() - base
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return seconds, programs, peak, base, checksum


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with copy_back():
        old = measure(args)
    new = measure(args)
    mib = 2**20
    print(f"AdamW step, {args.layers} x Linear({args.width}), state {new[3] / mib:.0f} MiB, platform {torch.tpu.get_device_name()}")
    for name, (s, progs, peak, _, _) in (("copy-back (AOTAutograd)", old), ("in-graph writes (donation)", new)):
        print(f"  {name:28s} {s * 1e3:8.2f} ms/step  {progs:5.0f} programs/step  peak +{peak / mib:7.1f} MiB")
    print(f"  in-graph / copy-back: {old[0] / new[0]:.2f}x the speed, {old[1] / new[1]:.0f}x fewer programs; "
          f"same parameters: {abs(old[4] - new[4]) <= 1e-6 * abs(old[4])}")


if __name__ == "__main__":
    main()
