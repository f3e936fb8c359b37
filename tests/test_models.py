"""Hugging Face models built from configs with small random weights (no hub download): on
"tpu" they give CPU's logits, CPU's greedy generation and CPU's training losses."""
import copy

import pytest
import torch
from helpers import TPU

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

CAUSAL = ["Llama", "Qwen2", "Qwen3", "Gemma", "Gemma2", "Gemma3Text", "Mistral", "GPT2"]


def small_config(name):
    cfg = getattr(transformers, name + "Config")()
    for k, v in SMALL.items():
        if hasattr(cfg, k) and v is not None:
            setattr(cfg, k, v)
    if name.startswith("Deepseek"):
        cfg.head_dim = cfg.qk_rope_head_dim  # MLA's rotary part
    return cfg


def causal_lm(name):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(small_config(name)).eval()


def close(a, b, atol=2e-4):
    torch.testing.assert_close(a.cpu(), b, atol=atol, rtol=atol)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_lm_logits_and_generation(name):
    model = causal_lm(name)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        ref_gen = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    dev = copy.deepcopy(model).to(TPU)
    with torch.no_grad():
        close(dev(ids.to(TPU)).logits, ref)
        gen = dev.generate(ids.to(TPU), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(gen.cpu(), ref_gen)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_lm_training_matches_cpu(name):
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    losses = {}
    for device in ("cpu", "tpu"):
        model = causal_lm(name).train().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = ids.to(device)
        out = []
        for _ in range(5):
            opt.zero_grad()
            loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[device] = out
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("name", ["Llama", "Qwen2", "GPT2"])
def test_causal_lm_compiled_logits(name):
    model = causal_lm(name)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).logits
        dev = copy.deepcopy(model).to(TPU)
        compiled = torch.compile(dev, backend="tpu")
        close(compiled(ids.to(TPU)).logits, ref)
