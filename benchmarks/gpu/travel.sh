#!/usr/bin/env bash
# What travels to a lent GPU (the device tool sends the working tree and the carried folders, 64 MiB
# in all). The shipped SmolLM2 heads (54 MiB) are not needed by the GPU scripts, which use
# Llama-3.1-8B-shaped targets with random weights: `out` moves their weight files into the
# ignored .gpu-stash/ (which does not travel) and prints what will travel; `back` restores them.
#   bash benchmarks/gpu/travel.sh out    # before the run (carry: [".bundle", ".sim"])
#   bash benchmarks/gpu/travel.sh back   # after it
set -euo pipefail
cd "$(dirname "$0")/../.."
STASH=.gpu-stash
LIMIT_MIB=64
bytes() {  # total size of the NUL-separated paths on stdin that exist (the stashed heads do not)
  local total=0 f
  while IFS= read -r -d '' f; do [ -f "$f" ] && total=$(( total + $(stat -c %s "$f") )); done
  echo "$total"
}
case "${1:-}" in
  out)
    mkdir -p "$STASH"
    git ls-files -z 'sglang_echo/assets/*.safetensors' | while IFS= read -r -d '' f; do
      [ -f "$f" ] || continue
      mkdir -p "$STASH/$(dirname "$f")"
      mv "$f" "$STASH/$f"
    done
    tracked=$(git ls-files -z | bytes)
    untracked=$(git ls-files -z --others --exclude-standard | bytes)
    carried=$( { find .bundle .sim -type f -print0 2>/dev/null || true; } | bytes)  # either may be absent
    total=$(( ${tracked:-0} + ${untracked:-0} + ${carried:-0} ))
    printf 'travels: %.1f MiB (tree %.1f, untracked %.1f, carried .bundle/.sim %.1f); limit %d MiB\n' \
      "$(echo "$total / 1048576" | bc -l)" "$(echo "${tracked:-0} / 1048576" | bc -l)" \
      "$(echo "${untracked:-0} / 1048576" | bc -l)" "$(echo "${carried:-0} / 1048576" | bc -l)" "$LIMIT_MIB"
    [ "$total" -le $(( LIMIT_MIB * 1048576 )) ] || { echo "over the limit: run 'travel.sh back' and trim" >&2; exit 1; }
    ;;
  back)
    [ -d "$STASH" ] || { echo "nothing to restore"; exit 0; }
    (cd "$STASH" && find . -type f -print0) | while IFS= read -r -d '' f; do
      mkdir -p "$(dirname "$f")"
      mv "$STASH/$f" "$f"
    done
    rm -rf "$STASH"
    git status --short sglang_echo/assets
    ;;
  *) echo "usage: bash benchmarks/gpu/travel.sh out|back" >&2; exit 2 ;;
esac
