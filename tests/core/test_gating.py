"""Gating config and the calibration file: schema, defaults, and refusals with clear reasons."""

import json

import pytest
import torch

from sglang_echo.core import (
    Calibration,
    CalibrationError,
    DepthStats,
    GatingConfig,
    fingerprint,
    layer_confidence,
    load_calibration,
)


def make_calibration(**over) -> Calibration:
    rows = tuple(DepthStats(d, 0.9 - 0.05 * d, (0.8, 0.95), 0.7, 100, 50, 0.1 * d) for d in range(1, 7))
    base = dict(
        model={"name": "m", "fingerprint": "sha256:aa"},
        drafter={"kind": "eagle3", "fingerprint": "sha256:bb"},
        depths=rows,
        sweet_spots=(1, 3, 6),
    )
    return Calibration(**{**base, **over})


def test_layer_confidence_is_exp_of_the_best_valid_path_score():
    score = torch.log(torch.tensor([[0.2, 0.5, 0.9], [0.3, 0.1, 0.05]]))
    valid = torch.tensor([[True, True, False], [False, False, False]])
    assert layer_confidence(score, valid).tolist() == pytest.approx([0.5, 0.0])


def test_round_trip_and_sparse_dense_fixed(tmp_path):
    path = tmp_path / "calib.json"
    make_calibration().save(path)
    calib = load_calibration(path, model_fingerprint="sha256:aa", drafter_fingerprint="sha256:bb")
    sparse = GatingConfig.from_calibration(calib)
    assert sparse.depths == (1, 3, 6) and sparse.thresholds == pytest.approx((0.1, 0.3, 0.6))
    dense = GatingConfig.dense(calib, max_depth=4)
    assert dense.depths == (1, 2, 3, 4) and dense.thresholds == pytest.approx((0.1, 0.2, 0.3, 0.4))
    fixed = GatingConfig.fixed(0.25, sparse.depths)
    assert fixed.thresholds == (0.25, 0.25, 0.25)
    assert GatingConfig.load(path).depths == (1, 3, 6)
    table = sparse.threshold_table(4)
    assert table.tolist() == pytest.approx([0, 0.1, 0, 0.3, 0])


def test_missing_file_falls_back_to_logged_defaults(caplog):
    cfg = GatingConfig.load(None)
    assert cfg == GatingConfig.default()
    assert "no calibration file" in caplog.text


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="other"), "not a sglang-echo/calibration file"),
        (lambda d: d.update(version=99), "schema version 99"),
        (lambda d: d.pop("depths"), "malformed calibration"),
        (lambda d: d.update(sweet_spots=[1, 9]), "lack rows"),
        (lambda d: d["depths"][0].update(threshold=1.5), "thresholds are probabilities"),
    ],
)
def test_malformed_files_are_refused_with_a_reason(tmp_path, mutate, message):
    raw = make_calibration().to_json()
    mutate(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path)


def test_mismatched_fingerprints_and_missing_files_are_refused(tmp_path):
    path = tmp_path / "calib.json"
    make_calibration().save(path)
    with pytest.raises(CalibrationError, match="different model"):
        load_calibration(path, model_fingerprint="sha256:zz")
    with pytest.raises(CalibrationError, match="different drafter"):
        load_calibration(path, drafter_fingerprint="sha256:zz")
    with pytest.raises(CalibrationError, match="not found"):
        GatingConfig.load(tmp_path / "nope.json")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="not valid JSON"):
        load_calibration(tmp_path / "garbage.json")


def test_fingerprint_tracks_config_and_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    f1 = fingerprint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    f2 = fingerprint(tmp_path)
    assert f2 != f1
    (tmp_path / "model.safetensors").write_bytes(b"y" * 11)  # a retrained head: same config and size
    assert fingerprint(tmp_path) != f2


def test_invalid_gating_configs_are_refused():
    with pytest.raises(ValueError, match="thresholds"):
        GatingConfig((1, 2), (0.5,))
    with pytest.raises(ValueError, match="start at 1"):
        GatingConfig((0,), (0.5,))
