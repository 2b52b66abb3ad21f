"""sglang's own argument parser and resolution pipeline accept ``--speculative-algorithm ECHO``
and run ECHO's validation: every drafter's settings, and a clear refusal of what cannot serve.

All cases resolve in one fresh process with the CPU engine (it must be set before sglang
imports, and importing sglang costs about 15 s here), then each test reads its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._server_args_probe import probe

NGRAM = {"SGLANG_ECHO_DRAFTER": "ngram"}
DART = {"SGLANG_ECHO_DRAFTER": "dart"}
DFLASH = {"SGLANG_ECHO_DRAFTER": "dflash"}


def _cases(model: Path, eagle3: Path, dart: Path, dflash: Path, tmp: Path) -> dict:
    base = [
        "--model-path",
        str(model),
        "--device",
        "cpu",
        "--attention-backend",
        "echo_torch",
        "--speculative-algorithm",
        "ECHO",
    ]
    draft = [*base, "--speculative-draft-model-path"]
    echo = [*draft, str(model)]
    return {
        # ECHO with an EAGLE-3 head: sglang's settings from ECHO's defaults, env and flags
        "defaults": {"argv": echo},
        "env": {"argv": echo, "env": {"SGLANG_ECHO_MAX_DEPTH": "3", "SGLANG_ECHO_W_MAX": "3"}},
        "flags": {
            "argv": echo
            + [
                "--speculative-num-steps",
                "5",
                "--speculative-eagle-topk",
                "3",
                "--max-running-requests",
                "8",
                "--enable-mixed-chunk",
            ]
        },
        "topk1": {"argv": echo + ["--speculative-eagle-topk", "1"]},
        "no_draft": {"argv": base},
        "calib": {"argv": echo, "env": {"SGLANG_ECHO_CALIBRATION": str(tmp / "missing.json")}},
        "policy": {"argv": echo, "env": {"SGLANG_ECHO_POLICY": "nope"}},
        # the n-gram drafter: no draft model
        "ngram_env": {"argv": base, "env": NGRAM},
        "ngram_file": {
            "argv": base,
            "env": {"SGLANG_ECHO_CONFIG": json.dumps({"drafter": "ngram", "policy": "static-tree"})},
        },
        "ngram_with_draft": {"argv": echo, "env": NGRAM},
        # heads of one drafter kind refused under another
        "dart": {"argv": draft + [str(dart)], "env": DART},
        "dart_head_as_eagle3": {"argv": draft + [str(dart)]},
        "eagle3_head_as_dart": {"argv": draft + [str(eagle3)], "env": DART},
        "dflash": {"argv": draft + [str(dflash)], "env": DFLASH},
        "dflash_head_as_eagle3": {"argv": draft + [str(dflash)]},
        "eagle3_head_as_dflash": {"argv": draft + [str(eagle3)], "env": DFLASH},
    }


@pytest.fixture(scope="module")
def resolved(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from sglang_echo.models.drafts import SMOLLM2_DART, shipped_head, stage_head

    tmp = tmp_path_factory.mktemp("server-args")
    cases = _cases(
        smollm2_dir,
        stage_head(smollm2_dir),
        stage_head(smollm2_dir, SMOLLM2_DART),
        shipped_head(smollm2_dir, "dflash"),
        tmp,
    )
    return probe(cases, tmp)


def _spec(r: dict) -> tuple:
    return r["speculative_num_steps"], r["speculative_eagle_topk"], r["speculative_num_draft_tokens"]


def test_echo_with_an_eagle3_head(resolved):
    d = resolved["defaults"]
    assert d["speculative_algorithm"] == "ECHO"
    assert _spec(d) == (4, 4, 13)  # depth 4, W_max 4, 1 + 4 x W_def 2 + 4
    assert d["max_running_requests"] == 48 and d["disable_overlap_schedule"] is True
    assert _spec(resolved["env"])[:2] == (3, 3)
    assert resolved["env"]["speculative_num_draft_tokens"] == 1 + 3 * 1 + 3
    f = resolved["flags"]
    assert _spec(f) == (5, 3, 9)
    assert f["max_running_requests"] == 8 and f["enable_mixed_chunk"] is False
    assert "ECHO needs topk >= 2" in resolved["topk1"]["error"]
    assert "--speculative-draft-model-path" in resolved["no_draft"]["error"]
    assert "missing.json" in resolved["calib"]["error"] and "not found" in resolved["calib"]["error"]
    assert "policy='nope' is unknown" in resolved["policy"]["error"]


def test_the_ngram_drafter(resolved):
    e = resolved["ngram_env"]
    assert e["speculative_algorithm"] == "ECHO", e
    assert _spec(e) == (4, 4, 13)
    assert e["max_running_requests"] == 48 and e["disable_overlap_schedule"] is True
    assert resolved["ngram_file"]["speculative_num_draft_tokens"] == 1 + 4 * 4  # static-tree: depth x W_max
    assert "drafter 'ngram' uses no draft model" in resolved["ngram_with_draft"]["error"]


@pytest.mark.parametrize(("kind", "name"), [("dart", "DART"), ("dflash", "DFlash")])
def test_a_head_serves_only_as_its_own_drafter(resolved, kind: str, name: str):
    assert resolved[kind]["speculative_algorithm"] == "ECHO", resolved[kind]
    assert f"is a {name} head: set the ECHO drafter to '{kind}'" in resolved[f"{kind}_head_as_eagle3"]["error"]
    assert f"drafter '{kind}' needs a {name} head" in resolved[f"eagle3_head_as_{kind}"]["error"]
