"""Training data from the user's own conversations: ``echo-train-drafter --dataset FILE.jsonl``.

One JSON object a line, with ``messages``: the OpenAI chat format, a list of ``{"role":
"system" | "user" | "assistant", "content": str}``; SpecForge's key ``conversations`` is read the
same way, other keys are ignored. The target's chat template (its tokenizer's) renders every
prompt, as the server renders a chat request.

Two ways to make the training rows, written as the self-distillation shards are (``shards``):

* **regenerate** (default): the target answers each conversation's last user turn, through the
  same backends as the prompt pool (``datagen.answer_into``: the sglang server by default), so
  the head learns what the target says. A final assistant turn in the file is dropped: it is the
  answer being regenerated. Earlier turns, assistant ones included, stay as context;
* **keep answers** (``--keep-answers``): the file's assistant turns are the answers. A
  conversation gives one row per assistant turn: everything before the turn, rendered with the
  generation prompt as the server would, then the turn's tokens up to the end-of-turn token.
  The loss starts at a row's prompt length (the pipeline's only mask), so it covers every
  assistant token once and no user or system token.

A bad line is refused before any model loads, with one message naming ``file:line`` and the
field (:class:`DatasetError`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sglang_echo.models.prompts import Message, Prompt

from .datagen import answer_into, check_manifest, prompt_ids, up_to_eos
from .shards import shard_path, write_shard

ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = ("messages", "conversations")


class DatasetError(ValueError):
    """A line of a ``--dataset`` file that cannot be used; the message names ``file:line`` and the field."""


@dataclass(frozen=True)
class Conversation:
    line: int  # 1-based line of the file
    messages: tuple[Message, ...]

    def prompt(self, messages: tuple[Message, ...] | None = None) -> Prompt:
        return Prompt(f"dataset/{self.line}", "dataset", messages=self.messages if messages is None else messages)


def _check_turns(where: str, msgs: object) -> tuple[Message, ...]:
    if not isinstance(msgs, list) or not msgs:
        raise DatasetError(f"{where}: messages: expected a non-empty list of {{role, content}} turns")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise DatasetError(f"{where}: messages[{i}]: expected an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise DatasetError(f"{where}: messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}")
        if role == "system" and i > 0:
            raise DatasetError(f"{where}: messages[{i}].role: a system turn may only come first")
        if not isinstance(content, str):
            raise DatasetError(f"{where}: messages[{i}].content: expected a string, got {type(content).__name__}")
        if not content.strip():
            raise DatasetError(f"{where}: messages[{i}].content: empty")
        out.append({"role": role, "content": content})
    return tuple(out)


def _check_shape(where: str, msgs: tuple[Message, ...], keep_answers: bool) -> tuple[Message, ...]:
    """The turns training uses: up to the last user turn (regenerate), or as given (keep)."""
    roles = [m["role"] for m in msgs]
    if keep_answers:
        if "assistant" not in roles:
            raise DatasetError(f"{where}: messages: no assistant turn to train on (--keep-answers)")
        first = roles.index("assistant")
        if "user" not in roles[:first]:
            raise DatasetError(f"{where}: messages[{first}].role: an assistant turn needs a user turn before it")
        return msgs
    if roles[-1] == "assistant":  # the answer the target rewrites
        msgs, roles = msgs[:-1], roles[:-1]
    if not roles or roles[-1] != "user":
        i = len(roles) - 1
        got = f"messages[{i}].role: {roles[i]!r}" if roles else "messages: only an assistant turn"
        raise DatasetError(f"{where}: {got}: the turn the target answers must be a user turn")
    return msgs


def read_dataset(path: str | Path, keep_answers: bool = False) -> list[Conversation]:
    """Every conversation of a JSONL file, checked; blank lines are skipped."""
    path = Path(path)
    out = []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: JSON strings may hold U+2028
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: expected a JSON object with 'messages', got {type(obj).__name__}")
        key = next((k for k in MESSAGE_KEYS if k in obj), None)
        if key is None:
            raise DatasetError(f"{where}: messages: missing (a list of {{role, content}} turns)")
        out.append(Conversation(n, _check_shape(where, _check_turns(where, obj[key]), keep_answers)))
    if not out:
        raise DatasetError(f"{path}: no conversations in the file")
    return out


def answer_rows(tok, conv: Conversation, source: str = "dataset") -> list[tuple[list[int], int]]:
    """``(ids, prompt length)`` per assistant turn of ``conv`` (``--keep-answers``).

    The prompt is tokenized as :func:`~.datagen.prompt_ids` tokenizes a served prompt; the answer
    is the text the template adds for the turn, cut after the first EOS (as generated rows are).
    The template must render the conversation before the turn as a prefix of the one with it."""
    rows = []
    for i, m in enumerate(conv.messages):
        if m["role"] != "assistant":
            continue
        head = conv.prompt(conv.messages[:i])
        try:
            prefix = head.as_text(tok)
            full = tok.apply_chat_template(list(conv.messages[: i + 1]), tokenize=False)
        except Exception as e:  # a template that refuses the turn order (jinja raises its own errors)
            raise DatasetError(f"{source}:{conv.line}: the chat template refuses this conversation: {e}") from None
        if not full.startswith(prefix):
            raise DatasetError(
                f"{source}:{conv.line}: messages[{i}]: the chat template does not render the turns before "
                "this answer as a prefix of the conversation with it (use the default, regenerate)"
            )
        answer = tok(full[len(prefix) :], add_special_tokens=False)["input_ids"]
        rows.append(up_to_eos(prompt_ids(tok, [head])[0], answer, tok.eos_token_id))
    return rows


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dataset_data(
    path: str | Path,
    conversations: list[Conversation],
    model_dir: str | Path,
    out: str | Path,
    keep_answers: bool,
    shard_size: int = 128,
    **answering,
) -> None:
    """Training rows of ``conversations`` (read from ``path``) in ``out/shard-*.safetensors``,
    ``shard_size`` conversations a shard, resumable like the pool's self-distillation; the
    manifest ties the folder to this file's content and these settings.

    ``answering``: how the target regenerates answers, the ``max_new``, ``batch``, ``dtype``,
    ``device`` and ``backend`` of :func:`~.datagen.answer_into` (unused with ``keep_answers``)."""
    out = Path(out)
    settings = {
        "dataset": str(Path(path).resolve()),
        "sha256": file_digest(Path(path)),
        "lines": [conversations[0].line, conversations[-1].line, len(conversations)],
        "keep_answers": keep_answers,
        "shard_size": shard_size,
    }
    if not keep_answers:
        settings["max_new"] = answering["max_new"]
    check_manifest(out, settings)
    if not keep_answers:
        answer_into(out, [c.prompt() for c in conversations], model_dir, shard_size=shard_size, **answering)
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    for k in range(0, len(conversations), shard_size):
        shard = shard_path(out, k // shard_size)
        if not shard.exists():
            write_shard(shard, [row for c in conversations[k : k + shard_size] for row in answer_rows(tok, c, path)])
