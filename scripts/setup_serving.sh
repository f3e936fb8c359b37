#!/usr/bin/env bash
# Sets up .venv-serve for serving on "tpu" with vLLM: vLLM 0.33 pins its own transformers
# (< 5.21) and brings torch 2.14, so it gets an environment of its own next to .venv. torchtpu
# is installed there from this checkout (its vllm.platform_plugins entry point is what vLLM
# finds). Run scripts/setup.sh first (it provides the Rust build's toolchain and maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-serve/bin/python ]; then
  "$PY" -m venv .venv-serve
fi
# .venv's uv and its cache (scripts/setup.sh).
install() { UV_CACHE_DIR="$PWD/.uv-cache" .venv/bin/uv pip install -q --python .venv-serve/bin/python "$@"; }
install --upgrade pip
# cuda-python pinned: left free, the resolver now picks cuda-python 12.6 next to cuda-bindings 13.5,
# whose files break FlashInfer's CUTLASS import that vLLM's worker reaches ("cuda.bindings.runtime
# has no attribute cudaLibrary_t").
install "vllm==0.33.0" "xla-cpu-pjrt==0.0.1" pytest pytest-timeout "cuda-python==13.4.4" "cuda-bindings==13.4.4"
install --no-deps "lammps-jax-pjrt-cpu==0.11.2"
VIRTUAL_ENV="$PWD/.venv-serve" PATH="$PWD/.venv-serve/bin:$PATH" .venv/bin/maturin develop --release -q
.venv-serve/bin/python -c "import vllm, torch, torchtpu; print('vLLM', vllm.__version__, 'ready on', torch.tpu.get_device_name())"
