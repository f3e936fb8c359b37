#!/bin/bash
# One prepared run on a machine with an NVIDIA GPU and no network (the device tool's H200):
# installs the abi3 wheel carried in .whl/, checks ops against torch (benches/gpu_smoke.py),
# then runs the benchmarks. Every result is written to $OUT as it comes.
#   RUNS=tpu,cuda,inductor STEPS=7 CHILD_TIMEOUT=210 BIG_TIMEOUT=470 SKIP_SMALL=1 bash benches/gpu_check.sh
export PYTHONUNBUFFERED=1 TORCHTPU_PLATFORM=${TORCHTPU_PLATFORM:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/torchtpu-*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi -L 2>/dev/null
timeout 120 python3 benches/gpu_smoke.py 2>&1 | tee "$OUT/smoke.txt"
if [ -z "$SKIP_SMALL" ]; then
  timeout 90 python3 benches/eager_add.py 2>&1 | tee "$OUT/eager_add.txt"
  timeout 120 python3 benches/h200_llama.py --tiny --runs tpu --batch 2 --seq 128 --steps 4 --child-timeout 100 \
    --platform "$TORCHTPU_PLATFORM" 2>&1 | tee "$OUT/tiny.txt"
fi
# float8 and float4: torch._scaled_mm, MXFP8 and NVFP4 F.scaled_mm against a bf16 matmul of the
# same size (issue 16), and a custom kernel's call overhead.
timeout 120 python3 benches/low_precision.py --size "${MATMUL_SIZE:-8192}" 2>&1 | tee "$OUT/low_precision.txt"
# Compiled flex attention: the listed key blocks, and every key, against the dense form.
timeout 150 python3 benches/flex_attention.py --seq "${FLEX_SEQ:-8192}" 2>&1 | tee "$OUT/flex_attention.txt"
# COMPILE_STEP=1: compile the whole training step (optimizer included) in the compiled runs.
timeout "${BIG_TIMEOUT:-400}" python3 benches/h200_llama.py --steps "${STEPS:-8}" --runs "${RUNS:-tpu,cuda,inductor}" \
  --child-timeout "${CHILD_TIMEOUT:-200}" --platform "$TORCHTPU_PLATFORM" ${COMPILE_STEP:+--compile-step} 2>&1 | tee "$OUT/llama.txt"
