"""ECHO settings: defaults, flags, file (JSON/TOML/inline), env overrides, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglang_echo.integration.config import EchoConfig, EchoConfigError, load_config
from sglang_echo.integration.served_calibration import load_calibration_for


def test_defaults_documented():
    cfg = load_config(environ={})
    assert (cfg.policy, cfg.k_max, cfg.max_depth, cfg.w_def, cfg.w_max, cfg.calibration) == (
        "echo",
        None,
        4,
        None,
        4,
        None,
    )
    assert cfg.w_default == 2 and cfg.resolved_width() == 1 + 4 * 2 + 4
    assert cfg.source == "defaults"


def test_w_def_follows_w_max_unless_set():
    """Without a w_def, a ``--speculative-eagle-topk`` alone gives a shape that fits: half of w_max."""
    assert load_config(topk=2, num_draft_tokens=7, environ={}).w_default == 1  # 1 + 4 * 1 + 2 = 7
    assert load_config(topk=6, environ={}).w_default == 3
    assert load_config(topk=6, environ={"SGLANG_ECHO_W_DEF": "1"}).w_default == 1


def test_flags_then_file_then_env(tmp_path: Path):
    f = tmp_path / "echo.json"
    f.write_text(json.dumps({"policy": "chain", "k_max": 32, "max_depth": 5}))
    env = {"SGLANG_ECHO_CONFIG": str(f), "SGLANG_ECHO_K_MAX": "24", "SGLANG_ECHO_POLICY": "static-tree"}
    cfg = load_config(num_steps=3, topk=4, num_draft_tokens=9, environ=env)
    assert cfg.policy == "static-tree" and cfg.k_max == 24  # env beats the file
    assert cfg.max_depth == 5  # the file beats the flag
    assert cfg.w_max == 4 and cfg.resolved_width() == 9  # flags beat the defaults
    assert "echo.json" in cfg.source and "env" in cfg.source


def test_toml_and_inline(tmp_path: Path):
    f = tmp_path / "echo.toml"
    f.write_text('[echo]\npolicy = "budgeted-chain"\nk_max = 10\n')
    assert load_config(environ={"SGLANG_ECHO_CONFIG": str(f)}).policy == "budgeted-chain"
    cfg = load_config(environ={"SGLANG_ECHO_CONFIG": '{"w_def": 2, "w_max": 3}'})
    assert (cfg.w_def, cfg.w_max) == (2, 3)


def test_dart_drafter_and_its_ngram_switch():
    cfg = load_config(environ={"SGLANG_ECHO_DRAFTER": "dart"})
    assert cfg.drafter == "dart" and cfg.dart_ngram is True
    assert load_config(environ={"SGLANG_ECHO_DART_NGRAM": "off"}).dart_ngram is False
    assert load_config(environ={"SGLANG_ECHO_CONFIG": '{"dart_ngram": false}'}).dart_ngram is False


@pytest.mark.parametrize(
    "env, match",
    [
        ({"SGLANG_ECHO_POLICY": "eagle9"}, "policy='eagle9' is unknown"),
        ({"SGLANG_ECHO_K_MAX": "many"}, "k_max='many' is not a valid integer"),
        ({"SGLANG_ECHO_K_MAX": "0"}, "k_max=0 must be >= 1"),
        ({"SGLANG_ECHO_W_DEF": "5"}, "1 <= w_def <= w_max"),
        ({"SGLANG_ECHO_W_MAX": "1", "SGLANG_ECHO_W_DEF": "1"}, "w_max=1 must be >= 2"),
        ({"SGLANG_ECHO_WIDTH": "3"}, "width=3 must be >= max_depth"),
        ({"SGLANG_ECHO_WIDTH": "5"}, "smaller than the widest tree"),
        ({"SGLANG_ECHO_DRAFTER": "medusa"}, "drafter='medusa' is unknown; choose one of eagle3, dart, dflash, ngram"),
        ({"SGLANG_ECHO_KMAX": "5"}, "SGLANG_ECHO_KMAX \\(did you mean SGLANG_ECHO_K_MAX\\?\\): nothing reads"),
        ({"SGLANG_ECHO_POLCY": "chain"}, "SGLANG_ECHO_POLCY \\(did you mean SGLANG_ECHO_POLICY\\?\\)"),
        ({"SGLANG_ECHO_DART_NGRAM": "maybe"}, "dart_ngram='maybe' is not a valid boolean"),
        ({"SGLANG_ECHO_CONFIG": "/nonexistent/echo.json"}, "does not name a file"),
        ({"SGLANG_ECHO_CONFIG": '{"kmax": 3}'}, r"unknown setting\(s\) \['kmax'\]"),
        ({"SGLANG_ECHO_CONFIG": "{not json"}, "not valid JSON"),
        (
            {"SGLANG_ECHO_CALIBRATION": "/nonexistent/calib.json"},
            "calibration file '/nonexistent/calib.json' not found",
        ),
    ],
)
def test_bad_values_are_clear(env, match):
    with pytest.raises(EchoConfigError, match=match):
        load_config(environ=env)


def test_malformed_and_mismatched_calibration(tmp_path: Path):
    from sglang_echo.core.calibration_file import CalibrationError, fingerprint

    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    cfg = load_config(environ={"SGLANG_ECHO_CALIBRATION": str(bad)})
    with pytest.raises(CalibrationError, match="not a sglang-echo/calibration file"):
        load_calibration_for(cfg)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    calib = write_calibration(tmp_path / "c.json", model_fp="sha256:other", drafter_fp=None)
    cfg = load_config(environ={"SGLANG_ECHO_CALIBRATION": str(calib)})
    with pytest.raises(CalibrationError, match="made for a different model"):
        load_calibration_for(cfg, model_path=str(model))
    ok = write_calibration(tmp_path / "ok.json", model_fp=fingerprint(model), drafter_fp=None)
    got = load_calibration_for(load_config(environ={"SGLANG_ECHO_CALIBRATION": str(ok)}), model_path=str(model))
    assert got.sweet_spots == (1, 2)
    ngram = load_config(environ={"SGLANG_ECHO_CALIBRATION": str(ok), "SGLANG_ECHO_DRAFTER": "ngram"})
    with pytest.raises(CalibrationError, match="made for the 'eagle3' drafter"):
        load_calibration_for(ngram, model_path=str(model))
    other_params = write_calibration(
        tmp_path / "ng.json", model_fp=fingerprint(model), drafter_fp="ngram:n=2..3", kind="ngram"
    )
    with pytest.raises(CalibrationError, match="made for a different drafter"):
        load_calibration_for(
            load_config(environ={"SGLANG_ECHO_CALIBRATION": str(other_params), "SGLANG_ECHO_DRAFTER": "ngram"}),
            model_path=str(model),
        )


def test_auto_control_kernel_is_settled_per_server():
    from sglang_echo.integration.config import resolve_control_kernel

    cfg = load_config(environ={})
    assert resolve_control_kernel(cfg, "cpu").control_kernel == "torch"
    assert (
        resolve_control_kernel(load_config(environ={"SGLANG_ECHO_POLICY": "chain"}), "cuda").control_kernel == "torch"
    )
    pinned = load_config(environ={"SGLANG_ECHO_CONTROL_KERNEL": "torch"})
    assert resolve_control_kernel(pinned, "cuda") is pinned


def test_calibration_against_a_model_that_is_not_local(tmp_path: Path, monkeypatch):
    """A hub id is checked against its cached snapshot, and refused where none is cached (it
    used to skip the fingerprint check)."""
    from huggingface_hub import constants

    from sglang_echo.core.calibration_file import CalibrationError, fingerprint

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at each call
    calib = write_calibration(tmp_path / "c.json", model_fp="sha256:other", drafter_fp=None)
    cfg = load_config(environ={"SGLANG_ECHO_CALIBRATION": str(calib)})
    with pytest.raises(
        CalibrationError,
        match="'acme/not-downloaded', which is neither a local folder nor in the Hugging Face cache: download it first",
    ):
        load_calibration_for(cfg, model_path="acme/not-downloaded")
    # The same id, cached: checked against the snapshot's fingerprint.
    snap = tmp_path / "hub" / "models--acme--cached" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"a": 2}')
    (tmp_path / "hub" / "models--acme--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--cached" / "refs" / "main").write_text("0" * 40)
    with pytest.raises(CalibrationError, match="made for a different model"):
        load_calibration_for(cfg, model_path="acme/cached")
    ok = write_calibration(tmp_path / "ok.json", model_fp=fingerprint(snap), drafter_fp=None)
    assert load_calibration_for(load_config(environ={"SGLANG_ECHO_CALIBRATION": str(ok)}), model_path="acme/cached")


def write_calibration(path: Path, *, model_fp, drafter_fp, thresholds=(0.05, 0.02), kind="eagle3") -> Path:
    """A minimal valid calibration file (also used by the server tests)."""
    rows = [
        {
            "depth": d,
            "auc": 0.8,
            "auc_ci": [0.7, 0.9],
            "accept_rate": 0.5,
            "num_accepted": 10,
            "num_rejected": 10,
            "threshold": t,
        }
        for d, t in zip((1, 2), thresholds)
    ]
    path.write_text(
        json.dumps(
            {
                "schema": "sglang-echo/calibration",
                "version": 1,
                "model": {"name": "m", "fingerprint": model_fp},
                "drafter": {"kind": kind, "name": "d", "fingerprint": drafter_fp},
                "depths": rows,
                "sweet_spots": [1, 2],
                "k_max": None,
            }
        )
    )
    return path


def test_config_is_frozen_dataclass():
    import dataclasses

    assert dataclasses.is_dataclass(EchoConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        EchoConfig().k_max = 3  # type: ignore[misc]


def test_lazy_extend_setting():
    assert load_config(environ={}).lazy_extend == 128
    assert load_config(environ={"SGLANG_ECHO_LAZY_EXTEND": "0"}).lazy_extend == 0
    with pytest.raises(EchoConfigError, match="lazy_extend=-1 must be >= 0"):
        load_config(environ={"SGLANG_ECHO_LAZY_EXTEND": "-1"})


def test_explore_backoff_setting_reaches_the_cost_budget():
    from sglang_echo.core.factory import make_policy
    from sglang_echo.integration.config import make_step_budget

    cfg = load_config(environ={"SGLANG_ECHO_BUDGET": "cost", "SGLANG_ECHO_EXPLORE_BACKOFF": "4"})
    assert make_step_budget(cfg, make_policy("echo"), None).explore_backoff == 4
    assert load_config(environ={}).explore_backoff == 16
    with pytest.raises(EchoConfigError, match="explore_backoff=0 must be >= 1"):
        load_config(environ={"SGLANG_ECHO_EXPLORE_BACKOFF": "0"})


def test_control_kernel_setting(monkeypatch):
    from types import SimpleNamespace

    from sglang_echo.integration.spec import validate_server_args

    cfg = load_config(environ={"SGLANG_ECHO_CONTROL_KERNEL": "triton"})
    assert cfg.control_kernel == "triton" and cfg.policy_config().control_kernel == "triton"
    assert load_config(environ={}).control_kernel == "auto"  # the server settles it (resolve_control_kernel)
    assert load_config(environ={}).policy_config().control_kernel == "torch"
    with pytest.raises(EchoConfigError, match="control_kernel='cuda' is unknown"):
        load_config(environ={"SGLANG_ECHO_CONTROL_KERNEL": "cuda"})
    with pytest.raises(EchoConfigError, match="not policy 'chain'"):
        load_config(environ={"SGLANG_ECHO_CONTROL_KERNEL": "triton", "SGLANG_ECHO_POLICY": "chain"})
    # The server refuses it without CUDA, naming the setting, before anything starts.
    for key in [k for k in os.environ if k.startswith("SGLANG_ECHO_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SGLANG_ECHO_DRAFTER", "ngram")
    monkeypatch.setenv("SGLANG_ECHO_CONTROL_KERNEL", "triton")
    sa = SimpleNamespace(
        speculative_draft_model_path=None,
        pp_size=1,
        enable_dp_attention=False,
        disaggregation_mode="null",
        speculative_adaptive=False,
        speculative_use_rejection_sampling=False,
        enable_multi_layer_eagle=False,
        page_size=1,
        speculative_eagle_topk=None,
        speculative_num_steps=None,
        speculative_num_draft_tokens=None,
        device="cpu",
        model_path=None,
    )
    with pytest.raises(ValueError, match="control_kernel 'triton'.*needs a CUDA device, not --device cpu"):
        validate_server_args(sa)
    sa.device = "cuda"  # and the n-gram drafter, whose trees are host-side, cannot use it either
    with pytest.raises(ValueError, match="the n-gram drafter builds its trees on the host"):
        validate_server_args(sa)
    monkeypatch.setenv("SGLANG_ECHO_CONTROL_KERNEL", "auto")
    validate_server_args(sa)
