"""Launch-blocking mode (TORCHTPU_LAUNCH_BLOCKING=1, torch.tpu.set_launch_blocking): an index
out of range found on the device raises at the line of the op that used it, with the user's
traceback; without it, at the next read, as on CUDA. Each case runs in a fresh process."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, traceback
    import torch
    if sys.argv[1] == "api":
        torch.tpu.set_launch_blocking(True)
        assert torch.tpu.is_launch_blocking() and not torch.tpu.is_fused_eager()
    emb = torch.nn.Embedding(10, 4).to("tpu")
    lin = torch.nn.Linear(4, 4).to("tpu")

    def forward(ids):
        h = lin(torch.ones(2, 4, device="tpu"))
        e = emb(ids)  # the op
        return h.sum() + e.sum()

    ids = torch.tensor([1, 6], device="tpu") * 2  # 12: out of range, known on the device only
    try:
        out = forward(ids)
        out.item()  # the read
    except IndexError as e:
        line = [f.line for f in traceback.extract_tb(e.__traceback__) if f.filename == __file__][-1]
        print("raised at:", line)
        print("message:", str(e).splitlines()[0])
    """)


@pytest.mark.parametrize("mode,env,where", [
    ("default", {}, "out.item()  # the read"),
    ("strict", {"TORCHTPU_FUSED_EAGER": "0"}, "out.item()  # the read"),
    ("env", {"TORCHTPU_LAUNCH_BLOCKING": "1"}, "e = emb(ids)  # the op"),
    ("api", {}, "e = emb(ids)  # the op"),
])
def test_device_side_error_raises_at_the_op_in_launch_blocking_mode(tmp_path, mode, env, where):
    script = tmp_path / "forward.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines.get("raised at") == where, proc.stdout + proc.stderr[-2000:]
    assert "index out of range in self" in lines["message"]
