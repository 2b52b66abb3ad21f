#!/usr/bin/env bash
# Everything sglang-echo measures on a lent GPU, in one call (see benchmarks/gpu/README.md):
#   GPU kernel tests, the verify-attention benchmark, and replay cost curves for SmolLM2 and a
#   Llama-3.1-8B-shaped target. Writes logs and JSON under ${OUT:-out/gpu}.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
C=benchmarks/configs
timeout 300 python3 -m sglang_echo.kernels.verify_cost --target-config $C/llama-3.1-8b.json \
  --draft-config $C/eagle3-llama-3.1-8b.json --label h100-llama-3.1-8b-shape --out "$OUT/cost-llama-3.1-8b.json" \
  2>&1 | tee "$OUT/cost-llama.log" | tail -4
timeout 120 python3 -m sglang_echo.kernels.verify_cost --target-config $C/smollm2-135m-instruct.json \
  --draft-config sglang_echo/assets/eagle3-smollm2-135m-instruct/config.json --label h100-smollm2-135m \
  --out "$OUT/cost-smollm2.json" 2>&1 | tee "$OUT/cost-smollm2.log" | tail -4
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/kernels 2>&1 | tee "$OUT/pytest-gpu.log" | tail -4
timeout 200 python3 -m sglang_echo.kernels.bench 2>&1 | tee "$OUT/attention.log"
