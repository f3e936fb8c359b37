"""`python -m torchtpu`: the environment report, run as a user runs it (in a subprocess)."""
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu.tools import collect_env


def report(tmp_path, *args, **env):
    """Runs `python -m torchtpu *args` with a fresh compile cache holding one known file."""
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "old.xla").write_bytes(b"x" * 1000)
    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(cache), **env}
    cmd = [sys.executable, "-m", "torchtpu", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout, cache


def cache_contents(cache):
    sizes = [p.stat().st_size for p in cache.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def test_json_report(tmp_path):
    out, cache = report(tmp_path, "--json", TORCHTPU_CPU_DEVICES="2")
    info = json.loads(out)
    assert info["error"] is None and info["device_error"] is None
    assert info["torchtpu"] == torchtpu.__version__
    assert info["torch"] == torch.__version__
    assert info["torchtpu_built_for_torch"] == torchtpu._C.built_with_torch()
    assert info["python"] == platform.python_version()
    assert info["os"] == platform.platform()
    assert info["platform"] == "cpu" and info["platform_version"] == torchtpu._C.platform()[1]
    assert info["plugin_path"] == torchtpu.PLUGIN_PATH and os.path.isfile(info["plugin_path"])
    assert re.fullmatch(r"0\.\d+", info["pjrt_api_version"])
    assert [d["index"] for d in info["devices"]] == [0, 1]
    for d in info["devices"]:
        assert d["name"] == "XLA CPU"
        assert 0 < d["free_bytes"] <= d["total_bytes"]
    # Counted after the plugin started, so the fingerprint memo it writes is included.
    files, size = cache_contents(cache)
    assert files >= 1 and size >= 1000
    assert info["compile_cache"] == {"path": str(cache), "enabled": True, "files": files, "bytes": size}
    assert info["environment"]["TORCHTPU_CPU_DEVICES"] == "2"
    assert info["environment"]["TORCHTPU_CACHE_DIR"] == str(cache)
    assert all(k.startswith("TORCHTPU_") or k in collect_env.OTHER_VARIABLES for k in info["environment"])
    for name in collect_env.INTEGRATIONS:
        assert info["integrations"][name] == collect_env._installed(name)


def test_text_report(tmp_path):
    out, cache = report(tmp_path)
    # "key:  value" lines; indented lines are a section's entries
    fields = dict(re.match(r"([^:]+):\s*(.*)", line).groups() for line in out.splitlines() if line[:1] != " ")
    assert fields["torchtpu"] == f"{torchtpu.__version__} (built for torch {torchtpu._C.built_with_torch()})"
    assert fields["torch"] == torch.__version__
    assert fields["Python"] == platform.python_version()
    assert fields["platform"] == "cpu"
    assert fields["plugin"] == torchtpu.PLUGIN_PATH
    assert re.fullmatch(r"0\.\d+", fields["PJRT API version"])
    assert int(fields["devices"]) >= 1
    assert re.search(r"^  tpu:0  XLA CPU  [\d.]+ GiB free of [\d.]+ GiB$", out, re.M)
    files, size = cache_contents(cache)
    assert fields["compile cache"].startswith(f"{cache} ({files} files, ")
    assert f"  TORCHTPU_CACHE_DIR={cache}\n" in out
    assert "error" not in fields


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is not None, reason="libtpu is installed")
def test_a_device_that_cannot_start_is_reported(tmp_path):
    out, _ = report(tmp_path, "--json", TORCHTPU_PLATFORM="tpu")
    info = json.loads(out)
    assert info["error"] is None and info["devices"] is None
    assert "pip install libtpu" in info["device_error"]
    assert info["torch"] == torch.__version__ and info["environment"]["TORCHTPU_PLATFORM"] == "tpu"
    out, _ = report(tmp_path, TORCHTPU_PLATFORM="tpu")
    assert re.search(r"^devices:\s+error: RuntimeError: .*pip install libtpu", out, re.M)


def test_an_extension_that_cannot_load_is_reported(tmp_path):
    # `python -m torchtpu` imports the package before its report runs, so this runs the report
    # module by path, with the extension made unimportable (as a torch mismatch makes it).
    code = (
        "import sys, runpy; sys.modules['torchtpu._C'] = None; "
        f"sys.exit(runpy.run_path({collect_env.__file__!r})['main'](sys.argv[1:]))"
    )
    for args in (["--json"], []):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        if args:
            info = json.loads(out.stdout)
            assert "torchtpu._C" in info["error"]
            assert info["torch"] == importlib.metadata.version("torch")  # from metadata: torch did not import
            assert info["torchtpu"] == importlib.metadata.version("torchtpu")
            assert info["devices"] is None and info["compile_cache"]["enabled"]
        else:
            assert re.match(r"error:\s+ModuleNotFoundError: .*torchtpu\._C", out.stdout)
