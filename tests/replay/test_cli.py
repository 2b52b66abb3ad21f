"""``echo-replay`` end to end on the tiny model: record -> validate -> run (n-gram drafter)."""

from __future__ import annotations

import json

from sglang_echo.replay.cli import main
from sglang_echo.replay.trace import Trace

from .test_cost import _cost_file

POLICY = [
    "--policies",
    "chain,static-tree,echo",
    "--max-depth",
    "3",
    "--topk",
    "3",
    "--total-tokens",
    "6",
    "--w-max",
    "3",
]


def test_record_validate_run(tmp_path, tiny_llama_dir, capsys):
    stem = tmp_path / "trace"
    main(
        [
            "record",
            "--model",
            str(tiny_llama_dir),
            "--drafter",
            "ngram",
            "--prompts",
            "chat,humaneval",
            "--per-set",
            "2",
            "--max-new-tokens",
            "8",
            "--depth",
            "3",
            "--width",
            "3",
            "--beams",
            "1,3",
            "--batch",
            "2",
            "--threads",
            "1",
            "--out",
            str(stem),
        ]
    )
    tr = Trace.load(stem)
    assert tr.num_prompts == 4 and tr.meta.drafter == "ngram" and tr.meta.prompts[0].startswith("chat")
    assert tr.meta.eos_id is not None and tr.meta.stats["record_seconds"] > 0

    main(
        [
            "validate",
            "--trace",
            str(stem),
            "--num-prompts",
            "2",
            "--batch",
            "2",
            "--k-max",
            "3x",
            *POLICY,
            "--out",
            str(tmp_path / "val.json"),
        ]
    )
    val = json.loads((tmp_path / "val.json").read_text())
    assert [r["policy"] for r in val["rows"]] == ["chain", "static-tree", "echo"] and all(
        r["exact"] for r in val["rows"]
    )

    _cost_file(tmp_path)  # writes tmp_path / "cost.json" (label "unit", an eagle3 draft curve)
    cost = tmp_path / "cost.json"
    main(
        [
            "run",
            "--trace",
            str(stem),
            "--cost",
            str(cost),
            "--batch-sizes",
            "1,4",
            "--k-max",
            "3x",
            "--min-steps",
            "4",
            *POLICY,
            "--out",
            str(tmp_path / "res"),
        ]
    )
    res = json.loads((tmp_path / "res.json").read_text())
    rows = res["rows"]
    assert [(r["policy_arg"], r["batch"]) for r in rows] == [
        (p, b) for b in (1, 4) for p in ("chain", "static-tree", "echo")
    ]
    for r in rows:
        assert r["coverage"] == 1.0 and r["k_max"] == 3 * r["batch"] and r["steps"] >= 4
        assert r["throughput"][0]["cost"] == "unit" and not r["throughput"][0]["draft_priced"]  # ngram: not priced
    md = (tmp_path / "res.md").read_text()
    assert "oracle frac" in md and "echo oracle frac" in md
    assert "oracle frac" in capsys.readouterr().out
