"""Fine-tune a small causal language model; the CUDA version of this script differs only in
DEVICE = "cuda". Runs a Llama-architecture model built from its config (random weights, no
download) on synthetic token data.

    python examples/train.py [--steps 20] [--compile]
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

DEVICE = "tpu"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = AutoModelForCausalLM.from_config(config).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    forward = torch.compile(model, backend="tpu") if a.compile else model
    # A repeating token pattern the model can learn.
    data = torch.arange(64).remainder(17).repeat(8, 1).to(DEVICE)
    t0 = time.perf_counter()
    for step in range(a.steps):
        optimizer.zero_grad()
        loss = forward(input_ids=data, labels=data).loss
        loss.backward()
        optimizer.step()
        if step % 5 == 0 or step == a.steps - 1:
            print(f"step {step:3d} loss {loss.item():.4f}")
    print(f"{a.steps} steps in {time.perf_counter() - t0:.2f} s on {torch.tpu.get_device_name()}")


if __name__ == "__main__":
    main()
