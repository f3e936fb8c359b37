"""SGLang serving on "tpu" through torchtpu's platform (`--device tpu`): offline Engine.generate
against Hugging Face on CPU (greedy tokens equal), top-k 1 sampling, SGLang's own errors for bad
requests, and `python -m sglang.launch_server` answering the openai client on 127.0.0.1.

Runs in SGLang's environment (scripts/setup_sglang.sh: SGLang pins its own torch and
transformers); skipped where SGLang is not installed."""
import sys

import pytest
import torch

sglang = pytest.importorskip("sglang")

from serving_models import WORDS, free_port, hf_greedy, save_tiny, serve_and_check  # noqa: E402

PROMPTS = [
    "the cat sat on the mat",
    "a big red dog ran to the house and then",
    " ".join(WORDS * 2),
]
# A small KV pool and batch: the CPU plugin's memory is the host's.
ENGINE_ARGS = dict(device="tpu", dtype="float32", max_total_tokens=2048, max_running_requests=4,
                   chunked_prefill_size=256, context_length=128, random_seed=0, log_level="warning")


# First in the file: SGLang's Engine.shutdown ends every child process of this process, so no
# other engine may be alive then (the module's Llama engine starts after this test).
def test_greedy_tokens_equal_hugging_face_qwen2(tmp_path, monkeypatch, capfd):
    model, tok = save_tiny("Qwen2", tmp_path)
    # The scheduler process logs each program it compiles (on the stderr it inherits).
    monkeypatch.setenv("TORCHTPU_LOG_COMPILES", "1")
    # Chunks of 64 tokens: the 100-token prompt's second chunk attends to its first.
    engine = sglang.Engine(model_path=str(tmp_path), **{**ENGINE_ARGS, "chunked_prefill_size": 64})
    try:
        assert engine.get_server_info()["attention_backend"] == "torchtpu_paged"  # the platform's default
        ids = [tok(p).input_ids for p in PROMPTS] + [[4 + (i * 7) % 60 for i in range(100)]]
        outs = engine.generate(input_ids=ids, sampling_params=greedy(8))
        for prompt, out in zip(ids, outs):
            assert out["output_ids"] == hf_greedy(model, prompt, 8), prompt
        capfd.readouterr()
        again = engine.generate(input_ids=ids, sampling_params=greedy(8))
        assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]
        # Its step buffers' views move through the token pool every step: filled by one
        # _foreach_copy_, each decoding step compiled a program for the views' new offsets.
        log = capfd.readouterr().err
        assert "compile aten::_foreach_copy_" not in log, log[-3000:]
        # Other prompts (no prefix cached), each a token shorter: new prefill token counts in
        # the buckets met already. The platform pads a prefill's tokens to their bucket, so the
        # model's programs (its matmuls among them) compile nothing new, and the tokens are
        # still Hugging Face's.
        other = [[4 + (i * 11 + k) % 60 for i in range(len(p) - 1)] for k, p in enumerate(ids)]
        outs = engine.generate(input_ids=other, sampling_params=greedy(8))
        log = capfd.readouterr().err
        assert "compile aten::mm(" not in log and "compile aten::addmm(" not in log, log[-3000:]
        for prompt, out in zip(other, outs):
            assert out["output_ids"] == hf_greedy(model, prompt, 8), prompt
    finally:
        engine.shutdown()


def test_an_unknown_model_path_gets_the_loaders_error(tmp_path):
    with pytest.raises(OSError, match="missing"):
        sglang.Engine(model_path=str(tmp_path / "missing"), **ENGINE_ARGS)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model, tok = save_tiny("Llama", path)
    engine = sglang.Engine(model_path=str(path), **ENGINE_ARGS)
    yield path, model, tok, engine
    engine.shutdown()


def greedy(n):
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


def test_greedy_tokens_equal_hugging_face(llama):
    _, model, tok, engine = llama
    ids = [tok(p).input_ids for p in PROMPTS]
    outs = engine.generate(input_ids=ids, sampling_params=greedy(10))
    for prompt, out in zip(ids, outs):
        assert out["output_ids"] == hf_greedy(model, prompt, 10), prompt


