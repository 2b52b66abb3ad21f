#!/usr/bin/env bash
# Start sglang with ECHO speculative decoding. Configuration comes from the environment:
#   MODEL_PATH (required)   target model directory
#   DRAFT_PATH              the draft head (EAGLE-3 in SpecForge's layout, DART, DFlash); required
#                           unless the drafter is the parameter-free n-gram one, which takes none
#   SGLANG_ECHO_DRAFTER     eagle3 (default) | dart | dflash | ngram; or "drafter" in the config file
#   SGLANG_ECHO_CONFIG      ECHO settings file (policy, k_max, depths, widths, calibration, drafter)
#   PORT (30000), HOST (0.0.0.0), TP_SIZE (1), MAX_RUNNING_REQUESTS (256)
#   PYTHON (python3)        the interpreter with sglang and sglang-echo installed
# Extra arguments are passed to sglang unchanged.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
: "${MODEL_PATH:?set MODEL_PATH to the target model directory}"

# The drafter as the plugin will read it (SGLANG_ECHO_DRAFTER over the config file's "drafter").
drafter="$("${PYTHON}" - <<'PY'
import sys
try:
    from sglang_echo.integration.config import configured_drafter
    print(configured_drafter())
except Exception as e:  # a bad setting: one line, no traceback
    print(f"sglang-echo-launch: {e}", file=sys.stderr)
    sys.exit(2)
PY
)"

draft_args=()
if [[ "${drafter}" == "ngram" ]]; then
  if [[ -n "${DRAFT_PATH:-}" ]]; then
    echo "sglang-echo-launch: DRAFT_PATH is set but the drafter is ngram, which takes no draft head;" \
      "unset one of them" >&2
    exit 2
  fi
else
  : "${DRAFT_PATH:?set DRAFT_PATH to the ${drafter} draft head directory (or SGLANG_ECHO_DRAFTER=ngram for none)}"
  draft_args=(--speculative-draft-model-path "${DRAFT_PATH}")
fi

exec "${PYTHON}" -m sglang.launch_server \
  --model-path "${MODEL_PATH}" \
  --speculative-algorithm ECHO \
  "${draft_args[@]}" \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-30000}" \
  --tp-size "${TP_SIZE:-1}" \
  --max-running-requests "${MAX_RUNNING_REQUESTS:-256}" \
  --enable-metrics \
  "$@"
