"""Hugging Face training unchanged: Trainer and Accelerator find "tpu" by themselves.

torchtpu sets ACCELERATE_TORCH_DEVICE when it loads (see torchtpu/compat/accelerate.py). The variable
is process-wide, so each check runs its script in a fresh interpreter whose environment holds
neither that variable nor the off switch: the device has to come from `import torch` alone.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def run_script(code, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_TORCH_DEVICE", "TORCHTPU_ACCELERATE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**clean, **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


# A user's training script with nothing about devices in it; `use_cpu` is TrainingArguments' own.
TRAIN = """
import json, sys, tempfile
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

def train(use_cpu):
    set_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64))
    # One batch of four sequences, seen every step: the loss falls by a few 1e-2 a step.
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4,
                             max_steps=5, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=use_cpu, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "params": sorted({p.device.type for p in model.parameters()})}

print(json.dumps({"auto": train(use_cpu=False), "cpu": train(use_cpu=True)}))
"""


def test_trainer_runs_on_tpu_and_matches_cpu():
    out = run_script(TRAIN)
    auto, cpu = out["auto"], out["cpu"]
    assert auto["params"] == ["tpu"]
    assert cpu["params"] == ["cpu"]
    assert len(auto["losses"]) == len(cpu["losses"]) == 5
    # float32 on both sides, in different reduction orders: losses agree to about 1e-6 relative
    # (measured: 3e-7), and five AdamW steps at lr 1e-3 do not amplify that. A step that went
    # wrong would show: each step lowers the loss by 2e-2 to 8e-2, a hundred times the tolerance.
    assert auto["losses"][-1] < auto["losses"][0] - 0.1
    torch.testing.assert_close(auto["losses"], cpu["losses"], rtol=1e-4, atol=0)


ACCELERATOR = """
import json, os
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState

default = Accelerator().device.type
AcceleratorState._reset_state(reset_partial_state=True)
print(json.dumps({"default": default, "cpu": Accelerator(cpu=True).device.type,
                  "var": os.environ.get("ACCELERATE_TORCH_DEVICE")}))
"""


def test_accelerator_picks_tpu():
    assert run_script(ACCELERATOR) == {"default": "tpu", "cpu": "cpu", "var": "tpu"}


@pytest.mark.parametrize("env", [{"TORCHTPU_ACCELERATE": "0"}, {"ACCELERATE_TORCH_DEVICE": "cpu"}],
                         ids=["off-switch", "user-value-wins"])
def test_accelerator_left_alone(env):
    import accelerate
    from packaging.version import Version

    out = run_script(ACCELERATOR, **env)
    assert out["var"] == env.get("ACCELERATE_TORCH_DEVICE")
    assert out["cpu"] == "cpu"
    if "ACCELERATE_TORCH_DEVICE" in env:
        assert out["default"] == "cpu"
    else:
        # Left to accelerate's own choice: from 1.16 it asks torch.accelerator (tpu), before
        # that it knows no PrivateUse1 device (cpu).
        assert out["default"] == ("tpu" if Version(accelerate.__version__) >= Version("1.16") else "cpu")


def word_tokenizer():
    """A word-level tokenizer over "w0".."w125", built locally (no hub downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(126)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                eos_token="<eos>", pad_token="<eos>")


def test_text_generation_pipeline_on_tpu():
    model, tokenizer = tiny_llama().eval(), word_tokenizer()
    outputs = {}
    for device in ("cpu", "tpu"):
        pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device=device)
        assert pipe.model.device.type == device
        outputs[device] = pipe("w1 w2 w3", max_new_tokens=3, do_sample=False)
    assert outputs["tpu"] == outputs["cpu"]
    text = outputs["tpu"][0]["generated_text"]
    assert text.startswith("w1 w2 w3") and len(text) > len("w1 w2 w3")