def test_sampling_with_top_k_1_is_greedy(llama):
    # (SGLang seeds requests only in its deterministic-inference mode, which needs CUDA kernels.)
    _, model, tok, engine = llama
    ids = [tok(p).input_ids for p in PROMPTS[:2]]
    sampled = engine.generate(input_ids=ids, sampling_params=dict(temperature=1.0, top_k=1, max_new_tokens=8,
                                                                   ignore_eos=True))
    for prompt, out in zip(ids, sampled):
        assert out["output_ids"] == hf_greedy(model, prompt, 8)
    free = engine.generate(input_ids=ids, sampling_params=dict(temperature=1.5, max_new_tokens=32, ignore_eos=True))
    assert all(0 <= t < 64 for o in free for t in o["output_ids"])
    assert free[0]["output_ids"] != hf_greedy(model, ids[0], 32)


def test_bad_requests_get_sglangs_errors(llama):
    _, _, tok, engine = llama
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(input_ids=tok(PROMPTS[0]).input_ids, sampling_params={"temperature": -1.0})
    with pytest.raises(ValueError, match=r"longer than the model's context length \(128 tokens\)"):
        engine.generate(input_ids=[4] * 200, sampling_params=greedy(4))
    # The engine keeps serving.
    assert len(engine.generate(input_ids=tok(PROMPTS[0]).input_ids, sampling_params=greedy(4))["output_ids"]) == 4


def test_launch_server_answers_the_openai_client(llama):
    path, model, tok, _ = llama
    port = free_port()
    serve_and_check(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", str(path), "--device", "tpu", "--host",
         "127.0.0.1", "--port", str(port), "--dtype", "float32", "--context-length", "128", "--max-total-tokens",
         "2048", "--max-running-requests", "8", "--served-model-name", "tiny"],
        path / "server.log", port, model, tok, PROMPTS)


# ---- the batched attention backend against SGLang's per-request one ---------------------------

def _backend_case(device, causal_lens):
    """A KV pool, a request-to-token table and a batch of three requests, (prefix, new tokens) each."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    pool, ctx = 96, 40
    k_cache, v_cache = torch.randn(pool, 2, 8, generator=g), torch.randn(pool, 2, 8, generator=g)
    req_to_token = torch.randint(0, pool, (5, ctx), generator=g, dtype=torch.int32)  # 5 request rows
    prefixes, news = zip(*causal_lens)
    seq_lens = torch.tensor([p + n for p, n in causal_lens])
    pool_indices = torch.tensor([3, 0, 4])
    query = torch.randn(sum(news), 4, 8, generator=g)
    runner = SimpleNamespace(device=torch.device(device), req_to_token_pool=SimpleNamespace(req_to_token=req_to_token.to(device)),
                             token_to_kv_pool=None)
    batch = SimpleNamespace(batch_size=3, seq_lens=seq_lens.to(device), seq_lens_cpu=seq_lens,
                            req_pool_indices=pool_indices.to(device), req_pool_indices_cpu=pool_indices,
                            extend_prefix_lens=torch.tensor(prefixes).to(device), extend_seq_lens=torch.tensor(news).to(device),
                            extend_seq_lens_cpu=list(news), extend_prefix_lens_cpu=list(prefixes), encoder_lens=None,
                            out_cache_loc=None)
    return runner, batch, [t.to(device) for t in (query, k_cache, v_cache)]


@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_batched_attention_equals_sglangs_per_request_attention(decode, window, causal):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from torchtpu.sglang.attention import TpuPagedAttnBackend

    if not causal and (decode or window):
        pytest.skip("SGLang's decode, and its sliding windows, are causal only")
    # A fresh prompt, a chunk after a 7-token prefix, a one-token step after 30.
    lens = [(4, 1), (11, 1), (30, 1)] if decode else [(0, 5), (7, 6), (30, 1)]
    results = []
    for device, cls in (("cpu", TorchNativeAttnBackend), ("tpu", TpuPagedAttnBackend)):
        runner, batch, (query, k_cache, v_cache) = _backend_case(device, lens)
        batch.forward_mode = ForwardMode.DECODE if decode else ForwardMode.EXTEND
        backend = cls(runner)
        backend.init_forward_metadata(batch)
        out = torch.zeros_like(query)
        common = dict(scaling=0.3, enable_gqa=True, sliding_window_size=window)
        table = runner.req_to_token_pool.req_to_token
        if decode:
            backend._run_sdpa_forward_decode(query, out, k_cache, v_cache, table, batch.req_pool_indices,
                                             batch.seq_lens, causal=False, **common)
        else:
            backend._run_sdpa_forward_extend(query, out, k_cache, v_cache, table, batch.req_pool_indices,
                                             batch.seq_lens, batch.extend_prefix_lens, batch.extend_seq_lens,
                                             causal=causal, **common)
        results.append(out.cpu())
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)

