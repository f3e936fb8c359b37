"""vLLM serving on "tpu" through torchtpu's platform plugin: offline LLM.generate against Hugging
Face generate on CPU (greedy tokens equal), seeded sampling, prefix caching, vLLM's own errors
for bad requests, and `vllm serve` answering the openai client on 127.0.0.1.

Runs in the serving environment (scripts/setup_serving.sh: vLLM pins its own transformers);
skipped where vLLM is not installed."""
import os
import sys

import pytest
import torch

vllm = pytest.importorskip("vllm")

from serving_models import WORDS, free_port, save_tiny, serve_and_check  # noqa: E402
from serving_models import hf_greedy as greedy_ids  # noqa: E402

PROMPTS = [
    "the cat sat on the mat",
    "a big red dog ran to the house and then",
    # Longer than one KV block (16 tokens).
    " ".join(WORDS * 2),
]


def token_prompts(tok, prompts=PROMPTS):
    """The prompts as token ids: the model comparisons bypass tokenizers (for some families
    transformers loads the saved tokenizer as the family's own class, which splits text
    differently than the tokenizer object the test holds)."""
    return [{"prompt_token_ids": tok(p).input_ids} for p in prompts]


def hf_greedy(model, tok, prompt, n):
    ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else tok(prompt).input_ids
    return greedy_ids(model, ids, n)


def make_llm(path, **kw):
    # A step holds at most 128 tokens (one whole prompt): the warm-up then compiles token counts
    # up to 128 rather than vLLM's default 512.
    return vllm.LLM(model=str(path), dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=4,
                    max_num_batched_tokens=128, kv_cache_memory_bytes=16 << 20, seed=0, **kw)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model, tok = save_tiny("Llama", path)
    llm = make_llm(path)
    yield path, model, tok, llm
    del llm


# Mistral and the Gemmas with an 8-token sliding window (the longest prompt crosses it); Gemma 2
# also soft-caps its attention scores.
# Mixtral and Qwen2-MoE: 4 experts, 2 per token (Qwen2-MoE adds its shared expert).
CONFIGS = {
    "Mistral": {"sliding_window": 8}, "Gemma2": {"sliding_window": 8}, "Gemma3Text": {"sliding_window": 8},
    "Mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen2Moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "shared_expert_intermediate_size": 64},
}


@pytest.mark.parametrize("family", ["Qwen2", "Qwen3", "Mistral", "Gemma2", "Gemma3Text", "Mixtral", "Qwen2Moe"])
def test_greedy_tokens_equal_hugging_face_other_families(family, tmp_path, monkeypatch):
    # No warm-up (the llama fixture's engine has it): these engines compile only the sizes
    # their prompts meet.
    monkeypatch.setenv("TORCHTPU_VLLM_WARMUP", "0")
    # And the engine core in this process (vLLM's single-process mode): no second process to
    # start and import vLLM into (the llama fixture's engine and `vllm serve` run it apart).
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model, tok = save_tiny(family, tmp_path, **CONFIGS.get(family, {}))
    llm = make_llm(tmp_path)
    prompts = token_prompts(tok)
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, 10), prompt


def test_greedy_tokens_equal_hugging_face(llama):
    _, model, tok, llm = llama
    outs = llm.generate(PROMPTS, vllm.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        assert out.prompt_token_ids == tok(prompt).input_ids
        assert out.outputs[0].token_ids, prompt
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, 12), prompt


def test_tensor_parallel_greedy_tokens_equal_hugging_face(tmp_path, monkeypatch):
    # Two worker processes, each holding half of every layer; their all-reduces go through
    # torchtpu's c10d backend (tccl).
    monkeypatch.setenv("TORCHTPU_VLLM_WARMUP", "0")
    model, tok = save_tiny("Llama", tmp_path)
    llm = make_llm(tmp_path, tensor_parallel_size=2)
    prompts = token_prompts(tok)
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, 10), prompt


def test_compiled_mode_greedy_tokens_equal_hugging_face(llama):
    # vLLM's compiled mode: the model graph, split at the attention ops, compiled by torchtpu.
    path, model, tok, _ = llama
    llm = vllm.LLM(model=str(path), dtype="float32", max_model_len=128, max_num_seqs=4, kv_cache_memory_bytes=16 << 20,
                   seed=0)
    prompts = token_prompts(tok)
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, 8)
    del llm


