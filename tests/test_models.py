"""Hugging Face models built from configs with small random weights (no hub download): on
"tpu" they give CPU's logits, CPU's greedy generation (up to a near tie) and CPU's training
losses, in eager mode and under torch.compile(backend="tpu") (generation there with a static KV
cache)."""
import copy

import pytest
import torch
from helpers import TPU, assert_matches_cpu, assert_same_greedy, greedy

transformers = pytest.importorskip("transformers")

# Shrinks every config to a tiny model; keys a config lacks are ignored.
SMALL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, moe_intermediate_size=32,
    n_routed_experts=4, num_local_experts=4, num_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    first_k_dense_replace=1, n_group=1, topk_group=1, sliding_window=16, n_embd=64, n_layer=2, n_head=4,
    n_positions=128, d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, num_decoder_layers=2,
    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=64, max_target_positions=64,
    layer_types=None, attn_implementation="sdpa",
    # Dropout draws differ between devices; training comparisons need it off.
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, dropout=0.0, attention_dropout=0.0,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, activation_dropout=0.0, dropout_rate=0.0,
)

CAUSAL = ["Llama", "Qwen2", "Qwen3", "Gemma", "Gemma2", "Gemma3Text", "Mistral", "Mixtral", "DeepseekV3", "GPT2"]


def small_config(name):
    cfg = getattr(transformers, name + "Config")()
    for k, v in SMALL.items():
        if hasattr(cfg, k) and v is not None:
            setattr(cfg, k, v)
    if name.startswith("Deepseek"):
        cfg.head_dim = cfg.qk_rope_head_dim  # MLA's rotary part
        cfg.num_key_value_heads = cfg.num_attention_heads  # MLA: every head has its keys (as in V3's config)
    if name == "ViT":
        cfg.image_size, cfg.patch_size = 32, 8
    if name == "Whisper":
        cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id, cfg.decoder_start_token_id = 0, 1, 2, 1
        cfg.begin_suppress_tokens, cfg.suppress_tokens = None, None
    return cfg


def causal_lm(name):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(small_config(name)).eval()


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_lm_logits_and_generation(name):
    model = causal_lm(name)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        ref_gen = greedy(model, dict(input_ids=ids), 16)
    dev = copy.deepcopy(model).to(TPU)
    with torch.no_grad():
        assert_matches_cpu(dev(ids.to(TPU)).logits, ref, atol=2e-4)
        gen = dev.generate(ids.to(TPU), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert_same_greedy(gen, ref_gen)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", CAUSAL)
def test_causal_lm_training_matches_cpu(name, mode):
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    losses = {}
    for device in ("cpu", "tpu"):
        model = causal_lm(name).train().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = torch.compile(model, backend="tpu") if device == "tpu" and mode == "compiled" else model
        x = ids.to(device)
        out = []
        for _ in range(5):
            opt.zero_grad()
            loss = run(x, labels=x).loss
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[device] = out
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_lm_compiled_logits_and_static_cache_generation(name):
    model = causal_lm(name)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).logits
        ref_gen = greedy(model, dict(input_ids=ids), 16)
        dev = copy.deepcopy(model).to(TPU)
        assert_matches_cpu(torch.compile(dev, backend="tpu")(ids.to(TPU)).logits, ref, atol=2e-4)
        # Generation with a static KV cache under torch.compile: one graph for the prompt, one
        # reused by every decoding step.
        torch._dynamo.reset()
        dev.forward = torch.compile(dev.forward, backend="tpu")
        before = len(torch.tpu.compile_stats()["graphs"])
        gen = dev.generate(ids.to(TPU), max_new_tokens=16, do_sample=False, pad_token_id=0,
                           cache_implementation="static")
    assert_same_greedy(gen, ref_gen)
    graphs = torch.tpu.compile_stats()["graphs"][before:]
    if getattr(model.config, "sliding_window", None) is None:
        assert len(graphs) <= 3 and max(g["calls"] for g in graphs) >= 15, graphs
    else:
        # transformers' sliding-window static cache keeps its fill level in a Python int that
        # dynamo guards on: each step recompiles until the window is full (any backend), and
        # the recompiles say so.
        assert "cumulative_length" in (graphs[-1]["last_recompile"] or "") or len(graphs) <= 3, graphs


