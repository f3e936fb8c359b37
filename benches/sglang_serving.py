"""SGLang on "tpu": output tokens/s of one fixed request set (16 prompts of 8 to 40 tokens, 32
greedy tokens each, a small random Llama saved locally) with the platform's batched attention
(torchtpu_paged) against SGLang's per-request torch_native attention and Hugging Face generate
on torch CPU, in one run.

    .venv-sglang/bin/python benches/sglang_serving.py [--requests 16] [--tokens 32]

Runs in SGLang's environment (scripts/setup_sglang.sh). Each engine serves the request set
twice; the second pass is timed (the first compiles what its shapes need).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from serving import bench_model, hf_run, prompts  # noqa: E402


def sglang_run(path, backend, reqs, tokens):
    import sglang

    engine = sglang.Engine(model_path=path, device="tpu", dtype="float32", attention_backend=backend,
                           max_total_tokens=4096, max_running_requests=16, context_length=128, random_seed=0,
                           log_level="warning")
    try:
        params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
        engine.generate(input_ids=prompts(len(reqs), seed=1), sampling_params=params)
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=reqs, sampling_params=params)
        seconds = time.perf_counter() - t0
        return sum(len(o["output_ids"]) for o in outs) / seconds, [o["output_ids"] for o in outs]
    finally:
        engine.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    a = p.parse_args()
    path, model = bench_model()
    reqs = prompts(a.requests)
    torch.set_num_threads(os.cpu_count())
    hf_tok_s, _ = hf_run(model, reqs, a.tokens)
    native, native_ids = sglang_run(path, "torch_native", reqs, a.tokens)
    batched, batched_ids = sglang_run(path, "torchtpu_paged", reqs, a.tokens)
    print(f"{a.requests} requests x {a.tokens} tokens, Llama 4 x 256 (random), platform {torch.tpu.get_device_name()}")
    print(f"{'run':<44}{'output tok/s':>14}")
    print(f"{'Hugging Face generate, torch CPU':<44}{hf_tok_s:>14.1f}")
    print(f"{'SGLang on tpu, torch_native attention':<44}{native:>14.1f}")
    print(f"{'SGLang on tpu, torchtpu_paged attention':<44}{batched:>14.1f}")
    print(f"torchtpu_paged / torch_native: {batched / native:.2f}x; torchtpu_paged / HF on CPU: "
          f"{batched / hf_tok_s:.2f}x; same tokens: {batched_ids == native_ids}")


if __name__ == "__main__":
    main()
