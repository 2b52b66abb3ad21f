"""`echo-bench acceptance` end to end on the tiny model (ngram and an early-exit EAGLE-3 head)."""

from __future__ import annotations

import json
import re

import pytest

from sglang_echo.bench import acceptance
from sglang_echo.bench.cli import SUBCOMMANDS

SMALL = [
    "--prompts",
    "chat,humaneval",
    "--per-set",
    "2",
    "--max-new-tokens",
    "6",
    "--batch",
    "2",
    "--max-depth",
    "4",
    "--topk",
    "3",
    "--total-tokens",
    "8",
    "--device",
    "cpu",
]


def test_registered():
    assert SUBCOMMANDS["acceptance"][0] == "sglang_echo.bench.acceptance"


def _run(tmp_path, *args):
    out = tmp_path / "res"
    acceptance.main([*args, *SMALL, "--out", str(out)])
    data = json.loads((tmp_path / "res.json").read_text())
    assert (tmp_path / "res.md").read_text().count("\n|") >= 2
    return data


def test_ngram(tmp_path, tiny_llama_dir):
    pytest.importorskip("sglang_echo.drafters.ngram")
    data = _run(tmp_path, "--model", str(tiny_llama_dir), "--drafter", "ngram", "--policies", "chain3,static-tree,echo")
    rows = data["rows"]
    assert [(r["prompts"], r["policy"]) for r in rows] == [
        (s, p) for s in ("chat", "humaneval") for p in ("ar", "chain3", "static-tree", "echo")
    ]
    assert all(r["mismatches"] == 0 and r["generated"] > 0 for r in rows)
    assert data["k_max"] == 16 and data["policies"]["static-tree"] == "static-tree-4x3x8"
    assert all(r["mat"] == 1.0 for r in rows if r["policy"] == "ar")
    assert "no shipped calibration" in data["calibration"]  # none ships for a tiny random target


def test_a_jsonl_file_is_a_prompt_set(tmp_path, tiny_llama_dir, capsys):
    """A ``.jsonl`` path in ``--prompts`` (the pool's dev split, say) is read as a set labelled
    by its stem less ``_dev``; a path that does not exist is refused before the target loads."""
    pytest.importorskip("sglang_echo.drafters.ngram")
    rows = [{"messages": [{"role": "user", "content": f"Say {w} three times."}]} for w in ("red", "blue")]
    (tmp_path / "qa_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    small = [a if a != "chat,humaneval" else f"{tmp_path / 'qa_dev.jsonl'},chat" for a in SMALL]
    args = ["--model", str(tiny_llama_dir), "--drafter", "ngram", "--policies", "echo", *small]
    acceptance.main([*args, "--out", str(tmp_path / "res")])
    rows = json.loads((tmp_path / "res.json").read_text())["rows"]
    assert [(r["prompts"], r["policy"], r["requests"]) for r in rows] == [
        (s, p, 2) for s in ("qa", "chat") for p in ("ar", "echo")
    ]
    with pytest.raises(SystemExit):
        acceptance.main(["--model", str(tiny_llama_dir), "--drafter", "ngram", "--prompts", "missing_dev.jsonl"])
    assert "missing_dev.jsonl" in capsys.readouterr().err


def test_echo_gates_with_the_calibration_it_is_given(tmp_path, tiny_llama_dir, capsys):
    """``--calibration FILE`` made for this target and drafter sets ECHO's gates and is recorded;
    ``defaults`` is the paper's gates; a file made for another target is refused."""
    pytest.importorskip("sglang_echo.drafters.ngram")
    from sglang_echo.core.calibration_file import fingerprint
    from sglang_echo.core.factory import PolicyConfig
    from sglang_echo.integration.served_calibration import drafter_fingerprint

    from ..integration.test_config import write_calibration

    fp = drafter_fingerprint("ngram")
    mine = write_calibration(
        tmp_path / "mine.json", model_fp=fingerprint(tiny_llama_dir), drafter_fp=fp, thresholds=(0.7, 0.4), kind="ngram"
    )
    calib, source = acceptance.gating_calibration(str(mine), tiny_llama_dir, "ngram", None)
    gating = acceptance.build_policy("echo", PolicyConfig(), calib).gating
    assert source == str(mine) and (gating.depths, gating.thresholds) == ((1, 2), (0.7, 0.4))
    assert acceptance.gating_calibration("defaults", tiny_llama_dir, "ngram", None) == (
        None,
        "the paper's default gates",
    )

    args = ("--model", str(tiny_llama_dir), "--drafter", "ngram", "--policies", "echo")
    assert _run(tmp_path, *args, "--calibration", str(mine))["calibration"] == str(mine)
    other = write_calibration(tmp_path / "other.json", model_fp="sha256:other", drafter_fp=fp, kind="ngram")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # refused before the target loads
        acceptance.main([*args, *SMALL, "--calibration", str(other)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "different model" in err and err.count("\n") == 1


def test_eagle3(tmp_path, tiny_llama_dir):
    pytest.importorskip("sglang_echo.drafters.eagle3")
    from sglang_echo.models.tiny import write_tiny_eagle3_draft

    V = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    # sglang ids [0, 0, 1] = inputs of layers 1, 1 and 2 (2 = the last layer's output, pre-norm)
    draft = write_tiny_eagle3_draft(
        tmp_path / "e3", tiny_llama_dir, init="early_exit", aux_layer_ids=[0, 0, 1], draft_vocab_size=V
    ).path
    data = _run(
        tmp_path,
        "--model",
        str(tiny_llama_dir),
        "--drafter",
        "eagle3",
        "--draft",
        str(draft),
        "--policies",
        "chain2,echo",
    )
    assert data["captured_layers"] == [1, 1, 2]
    assert all(r["mismatches"] == 0 for r in data["rows"])


def test_mismatch_exits_nonzero(tmp_path, tiny_llama_dir, monkeypatch, capsys):
    pytest.importorskip("sglang_echo.drafters.ngram")
    import sglang_echo.eval as ev

    real = ev.speculative_generate

    def corrupt(*a, **k):
        res = real(*a, **k)
        res.tokens[0] = [t + 1 for t in res.tokens[0]]
        return res

    monkeypatch.setattr(ev, "speculative_generate", corrupt)
    assert (
        acceptance.main(
            [
                "--model",
                str(tiny_llama_dir),
                "--drafter",
                "ngram",
                "--policies",
                "chain2",
                *SMALL,
                "--out",
                str(tmp_path / "bad"),
            ]
        )
        == 1
    )
    assert "MISMATCH" in capsys.readouterr().err
    data = json.loads((tmp_path / "bad.json").read_text())
    assert data["mismatch_details"]


def test_the_shipped_head_is_the_default_draft_and_a_misfit_says_so(tiny_llama_dir, smollm2_dir, capsys):
    """Without --draft a learned drafter takes the head of its kind that ships, as `make serve`
    does; on a target it was not trained for, the command says why instead of failing later."""
    from sglang_echo.models.drafts import SMOLLM2_EAGLE3

    assert acceptance.shipped_draft(smollm2_dir, "eagle3").name.endswith(SMOLLM2_EAGLE3.name)
    with pytest.raises(SystemExit) as e:  # before the target loads
        acceptance.main(["--model", str(tiny_llama_dir), "--drafter", "eagle3", "--policies", "chain2", *SMALL])
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search("--drafter eagle3: .* was trained for a target with hidden_size", err)
