"""Cost curves, the throughput model, and measure-cost on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_echo.replay.cost import CostModel, Curve
from sglang_echo.replay.simulate import ReplayResult


def test_curve_interpolates_and_extrapolates():
    c = Curve([(1, 1, 1.0), (1, 3, 2.0), (1, 5, 6.0), (4, 4, 10.0), (4, 8, 20.0)])
    assert c(1, 1) == 1.0 and c(1, 2) == 1.5 and c(1, 4) == 4.0
    assert c(1, 0.5) == 1.0  # flat below the first point
    assert c(1, 7) == 10.0  # the last segment's slope beyond the last point
    assert c(4, 6) == 15.0 and c(16, 6) == 15.0  # the nearest batch size outside the measured ones
    assert c(2, 4) == pytest.approx(0.5 * 4.0 + 0.5 * 10.0)  # halfway in log B between B=1 and B=4
    noisy = Curve([(1, 1, 1.0), (1, 2, 3.0), (1, 3, 2.0), (1, 4, 5.0)])
    assert noisy(1, 3) == 3.0 and noisy(1, 2.5) == 3.0  # never cheaper with more tokens


def _cost_file(tmp_path, draft=True):
    raw = {
        "schema": "sglang-echo/replay-cost",
        "version": 1,
        "label": "unit",
        "verify": [{"batch": 2, "tokens": 2, "seconds": 0.1}, {"batch": 2, "tokens": 10, "seconds": 0.5}],
        "draft": {
            "kind": "eagle3",
            "forward": [{"batch": 2, "rows": 2, "seconds": 0.01}, {"batch": 2, "rows": 4, "seconds": 0.02}],
            "catch_up": [{"batch": 2, "rows": 2, "seconds": 0.004}],
        }
        if draft
        else None,
    }
    p = tmp_path / "cost.json"
    p.write_text(json.dumps(raw))
    return CostModel.load(p)


def test_throughput_model_by_hand(tmp_path):
    res = ReplayResult(
        "x",
        batch_size=2,
        k_max=8,
        accept_len=[torch.tensor([2, 1]), torch.tensor([0, 0])],
        verified_total=[6, 2],
        committed=[5, 2],
        draft_calls=[[(0, 2, 1, 2), (1, 2, 2, 3)], [(0, 2, 1, 2)]],
        catch_up=[(2, 3), (2, 1)],
    )
    m = _cost_file(tmp_path)
    t = m.throughput(res, "eagle3")
    verify = 0.3 + 0.1  # T_verify(2, 6) = 0.3 on the line through (2, .1) and (10, .5); T(2, 2) = 0.1
    draft = 0.02 + (0.004 + 0.004)  # one depth-1 forward over 2 x 2 rows; catch-ups (flat curve)
    assert t["verify_ms_per_step"] == pytest.approx(1e3 * verify / 2)
    assert t["draft_ms_per_step"] == pytest.approx(1e3 * draft / 2)
    assert t["tokens_per_s"] == pytest.approx(7 / (verify + draft))
    assert t["ar_tokens_per_s"] == pytest.approx(2 / 0.1) and t["speedup"] == pytest.approx(t["tokens_per_s"] / 20)
    assert t["draft_priced"]
    # Another drafter (or a file without a draft curve) is priced at zero draft time, and says so.
    assert not m.throughput(res, "ngram")["draft_priced"] and m.throughput(res, "ngram")["draft_ms_per_step"] == 0
    assert _cost_file(tmp_path, draft=False).throughput(res, "eagle3")["draft_ms_per_step"] == 0
    # The control plane: charged on every step that drafted (even only from the roots), never on
    # a step that did not (plain decoding).
    m.control_s = 0.05
    t = m.throughput(res, "eagle3")
    assert t["control_ms_per_step"] == pytest.approx(1e3 * 0.05)
    assert t["tokens_per_s"] == pytest.approx(7 / (verify + draft + 2 * 0.05))
    res.draft_calls[1] = []
    assert m.throughput(res, "eagle3")["control_ms_per_step"] == pytest.approx(1e3 * 0.05 / 2)


def test_measure_cost_on_the_tiny_model(tmp_path, tiny_llama_dir):
    from sglang_echo.models.tiny import write_tiny_eagle3_draft
    from sglang_echo.replay.cli import main

    V = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    head = write_tiny_eagle3_draft(tmp_path / "e3", tiny_llama_dir, aux_layer_ids=[0, 0, 1], draft_vocab_size=512).path
    out = tmp_path / "cost.json"
    main(
        [
            "measure-cost",
            "--model",
            str(tiny_llama_dir),
            "--drafter",
            "eagle3",
            "--draft",
            str(head),
            "--batches",
            "1,2",
            "--tokens-per-request",
            "1,3",
            "--frontiers",
            "1,2",
            "--catch-up-tokens",
            "2",
            "--prefix",
            "8",
            "--reps",
            "1",
            "--threads",
            "1",
            "--label",
            "tiny-cpu",
            "--out",
            str(out),
        ]
    )
    raw = json.loads(out.read_text())
    assert raw["machine"]["cpu"] and raw["target"]["prefix_len"] == 8 and V > 0
    assert sorted((p["batch"], p["tokens"]) for p in raw["verify"]) == [(1, 1), (1, 3), (2, 2), (2, 6)]
    assert len(raw["draft"]["forward"]) == 4 and len(raw["draft"]["catch_up"]) == 2
    assert all(p["seconds"] > 0 for p in raw["verify"] + raw["draft"]["forward"])
    m = CostModel.load(out)
    assert m.label == "tiny-cpu" and m.draft_priced("eagle3") and m.verify(1, 2) > 0
