"""The main job: a small model trained and run on device "tpu", next to the same run on CPU.

On a machine without a TPU, "tpu" runs on XLA's CPU PJRT plugin. Nothing here differs from
a CUDA script but the device string.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyClassifier(nn.Module):
    def __init__(self, dim=32, hidden=64, classes=4):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


def train(device, steps=20, seed=0):
    torch.manual_seed(seed)
    model = TinyClassifier().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 32, generator=gen)
    y = (x[:, :4].argmax(dim=1)).to(device)
    x = x.to(device)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        acc = (model(x).argmax(dim=1) == y).float().mean().item()
    return losses, acc, time.perf_counter() - t0


def main():
    print(f"device 'tpu' is: {torch.tpu.get_device_name()}")
    cpu_losses, cpu_acc, cpu_s = train("cpu")
    tpu_losses, tpu_acc, tpu_s = train("tpu")
    print(f"{'step':>4} {'loss (tpu)':>12} {'loss (cpu)':>12}")
    for i, (a, b) in enumerate(zip(tpu_losses, cpu_losses)):
        if i % 4 == 0 or i == len(tpu_losses) - 1:
            print(f"{i:>4} {a:12.5f} {b:12.5f}")
    print(f"accuracy: tpu {tpu_acc:.3f}, cpu {cpu_acc:.3f}")
    print(f"time: tpu {tpu_s:.2f} s (includes compiling each op once), cpu {cpu_s:.2f} s")
    worst = max(abs(a - b) for a, b in zip(tpu_losses, cpu_losses))
    print(f"largest loss difference: {worst:.2e}")
    if worst > 1e-3:
        raise SystemExit("tpu and cpu runs disagree")


if __name__ == "__main__":
    main()
