"""The trainer's resume check, shared by the head kinds' training tests."""

from __future__ import annotations

import json
from typing import Callable

import pytest
import torch

from sglang_echo.training.trainer import TrainConfig, train


def train_interrupted_and_resumed(fresh_head: Callable, loss_fn, seqs, cfg: TrainConfig, tmp_path):
    """Train one fresh head to the end; train another that is interrupted after its first
    checkpoint (step 4: ``cfg.save_every`` must be 4), then resume it. The resumed weights must equal
    the uninterrupted run's. Returns the uninterrupted head and its report."""
    full = fresh_head()
    report = train(full, loss_fn, lambda out: full.save(out, dtype=torch.float32), seqs, seqs[:2], cfg, tmp_path / "a")

    calls = {"n": 0}

    def crashing(model, batch):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return loss_fn(model, batch)

    part = fresh_head()
    with pytest.raises(KeyboardInterrupt):
        train(part, crashing, lambda out: part.save(out, dtype=torch.float32), seqs, [], cfg, tmp_path / "b")
    assert json.loads((tmp_path / "b" / "checkpoint" / "state.json").read_text())["step"] == 4
    resumed = fresh_head()
    train(resumed, loss_fn, lambda out: resumed.save(out, dtype=torch.float32), seqs, [], cfg, tmp_path / "b")
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    return full, report
