"""SGLang serving on "tpu" through torchtpu's platform (`--device tpu`): offline Engine.generate
against Hugging Face on CPU (greedy tokens equal), top-k 1 sampling, SGLang's own errors for bad
requests, and `python -m sglang.launch_server` answering the openai client on 127.0.0.1.

Runs in SGLang's environment (scripts/setup_sglang.sh: SGLang pins its own torch and
transformers); skipped where SGLang is not installed."""
import sys

import pytest

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
def test_greedy_tokens_equal_hugging_face_qwen2(tmp_path):
    model, tok = save_tiny("Qwen2", tmp_path)
    engine = sglang.Engine(model_path=str(tmp_path), **ENGINE_ARGS)
    try:
        ids = [tok(p).input_ids for p in PROMPTS]
        outs = engine.generate(input_ids=ids, sampling_params=greedy(8))
        for prompt, out in zip(ids, outs):
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
