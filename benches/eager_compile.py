"""What new shapes cost in eager mode: first-seen-op compile times over the tiny-Llama training
step, and Hugging Face `generate` (48 tokens from a 20-token prompt, tiny Llama) first and second
call, each against torch on CPU and against this build with the quick compile tier off and
with bucketed programs off (the previous defaults), and in fused eager mode (whose new programs
compile side by side on worker threads), also without tier-ups (TORCHTPU_TIER_UP_ELEMENTS=0: larger
programs compile at full optimization at once, the previous default) and with new graphs compiled as
one program at their first run (TORCHTPU_FUSE_NEW_GRAPHS=1), in one run. Every torchtpu measurement runs in a fresh process with an
empty persistent cache, so every program is really compiled; the last row of each part is a warm
restart: a second process of the default mode with the cache the first one filled.

    python benches/eager_compile.py
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def train_step(device):
    sys.path.insert(0, HERE)
    import torch
    import torch.nn.functional as F
    from tiny_llama import TinyLlama

    torch.manual_seed(0)
    model = TinyLlama().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 1000, (4, 129)).to(device)
    t0 = time.perf_counter()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    loss.item()
    return time.perf_counter() - t0


def generate(device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval().to(device)
    prompt = torch.randint(0, 1000, (1, 20)).to(device)
    times, out = [], None
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=48, min_new_tokens=48, do_sample=False)
        times.append(time.perf_counter() - t0)
    return times, out[0].tolist()


def child(what, device):
    """Runs one measurement in this process and prints it as JSON."""
    if device == "tpu":
        import torchtpu  # noqa: F401
    if what == "train":
        result = {"seconds": train_step(device)}
    else:
        times, tokens = generate(device)
        result = {"first": times[0], "second": times[1], "tokens": tokens}
    if device == "tpu":
        import torch

        stats = torch.tpu.compile_stats()
        result["compiles"] = stats["misses"]
        result["phases"] = stats["phases"]
        result["disk_hits"] = stats["disk_hits"]
    print("RESULT " + json.dumps(result))


def measure(what, device, quick=True, buckets=True, fused=False, new_graphs=False, tier_up=True, cache=None):
    cache = cache or tempfile.mkdtemp(prefix="tt-bench-")
    env = dict(os.environ, TORCHTPU_LOG_COMPILES="1", TORCHTPU_CACHE_DIR=cache)
    env["TORCHTPU_FUSED_EAGER"] = "1" if fused else "0"
    env["TORCHTPU_FUSE_NEW_GRAPHS"] = "1" if new_graphs else "0"
    if not quick:
        env["TORCHTPU_QUICK_COMPILE_ELEMENTS"] = "0"
    env["TORCHTPU_BUCKET_PROGRAMS"] = "1" if buckets else "0"
    if not tier_up:
        env["TORCHTPU_TIER_UP_ELEMENTS"] = "0"
    p = subprocess.run([sys.executable, __file__, "--child", what, device], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(p.stdout + p.stderr)
    result = json.loads(p.stdout.split("RESULT ", 1)[1])
    result["compile_ms"] = [float(m.group(1)) for m in re.finditer(r" ([0-9.]+) ms \(compiled", p.stderr)]
    result["cache"] = cache
    return result


def spread(ms):
    ms = sorted(ms)
    return f"median {statistics.median(ms):6.1f} ms  p90 {ms[int(0.9 * len(ms))]:6.1f} ms  total {sum(ms) / 1e3:5.2f} s"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3])
    print("first-seen programs of one tiny-Llama training step (eager, forward + backward + AdamW):")
    cpu = measure("train", "cpu")
    rows = [("quick tier off", measure("train", "tpu", quick=False, buckets=False)), ("strict eager", measure("train", "tpu")),
            ("fused, no tier-up", measure("train", "tpu", fused=True, tier_up=False)),
            ("fused (default)", measure("train", "tpu", fused=True)),
            ("fused, new graphs fused", measure("train", "tpu", fused=True, new_graphs=True))]
    for name, r in rows:
        print(f"  {name:<26} {len(r['compile_ms']):4d} programs  {spread(r['compile_ms'])}  step {r['seconds']:5.2f} s "
              f"({r['seconds'] / cpu['seconds']:.0f}x torch CPU's {cpu['seconds']:.2f} s)")
    warm = measure("train", "tpu", fused=True, cache=rows[3][1]["cache"])
    print(f"  {'fused, warm restart':<26} {len(warm['compile_ms']):4d} programs compiled, {warm['disk_hits']} loaded in "
          f"{warm['phases']['cache_load']:.2f} s  step {warm['seconds']:5.2f} s ({warm['seconds'] / cpu['seconds']:.0f}x torch CPU's)")
    print(f"  compile time: {sum(rows[1][1]['compile_ms']) / sum(rows[0][1]['compile_ms']):.2f}x the quick-tier-off build")
    print("HF generate, 48 new tokens from a 20-token prompt (tiny Llama, greedy):")
    cpu = measure("generate", "cpu")
    print(f"  {'torch CPU':<26} first {cpu['first']:6.2f} s  second {cpu['second']:6.2f} s")
    for name, quick, buckets, fused, new_graphs, tier_up in [
            ("quick tier off", False, False, False, False, True), ("buckets off", True, False, False, False, True),
            ("strict eager", True, True, False, False, True), ("fused, no tier-up", True, True, True, False, False),
            ("fused (default)", True, True, True, False, True), ("fused, new graphs fused", True, True, True, True, True)]:
        r = measure("generate", "tpu", quick, buckets, fused, new_graphs, tier_up)
        same = "same tokens as CPU" if r["tokens"] == cpu["tokens"] else "TOKENS DIFFER FROM CPU"
        print(f"  {name:<26} first {r['first']:6.2f} s ({r['first'] / cpu['first']:5.1f}x CPU)  second {r['second']:6.2f} s "
              f"({r['second'] / cpu['second']:4.1f}x CPU)  {len(r['compile_ms'])} programs, {spread(r['compile_ms'])}; {same}")
        print("                             compile time by phase: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["phases"].items()))
        if name == "fused (default)":
            default_cache = r["cache"]
    r = measure("generate", "tpu", fused=True, cache=default_cache)
    same = "same tokens as CPU" if r["tokens"] == cpu["tokens"] else "TOKENS DIFFER FROM CPU"
    print(f"  {'fused, warm restart':<26} first {r['first']:6.2f} s ({r['first'] / cpu['first']:5.1f}x CPU)  second {r['second']:6.2f} s "
          f"({r['second'] / cpu['second']:4.1f}x CPU)  {len(r['compile_ms'])} programs compiled, {r['disk_hits']} loaded in "
          f"{r['phases']['cache_load']:.2f} s; {same}")


if __name__ == "__main__":
    main()
