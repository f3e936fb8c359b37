"""float8 recipes on tpu with torchao: training with convert_to_float8_training (dynamic
tensor-wise scales through torch._scaled_mm), eager and compiled, within float8 tolerance of
the bf16 run and close to the same recipe on CPU; MXFP8 training of a tiny Llama
(MXFP8TrainingOpConfig) within 3% of bf16 and close to the same recipe on CPU; float8
weight-only inference of a Hugging Face model against the same quantized model on CPU."""
import copy

import pytest
import torch

from helpers import TPU, tiny_llama

torchao_float8 = pytest.importorskip("torchao.float8", reason="setup.sh installs torchao")


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 16))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 64, generator=g), torch.randn(32, 16, generator=g)) for _ in range(4)]


def train(model, device, steps=8, compiled=False):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    forward = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for i, (x, y) in zip(range(steps), batches() * steps):
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            out = forward(x.to(device))
        loss = torch.nn.functional.mse_loss(out.float(), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_float8_training_tracks_bf16(compiled):
    bf16 = train(mlp(), "tpu", compiled=compiled)
    model = torchao_float8.convert_to_float8_training(mlp())
    assert sum(type(m).__name__ == "Float8Linear" for m in model.modules()) == 3
    fp8 = train(model, "tpu", compiled=compiled)
    assert fp8[-1] < fp8[0] * 0.95, fp8  # it learns
    torch.testing.assert_close(fp8, bf16, rtol=2e-2, atol=0)


def test_float8_training_matches_cpu():
    cpu = train(torchao_float8.convert_to_float8_training(mlp()), "cpu")
    tpu = train(torchao_float8.convert_to_float8_training(mlp()), "tpu")
    torch.testing.assert_close(tpu, cpu, rtol=5e-3, atol=0)


def mxfp8_llama():
    # torchao's MXFP8 training recipe on every linear layer but the head. Its AUTO kernels are
    # Triton and CUDA ones; EMULATED quantizes with torch ops (on the device) and multiplies the
    # dequantized operands. It takes bf16 weights (not autocast).
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    model = tiny_llama()
    quantize_(model, MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and "lm_head" not in fqn)
    assert sum("MXFP8" in type(m.weight).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)) == 14
    return model


def train_lm(model, device, steps=20):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 128, (4, 32), generator=g) for _ in range(4)]
    losses = []
    for i in range(steps):
        ids = data[i % len(data)].to(device)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


def test_mxfp8_llama_training_tracks_bf16_and_cpu():
    bf16 = train_lm(tiny_llama(), "cpu")  # the bf16 run on tpu matches CPU (test_models.py)
    mx = train_lm(mxfp8_llama(), "tpu")
    assert mx[-1] < mx[0] * 0.8, mx  # it learns
    torch.testing.assert_close(mx, bf16, rtol=3e-2, atol=0)
    torch.testing.assert_close(mx, train_lm(mxfp8_llama(), "cpu"), rtol=1e-2, atol=0)


def test_float8_weight_only_hugging_face_inference():
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    model = tiny_llama().eval()
    quantize_(model, Float8WeightOnlyConfig())
    weight = model.model.layers[0].mlp.up_proj.weight
    on_tpu = copy.deepcopy(model).to(TPU)
    assert on_tpu.model.layers[0].mlp.up_proj.weight.qdata.dtype == torch.float8_e4m3fn
    assert on_tpu.model.layers[0].mlp.up_proj.weight.qdata.device.type == "tpu"
    assert type(on_tpu.model.layers[0].mlp.up_proj.weight) is type(weight)
    ids = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        ref = model(ids).logits
        got = on_tpu(ids.to(TPU)).logits.cpu()
        torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)
        ref_tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
        got_tokens = on_tpu.generate(ids.to(TPU), max_new_tokens=8, do_sample=False).cpu()
    assert torch.equal(got_tokens, ref_tokens)
