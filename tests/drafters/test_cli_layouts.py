"""The offline tools take a head folder in any published weight layout: ``echo-bench acceptance``
(whose ``build_drafter`` also loads ``echo-replay``'s heads) drafts exactly the same with a sharded
``.bin`` copy of a head as with its ``model.safetensors``."""

from __future__ import annotations

import json

import pytest

from sglang_echo.bench import acceptance
from tests.drafters.test_checkpoint import resave

SMALL = [
    "--prompts",
    "chat",
    "--per-set",
    "2",
    "--max-new-tokens",
    "6",
    "--batch",
    "2",
    "--max-depth",
    "3",
    "--topk",
    "2",
    "--total-tokens",
    "6",
    "--device",
    "cpu",
    "--policies",
    "chain3,static-tree",
    "--calibration",
    "defaults",
]
SAME = ("prompts", "policy", "requests", "steps", "mat", "verified_per_step", "yield", "generated", "mismatches")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2_dir):
    """A tiny random Llama (SmolLM2 tokenizer) and a random EAGLE-3 head for it (safetensors)."""
    from sglang_echo.models.tiny import write_tiny_eagle3_draft, write_tiny_llama

    root = tmp_path_factory.mktemp("cli-layouts")
    target = write_tiny_llama(root / "tiny-llama", smollm2_dir).path
    V = json.loads((target / "config.json").read_text())["vocab_size"]
    head = write_tiny_eagle3_draft(root / "e3", target, aux_layer_ids=[0, 0, 1], draft_vocab_size=V, seed=3)
    return target, head.path


def test_acceptance_reads_a_sharded_bin_head_as_its_safetensors(tmp_path, tiny):
    target, head = tiny
    rows = {}
    for layout in ("safetensors", "sharded-bin"):
        draft = head if layout == "safetensors" else resave(head, tmp_path / layout, layout)
        out = tmp_path / f"res-{layout}"
        acceptance.main(
            ["--model", str(target), "--drafter", "eagle3", "--draft", str(draft), *SMALL, "--out", str(out)]
        )
        data = json.loads(out.with_suffix(".json").read_text())
        rows[layout] = [{k: r[k] for k in SAME} for r in data["rows"]]
    assert not list((tmp_path / "sharded-bin").glob("*.safetensors"))
    assert rows["sharded-bin"] == rows["safetensors"]
    assert all(r["mismatches"] == 0 and r["generated"] > 0 for r in rows["safetensors"])


def test_a_folder_without_weights_stops_the_cli_with_the_loader_error(tmp_path, tiny, capsys):
    target, head = tiny
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((head / "config.json").read_text())
    with pytest.raises(SystemExit) as e:  # one line, before the target loads; nothing written
        acceptance.main(
            [
                "--model",
                str(target),
                "--drafter",
                "eagle3",
                "--draft",
                str(tmp_path / "empty"),
                *SMALL,
                "--out",
                str(tmp_path / "res"),
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "no head weights (looked for model.safetensors" in err and not list(tmp_path.glob("res*"))
