"""TorchTitan 0.3's llama3 "debugmodel" on device "tpu", CPU-sized, with FSDP2 under torchrun.

This one file is three things:
  python titan_tpu.py --make-assets DIR               a tiny word-level HF tokenizer + jsonl data
  --module titan_tpu --config llama3_debugmodel_tpu   the TorchTitan config (this module)
  torchrun ... titan_tpu.py --module titan_tpu --config llama3_debugmodel_tpu [overrides]
                                                      runs torchtitan.train, unchanged

TorchTitan picks "tpu" by itself (the PrivateUse1 device) and its process group backend from
torch ("tccl"); nothing in it is patched.
"""
import json
import os
import random
import sys


def llama3_debugmodel_tpu():
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    config.training.local_batch_size = 2
    config.training.seq_len = 64
    config.training.steps = 8
    config.training.mixed_precision_param = "float32"  # same math as a 1-process run
    config.lr_scheduler.warmup_steps = 1
    config.checkpoint.enable = False
    config.validator.enable = False
    config.debug.seed = 42
    config.metrics.log_freq = 1
    return config


def make_assets(out, seq_len=64, local_bs=2, world=2, steps=8):
    """A word-level tokenizer.json (+ tokenizer_config.json naming BOS/EOS) and data in which
    every document is exactly seq_len + 1 tokens with BOS and EOS: one sample per document.
    data_2p/train.jsonl: rank r of `world` reads the r-th contiguous block (split_dataset_by_node);
    data_1p/train.jsonl: the same documents interleaved so one process with local batch
    world * local_bs sees the same global batch at every step."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = [f"w{i}" for i in range(200)]

    def doc():  # mostly-deterministic successor so the loss has something to learn
        w = rng.randrange(200)
        toks = [w]
        for _ in range(seq_len - 2):
            w = (w * 7 + 3) % 200 if rng.random() < 0.9 else rng.randrange(200)
            toks.append(w)
        return " ".join(words[t] for t in toks)

    tok_dir = os.path.join(out, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(
        special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]))
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "unk_token": "<unk>"}, f)

    per_rank = local_bs * (steps + 2)
    docs = [doc() for _ in range(per_rank * world)]
    assert all(len(tok.encode(d).ids) == seq_len - 1 for d in docs[:4])
    shards = [docs[r * per_rank:(r + 1) * per_rank] for r in range(world)]
    inter = [d for s in range(steps + 2) for r in range(world)
             for d in shards[r][s * local_bs:(s + 1) * local_bs]]
    for name, rows in (("data_2p", docs), ("data_1p", inter)):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        with open(os.path.join(out, name, "train.jsonl"), "w") as f:
            f.writelines(json.dumps({"text": r}) + "\n" for r in rows)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-assets"]:
        make_assets(sys.argv[2])
        sys.exit(0)
    import runpy

    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
