"""The training prompt pool is reproducible, distinct, mixed, and disjoint from every evaluation set."""

import json
from collections import Counter
from pathlib import Path

from sglang_echo.models.prompts import load_humaneval
from sglang_echo.training.prompt_pool import MIX, build_pool, prompt_text

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
    assert [prompt_text(p) for p in a] == [prompt_text(p) for p in b]
    assert len({prompt_text(p) for p in a}) == 2000
    assert [prompt_text(p) for p in build_pool(50, seed=4)] != [prompt_text(p) for p in build_pool(50, seed=3)]


def test_a_smaller_pool_is_a_prefix_of_a_larger_one():
    """Data shards are slices of the pool, so a run with more prompts extends a smaller one."""
    small, large = build_pool(300), build_pool(900)
    assert [prompt_text(p) for p in small] == [prompt_text(p) for p in large[:300]]


def test_pool_mixes_every_source_in_its_shape():
    pool = build_pool(3000)
    counts = Counter(p.id.split("/")[1] for p in pool)
    assert set(counts) == set(MIX)
    for source, share in MIX.items():  # finite sources may hand some of their share on, never most of it
        assert counts[source] >= 0.5 * share * len(pool), (source, counts)
    for p in pool:
        raw = p.id.split("/")[1] == "code"
        assert p.is_chat != raw  # code completions are raw text, like HumanEval; the rest are chat
        if raw:
            assert p.prompt.startswith("def ") and '"""' in p.prompt


def test_pool_is_disjoint_from_evaluation_prompts():
    evals = eval_texts()
    assert evals, "the dev prompt sets should be found"
    humaneval = {p.prompt for p in load_humaneval()}
    assert len(humaneval) == 164
    texts = {prompt_text(p) for p in build_pool(6000)}
    assert not texts & evals
    assert not texts & humaneval
