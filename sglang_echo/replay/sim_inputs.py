"""What a simulated-acceptance benchmark takes from a trace (``echo-replay sim-inputs``).

Both speculative servers of a GPU benchmark with random weights are simulated from the same
trace, each by its own convention:

* ECHO with ``SGLANG_ECHO_SIMULATE=STEM`` (:mod:`sglang_echo.integration.simulate`) follows a
  request's trace stream by its prompt ids, so the benchmark sends the trace's prompts as
  ``input_ids`` (SmolLM2's ids are valid ids of any larger vocabulary) and asks for at most the
  trace's ``max_new`` tokens with ``ignore_eos``;
* sglang's EAGLE3 with ``SGLANG_SIMULATE_ACC_LEN`` = the mean tokens committed per step (accepted
  drafts + the bonus token) that the replay gives its static tree on the same trace
  (:func:`eagle3_acc_len`: the core's ``static-tree`` policy, EAGLE's global re-rank of a
  ``steps x topk`` tree to ``tokens`` nodes, replayed exactly as ``echo-replay run`` does). sglang
  draws each step's length from that mean (``SGLANG_SIMULATE_ACC_METHOD=match-expected``, its
  default: the floor or the ceiling, with the mean kept) for the whole batch.

Plain decoding needs nothing: the same prompts and lengths. :func:`sim_inputs` gathers it all in
one JSON (``sglang-echo/sim-inputs`` v1) with the label every figure made from it must carry.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .trace import Trace

SCHEMA = "sglang-echo/sim-inputs"
VERSION = 1
LABEL = "simulated acceptance"


@dataclass(frozen=True)
class TreeShape:
    """sglang's EAGLE tree flags: ``--speculative-num-steps / -eagle-topk / -num-draft-tokens``."""

    steps: int
    topk: int
    tokens: int

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        m = re.fullmatch(r"\s*(\d+)/(\d+)/(\d+)\s*", text)
        shape = cls(*(int(g) for g in m.groups())) if m else None
        if shape is None or min(shape.steps, shape.topk) < 1 or shape.tokens < 2:
            raise ValueError(f"--eagle3-shape {text!r}: expected STEPS/TOPK/TOKENS, e.g. 3/3/5 (tokens >= 2)")
        return shape

    def __str__(self) -> str:
        return f"{self.steps}/{self.topk}/{self.tokens}"


def eagle3_acc_len(trace: Trace, shape: TreeShape, max_new: Optional[int] = None) -> dict:
    """The replayed static tree ``shape`` over every trace stream (eos ignored, as the benchmark's
    requests): its mean committed tokens per request and step, the ``SGLANG_SIMULATE_ACC_LEN``
    that gives sglang's EAGLE3 the same mean, and how much of the tree the trace covered."""
    from sglang_echo.core.factory import PolicyConfig, make_policy

    from .simulate import replay_offline

    cfg = PolicyConfig(max_depth=shape.steps, topk=shape.topk, total_tokens=shape.tokens)
    policy = make_policy("static-tree", cfg)
    res = replay_offline(trace, policy, list(range(trace.num_prompts)), k_max=cfg.k_max, max_new=max_new, eos_id=None)
    if res.request_steps == 0:
        raise ValueError("the trace has no stream with a speculative step (max_new < 2)")
    return {
        "shape": str(shape),
        "simulate_acc_len": round(res.mat, 4),
        "request_steps": res.request_steps,
        "accepted_drafts": res.accepted,
        "coverage": res.coverage.as_dict(),
    }


def sim_inputs(trace: Trace, stem: str | Path, shape: TreeShape, max_new: Optional[int] = None) -> dict:
    """The benchmark's inputs from ``trace`` (module docstring)."""
    max_new = min(max_new or trace.meta.max_new, trace.meta.max_new)
    names = trace.meta.prompts or [f"trace/{p}" for p in range(trace.num_prompts)]
    eagle3 = eagle3_acc_len(trace, shape, max_new)
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "trace": str(stem),
        "label": LABEL,
        "target": trace.meta.target,
        "drafter": trace.meta.drafter,
        "draft": trace.meta.draft,
        "vocab_size": trace.vocab_needed(),
        "max_new": max_new,
        "env": {
            "echo": {"SGLANG_ECHO_SIMULATE": str(stem)},
            "eagle3": {"SGLANG_SIMULATE_ACC_LEN": str(eagle3["simulate_acc_len"])},
        },
        "eagle3": eagle3,
        "prompts": [{"id": names[p], "input_ids": trace.prompt(p).tolist()} for p in range(trace.num_prompts)],
    }


def load_sim_inputs(path: str | Path) -> dict:
    """A ``sim-inputs`` file, checked (ValueError naming the file)."""
    raw = json.loads(Path(path).read_text())
    if raw.get("schema") != SCHEMA or raw.get("version") != VERSION:
        raise ValueError(f"{path}: not a {SCHEMA} v{VERSION} file")
    return raw
