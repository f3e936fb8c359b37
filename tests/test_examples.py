"""The examples run as a user runs them (tiny sizes), and differ from CUDA only in DEVICE."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("compiled", [False, True])
def test_train_example_learns(compiled):
    out = run("examples/train.py", "--steps", "12", *(["--compile"] if compiled else []))
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) >= 3 and losses[-1] < losses[0] * 0.8, out


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_generate_example(model):
    out = run("examples/generate.py", "--model", model, "--tokens", "8")
    tokens = re.search(r"\[(.*)\]", out).group(1).split(",")
    assert len(tokens) == 5 + 8


def test_custom_kernel_example():
    out = run("examples/custom_kernel.py")
    errors = {k.strip(): float(v) for k, v in re.findall(r"^(.*) max \|.*\|: (\S+)$", out, re.M)}
    assert set(errors) == {"eager", "grad", "compiled", "pallas"}, out
    assert all(e < 1e-3 for e in errors.values()), out