def test_seeded_sampling_is_reproducible(llama):
    llm = llama[3]
    params = dict(temperature=1.0, top_k=8, top_p=0.9, max_tokens=16, ignore_eos=True)
    first = llm.generate(PROMPTS[:2], vllm.SamplingParams(seed=7, **params))
    again = llm.generate(PROMPTS[:2], vllm.SamplingParams(seed=7, **params))
    other = llm.generate(PROMPTS[:2], vllm.SamplingParams(seed=8, **params))
    tokens = [[list(o.outputs[0].token_ids) for o in run] for run in (first, again, other)]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]
    # top_k = 8 over a 30-word vocabulary: every sampled token is in range.
    assert all(0 <= t < 64 for seq in tokens[0] for t in seq)


def test_prefix_cache_hits_give_the_same_tokens(llama):
    llm = llama[3]
    prompt = " ".join(WORDS * 2)  # two full blocks of shared prefix
    greedy = vllm.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    miss = llm.generate([prompt + " cat"], greedy)[0]
    hit = llm.generate([prompt + " cat"], greedy)[0]
    assert hit.num_cached_tokens > 0 and miss.outputs[0].token_ids == hit.outputs[0].token_ids
    _, model, tok, _ = llama
    assert list(hit.outputs[0].token_ids) == hf_greedy(model, tok, prompt + " cat", 8)


def test_a_prompt_longer_than_max_model_len_gets_vllms_error(llama):
    llm = llama[3]
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="maximum context length is 128 tokens"):
        llm.generate([" ".join(["cat"] * 200)], vllm.SamplingParams(max_tokens=4))
    # The engine keeps serving.
    out = llm.generate([PROMPTS[0]], vllm.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_chunked_prefill_gives_hugging_faces_tokens(tmp_path, monkeypatch):
    # At most 16 tokens a step: the 52-token prompt is prefilled in 4 chunks, each attending to
    # the keys the earlier chunks wrote into the paged cache, alongside the other requests'
    # prefills and decodes.
    monkeypatch.setenv("TORCHTPU_VLLM_WARMUP", "0")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model, tok = save_tiny("Llama", tmp_path)
    llm = vllm.LLM(model=str(tmp_path), dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=4,
                   max_num_batched_tokens=16, enable_chunked_prefill=True, kv_cache_memory_bytes=16 << 20, seed=0)
    prompts = token_prompts(tok)
    assert len(prompts[2]["prompt_token_ids"]) > 3 * 16
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, 6), prompt


def test_new_token_counts_in_known_buckets_compile_nothing(tmp_path, monkeypatch):
    # A running server's steps come with new token and request counts all the time; vLLM's
    # input preparation cuts its step buffers at those counts. After one request set, another
    # whose counts differ but fall in the same power-of-two buckets compiles no program (the
    # engine core in this process, so that its compile counts are this process's), and its
    # tokens are Hugging Face's.
    monkeypatch.setenv("TORCHTPU_VLLM_WARMUP", "0")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model, tok = save_tiny("Llama", tmp_path)
    llm = make_llm(tmp_path)
    greedy = vllm.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def prompts(lengths):
        return token_prompts(tok, [" ".join(WORDS[i % len(WORDS)] for i in range(n)) for n in lengths])

    first, second = prompts([4, 9, 13]), prompts([5, 8, 14])
    counts = [[len(p["prompt_token_ids"]) for p in ps] for ps in (first, second)]
    assert counts[0] != counts[1] and sum(counts[0]) != sum(counts[1])
    llm.generate(first, greedy)
    before = torch.tpu.compile_stats()["misses"]
    outs = llm.generate(second, greedy)
    assert torch.tpu.compile_stats()["misses"] - before == 0
    for prompt, out in zip(second, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, 6), prompt


def test_after_the_warm_up_request_sets_compile_nothing(tmp_path, monkeypatch):
    # The warm-up runs vLLM's whole step (input preparation, model, sampling) over the request
    # and token counts' buckets: request sets of any shape then compile no program (before the
    # step warm-up, the first set alone compiled 52), and give Hugging Face's tokens. The sets:
    # counts that stay, counts that fall as requests finish, more prompts than the batch holds
    # (new requests join as others leave), a long prompt with a short one, each with its own
    # number of output tokens.
    monkeypatch.setenv("TORCHTPU_VLLM_WARMUP", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model, tok = save_tiny("Llama", tmp_path)
    llm = make_llm(tmp_path)
    sets = [[4, 9, 13, 6], [3, 9, 13], [5, 7, 2, 11, 4], [40, 3], [17, 17, 17], [30, 50, 2, 9]]
    compiles = []
    for k, lengths in enumerate(sets):
        prompts = token_prompts(tok, [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for i in range(n)) for n in lengths])
        outputs = [2 + (i + k) % 6 for i in range(len(lengths))]
        before = torch.tpu.compile_stats()["misses"]
        outs = llm.generate(prompts, [vllm.SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in outputs],
                            use_tqdm=False)
        compiles.append(torch.tpu.compile_stats()["misses"] - before)
        for prompt, m, out in zip(prompts, outputs, outs):
            assert list(out.outputs[0].token_ids) == hf_greedy(model, tok, prompt, m), (lengths, prompt)
    assert compiles == [0] * len(sets)


def test_invalid_sampling_parameters_get_vllms_errors(llama):
    llm = llama[3]
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="temperature must be non-negative"):
        vllm.SamplingParams(temperature=-1.0)
    # Checked by the engine against its configuration (at most 20 logprobs by default).
    with pytest.raises(VLLMValidationError, match="logprobs"):
        llm.generate([PROMPTS[0]], vllm.SamplingParams(logprobs=1000, max_tokens=2))
    out = llm.generate([PROMPTS[0]], vllm.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_an_unknown_model_path_gets_the_loaders_error(tmp_path):
    with pytest.raises(OSError, match="missing"):
        make_llm(tmp_path / "missing")


@pytest.mark.parametrize("activation,on_input", [("SILU", False), ("GELU_TANH", True), ("SILU_NO_MUL", False)])
def test_moe_experts_equal_a_per_token_loop_on_cpu(activation, on_input):
    import torch.nn.functional as F
    from torchtpu.vllm.moe import MoEActivation, fused_experts

    torch.manual_seed(0)
    tokens, hidden, inter, experts, k = 9, 16, 12, 5, 2
    act = MoEActivation[activation]
    gated = not activation.endswith("NO_MUL")
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts, 2 * inter if gated else inter, hidden) / 4
    w2 = torch.randn(experts, hidden, inter) / 4
    topk_ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).to(torch.int32)
    topk_weights = torch.rand(tokens, k)
    fn = {"SILU": F.silu, "GELU_TANH": lambda t: F.gelu(t, approximate="tanh"), "SILU_NO_MUL": F.silu}[activation]
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for e, w in zip(topk_ids[t].tolist(), topk_weights[t]):
            row = x[t] * w if on_input else x[t]
            h = w13[e] @ row
            h = fn(h[:inter]) * h[inter:] if gated else fn(h)
            want[t] += w2[e] @ h if on_input else w * (w2[e] @ h)
    tpu = [a.to("tpu") for a in (x, w13, w2, topk_weights, topk_ids)]
    got = fused_experts(*tpu[:3], tpu[3], tpu[4], act, apply_router_weight_on_input=on_input)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    # One token: most experts get no rows (empty groups in the grouped matmuls).
    one = fused_experts(*tpu[:3], tpu[3][:1], tpu[4][:1], act, apply_router_weight_on_input=on_input)
    torch.testing.assert_close(one.cpu(), want[:1], rtol=1e-5, atol=1e-5)


def test_vllm_serve_answers_the_openai_client(llama):
    path, model, tok, _ = llama
    port = free_port()
    serve_and_check(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(path), "--host", "127.0.0.1", "--port",
         str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "128", "--max-num-seqs", "8",
         "--max-num-batched-tokens", "128", "--kv-cache-memory-bytes", str(16 << 20), "--served-model-name", "tiny"],
        path / "server.log", port, model, tok, PROMPTS, env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO"})
