#!/usr/bin/env bash
# Runs every test: the Rust crates' cargo tests (the PJRT layer and the StableHLO printer run
# against the CPU plugin) and the Python tests against PyTorch on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export PJRT_CPU_PLUGIN="$SITE/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
export PJRT_NEWER_CPU_PLUGIN="$SITE/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"
export TORCHTPU_REQUIRE_PLUGINS=1
# A fresh executable cache, so that the tests exercise compiling as well as loading.
export TORCHTPU_CACHE_DIR="$(mktemp -d)"
trap 'rm -rf "$TORCHTPU_CACHE_DIR"' EXIT
export PYO3_PYTHON="$PWD/.venv/bin/python"
cargo test --release -p pjrt -p stablehlo -p lowerings -p engine -q
# Tests run in parallel worker processes (pytest-xdist), one per core unless
# TORCHTPU_TEST_WORKERS says otherwise (0: everything in this process).
# worksteal: a worker that runs out takes tests queued for the other (the long end-to-end
# tests, which conftest.py puts first, then never leave one worker alone at the end).
.venv/bin/python -m pytest -q -x --timeout=900 -n "${TORCHTPU_TEST_WORKERS:-auto}" --dist worksteal --durations=25 "$@"
# The serving tests run in the serving environment (scripts/setup_serving.sh), where vLLM is.
if [ -x .venv-serve/bin/python ] && [ $# -eq 0 ]; then
  .venv-serve/bin/python -m pytest -q -x --timeout=900 -p no:cacheprovider --durations=10 tests/test_vllm.py
fi
# And the SGLang tests in SGLang's environment (scripts/setup_sglang.sh).
if [ -x .venv-sglang/bin/python ] && [ $# -eq 0 ]; then
  .venv-sglang/bin/python -m pytest -q -x --timeout=900 -p no:cacheprovider --durations=10 tests/test_sglang.py
fi
