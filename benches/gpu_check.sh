#!/bin/bash
# One prepared run on a machine with an NVIDIA GPU and no network (the device tool's H200):
# installs the abi3 wheel carried in .whl/, checks ops against torch, then runs the benchmarks.
# Every result is written to $OUT as it comes.
export PYTHONUNBUFFERED=1 TORCHTPU_PLATFORM=${TORCHTPU_PLATFORM:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/torchtpu-*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi -L
timeout 90 python3 - <<'PY' 2>&1 | tee "$OUT/smoke.txt"
import time, torch, torchtpu
print("device:", torch.tpu.get_device_name(), torchtpu._C.platform() if hasattr(torchtpu._C, "platform") else "")
torch.manual_seed(0)
a, b = torch.randn(64, 96), torch.randn(96, 32)
for dt in (torch.float32, torch.bfloat16):
    got = (a.to(dt).to("tpu") @ b.to(dt).to("tpu")).cpu().float()
    want = (a.to(dt) @ b.to(dt)).float()
    print(dt, "matmul max err", (got - want).abs().max().item())
x = torch.randn(5, 7)
print("softmax err", (torch.softmax(x.to("tpu").t(), 0).cpu() - torch.softmax(x.t(), 0)).abs().max().item())
print("sum", x.to("tpu").sum(1).cpu().sub(x.sum(1)).abs().max().item())
PY
timeout 90 python3 benches/eager_add.py 2>&1 | tee "$OUT/eager_add.txt"
timeout 120 python3 benches/h200_llama.py --tiny --runs tpu --batch 2 --seq 128 --steps 4 --child-timeout 100 --platform $TORCHTPU_PLATFORM 2>&1 | tee "$OUT/tiny.txt"
timeout ${BIG_TIMEOUT:-400} python3 benches/h200_llama.py --steps ${STEPS:-8} --runs ${RUNS:-tpu,cuda,inductor} --child-timeout ${CHILD_TIMEOUT:-200} 2>&1 | tee "$OUT/llama.txt"
