#!/bin/bash
# usage: run.sh CONFIG  -> profiles the scheduler during a c=32 run
cd /work/main && source .venv/bin/activate
cfg=$1
echo-bench serve --configs $cfg --calibration benchmarks/results/calibration-smollm2/fp32 --concurrency 32 --max-new 64 --per-set 4 --rounds 2 --port 30400 --out /tmp/prof/out-$cfg > /tmp/prof/bench-$cfg.log 2>&1 &
BP=$!
# wait for decode to start: a "Decode batch" line in the server log
for i in $(seq 1 300); do
  if grep -qs "Decode batch" /tmp/sglang-echo-logs/*30400* 2>/dev/null; then break; fi
  sleep 2
done
sleep 5
PID=$(ps -eo pid,pcpu,comm --sort=-pcpu | awk 'NR==2{print $1}')
echo "profiling pid $PID $(ps -o comm= -p $PID)"
py-spy record -p $PID -d 40 -r 50 -f raw -o /tmp/prof/$cfg.raw > /dev/null 2>&1
wait $BP
tail -5 /tmp/prof/bench-$cfg.log
