#!/usr/bin/env bash
# The trace a GPU benchmark simulates acceptance from (benchmarks/gpu/README.md, "Simulated
# acceptance"), recorded HERE on the CPU before the device call: SmolLM2-135M-Instruct (float32)
# and its shipped EAGLE-3 head over the first PER_SET prompts of each prompt set, MAX_NEW greedy
# tokens each, a draft tree of depth DEPTH (WIDTH children per node, the union of BEAMS, at most
# MAX_NODES nodes) at every position. Then `echo-replay sim-inputs` writes STEM.sim.json: the
# prompts as token ids and sglang EAGLE3's SGLANG_SIMULATE_ACC_LEN for the static tree SHAPE.
# Writes under ${SIM:-.sim} (gitignored: name it in the device call's `carry`); kept if present
# unless FORCE=1. The defaults cover ECHO's defaults (depth 4, W_max 2), chains of depth <= DEPTH
# and the 3/3/5 static tree, all at coverage 1.0; about 2.4 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SIM=${SIM:-.sim}
STEM=${STEM:-$SIM/smollm2-eagle3}
PROMPTS=${PROMPTS:-chat,math,summarize,humaneval}
PER_SET=${PER_SET:-4}
MAX_NEW=${MAX_NEW:-128}
DEPTH=${DEPTH:-5}
WIDTH=${WIDTH:-4}
BEAMS=${BEAMS:-1,2,3}
MAX_NODES=${MAX_NODES:-64}
SHAPE=${SHAPE:-3/3/5}
THREADS=${THREADS:-1}  # a 135M model on a shared box: one thread is fastest

if [[ "${FORCE:-0}" != 1 && -f "$STEM.json" && -f "$STEM.safetensors" ]]; then
  echo "make_trace: $STEM exists (FORCE=1 records it again)"
else
  rm -f "$STEM.json" "$STEM.safetensors" "$STEM.sim.json"
  model=$("$PY" -c "from sglang_echo.models.prepare import prepare; print(prepare(dtype='float32').path)")
  start=$(date +%s)
  "$PY" -m sglang_echo.replay.cli record --model "$model" --drafter eagle3 --prompts "$PROMPTS" \
    --per-set "$PER_SET" --max-new-tokens "$MAX_NEW" --depth "$DEPTH" --width "$WIDTH" --beams "$BEAMS" \
    --max-nodes "$MAX_NODES" --batch 8 --threads "$THREADS" --out "$STEM" 2>&1 | grep -v '^record:' || true
  [[ -f "$STEM.json" ]] || { echo "make_trace: recording failed" >&2; exit 1; }
  echo "make_trace: recorded in $(( $(date +%s) - start )) s"
fi
"$PY" -m sglang_echo.replay.cli sim-inputs --trace "$STEM" --eagle3-shape "$SHAPE" --max-new-tokens "$MAX_NEW"
du -h "$STEM".*
