"""``echo-train-drafter --dataset``: conversations in the OpenAI chat format become training rows,
through the target regenerating the last answer or (``--keep-answers``) from the file's answers;
a bad line is one error naming file:line and the field, before any model loads."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_echo.models.prompts import Prompt
from sglang_echo.training import datagen
from sglang_echo.training.cli import main
from sglang_echo.training.datagen import prompt_ids
from sglang_echo.training.dataset import Conversation, DatasetError, answer_rows, dataset_data, read_dataset
from sglang_echo.training.shards import read_shards
from tests.training.test_datagen import _EchoAnswers

SYSTEM = {"role": "system", "content": "You are terse."}
U1 = {"role": "user", "content": "Name a colour."}
A1 = {"role": "assistant", "content": "Blue."}
U2 = {"role": "user", "content": "And a fruit?"}
HF = dict(max_new=4, batch=1, dtype="float32", device="cpu", backend="hf")
A2 = {"role": "assistant", "content": "A pear, ripe and sweet."}


def write(tmp_path, *rows, name="data.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


BAD = [
    ('{"messages": [', False, ":2: not JSON"),
    ("[1, 2]", False, ":2: expected a JSON object with 'messages', got list"),
    ({"prompt": "hi"}, False, ":2: messages: missing"),
    ({"messages": []}, False, ":2: messages: expected a non-empty list"),
    ({"messages": ["hi"]}, False, ":2: messages[0]: expected an object"),
    ({"messages": [{"role": "tool", "content": "x"}]}, False, ":2: messages[0].role: 'tool' is not one of"),
    ({"messages": [{"content": "x"}]}, False, ":2: messages[0].role: None is not one of"),
    ({"messages": [U1, {"role": "assistant", "content": " \n"}]}, False, ":2: messages[1].content: empty"),
    ({"messages": [{"role": "user", "content": 3}]}, False, ":2: messages[0].content: expected a string, got int"),
    ({"messages": [U1, SYSTEM]}, False, ":2: messages[1].role: a system turn may only come first"),
    ({"messages": [SYSTEM, A1]}, False, ":2: messages[0].role: 'system': the turn the target answers must be"),
    ({"messages": [U1, A1, A2]}, False, ":2: messages[1].role: 'assistant': the turn the target answers must be"),
    ({"messages": [A1]}, False, ":2: messages: only an assistant turn"),
    ({"messages": [SYSTEM, U1]}, True, ":2: messages: no assistant turn to train on (--keep-answers)"),
    ({"messages": [A1, U1, A2]}, True, ":2: messages[0].role: an assistant turn needs a user turn before it"),
]


@pytest.mark.parametrize("row, keep, message", BAD, ids=[b[2] for b in BAD])
def test_a_bad_line_is_named_by_file_line_and_field(tmp_path, row, keep, message):
    path = write(tmp_path, {"messages": [U1, A1]}, row)  # line 1 is good in both modes
    with pytest.raises(DatasetError) as e:
        read_dataset(path, keep_answers=keep)
    assert str(e.value).startswith(path + message), str(e.value)
    assert "\n" not in str(e.value)


def test_conversations_are_read_for_each_mode(tmp_path):
    """Blank lines are skipped (line numbers stay the file's); SpecForge's ``conversations`` key
    reads like ``messages``; regenerating drops the final answer and keeps earlier turns."""
    path = write(
        tmp_path,
        {"id": 7, "messages": [SYSTEM, U1, A1, U2, A2]},
        "",
        {"conversations": [U1, A1, U2]},
    )
    regen = read_dataset(path)
    assert [c.line for c in regen] == [1, 3]
    assert regen[0].messages == (SYSTEM, U1, A1, U2) and regen[1].messages == (U1, A1, U2)
    keep = read_dataset(path, keep_answers=True)
    assert keep[0].messages == (SYSTEM, U1, A1, U2, A2) and keep[1].messages == (U1, A1, U2)
    with pytest.raises(DatasetError, match="no conversations"):
        read_dataset(write(tmp_path, "", name="empty.jsonl"))
    (tmp_path / "latin1.jsonl").write_bytes('{"messages": [{"role": "user", "content": "café"}]}'.encode("latin-1"))
    with pytest.raises(DatasetError, match="latin1.jsonl: not UTF-8 text"):
        read_dataset(tmp_path / "latin1.jsonl")


def test_kept_answers_are_one_row_per_assistant_turn(tok):
    """Each row is the served prompt of the turns before an answer, then the answer's tokens up to
    the end-of-turn token: the loss (from the prompt length on) covers every answer once."""
    conv = Conversation(1, (SYSTEM, U1, A1, U2, A2))
    rows = answer_rows(tok, conv)
    assert len(rows) == 2
    for (ids, p), upto, answer in zip(rows, (2, 4), (A1, A2)):
        served = prompt_ids(tok, [Prompt("x", "t", messages=conv.messages[:upto])])[0]
        assert ids[:p] == served
        assert tok.decode(ids[p:]) == answer["content"] + tok.eos_token
        assert ids[-1] == tok.eos_token_id
    first, second = rows
    assert second[0][: len(first[0])] == first[0]  # the second prompt holds the first answer as context


class _Refusing:
    """A tokenizer whose template renders a turn differently once an answer follows it."""

    eos_token_id = 0

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        turns = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return turns + "<assistant>" if add_generation_prompt else turns.replace("<user>", "<u>")


def test_a_template_that_rewrites_earlier_turns_is_refused():
    with pytest.raises(DatasetError, match=r"^f\.jsonl:4: messages\[1\]: the chat template does not render"):
        answer_rows(_Refusing(), Conversation(4, (U1, A1)), "f.jsonl")


def test_regenerated_data_asks_the_target_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(datagen, "HFAnswers", _EchoAnswers)
    _EchoAnswers.asked = []
    path = write(tmp_path, *({"messages": [U1, A1, {"role": "user", "content": f"Number {i}?"}]} for i in range(5)))
    convs, out = read_dataset(path), tmp_path / "d"
    dataset_data(path, convs, "unused", out, keep_answers=False, shard_size=2, **HF)
    assert _EchoAnswers.asked == [f"dataset/{line}" for line in range(1, 6)]
    assert len(read_shards(out)) == 5 and len(list(out.glob("shard-*"))) == 3
    (out / "shard-00002.safetensors").unlink()
    _EchoAnswers.asked = []
    dataset_data(path, convs, "unused", out, keep_answers=False, shard_size=2, **HF)
    assert _EchoAnswers.asked == ["dataset/5"]  # only the missing shard
    with open(path, "a") as fh:  # another file content: the folder's shards would not match it
        fh.write(json.dumps({"messages": [U2]}) + "\n")
    with pytest.raises(ValueError, match="sha256"):
        dataset_data(path, convs, "unused", out, keep_answers=False, shard_size=2, **HF)


def test_the_cli_refuses_bad_datasets_before_any_work(tmp_path, capsys, monkeypatch):
    from sglang_echo.training import cli

    monkeypatch.setattr(cli, "_train", lambda args: pytest.fail("the work started"))
    bad = write(tmp_path, {"messages": [U1, A1]}, {"messages": [{"role": "user", "content": ""}]}, name="bad.jsonl")
    one = write(tmp_path, {"messages": [U1]}, name="one.jsonl")
    for argv, says in (
        (["--dataset", bad], f"argument --dataset: {bad}:2: messages[0].content: empty"),
        (["--keep-answers"], "argument --keep-answers: needs --dataset"),
        (["--dataset", str(tmp_path / "nope.jsonl")], "no such file"),
        (["--dataset", one, "--prompt-offset", "1"], "has 1 conversations"),
    ):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_one_sequence_is_refused_in_one_line(tmp_path, smollm2_dir, capsys):
    """A one-conversation file leaves nothing to train on once a sequence is held out."""
    from sglang_echo.models.tiny import write_tiny_llama

    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=6).path
    path = write(tmp_path, {"messages": [U1, A1]})
    assert main(["--model", str(target), "--out", str(tmp_path / "o"), "--dataset", path, "--keep-answers"]) == 1
    assert "holds 1 sequence: training needs 2 or more" in capsys.readouterr().err


def test_cli_trains_on_kept_answers(tmp_path, smollm2_dir):
    """--dataset --keep-answers end to end on a tiny target: multi-turn rows, features, a head."""
    from sglang_echo.models.tiny import write_tiny_llama

    torch.set_num_threads(1)
    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=6).path
    rows = [{"messages": [SYSTEM, U1, A1, U2, A2]}] + [
        {"messages": [{"role": "user", "content": f"Count to {i}."}, {"role": "assistant", "content": "1 2 3"}]}
        for i in range(3, 9)
    ]
    path = write(tmp_path, *rows)
    out = tmp_path / "head"
    flags = ["--epochs", "1", "--draft-vocab", "256", "--batch-tokens", "256", "--ttt-steps", "2", "--eval-fraction"]
    args = ["--model", str(target), "--out", str(out), "--dataset", path, "--keep-answers", "--num-prompts", "6"]
    assert main([*args, *flags, "0.2"]) == 0
    report = json.loads((out / "training_report.json").read_text())
    assert report["dataset"] == path and report["keep_answers"] and report["prompts"] == 6
    assert len(read_shards(out / "data")) == 7  # two rows for the two-answer conversation
    assert report["steps"] >= 1 and (out / "config.json").exists()


def test_the_target_regenerates_the_last_answer_after_multi_turn_context(tmp_path, smollm2_dir, tok):
    """Through transformers' generate on a tiny target: the prompt is the served rendering of
    every turn but the file's last answer, then at most max_new generated tokens."""
    from sglang_echo.models.tiny import write_tiny_llama

    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=2).path
    path = write(tmp_path, {"messages": [SYSTEM, U1, A1, U2, A2]}, {"messages": [U2]})
    convs = read_dataset(path)
    dataset_data(path, convs, target, tmp_path / "d", keep_answers=False, **HF)
    rows = read_shards(tmp_path / "d")
    assert len(rows) == 2
    for (ids, p), conv in zip(rows, convs):
        assert ids[:p].tolist() == prompt_ids(tok, [conv.prompt()])[0]
        assert 1 <= len(ids) - p <= 4
    assert A1["content"] in tok.decode(rows[0][0][: rows[0][1]]) and A2["content"] not in tok.decode(rows[0][0])
