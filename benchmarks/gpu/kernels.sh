#!/usr/bin/env bash
# Fourth GPU call (see benchmarks/gpu/README.md): the fused Triton control kernels
# (kernels/control/: elastic.py, layout.py). Their exactness against the eager policy, eagerly and replayed
# as CUDA graphs, then `echo-bench graphs --kernels` at batch 8, 64 and 256 (eager vs graphs vs
# graphs of the kernels, same steps, layouts compared). Also re-runs the graph-builder tests
# that were only fixed on the CPU. Writes logs under ${OUT:-out/gpu}; DEV=cpu STEPS=2 is a dry run.
source "$(dirname "$0")/setup.sh"
# On CUDA every case runs compiled on the GPU (the equality cases on CUDA tensors, the graph
# replays); DEV=cpu runs the same cases under Triton's interpreter. The SmolLM2 case needs the
# model package, which the device does not have (and --noconftest drops its fixture).
[ "$DEV" = cuda ] || export TRITON_INTERPRET=1
timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest -k "not real_model" tests/kernels/test_control.py \
  tests/core/test_graphs.py 2>&1 | tee "$OUT/pytest-kernels.log" | tail -3
for B in 8 64 256; do
  timeout 90 python3 -m sglang_echo.bench.cli graphs --batch $B --steps ${STEPS:-30} --device "$DEV" --kernels --out "$OUT/kernels-b$B" \
    2>&1 | grep -v '^\[W' | tee -a "$OUT/kernels.log"
done
