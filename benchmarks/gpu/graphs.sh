#!/usr/bin/env bash
# Third GPU call (see benchmarks/gpu/README.md): the control plane as CUDA graphs
# (sglang_echo/core/graphs.py), eager, graphed and Inductor-fused side by side in one run
# (`echo-bench graphs`), and the graphs' replay checked against eager tree building.
# Writes logs under ${OUT:-out/gpu}. DEV=cpu is a dry run of the same commands without CUDA.
source "$(dirname "$0")/setup.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider --noconftest tests/core/test_graphs.py tests/core/test_cuda.py \
  2>&1 | tee "$OUT/pytest-graphs.log" | tail -3
for B in 8 64 256; do
  timeout 120 python3 -m sglang_echo.bench.cli graphs --batch $B --device "$DEV" --out "$OUT/graphs-b$B" \
    2>&1 | grep -v '^\[W' | tee -a "$OUT/graphs.log"
done
for B in 64 256; do  # Inductor compiles every stage (seconds each): ECHO only
  timeout 200 python3 -m sglang_echo.bench.cli graphs --batch $B --device "$DEV" --compile --policies echo \
    --out "$OUT/graphs-fused-b$B" 2>&1 | grep -v '^\[W' | tee -a "$OUT/graphs-fused.log"
done