@pytest.mark.parametrize("name", ["Llama", "Qwen2", "Gemma2", "Mistral"])
def test_causal_lm_with_flex_attention_matches_sdpa_on_cpu(name, caplog):
    # attn_implementation="flex_attention": transformers compiles its block masks with inductor
    # (create_block_mask(..., _compile=True)) and refuses flex attention on an accelerator named
    # "tpu" unless torchtpu tells it that this one runs it. It compiles flex attention, whose
    # graphs torchtpu lowers whole: Gemma2's score function caps the scores (tanh), Mistral's
    # mask is a sliding window.
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(4))
    ref = causal_lm(name).train()
    torch.manual_seed(0)
    flex = transformers.AutoModelForCausalLM.from_config(small_config(name), attn_implementation="flex_attention")
    flex.load_state_dict(ref.state_dict())
    dev = flex.train().to(TPU)
    assert dev.config._attn_implementation == "flex_attention"
    want, got = ref(ids, labels=ids), dev(ids.to(TPU), labels=ids.to(TPU))
    assert_matches_cpu(got.logits.detach(), want.logits.detach(), atol=2e-4)
    want.loss.backward()
    got.loss.backward()
    for (n, p), q in zip(ref.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=2e-5, rtol=1e-4, msg=n)
    assert "runs eagerly" not in caplog.text, caplog.text


def _ids(shape, seed):
    return torch.randint(3, 128, shape, generator=torch.Generator().manual_seed(seed))


def _pixels(seed):
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _features(seed):
    return torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(seed))


# (config name, auto class, inputs, labels): encoders, encoder-decoders, vision and speech.
OTHERS = {
    "Bert": ("AutoModelForMaskedLM", lambda: dict(input_ids=_ids((2, 10), 4)), lambda: _ids((2, 10), 5)),
    "T5": ("AutoModelForSeq2SeqLM", lambda: dict(input_ids=_ids((2, 10), 4), decoder_input_ids=_ids((2, 5), 6)),
           lambda: _ids((2, 5), 7)),
    "ViT": ("AutoModelForImageClassification", lambda: dict(pixel_values=_pixels(4)),
            lambda: torch.tensor([0, 1])),
    "Whisper": ("AutoModelForSpeechSeq2Seq", lambda: dict(input_features=_features(4), decoder_input_ids=_ids((2, 4), 6)),
                lambda: _ids((2, 4), 7)),
}


def other_model(name):
    torch.manual_seed(0)
    auto, _, _ = OTHERS[name]
    return getattr(transformers, auto).from_config(small_config(name))


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_models_logits_eager_and_compiled(name):
    _, inputs, _ = OTHERS[name]
    model = other_model(name).eval()
    x = inputs()
    with torch.no_grad():
        ref = model(**x).logits
        dev = copy.deepcopy(model).to(TPU)
        assert_matches_cpu(dev(**{k: v.to(TPU) for k, v in x.items()}).logits, ref, atol=2e-4)
        compiled = torch.compile(dev, backend="tpu")
        assert_matches_cpu(compiled(**{k: v.to(TPU) for k, v in x.items()}).logits, ref, atol=2e-4)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_models_training_matches_cpu(name, mode):
    _, inputs, labels = OTHERS[name]
    losses = {}
    for device in ("cpu", "tpu"):
        model = other_model(name).train().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = torch.compile(model, backend="tpu") if device == "tpu" and mode == "compiled" else model
        x = {k: v.to(device) for k, v in inputs().items()}
        y = labels().to(device)
        out = []
        for _ in range(5):
            opt.zero_grad()
            loss = run(**x, labels=y).loss
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[device] = out
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-4, abs=1e-4)
