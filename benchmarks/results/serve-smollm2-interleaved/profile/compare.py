"""Scheduler time per unit of MLP work, ECHO (budget cost) against no speculation, frame by frame.

usage: gunzip -k *.raw.gz && python compare.py   (the raw stacks of run.sh echo-cost 8 16 / none 8 16)"""
import collections


def load(path):
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        yield [frame.strip().split(" ")[0] for frame in stack.split(";")], int(n)


def profile(path, prefill_frame):
    """Inclusive samples per frame of the scheduler's decode steps, MLP samples, decode and prefill totals."""
    frames, mlp, decode, prefill = collections.Counter(), 0, 0, 0
    for names, n in load(path):
        if "Scheduler.run_event_loop" not in names:
            continue  # other threads (watchdog, progress bars)
        if prefill_frame in names:
            prefill += n
            continue
        decode += n
        frames.update({k: n for k in set(names)})
        mlp += n if "LlamaMLP.forward" in names else 0
    return frames, mlp, decode, prefill


a, ma, da, pa = profile("echo-cost.raw", "EAGLEWorkerV2._forward_prefill_batch")
b, mb, db, pb = profile("none.raw", "EagerRunner._execute_extend")
print(f"decode samples per MLP sample: echo {da / ma:.3f}, none {db / mb:.3f}; "
      f"prefill share of the scheduler: echo {pa / (da + pa):.3f}, none {pb / (db + pb):.3f}")
keys = {k for k, v in a.items() if v / ma > 0.01} | {k for k, v in b.items() if v / mb > 0.01}
for k in sorted(keys, key=lambda k: -abs(a[k] / ma - b[k] / mb))[:40]:
    print(f"{k[:80]:80s} echo {a[k] / ma:6.3f}  none {b[k] / mb:6.3f}")
