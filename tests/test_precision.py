"""torch.set_float32_matmul_precision (and allow_tf32, and the fp32_precision settings) on tpu:
every float32 matmul and convolution program carries the matching precision_config, eager and
compiled, and a change of setting compiles new programs rather than reusing the old ones."""
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys, torch
setting = sys.argv[1]
if setting == "allow_tf32":
    torch.backends.cuda.matmul.allow_tf32 = True
elif setting == "mixed":
    # The legacy and the new API mixed: PyTorch refuses to say; the new CUDA setting decides.
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.fp32_precision = "tf32"
elif setting != "default":
    torch.set_float32_matmul_precision(setting)
x = torch.randn(8, 16, device="tpu")
w = torch.randn(4, 16, device="tpu")
ref = torch.nn.functional.linear(x.cpu(), w.cpu())
out = torch.nn.functional.linear(x, w)
assert torch.allclose(out.cpu(), ref, atol=5e-2), "matmul result"
img = torch.randn(1, 3, 8, 8, device="tpu")
k = torch.randn(2, 3, 3, 3, device="tpu")
torch.nn.functional.conv2d(img, k).cpu()
(x.bfloat16() @ w.bfloat16().t()).cpu()
torch.compile(lambda a, b: torch.relu(a @ b.t()), backend="tpu")(x, w).cpu()
"""


def programs(tmp_path, setting):
    dump = tmp_path / setting
    env = dict(os.environ, TORCHTPU_DUMP_PROGRAMS=str(dump))
    r = subprocess.run([sys.executable, "-c", SCRIPT, setting], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return {p.name: p.read_text() for p in sorted(dump.iterdir())}


def precisions(texts, what):
    """The precision names on every `what` op ("dot_general", "convolution") of the programs."""
    found = []
    for text in texts:
        for line in text.splitlines():
            if f"stablehlo.{what}" in line:
                found.append(line.split("#stablehlo<precision ")[1].split(">")[0] if "precision" in line else None)
    return found


def f32_lines(texts, what):
    return [t for t in texts if any(f"stablehlo.{what}" in line and "xf32>" in line for line in t.splitlines())]


@pytest.mark.parametrize("setting, expected", [
    ("default", "HIGHEST"), ("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT"),
    ("allow_tf32", "HIGH"), ("mixed", "HIGH"),
])
def test_precision_config_follows_the_setting(tmp_path, setting, expected):
    progs = programs(tmp_path, setting)
    eager_mm = [t for n, t in progs.items() if "run_graph" not in n and "bf16" not in t]
    compiled = [t for n, t in progs.items() if "run_graph" in n]
    assert compiled, "the compiled function made no program"
    for group in (eager_mm, compiled):
        dots = precisions(f32_lines(group, "dot_general"), "dot_general")
        assert dots and set(dots) == {expected}, dots
    convs = precisions(f32_lines(progs.values(), "convolution"), "convolution")
    assert convs and set(convs) == {expected}, convs
    # 16-bit operands are exact in any mode: no attribute.
    bf16 = [t for t in progs.values() if "stablehlo.dot_general" in t and "xbf16>, tensor" in t]
    assert bf16 and all("precision" not in line for t in bf16 for line in t.splitlines()
                        if "stablehlo.dot_general" in line)


def test_changing_the_setting_recompiles(tmp_path):
    script = r"""
import torch
x = torch.randn(8, 8, device="tpu")
f = torch.compile(lambda a: a @ a, backend="tpu")
for p in ["highest", "medium", "highest"]:
    torch.set_float32_matmul_precision(p)
    (x @ x).cpu()
    f(x).cpu()
"""
    dump = tmp_path / "dump"
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TORCHTPU_DUMP_PROGRAMS=str(dump)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = [p.read_text() for p in sorted(dump.iterdir())]
    found = precisions(texts, "dot_general")
    # highest (eager, compiled), medium (eager, compiled); the second highest reuses the first.
    assert found == ["HIGHEST", "HIGHEST", "DEFAULT", "DEFAULT"], found
