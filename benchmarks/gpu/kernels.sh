#!/usr/bin/env bash
# Fourth GPU call (see benchmarks/gpu/README.md): the fused Triton control kernels
# (kernels/control/: elastic.py, layout.py), compiled for the GPU. Their exactness against the eager
# torch code, into poisoned buffers (a cell a kernel leaves unwritten fails), eagerly and replayed
# as CUDA graphs: the layout kernels at every pool size P in {1 .. 129} x width W in {1 .. 33}
# around the warp and tile boundaries, the elastic kernels at batches around their 32-row chunks
# and warp counts, ECHO's graphed step at W = 13 and 27; then `echo-bench graphs --kernels` at
# batch 8, 64 and 256 (eager vs graphs vs graphs of the kernels, same steps, layouts compared:
# `differ` must be 0). Writes logs under ${OUT:-out/gpu}; DEV=cpu STEPS=2 is a dry run.
source "$(dirname "$0")/setup.sh"
# On CUDA every case runs compiled on the GPU; DEV=cpu runs the same cases under Triton's
# interpreter. Left out: the SmolLM2 case (the device has no model package, and --noconftest
# drops its fixture) and the sm_90 compile check, which runs on the CPU (CI) already.
[ "$DEV" = cuda ] || export TRITON_INTERPRET=1
timeout 240 python3 -m pytest -q -p no:cacheprovider --noconftest -k "not real_model and not hopper" \
  tests/kernels/test_control.py tests/kernels/test_control_layout.py 2>&1 | tee "$OUT/pytest-kernels.log" | tail -3
for B in 8 64 256; do
  timeout 60 python3 -m sglang_echo.bench.cli graphs --batch $B --steps ${STEPS:-20} --device "$DEV" --kernels \
    --out "$OUT/kernels-b$B" 2>&1 | grep -v '^\[W' | tee -a "$OUT/kernels.log"
done
python3 - "$OUT" <<'PY' | tee -a "$OUT/kernels.log"
import json, pathlib, sys
rows = [r for f in sorted(pathlib.Path(sys.argv[1]).glob("kernels-b*.json")) for r in json.loads(f.read_text())["rows"]]
bad = [f"{r['label']} at batch {r['batch']}: {r['differ']}/{r['steps']}" for r in rows if r["differ"]]
missing = [b for b in (8, 64, 256) if not any(r["batch"] == b for r in rows)]
print(f"layouts: {len(rows)} rows" + (f", NO RESULT at batch {missing}" if missing else "") + ", "
      + ("steps differ from eager in " + "; ".join(bad) if bad else "no step differs"))
PY
