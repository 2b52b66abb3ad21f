#!/bin/bash
# usage: run.sh CONFIG [C ROUNDS SECONDS RATE] -> /tmp/prof/CONFIG.raw: py-spy of the scheduler process
# during `echo-bench serve --configs CONFIG --concurrency C --rounds ROUNDS`, once decoding runs.
# Defaults (32 2 40 50) are this folder's profile; ../serve-smollm2-interleaved used 8 16 30 200.
cd "$(git rev-parse --show-toplevel)" && source .venv/bin/activate
cfg=$1; c=${2:-32}; rounds=${3:-2}; seconds=${4:-40}; rate=${5:-50}
mkdir -p /tmp/prof /tmp/sglang-echo-logs/old && mv /tmp/sglang-echo-logs/*.log /tmp/sglang-echo-logs/old/ 2>/dev/null
echo-bench serve --configs $cfg --calibration benchmarks/results/calibration-smollm2/fp32 --concurrency $c \
  --max-new 64 --per-set 4 --rounds $rounds --port 30400 --out /tmp/prof/out-$cfg > /tmp/prof/bench-$cfg.log 2>&1 &
BP=$!
for i in $(seq 1 300); do  # wait for decoding: a "Decode batch" line in the server log
  if grep -qs "Decode batch" /tmp/sglang-echo-logs/*30400* 2>/dev/null; then break; fi
  sleep 1
done
sleep 4
PID=$(ps -eo pid,pcpu,comm --sort=-pcpu | awk 'NR==2{print $1}')
echo "profiling pid $PID $(ps -o comm= -p $PID)"
py-spy record -p $PID -d $seconds -r $rate -f raw -o /tmp/prof/$cfg.raw > /dev/null 2>&1
wait $BP
grep "tok/s" /tmp/prof/bench-$cfg.log | head -3
