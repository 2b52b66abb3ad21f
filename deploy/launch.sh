#!/usr/bin/env bash
# Start sglang with ECHO speculative decoding. Configuration comes from the environment:
#   MODEL_PATH (required)   target model directory
#   DRAFT_PATH (required)   EAGLE-3 draft head (SpecForge layout)
#   SGLANG_ECHO_CONFIG      ECHO settings file (policy, k_max, depths, widths, calibration)
#   PORT (30000), HOST (0.0.0.0), TP_SIZE (1), MAX_RUNNING_REQUESTS (256)
# Extra arguments are passed to sglang unchanged.
set -euo pipefail
: "${MODEL_PATH:?set MODEL_PATH to the target model directory}"
: "${DRAFT_PATH:?set DRAFT_PATH to the EAGLE-3 draft head directory}"
exec python3 -m sglang.launch_server \
  --model-path "${MODEL_PATH}" \
  --speculative-algorithm ECHO \
  --speculative-draft-model-path "${DRAFT_PATH}" \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-30000}" \
  --tp-size "${TP_SIZE:-1}" \
  --max-running-requests "${MAX_RUNNING_REQUESTS:-256}" \
  --enable-metrics \
  "$@"
