"""Llama-shaped ~886M-parameter training step on one NVIDIA GPU (H200, bf16, AdamW,
batch 8 x 2048): torchtpu compiled through XLA's CUDA PJRT plugin against torch eager and
torch.compile (inductor) on CUDA, each in its own process, in one run.

    python benches/h200_llama.py [--steps 10] [--batch 8] [--seq 2048] [--runs tpu,cuda,inductor]
                                 [--compile-step]

`--compile-step` compiles the whole step (zero_grad, forward, backward, AdamW step) instead of
the model alone: dynamo splits it into forward, backward and optimizer graphs, and on tpu the
optimizer graph updates parameters and state in place (donation) as one program.

`--tiny --platform cpu --runs tpu` runs a 2-layer version on the CPU plugin (a check before a GPU run).

Prints tokens/s, MFU (6 * params * tokens/s over the GPU's dense bf16 peak) and the first
step's seconds (which is mostly compiling).
"""
import argparse
import json
import os
import subprocess
import sys
import time

PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def model_config(vocab=32000, hidden=1536, inter=4096, layers=28, heads=12, kv_heads=12, seq=2048):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                       tie_word_embeddings=False, attn_implementation="sdpa")


TINY = dict(vocab=1000, hidden=128, inter=256, layers=2, heads=4, kv_heads=2)


def child(kind, steps, batch, seq, tiny, compile_step):
    import torch
    from transformers import AutoModelForCausalLM

    device = "tpu" if kind == "tpu" else "cuda"
    if kind == "tpu":
        import torchtpu  # noqa: F401
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(seq=seq, **(TINY if tiny else {}))).to(torch.bfloat16).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    backend = {"tpu": "tpu", "cuda": None, "inductor": "inductor"}[kind]
    forward = torch.compile(model, backend=backend) if backend and not compile_step else model
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq)).to(device)  # same tokens on every run

    def train_step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = forward(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(train_step, backend=backend) if backend and compile_step else train_step
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step(tokens)
        loss.item()  # waits for the step
        times.append(time.perf_counter() - t0)
    steady = times[2:] or times[1:] or times
    tok_s = batch * seq / (sum(steady) / len(steady))
    # One more step timed by phase (with a device sync after each), to see where time goes; a
    # step compiled whole has no phases to time apart.
    sync = torch.tpu.synchronize if kind == "tpu" else torch.cuda.synchronize
    sync()
    t0 = t1 = t2 = time.perf_counter()
    if not compile_step:
        opt.zero_grad(set_to_none=True)
        forward(input_ids=tokens, labels=tokens).loss.backward()
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        t2 = time.perf_counter()
    name = torch.tpu.get_device_name() if kind == "tpu" else torch.cuda.get_device_name()
    print(json.dumps({"kind": kind, "compile_step": compile_step, "tok_s": tok_s, "first_s": times[0], "params": params, "device": name,
                      "loss": loss.item(), "fwd_bwd_s": None if compile_step else t1 - t0,
                      "opt_s": None if compile_step else t2 - t1}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--runs", default="tpu,cuda,inductor")
    p.add_argument("--platform", default="cuda", help="TORCHTPU_PLATFORM for the torchtpu run")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model, to check the script anywhere")
    p.add_argument("--child-timeout", type=float, default=None, help="seconds allowed to each run")
    p.add_argument("--compile-step", action="store_true", help="compile the whole training step, optimizer included")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child, a.steps, a.batch, a.seq, a.tiny, a.compile_step)
    rows = []
    for kind in a.runs.split(","):
        env = {**os.environ, "TORCHTPU_PLATFORM": a.platform}
        cmd = [sys.executable, __file__, "--child", kind, "--steps", str(a.steps), "--batch", str(a.batch), "--seq", str(a.seq)]
        try:
            flags = (["--tiny"] if a.tiny else []) + (["--compile-step"] if a.compile_step else [])
            out = subprocess.run(cmd + flags, capture_output=True, text=True, env=env,
                                 timeout=a.child_timeout)
        except subprocess.TimeoutExpired as e:
            print(f"{kind}: no result within {a.child_timeout} s\n{(e.stderr or b'')[-2000:]}", flush=True)
            continue
        print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "", flush=True)
        if out.returncode != 0:
            print(f"{kind}: failed\n{out.stderr[-2000:]}")
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not rows:
        return
    base = next((r["tok_s"] for r in rows if r["kind"] == "inductor"), rows[0]["tok_s"])
    what = "whole step compiled" if a.compile_step else "model compiled, optimizer eager"
    print(f"model: {rows[0]['params'] / 1e6:.0f}M params, bf16, AdamW, batch {a.batch} x {a.seq}; {what}")
    print(f"{'run':<28}{'tok/s':>10}{'vs inductor':>13}{'MFU':>8}{'first step s':>14}{'loss':>9}{'fwd+bwd s':>11}{'opt s':>8}")
    for r in rows:
        peak = next((v for k, v in PEAK_BF16.items() if k in r["device"]), None)
        mfu = 6 * r["params"] * r["tok_s"] / peak if peak else float("nan")
        label = {"tpu": "torchtpu compiled (PJRT)", "cuda": "torch eager (CUDA)", "inductor": "torch.compile (inductor)"}[r["kind"]]
        phases = "" if r["fwd_bwd_s"] is None else f"{r['fwd_bwd_s']:>11.3f}{r['opt_s']:>8.3f}"
        print(f"{label:<28}{r['tok_s']:>10.0f}{r['tok_s'] / base:>12.2f}x{mfu:>8.1%}{r['first_s']:>14.1f}{r['loss']:>9.3f}"
              f"{phases}")


if __name__ == "__main__":
    main()
