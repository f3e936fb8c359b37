#!/usr/bin/env bash
# Sets up a virtual environment in .venv with torch 2.11.0, the XLA CPU PJRT plugins and
# torchtpu built from this checkout (Rust core + C++ shim, release build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "torch==2.11.0" numpy "maturin>=1.5,<2" pytest pytest-timeout "xla-cpu-pjrt==0.0.1"
# For the tests: PyTorch's OpInfo database needs expecttest; the model tests use transformers.
.venv/bin/pip install -q expecttest hypothesis transformers
# The second CPU plugin; its declared dependencies are not needed for the .so itself.
.venv/bin/pip install -q --no-deps "lammps-jax-pjrt-cpu==0.11.2"
if ! command -v cargo >/dev/null; then
  echo "torchtpu needs a Rust toolchain (cargo) to build; see https://rustup.rs" >&2
  exit 1
fi
# maturin builds the extension against the torch installed above.
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin develop --release -q
.venv/bin/python -c "import torch, torchtpu; print('torchtpu ready on', torch.tpu.get_device_name())"
