"""A sequence of Hugging Face generations in one fresh process, as a chat or a test
suite makes them: greedy, beam and assisted generation, then generations that continue from a
returned KV cache, at several batch sizes and prompt lengths. Each one must give CPU's tokens
and (but for beam search, whose cache rows of dropped beams have no set order) CPU's cache. Earlier calls leave programs behind (bucketed programs, promotions) that later
calls reuse; a wrong reuse shows only in such a sequence, never in a single call."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

SCRIPT = """
import copy, json, sys, torch
sys.path.insert(0, {tests!r})
import torchtpu
from test_models import causal_lm
model = causal_lm({name!r})
dev = copy.deepcopy(model).to("tpu")
kw = dict(pad_token_id=-1, eos_token_id=-1, use_cache=True, do_sample=False, return_dict_in_generate=True)
bad = []

def continued(m, device, ids, mask, first, then):
    inputs = dict(input_ids=ids.to(device), attention_mask=mask.to(device))
    out = m.generate(**inputs, **kw, max_new_tokens=first)
    grown = out.sequences.shape[-1] - mask.shape[1]
    inputs.update(input_ids=out.sequences, past_key_values=out.past_key_values,
                  attention_mask=torch.nn.functional.pad(inputs["attention_mask"], (0, grown), value=1))
    return m.generate(**inputs, **kw, max_new_tokens=then)

def compare(what, cpu, tpu):
    if not torch.equal(cpu.sequences, tpu.sequences.cpu()):
        bad.append(what + ": tokens")
    if "beam" in what:
        return  # the rows of beams not kept are left in an order of their own
    for i, (c, t) in enumerate(zip(cpu.past_key_values.layers, tpu.past_key_values.layers)):
        for name in ("keys", "values"):
            if not torch.allclose(getattr(c, name), getattr(t, name).cpu(), atol=1e-4, rtol=1e-4):
                bad.append(f"{{what}}: layer {{i}} {{name}}")

g = torch.Generator().manual_seed(5)
with torch.no_grad():
    for step in range(8):
        batch, length = [13, 1, 2, 13, 4][step % 5], 5 + step % 4
        ids = torch.randint(3, 128, (batch, length), generator=g)
        mask = torch.randint(0, 2, (batch, length), generator=g)
        mask[:, -1] = 1
        cases = {{"greedy": lambda m, d: m.generate(input_ids=ids.to(d), attention_mask=mask.to(d), **kw, max_new_tokens=4),
                 "beam": lambda m, d: m.generate(input_ids=ids.to(d), attention_mask=mask.to(d), **kw, max_new_tokens=3, num_beams=2),
                 "assisted": lambda m, d: m.generate(input_ids=ids[:1].to(d), attention_mask=mask[:1].to(d), **kw, max_new_tokens=3,
                                                     assistant_model=m),
                 "continued": lambda m, d: continued(m, d, ids, mask, 2 + step % 3, 1 + step % 2)}}
        for what, fn in cases.items():
            if what != "continued" and step % 4:
                continue
            compare(f"step {{step}} {{what}} {{tuple(ids.shape)}}", fn(model, "cpu"), fn(dev, "tpu"))
print(json.dumps(bad))
"""


@pytest.mark.parametrize("name,mode", [("Llama", "fused"), ("Llama", "strict"), ("GPT2", "fused")])
def test_each_generation_of_a_sequence_matches_cpu(tmp_path, name, mode):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path))
    env.pop("TORCHTPU_BUCKET_PROGRAMS", None)  # the default: on
    if mode == "strict":
        env["TORCHTPU_FUSED_EAGER"] = "0"
    code = textwrap.dedent(SCRIPT.format(tests=os.path.dirname(__file__), name=name))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []
