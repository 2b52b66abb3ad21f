#!/bin/bash
# The same server twice, side by side: glibc's malloc defaults (port 30100) against the launcher's
# CPU_MALLOC_ENV (port 30200); minor faults and CPU ticks of each scheduler before and after.
# Usage (repo root): SPEC=none bash benchmarks/results/cpu-malloc/ab.sh OUT
set -u
OUT=${1:-out/cpu-malloc}; SPEC=${SPEC:-none}; mkdir -p "$OUT"
SGLANG_ECHO_MALLOC_TUNING=0 setsid .venv/bin/python -m sglang_echo.serve.launch --spec "$SPEC" --port 30100 > "$OUT/default.log" 2>&1 &
P1=$!
setsid .venv/bin/python -m sglang_echo.serve.launch --spec "$SPEC" --port 30200 > "$OUT/tuned.log" 2>&1 &
P2=$!
for port in 30100 30200; do
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:$port/v1/models >/dev/null && break; sleep 2; done
done
sched() { ps -eo pid,pgid,args | awk -v g="$1" '$2==g' | grep -i scheduler | awk '{print $1}' | head -1; }
stat() { awk '{print "minflt", $10, "utime", $14, "stime", $15}' "/proc/$1/stat"; }
s1=$(sched $P1); s2=$(sched $P2)
echo "before: default $(stat "$s1") | tuned $(stat "$s2")" | tee "$OUT/faults.txt"
.venv/bin/python loadtests/run.py --host default=http://127.0.0.1:30100 --host tuned=http://127.0.0.1:30200 \
  --users 64 --level-seconds 30 --level-requests 64 --max-new-tokens 64 --max-new-tokens-jitter 16 --ignore-eos \
  --drain-seconds 120 --repeats 2 --warmup-requests 16 --out "$OUT"
echo "after: default $(stat "$s1") | tuned $(stat "$s2")" | tee -a "$OUT/faults.txt"
kill -- -$P1 -$P2 2>/dev/null; sleep 3; kill -9 -- -$P1 -$P2 2>/dev/null
