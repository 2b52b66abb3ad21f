"""DART's n-gram trie (``drafters/ngram_trie.py``): counts and continuation probabilities, a
request's own history as local counts, its safetensors file and the errors bad ones give, and
``echo-build-ngram``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from sglang_echo.drafters.ngram_trie import LocalNGrams, NGramTrie, NGramTrieError, continuation_prob

V = 97
TOY = torch.tensor([1, 2, 3, 2, 2, 1, 3, 2, 3, 1, 2])  # the example in DART's trie_ngram.cpp


def test_trie_counts_and_dart_probabilities(tmp_path):
    trie = NGramTrie.build([TOY, torch.tensor([5])], vocab_size=V, order=3)
    assert trie.keys[0].numel() == 4 and int(trie.count(1, torch.tensor(2))) == 5
    # bigrams 12 23 32 22 21 13 32 23 31 12; trigrams 123 232 322 221 213 132 323 231 312
    assert (
        int(trie.count(2, torch.tensor(1 * V + 2))) == 2 and int(trie.count(3, torch.tensor((2 * V + 3) * V + 1))) == 1
    )
    trie.save(tmp_path / "toy.safetensors")
    loaded = NGramTrie.load(tmp_path / "toy.safetensors", vocab_size=V)
    assert loaded.order == 3 and loaded.meta["tokens"] == "12"
    ctx = torch.tensor([[[2, 3], [2, 3], [2, 3], [3, 1], [-1, 2], [9, 9]]])
    tok = torch.tensor([[1, 2, 3, 2, 1, 1]])
    # (2,3) occurs twice, followed by 2 and 1; 3 never follows (2,3) nor 3; (3,1)->2 once;
    # (-1,2) backs off to (2,): 5 occurrences, one followed by 1; (9,9) and (9,) are unseen.
    for t in (trie, loaded):
        p, m = continuation_prob(ctx, tok, 3, V, trie=t)
        assert p[0].tolist() == pytest.approx([0.5, 0.5, 0.0, 1.0, 0.2, 0.0])
        assert m[0].tolist() == [2, 2, 0, 2, 1, 0]
    # The same counts from a request's own history, and the two combined as pseudo-counts.
    local = LocalNGrams(torch.cat([TOY, torch.zeros(4, dtype=torch.int64)])[None], torch.tensor([11]), 3, V)
    p, _ = continuation_prob(ctx, tok, 3, V, local=local)
    assert p[0].tolist() == pytest.approx([0.5, 0.5, 0.0, 1.0, 0.2, 0.0])
    p, _ = continuation_prob(ctx, tok, 3, V, trie=trie, local=local, local_weight=3.0)
    assert p[0].tolist() == pytest.approx([0.5, 0.5, 0.0, 1.0, 0.2, 0.0])  # same ratios, 4x the counts


def test_bad_trie_files_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00not a safetensors file at all")
    with pytest.raises(NGramTrieError, match="not a safetensors n-gram trie"):
        NGramTrie.load(junk)
    with pytest.raises(NGramTrieError, match="no such"):
        NGramTrie.load(tmp_path / "missing.safetensors")
    other = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(other))
    with pytest.raises(NGramTrieError, match="not an sglang-echo n-gram trie"):
        NGramTrie.load(other)
    good = tmp_path / "good.safetensors"
    NGramTrie.build([TOY], vocab_size=V).save(good)
    with pytest.raises(NGramTrieError, match="97-token vocabulary, the target has 50"):
        NGramTrie.load(good, vocab_size=50)
    from safetensors import safe_open

    with safe_open(str(good), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["keys.2"] = t["keys.2"].flip(0)
    save_file(t, str(tmp_path / "unsorted.safetensors"), metadata=meta)
    with pytest.raises(NGramTrieError, match="not sorted"):
        NGramTrie.load(tmp_path / "unsorted.safetensors")


def test_build_ngram_cli(tmp_path, capsys):
    from sglang_echo.training.ngram_cli import main as build_ngram_main
    from sglang_echo.training.shards import write_shard

    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    _write_char_tokenizer(tok_dir)
    shards = tmp_path / "sd"
    shards.mkdir()
    write_shard(shards / "shard-00000.safetensors", [(TOY.tolist(), 3), ([4, 5, 6], 1)])
    out = tmp_path / "t.safetensors"
    assert build_ngram_main([str(shards), "--model", str(tok_dir), "--out", str(out)]) == 0
    trie = NGramTrie.load(out, vocab_size=V)
    assert trie.meta["tokens"] == "14" and "wrote" in capsys.readouterr().out
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"tokens": [1, 2, 3]}\n{"text": "ab"}\n\n')
    assert build_ngram_main([str(jl), "--model", str(tok_dir), "--out", str(out), "--answers-only"]) == 0
    assert NGramTrie.load(out).meta["sequences"] == "2"
    jl.write_text('{"tokens": [1, 2]}\n{"oops": 1}\n')
    assert build_ngram_main([str(jl), "--model", str(tok_dir), "--out", str(out)]) == 1  # found while counting
    assert "echo-build-ngram: error: " in (err := capsys.readouterr().err) and "c.jsonl:2" in err
    for bad, msg in ((tmp_path / "tok", "without self-distillation shards"), (tmp_path / "nope.jsonl", "no such file")):
        with pytest.raises(SystemExit) as e:  # found before any work
            build_ngram_main([str(bad), "--model", str(tok_dir), "--out", str(out)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and err.count("\n") == 1


def _write_char_tokenizer(d):
    """A tiny word-level tokenizer (no network) with V ids; config.json gives the vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {chr(97 + i): i + 10 for i in range(26)} | {"[UNK]": 0}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(str(d))
    (d / "config.json").write_text(json.dumps({"vocab_size": V}))
