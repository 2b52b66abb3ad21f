"""The training prompt pool is reproducible, distinct, and disjoint from every evaluation set."""

import json
from pathlib import Path

from sglang_echo.training.prompt_pool import build_pool

ROOT = Path(__file__).resolve().parents[2]


def eval_texts() -> set[str]:
    texts = set()
    for path in (ROOT / "prompts").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            texts |= {row["prompt"]} if "prompt" in row else {m["content"] for m in row["messages"]}
    return texts


def test_pool_is_reproducible_and_distinct():
    a, b = build_pool(2000, seed=3), build_pool(2000, seed=3)
    assert a == b and len(set(a)) == 2000
    assert build_pool(50, seed=4) != build_pool(50, seed=3)


def test_pool_is_disjoint_from_evaluation_prompts():
    evals = eval_texts()
    assert evals, "the dev prompt sets should be found"
    assert not evals & set(build_pool(3000))

