#!/usr/bin/env bash
# The real sglang server on a bare GPU host (torch, triton and nvcc only), plain and with ECHO,
# in two device calls of at most 6 minutes each (benchmarks/gpu/README.md, "serve.sh"):
#   a: install sglang from the carried bundle; the CUDA platform's ops (-m gpu); greedy equality of
#      ECHO (n-gram drafter, really accepting on random weights' repetitive output) with plain
#      decoding on a small float32 target; tokens/s of none, sglang's EAGLE3 and ECHO on a
#      Llama-3.1-8B-shaped bf16 target at c = 1..256 (random heads: drafts are never accepted, so
#      this measures what drafting costs; ECHO must stay >= 0.97x plain while it drafts);
#   b: the same three at c = 1..256 with SIMULATED acceptance from the SmolLM2 trace (.sim/);
#   c: the GPU tests: the control kernels into poisoned buffers and as CUDA graphs, their start-up
#      check, the platform's CUDA ops, ragged verify under CUDA graphs (two servers), a simulated
#      step without host syncs.
# Before the calls, here: echo-bundle --out .bundle; bash benchmarks/gpu/make_trace.sh;
# bash benchmarks/gpu/travel.sh out; then run `bash benchmarks/gpu/serve.sh a` with carry
# [".bundle", ".sim"]; afterwards travel.sh back. DEV=cpu runs the same steps on tiny shapes here.
set -uo pipefail
cd "$(dirname "$0")/../.."
PART=${1:?usage: serve.sh a|b|c}
OUT=${OUT:-out/gpu}
DEV=${DEV:-cuda}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
C=benchmarks/configs
if [ "$DEV" = cuda ]; then
  PY=python3
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
  { tar -xJf .bundle/echo-bundle.tar.xz -C /tmp && $PY /tmp/echo-bundle/install.py \
      && $PY -m pip install -q --no-deps --no-index --find-links /tmp/echo-bundle/build -e . \
      && $PY -m sglang_echo.platform.install; } >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
  tail -3 "$OUT/install.log"
  BIG="--model $C/llama-3.1-8b.json --draft $C/eagle3-llama-3.1-8b.json --dtype bfloat16"
  SMALL="--model $C/llama-small.json --dtype float32"
  LEVELS=1,8,32,64,128,256 PROMPTS=256:256 MAX_NEW=128
  # Servers side by side on one GPU, each with the same KV pool whatever order they start in (sglang
  # sizes a pool from the memory free when it loads): 131,072 tokens (16.8 GB for the 8B shape) holds
  # 256 requests of 384 tokens with their draft slots; the fraction only has to leave that room.
  SHARE="--mem-fraction-static 0.85" POOL="--max-total-tokens 131072"
else  # a dry run of the same steps on this CPU: SmolLM2-shaped random weights, two small levels
  PY=${PY:-.venv/bin/python}
  BIG="--model $C/smollm2-135m-instruct.json --draft sglang_echo/assets/eagle3-smollm2-135m-instruct/config.json --dtype float32"
  SMALL="--model $C/smollm2-135m-instruct.json --dtype float32"
  LEVELS=1,2 PROMPTS=4:32 MAX_NEW=8 SHARE="" POOL=""  # a CPU server's pool is sized by the launcher
fi
BENCH=($PY -m sglang_echo.bench.cli serve --device "$DEV" --load-format dummy --ignore-eos --interleave
       --min-requests 8 --warmup-requests 8)

run() {  # name, timeout, command...: the log under $OUT, its last lines here
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E 'tok/s|lossless|passed|failed|error' "$OUT/$name.log" | tail -12
  [ $rc -eq 0 ] || echo "!! $name exited $rc (log: $name.log)"
}

case "$PART" in
  a)
    [ "$DEV" = cuda ] && run cuda-ops 120 $PY -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/platform/test_cuda_ops.py
    run equality 150 "${BENCH[@]}" $SMALL --token-prompts 16:64 --max-new-tokens "$((MAX_NEW / 2))" --concurrency 8 \
      --configs none,echo-ngram --server-args "$SHARE" $POOL --out "$OUT/equality"
    run throughput 270 "${BENCH[@]}" $BIG --token-prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" --concurrency "$LEVELS" \
      --configs none,eagle3,echo --server-args "$SHARE" $POOL --out "$OUT/throughput"
    ;;
  b)
    [ -f .sim/smollm2-eagle3.sim.json ] || { echo "no .sim/ trace: run benchmarks/gpu/make_trace.sh here and carry .sim"; exit 1; }
    # ECHO gates with the traced pair's calibration (checked against the trace's fingerprints).
    run simulated 300 "${BENCH[@]}" $BIG --simulate .sim/smollm2-eagle3 --max-new-tokens "$MAX_NEW" --concurrency "$LEVELS" \
      --calibration sglang_echo/assets/calibration/smollm2-135m-instruct-eagle3-fp32.json \
      --configs none,eagle3,echo --server-args "$SHARE" $POOL --out "$OUT/simulated"
    ;;
  c)
    [ "$DEV" = cuda ] || { echo "serve.sh c needs CUDA"; exit 2; }
    run kernel-tests 200 $PY -m pytest -q -p no:cacheprovider -k "not real_model and not hopper" \
      tests/kernels/test_control.py tests/kernels/test_control_layout.py tests/kernels/test_selfcheck.py
    run gpu-tests 200 $PY -m pytest -q -p no:cacheprovider -m gpu tests/platform/test_cuda_ops.py tests/kernels/test_gpu.py \
      tests/integration/test_simulate.py tests/integration/test_ragged_gpu.py
    ;;
  *) echo "usage: serve.sh a|b|c" >&2; exit 2 ;;
esac
ls "$OUT"
