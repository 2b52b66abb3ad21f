"""``echo-replay validate-server``: the replay against a real sglang ECHO server."""

from __future__ import annotations

import pytest

from sglang_echo.core.factory import PolicyConfig
from sglang_echo.integration.config import load_config
from sglang_echo.replay.validate_server import _histogram, _trim, server_env

from ..conftest import REPLAY_PORTS
from .server_check import record_then_validate

CFG = PolicyConfig(k_max=8, max_depth=6, w_def=1, w_max=4, topk=10, total_tokens=40, fixed_tau=0.25)
# The PolicyConfig fields each policy reads (core/factory.py).
READS = {
    "chain": ("max_depth",),
    "static-tree": ("max_depth", "topk", "total_tokens"),
    "budgeted-chain": ("k_max", "max_depth"),
    "echo": ("k_max", "max_depth", "w_def", "w_max"),
    "dense-gating": ("k_max", "max_depth", "w_def", "w_max"),
    "fixed-threshold": ("k_max", "max_depth", "w_def", "w_max", "fixed_tau"),
}


@pytest.mark.parametrize("policy", sorted(READS))
def test_the_server_builds_the_replayed_policy(policy, tmp_path):
    calib = tmp_path / "calibration.json"
    calib.write_text("{}")
    env = server_env(policy, CFG, "ngram", calib)
    cfg = load_config(environ=env)
    assert cfg.policy == policy and cfg.drafter == "ngram" and cfg.calibration == str(calib.resolve())
    server = cfg.policy_config()
    for field in READS[policy]:
        assert getattr(server, field) == getattr(CFG, field), field


def test_histograms_use_sglangs_layout():
    assert _histogram([0, 2, 2, 0, 1]) == [2, 1, 2] and _histogram([]) == []
    assert _trim([3, 1, 0, 0]) == [3, 1] and _trim(None) == []


@pytest.mark.server
def test_replay_equals_the_server(tmp_path):
    """SmolLM2 (float32) with the n-gram drafter: a small trace, then one ECHO server per policy,
    each trace prompt alone: sglang's per-request step count, accepted-draft and tree-size
    histograms equal the replay's, and the outputs the recorded continuation."""
    rows = record_then_validate(
        tmp_path,
        REPLAY_PORTS,
        ["--drafter", "ngram", "--max-new-tokens", "48", "--depth", "6", "--width", "4", "--beams", "1,4"],
        [
            "--policies",
            "echo,static-tree",
            "--k-max",
            "8",
            "--max-depth",
            "6",
            "--w-max",
            "4",
            "--topk",
            "4",
            "--total-tokens",
            "12",
        ],
    )
    assert [r["policy"] for r in rows] == ["echo", "static-tree"]
    for r in rows:
        assert r["exact"] and r["requests"] == 2 and r["steps"] > 0
