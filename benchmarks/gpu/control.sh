#!/usr/bin/env bash
# Second GPU call (see benchmarks/gpu/README.md): the ECHO core on CUDA tensors (exactness vs CPU,
# control-plane cost per step on the GPU and on the same host's CPU) and a long-context verify curve.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest tests/core/test_cuda.py 2>&1 | tee "$OUT/pytest-core-cuda.log" | tail -3
for B in 64 256; do
  for DEV in cuda cpu; do
    timeout 150 python3 -m sglang_echo.bench.cli scheduler --batch $B --steps 30 --device $DEV 2>&1 | tee -a "$OUT/control.log"
  done
done
timeout 200 python3 -m sglang_echo.kernels.verify_cost --target-config benchmarks/configs/llama-3.1-8b.json \
  --prefix 2048 --batches 1,8,32,64,128 --label h100-llama-3.1-8b-shape-prefix2048 \
  --out "$OUT/cost-llama-3.1-8b-prefix2048.json" 2>&1 | tee "$OUT/cost-llama-prefix2048.log" | tail -3
