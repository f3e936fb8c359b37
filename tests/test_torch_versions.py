"""torchtpu runs only on the torch release it was built for: a build for another release
raises an ImportError naming both versions and the rebuild command, never registers half a
device, and leaves `import torch` working (autoload warns instead of failing).

The cross-version tests use the venvs beside the checkout that hold another torch release and a
torchtpu built for it: those scripts/check_torch_versions.sh makes (.venv-torch<X.Y>) and
SGLang's (.venv-sglang, torch 2.14.1)."""
import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torchtpu
from torchtpu import _extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_built_for_the_running_torch():
    built = torchtpu._C.built_with_torch()
    assert _extension.release(built) == _extension.release(torch.__version__)
    # The same version is readable from the library file without loading it.
    assert _extension.built_for_from_file(torchtpu._C.__file__) == built


def test_release_ignores_the_local_build_tag():
    assert _extension.release("2.14.0+cu130") == (2, 14, 0)
    assert _extension.release("2.11.0") == (2, 11, 0)
    assert _extension.release("2.15.0a0+git1234") == (2, 15, 0)
    assert _extension.release("2.14.0+cu130") != _extension.release("2.14.1")


def _other_torch_venvs():
    """(python, torch version) of sibling venvs whose torch release differs from ours and that
    have their own torchtpu installed (its autoload entry point is what warns there)."""
    found = []
    pythons = glob.glob(os.path.join(ROOT, ".venv-torch*", "bin", "python"))
    pythons += glob.glob(os.path.join(ROOT, ".venv-sglang", "bin", "python"))
    for py in sorted(pythons):
        out = subprocess.run([py, "-c", "import importlib.metadata as m; m.version('torchtpu'); print(m.version('torch'))"],
                             capture_output=True, text=True, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        if out.returncode == 0 and _extension.release(out.stdout.strip()) != _extension.release(torch.__version__):
            found.append((py, out.stdout.strip()))
    return found


# Imports torch (autoload must warn, not fail), then torchtpu (must raise the mismatch error),
# then checks that no half-registered "tpu" device is left behind.
_PROBE = textwrap.dedent("""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
    print("WARNED:", any("built for torch" in str(w.message) for w in caught))
    print("X:", torch.ones(2).add(1).tolist())
    try:
        import torchtpu
        print("LOADED")
    except ImportError as e:
        print("ERROR:", type(e).__name__, e)
    try:
        torch.empty(1, device="tpu")
        print("DEVICE: usable")
    except RuntimeError:
        print("DEVICE: absent")
""")


def _probe(python, package_parent):
    env = {**os.environ, "PYTHONPATH": package_parent, "TORCHTPU_AUTOLOAD": "1"}
    out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _check_refused(stdout, built, running):
    assert "WARNED: True" in stdout, stdout
    assert "X: [2.0, 2.0]" in stdout, stdout
    assert "ERROR: TorchVersionMismatchError" in stdout, stdout
    # (`running` may lack the local build tag, "+cu130", that torch.__version__ has)
    assert f"built for torch {built}, but torch {running}" in stdout and "is running" in stdout, stdout
    assert "--no-build-isolation" in stdout, stdout
    assert "DEVICE: absent" in stdout, stdout


def _copy_package(pkg, dest):
    """A directory with only this torchtpu package in it, for PYTHONPATH (the package's own
    parent may be a site-packages holding another torch)."""
    shutil.copytree(pkg, os.path.join(dest, "torchtpu"), ignore=shutil.ignore_patterns("__pycache__"))
    return str(dest)


def test_this_build_refuses_another_torch(tmp_path):
    """This torchtpu, imported by a python that has another torch release."""
    others = _other_torch_venvs()
    if not others:
        pytest.skip("no venv with another torch (scripts/check_torch_versions.sh makes them)")
    parent = _copy_package(os.path.dirname(torchtpu.__file__), tmp_path)
    for python, version in others:
        _check_refused(_probe(python, parent), torchtpu._C.built_with_torch(), version)


def test_another_build_refuses_this_torch(tmp_path):
    """Another venv's torchtpu wheel (built for its torch), imported into this torch."""
    others = _other_torch_venvs()
    if not others:
        pytest.skip("no venv with another torch (scripts/check_torch_versions.sh makes them)")
    for python, version in others:
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        pkg = os.path.join(site, "torchtpu")
        if not os.path.exists(os.path.join(pkg, "__init__.py")):
            continue
        parent = _copy_package(pkg, tmp_path / version)
        built = _extension.built_for_from_file(glob.glob(os.path.join(parent, "torchtpu", "_C*.so"))[0])
        assert _extension.release(built) == _extension.release(version)
        _check_refused(_probe(sys.executable, parent), built, torch.__version__)
