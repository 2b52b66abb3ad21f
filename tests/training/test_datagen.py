"""Self-distillation through the real server writes what transformers' greedy decoding writes."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.training import datagen
from sglang_echo.training.datagen import generate, up_to_eos
from sglang_echo.training.prompt_pool import build_pool
from sglang_echo.training.shards import read_shards


def test_rows_end_at_the_first_eos():
    assert up_to_eos([1, 2], [5, 6, 0, 7, 0], eos=0) == ([1, 2, 5, 6, 0], 2)
    assert up_to_eos([1], [5, 6], eos=0) == ([1, 5, 6], 1)


def test_an_unknown_backend_is_refused(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        generate(tmp_path, tmp_path / "d", prompts=1, backend="vllm")


class _EchoAnswers:
    """A backend that answers every prompt with its pool index, recording what it was asked."""

    asked: list[str] = []

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def answer_shards(self, shards, max_new, bar):
        for shard in shards:
            _EchoAnswers.asked += [p.id for p in shard]
            yield [([7], 1) for _ in shard]


def test_an_offset_takes_the_pool_prompts_after_it_and_shards_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(datagen, "HFAnswers", _EchoAnswers)
    _EchoAnswers.asked = []
    generate("unused", tmp_path, prompts=5, shard_size=2, backend="hf", offset=3)
    assert _EchoAnswers.asked == [p.id for p in build_pool(8)[3:]]
    assert len(read_shards(tmp_path)) == 5 and len(list(tmp_path.glob("shard-*"))) == 3
    (tmp_path / "shard-00001.safetensors").unlink()
    _EchoAnswers.asked = []
    generate("unused", tmp_path, prompts=5, shard_size=2, backend="hf", offset=3)
    assert _EchoAnswers.asked == [p.id for p in build_pool(8)[5:7]]  # only the missing shard
    with pytest.raises(ValueError, match="offset"):  # another slice of the pool would reuse the shard names
        generate("unused", tmp_path, prompts=5, shard_size=2, backend="hf", offset=0)


@pytest.mark.server
def test_the_server_backend_answers_as_hf_generate(tmp_path, smollm2_dir):
    """SmolLM2 in float32, both backends: the same rows, shard by shard; a finished directory is
    not regenerated (resumable)."""
    kw = dict(prompts=6, max_new=24, shard_size=4, dtype="float32", device="cpu")
    generate(smollm2_dir, tmp_path / "server", backend="server", batch=4, **kw)
    generate(smollm2_dir, tmp_path / "hf", backend="hf", batch=1, **kw)  # batch 1: no padding
    served, hf = read_shards(tmp_path / "server"), read_shards(tmp_path / "hf")
    assert len(served) == len(hf) == 6
    assert len(list((tmp_path / "server").glob("shard-*.safetensors"))) == 2
    for (s, sp), (h, hp) in zip(served, hf):
        assert sp == hp and torch.equal(s, h)
    assert any(len(s) - p == 24 for s, p in served)  # some answers ran to max_new
    log = tmp_path / "server" / "datagen-server.log"
    size = log.stat().st_size
    generate(smollm2_dir, tmp_path / "server", backend="server", batch=4, **kw)
    assert log.stat().st_size == size  # nothing left to do: no server started
