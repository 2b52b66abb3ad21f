"""Replay == the offline engine: the same policy, drafter and target, step for step.

For every policy, :func:`validate` runs :func:`sglang_echo.eval.speculative_generate` live (the
real target verifying real draft trees) on trace prompts, and :func:`replay_offline` on the same
prompts as the same fixed batch, then compares every step's accepted length and tree size per
request, and the live output with the recorded continuation. Any difference is reported, not
smoothed over: replay is exact only while the drafter's proposals at a position do not depend
on anything but the committed prefix and the node's path (true of the repo's drafters up to
floating-point rounding: the recording computes the target features and draft forwards with
other batch shapes than a live step, so a near-tie in a top-k or a gate can in principle flip).
"""

from __future__ import annotations

from typing import Optional, Sequence

from sglang_echo.core.policy import TreePolicy

from .drafter import RecordedDrafter
from .simulate import replay_offline
from .trace import Trace


def validate(
    trace: Trace,
    target,
    drafter,
    policies: dict[str, TreePolicy],
    prompts: Sequence[int],
    *,
    batch: int,
    k_max: int,
    max_new: Optional[int] = None,
    eos_id: Optional[int] = None,
) -> list[dict]:
    from sglang_echo.eval.loop import speculative_generate

    max_new = max_new or trace.meta.max_new
    recorded = RecordedDrafter(trace)
    rows = []
    for name, policy in policies.items():
        row = {
            "policy": name,
            "name": policy.name,
            "steps": 0,
            "request_steps": 0,
            "accept_mismatch_steps": 0,
            "size_mismatch_steps": 0,
            "step_count_mismatch": 0,
            "output_mismatch": 0,
            "live_committed": 0,
            "replay_committed": 0,
            "first_mismatch": None,
        }
        for lo in range(0, len(prompts), batch):
            idx = list(prompts[lo : lo + batch])
            live = speculative_generate(target, drafter, policy, [trace.prompt(p) for p in idx], max_new, eos_id)
            rep = replay_offline(trace, policy, idx, k_max=k_max, max_new=max_new, eos_id=eos_id, drafter=recorded)
            row["steps"] += live.steps
            row["request_steps"] += live.request_steps
            row["live_committed"] += live.request_steps + sum(int(a[a >= 0].sum()) for a in live.accept_len)
            row["replay_committed"] += rep.request_steps + rep.accepted
            if live.steps != rep.steps:
                row["step_count_mismatch"] += 1
            for s, (la, ra, ls, rs) in enumerate(zip(live.accept_len, rep.accept_len, live.tree_size, rep.tree_size)):
                bad_a, bad_s = not bool((la == ra).all()), not bool((ls == rs).all())
                row["accept_mismatch_steps"] += bad_a
                row["size_mismatch_steps"] += bad_s
                if (bad_a or bad_s) and row["first_mismatch"] is None:
                    row["first_mismatch"] = {
                        "prompts": idx,
                        "step": s,
                        "live_accept": la.tolist(),
                        "replay_accept": ra.tolist(),
                        "live_size": ls.tolist(),
                        "replay_size": rs.tolist(),
                    }
            for b, p in enumerate(idx):
                n = trace.stream_length(p, max_new, eos_id)
                row["output_mismatch"] += live.tokens[b] != trace.output(p)[:n].tolist()
        row["exact"] = not (
            row["accept_mismatch_steps"]
            or row["size_mismatch_steps"]
            or row["step_count_mismatch"]
            or row["output_mismatch"]
        )
        rows.append(row)
    return rows
