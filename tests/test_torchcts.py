"""TorchCTS (an outside conformance suite for PyTorch backends, on PyPI as torchcts) on "tpu":
a fixed selection of it, run as a user runs it (`torchcts run` with tests/torchcts/manifest.py),
in a process of its own. A node that crashes, or fails and is not in the known failures
(tests/torchcts/known_failures.txt), fails this test. docs/ops.md has the figures.

The selection: PyTorch's OpInfo error inputs at semantic level 3 in float32 (each op's bad
inputs must raise CPU's exception class and message on tpu)."""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

torchcts = pytest.importorskip("torchcts")

MANIFEST_DIR = Path(__file__).parent / "torchcts"
SELECTION = ["opinfo/test_opinfo_errors.py"]


def known_failures():
    lines = (MANIFEST_DIR / "known_failures.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_torchcts_selection(tmp_path):
    package = Path(torchcts.__file__).parent
    report = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "torchcts", "run", "--device", "tpu", "--level", "3", "--dtype", "float32",
           "--non-interactive", "--results-dir", str(tmp_path / "results"),
           *(str(package / path) for path in SELECTION), "-p", "no:cacheprovider", f"--junitxml={report}"]
    # Launch-blocking mode: a device-side error raises at its op, in its own node (by default
    # it raises at the next read, which can fall in a later node).
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TORCHTPU_LAUNCH_BLOCKING="1")
    proc = subprocess.run(cmd, cwd=MANIFEST_DIR, capture_output=True, text=True, timeout=900, env=env)
    # A crash ends the pytest process before it writes its report.
    assert report.exists(), f"TorchCTS ended without a report (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[name] = "skipped" if case.find("skipped") is not None else "failed" if failed else "passed"
    assert len(outcomes) >= 200, proc.stdout[-3000:]
    failed = {n for n, o in outcomes.items() if o == "failed"}
    passed = {n for n, o in outcomes.items() if o == "passed"}
    print(f"TorchCTS selection: {len(passed)} of {len(passed) + len(failed)} executed nodes passed")
    known = known_failures()
    assert not failed - known, f"new failures: {sorted(failed - known)}\n{proc.stdout[-5000:]}"
    # A known failure that passes is reported: delete it from the list when its op is fixed.
    if known & passed:
        print(f"known failures that passed this time: {sorted(known & passed)}")
