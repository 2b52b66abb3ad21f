"""The training prompt pool is reproducible, distinct, mixed, and disjoint from every evaluation
set and from its own dev split; the templated turns of its conversations are right."""

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from sglang_echo.models.prompts import load_humaneval, read_jsonl
from sglang_echo.training import pool_kinds
from sglang_echo.training.pool_cli import main
from sglang_echo.training.pool_facts import invent
from sglang_echo.training.pool_sentences import LANGUAGES, PARALLEL, TARGET_LANGUAGES
from sglang_echo.training.prompt_pool import (
    DEV_SHARE,
    MIX,
    build_pool,
    dev_pool,
    is_dev,
    prompt_text,
)

ROOT = Path(__file__).resolve().parents[2]
DEV_PER_KIND = 64


def eval_texts() -> set[str]:
    texts = set()
    for path in (ROOT / "prompts").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            texts |= {row["prompt"]} if "prompt" in row else {m["content"] for m in row["messages"]}
    return texts


def contents(p) -> set[str]:
    """Every text a prompt shows the target: the raw prompt or each turn."""
    return {p.prompt} if p.prompt is not None else {m["content"] for m in p.messages}


def dev_split() -> list:
    return [p for kind in MIX for p in dev_pool(kind, DEV_PER_KIND)]


def test_pool_is_reproducible_and_distinct():
    a, b = build_pool(2000, seed=3), build_pool(2000, seed=3)
    assert [prompt_text(p) for p in a] == [prompt_text(p) for p in b]
    assert len({prompt_text(p) for p in a}) == 2000
    assert [prompt_text(p) for p in build_pool(50, seed=4)] != [prompt_text(p) for p in build_pool(50, seed=3)]


def test_a_smaller_pool_is_a_prefix_of_a_larger_one():
    """Data shards are slices of the pool, so a run with more prompts extends a smaller one."""
    small, large = build_pool(300), build_pool(900)
    assert [prompt_text(p) for p in small] == [prompt_text(p) for p in large[:300]]
    assert [prompt_text(p) for p in dev_pool("rag", 10)] == [prompt_text(p) for p in dev_pool("rag", 30)[:10]]


def test_pool_mixes_every_kind_in_its_shape():
    pool = build_pool(3000)
    counts = Counter(p.id.split("/")[1] for p in pool)
    assert set(counts) == set(MIX) == set(pool_kinds.KINDS)
    for kind, share in MIX.items():  # finite kinds may hand some of their share on, never most of it
        assert counts[kind] >= 0.5 * share * len(pool), (kind, counts)
    for p in pool:
        kind = p.meta["kind"]
        assert p.id.split("/")[1] == kind
        assert p.is_chat != (kind == "code")  # code completions are raw text, like HumanEval; the rest are chat
        if kind == "code":
            assert p.prompt.startswith("def ") and '"""' in p.prompt
            continue
        roles = [m["role"] for m in p.messages]
        if kind == "multi-turn":  # two or three user turns, alternating with assistant turns
            assert roles in (["user", "assistant", "user"], ["user", "assistant"] * 2 + ["user"]), roles
        else:
            assert roles == ["user"]
        if kind == "translation":
            assert any(lang in p.messages[0]["content"] for lang in TARGET_LANGUAGES)
        if kind == "rag":  # a question about an entity or function, with the passage that answers it
            text = p.messages[0]["content"]
            assert len(text) > 200 and p.meta["group"] in text, text


def test_pool_is_disjoint_from_evaluation_prompts():
    """No turn of any pool or dev-split prompt is a prompt or turn of `prompts/` or HumanEval."""
    evals = eval_texts()
    assert evals, "the dev prompt sets should be found"
    humaneval = {p.prompt for p in load_humaneval()}
    assert len(humaneval) == 164
    texts = set().union(*(contents(p) for p in [*build_pool(6000), *dev_split()]))
    assert not texts & evals
    assert not texts & humaneval


def test_no_dev_prompt_is_in_training():
    """The dev split holds out whole groups: no dev prompt, and no dev passage or function stub
    under any other wording, reaches a training prompt."""
    train, dev = build_pool(6000), dev_split()
    assert all(len([p for p in dev if p.meta["kind"] == k]) == DEV_PER_KIND for k in MIX)
    assert not {prompt_text(p) for p in train} & {prompt_text(p) for p in dev}
    assert not any(is_dev(p.meta["group"]) for p in train) and all(is_dev(p.meta["group"]) for p in dev)
    train_text = "\n".join(prompt_text(p) for p in train)
    held_out = [p.meta["group"] for p in dev if p.meta["kind"] in ("summarize", "code")]
    assert len(held_out) == 2 * DEV_PER_KIND
    assert not [g for g in held_out if g in train_text]  # verbatim content, so a substring test is exact
    trained = [p.meta["group"] for p in train if p.meta["kind"] in ("summarize", "code")]
    assert sum(map(is_dev, trained)) == 0 and len(trained) > 500


def test_the_dev_share_is_about_what_it_says():
    groups = [f"group {i}" for i in range(20000)]
    assert abs(sum(map(is_dev, groups)) / len(groups) - DEV_SHARE) < 0.01


def test_the_dev_split_is_written_per_kind_in_the_prompts_format(tmp_path):
    assert main(["--out", str(tmp_path), "--per-kind", "5"]) == 0
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(f"{k}_dev.jsonl" for k in MIX)
    for kind in MIX:
        rows = read_jsonl((tmp_path / f"{kind}_dev.jsonl").read_text().splitlines(), kind)
        assert [prompt_text(p) for p in rows] == [prompt_text(p) for p in dev_pool(kind, 5)]
        assert all(p.meta["kind"] == kind for p in rows)
    with pytest.raises(ValueError, match="kind 'poems'"):
        dev_pool("poems", 1)


def _numbers(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def test_templated_math_turns_are_right():
    rng = random.Random(0)
    checked = 0
    for _ in range(300):
        d = pool_kinds._math_dialogue(rng, three=True)
        for m in d.messages[1::2]:  # "a op b = c" in every assistant turn
            a, b, c = _numbers(m["content"])[-3:]
            op = re.search(r"[×÷−]", m["content"]).group()
            assert {"×": a * b, "÷": a / b, "−": a - b}[op] == c, m["content"]
            checked += 1
    assert checked == 600


def test_templated_translation_turns_are_the_parallel_sentences():
    rng = random.Random(1)
    for _ in range(200):
        d = pool_kinds._translation_dialogue(rng, three=True)
        row = next(r for r in PARALLEL if r[0] in d.messages[0]["content"])
        for ask, answer in ((d.messages[0], d.messages[1]), (d.messages[2], d.messages[3])):
            lang = next(lang for lang in LANGUAGES[1:] if lang in ask["content"])
            assert answer["content"] == row[LANGUAGES.index(lang)]


def test_invented_facts_answer_from_their_passage():
    """Every fact an answer states (its numbers and names) is in the entity's passage."""
    rng = random.Random(2)
    for _ in range(200):
        facts = invent(rng)
        assert facts.passage.count(facts.name) >= 1
        for _question, answer in facts.qa:
            for n in _numbers(answer):
                assert f"{n:,}" in facts.passage or str(n) in facts.passage, (answer, facts.passage)
            for word in re.findall(r"\b[A-Z][a-z]+\b", answer):
                assert word in facts.passage or word in ("The", "Adults", "It", "In", "Hold", "A"), (word, answer)
