"""Staging a shipped head next to its target: geometry checked, and a retrained head restaged."""

import json

import pytest

from sglang_echo.models.drafts import DraftMismatch, stage_head


def _dirs(tmp_path, hidden=8, vocab=32):
    target, head = tmp_path / "target", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": hidden, "vocab_size": vocab}))
    (target / "tokenizer.json").write_text("{}")
    (head / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 32}))
    (head / "model.safetensors").write_bytes(b"a" * 16)
    return target, head


def test_a_retrained_head_of_the_same_size_is_restaged(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_ECHO_CACHE", str(tmp_path / "cache"))
    target, head = _dirs(tmp_path)
    staged = stage_head(target, head)
    assert (staged / "model.safetensors").read_bytes() == b"a" * 16
    assert (staged / "tokenizer.json").is_file()
    (head / "model.safetensors").write_bytes(b"b" * 16)  # same config, same size, new weights
    assert (stage_head(target, head) / "model.safetensors").read_bytes() == b"b" * 16


def test_a_head_for_another_target_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_ECHO_CACHE", str(tmp_path / "cache"))
    target, head = _dirs(tmp_path, hidden=16)
    with pytest.raises(DraftMismatch, match="hidden_size"):
        stage_head(target, head)


def test_a_head_in_any_weight_layout_is_staged_whole(tmp_path, monkeypatch):
    """Sharded .bin: the index and every shard it names travel; a folder without weights is refused."""
    monkeypatch.setenv("SGLANG_ECHO_CACHE", str(tmp_path / "cache"))
    target, head = _dirs(tmp_path)
    (head / "model.safetensors").unlink()
    shards = {"a.weight": "pytorch_model-00001-of-00002.bin", "b.weight": "pytorch_model-00002-of-00002.bin"}
    (head / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": shards}))
    for name in shards.values():
        (head / name).write_bytes(name.encode())
    staged = stage_head(target, head)
    for name in ["pytorch_model.bin.index.json", *shards.values()]:
        assert (staged / name).read_bytes() == (head / name).read_bytes(), name
    for name in shards.values():
        (head / name).unlink()
    with pytest.raises(DraftMismatch, match="names shard\\(s\\) missing"):
        stage_head(target, head)
    (head / "pytorch_model.bin.index.json").unlink()
    with pytest.raises(DraftMismatch, match="no head weights \\(looked for model.safetensors.index.json"):
        stage_head(target, head)
