"""Greedy generation with a KV cache; the CUDA version differs only in DEVICE = "cuda".
The model is built from its config with random weights (no download).

    python examples/generate.py [--model llama|qwen2|gemma|mistral|gpt2] [--tokens 16]
"""
import argparse

import torch
import transformers

DEVICE = "tpu"
CONFIGS = {
    "llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "gemma": transformers.GemmaConfig,
    "mistral": transformers.MistralConfig, "gpt2": transformers.GPT2Config,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama", choices=sorted(CONFIGS))
    p.add_argument("--tokens", type=int, default=16)
    a = p.parse_args()
    torch.manual_seed(0)
    small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_embd=64, n_layer=2, n_head=4)
    config = CONFIGS[a.model]()
    for k, v in small.items():
        if hasattr(config, k):
            setattr(config, k, v)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().to(DEVICE)
    prompt = torch.tensor([[1, 7, 42, 9, 100]], device=DEVICE)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=a.tokens, do_sample=False, pad_token_id=0)
    print(f"{a.model} on {torch.tpu.get_device_name()}: {out[0].tolist()}")


if __name__ == "__main__":
    main()
