import json

import pytest

from sglang_echo.training import learning_curve


def _curve():
    kinds = {"chat": [0.3, 0.2], "code": [0.5, 0.4]}
    return [
        {"step": 0, "tokens": 0, "dev_top1_mean": [0.4, 0.3], "dev_top1": kinds},
        {"step": 25, "tokens": 90_000, "dev_top1_mean": [0.5, 0.35], "dev_top1": kinds},
    ]


def test_a_report_or_its_curve_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    report = tmp_path / "training_report.json"
    report.write_text(json.dumps({"steps": 25, "curve": _curve()}))
    curve_file = tmp_path / "learning_curve.json"
    curve_file.write_text(json.dumps(_curve()))
    assert learning_curve.load(report) == learning_curve.load(curve_file) == _curve()
    assert learning_curve.main([str(report)]) == 0
    png = tmp_path / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_without_a_curve_is_refused(tmp_path, capsys):
    report = tmp_path / "training_report.json"
    report.write_text(json.dumps({"steps": 25}))
    with pytest.raises(SystemExit):
        learning_curve.main([str(report)])
    assert "no learning curve" in capsys.readouterr().err


def test_a_run_from_a_trained_head_continues_its_curve(tmp_path):
    """Tokens count on from the earlier curve's end, points name their run; a head probed on
    another dev split (or with no curve) is not continued, and says why."""
    head = tmp_path / "head"
    head.mkdir()
    (head / "learning_curve.json").write_text(json.dumps(_curve()))
    (head / "training_report.json").write_text(json.dumps({"dev_per_kind": 16}))
    earlier, why = learning_curve.earlier_curve(head, 16, {"chat", "code"})
    assert earlier == _curve() and "90,000" in why
    curve = learning_curve.continued(earlier, _curve())
    assert [p["tokens"] for p in curve] == [0, 90_000, 90_000, 180_000]
    assert [p.get("run", 0) for p in curve] == [0, 0, 1, 1]
    assert [p.get("run", 0) for p in learning_curve.continued(curve, _curve())[-2:]] == [2, 2]
    assert learning_curve.earlier_curve(head, 8, {"chat", "code"})[0] == []
    assert learning_curve.earlier_curve(head, 16, {"chat"})[0] == []
    assert "no curve" in learning_curve.earlier_curve(tmp_path, 16, {"chat", "code"})[1]
