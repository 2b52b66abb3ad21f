"""The calibration probe inside the serving worker: per-step confidence samples, written as JSONL.

``echo-calibrate`` starts the real sglang server with the ``beam-tree`` policy (every depth up to
the probe depth drafted and verified) and ``SGLANG_ECHO_PROBE_OUT=<file>``. Both ECHO workers then
call, for every verify step of the batch::

    recorder.on_draft(pool, max_depth, rids, positions)  # after the trees are built: c_{i,d}, top-1 per depth
    recorder.on_verify(tokens, seconds)       # the step's verified tokens and verify time
    recorder.on_accept(num_correct_per_req)   # when sglang has the accept counts on the host

and the recorder appends one line per step::

    {"conf": [[c_{i,1}, ..., c_{i,D}], ...], "top1": [[...], ...], "accepted": [a_i, ...],
     "rid": ["...", ...], "pos": [p_i, ...], "verify_tokens": 66, "verify_s": 0.041}

``c_{i,d}`` is Eq. 6 (best path probability at depth d), ``top1`` the drafter's highest
single-token probability at depth d, ``a_i`` the number of draft tokens the target accepted, so
depth d is *accepted* when ``a_i >= d``. ``rid`` and ``pos`` (the request and its root's
position) name each sample, so two runs can be compared position by position (a request's
drafts at a position depend on its committed tokens only, not on the batch around it). Lines
are flushed as they are written: an interrupted calibration keeps every finished step, and a
torn last line is skipped on reading.

Under overlap scheduling sglang reports a step's accept counts after the next step has drafted,
so drafted steps wait in a FIFO; a step whose batch size does not match its accept counts is
dropped (counted in ``dropped``) rather than mislabelled.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from sglang_echo import env
from sglang_echo.core.tree import NodePool

log = logging.getLogger(__name__)

ENV_PROBE_OUT = "SGLANG_ECHO_PROBE_OUT"


def depth_profile(pool: NodePool, max_depth: int) -> tuple[Tensor, Tensor]:
    """``(conf, top1)``, each ``[B, max_depth]``: Eq. 6's ``c_{i,d}`` over every candidate drafted
    at depth d (0 where none was) and the highest single-token probability among them."""
    B, dev = pool.batch_size, pool.score.device
    depth = pool.depth.clamp(max=max_depth)
    valid = pool.valid & (pool.depth >= 1)
    neg = torch.full_like(pool.score, float("-inf"))
    init = torch.full((B, max_depth + 1), float("-inf"), device=dev)
    best = init.scatter_reduce(1, depth, torch.where(valid, pool.score, neg), reduce="amax")
    top1 = init.clone().scatter_reduce(1, depth, torch.where(valid, pool.logprob, neg), reduce="amax")
    return best[:, 1:].exp(), top1[:, 1:].exp()


class ProbeRecorder:
    """Collects probe samples in the scheduler process and appends them to ``path``."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._cuda = torch.device(device).type == "cuda"
        self._pending: deque[dict] = deque()
        self.steps = self.dropped = 0
        log.warning("ECHO: calibration probe on, writing samples to %s", self.path)

    @classmethod
    def from_env(cls, device: torch.device | str = "cpu") -> Optional["ProbeRecorder"]:
        path = env.get(ENV_PROBE_OUT)
        return cls(path, device) if path else None

    def on_draft(
        self,
        pool: NodePool,
        max_depth: int,
        rids: Optional[Sequence[str]] = None,
        positions: Optional[Sequence[int]] = None,
    ) -> None:
        conf, top1 = depth_profile(pool, max_depth)
        row = {"conf": conf.cpu().tolist(), "top1": top1.cpu().tolist()}
        if rids is not None:
            row["rid"] = list(rids)
        if positions is not None:
            row["pos"] = [int(p) for p in positions]
        self._pending.append(row)

    @contextmanager
    def timed_verify(self, tokens: int) -> Iterator[None]:
        """Time the verify pass of the step drafted last (synchronising the GPU around it)."""
        if self._cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        yield
        if self._cuda:
            torch.cuda.synchronize()
        self.on_verify(tokens, time.perf_counter() - t0)

    def on_verify(self, tokens: int, seconds: float) -> None:
        if self._pending:
            self._pending[-1].update(verify_tokens=int(tokens), verify_s=round(seconds, 6))

    def on_accept(self, num_correct_per_req: Sequence[int]) -> None:
        if not self._pending:
            return
        row = self._pending.popleft()
        if len(row["conf"]) != len(num_correct_per_req):
            self.dropped += 1
            return
        row["accepted"] = [int(a) for a in num_correct_per_req]
        row["conf"] = [[round(c, 6) for c in r] for r in row["conf"]]
        row["top1"] = [[round(c, 6) for c in r] for r in row["top1"]]
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        self.steps += 1


@dataclass(frozen=True)
class ProbeSamples:
    """Every (request, step) sample of a probe run, one row each."""

    conf: np.ndarray  # [N, D] c_{i,d}
    top1: np.ndarray  # [N, D]
    accepted_len: np.ndarray  # [N] draft tokens accepted
    verify_tokens: np.ndarray  # [S] per step (steps with a timing)
    verify_s: np.ndarray  # [S]

    @property
    def num_samples(self) -> int:
        return len(self.accepted_len)

    @property
    def depth(self) -> int:
        return self.conf.shape[1]

    def labels(self, d: int) -> np.ndarray:
        """Whether the target accepted a node at depth ``d`` (1-based)."""
        return self.accepted_len >= d


def read_samples(path: str | Path) -> ProbeSamples:
    """Read a probe file; a torn last line (interrupted run) is skipped, anything else malformed
    raises ``ValueError`` naming the line."""
    conf, top1, acc, tokens, secs = [], [], [], [], []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            c, t, a = row["conf"], row["top1"], row["accepted"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            if no == len(lines):
                log.warning("%s: skipping a torn last line (interrupted run)", path)
                continue
            raise ValueError(f"{path}:{no}: not a probe sample line ({type(e).__name__}: {e})") from None
        conf.extend(c)
        top1.extend(t)
        acc.extend(a)
        if "verify_s" in row:
            tokens.append(row["verify_tokens"])
            secs.append(row["verify_s"])
    if not acc:
        raise ValueError(f"{path}: no probe samples (did the server run the beam-tree probe?)")
    return ProbeSamples(
        conf=np.asarray(conf, dtype=np.float64),
        top1=np.asarray(top1, dtype=np.float64),
        accepted_len=np.asarray(acc, dtype=np.int64),
        verify_tokens=np.asarray(tokens, dtype=np.int64),
        verify_s=np.asarray(secs, dtype=np.float64),
    )
