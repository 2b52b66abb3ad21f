"""EAGLE-3 training: the TTT unroll is what the drafter computes, training learns, runs resume.

The unroll check is the one that matters for acceptance: step ``j`` at pair ``t`` must equal the
head recomputed without any cache over the committed pairs ``0..t`` followed by ``j`` draft steps
(each fed the previous step's output and the true next token), i.e. sglang's draft at depth
``j + 1`` when every earlier draft was right.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

from sglang_echo.drafters.eagle3_head import Eagle3Head
from sglang_echo.training.batches import collate
from sglang_echo.training.eagle3 import draft_vocab, init_head, ttt_loss, ttt_unroll
from sglang_echo.training.features import Sequence
from sglang_echo.training.trainer import TrainConfig, resolve_precision, train
from tests.drafters.test_eagle3 import DT, VD, H, V, make_head, reference_logps
from tests.training.resume import train_interrupted_and_resumed


def _sequences(n: int, seed: int = 0, period: int = 0) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 12 + 3 * i
        toks = torch.randint(0, V, (T,), generator=g)
        if period:  # a learnable pattern: every text cycles through the same `period` tokens
            toks = (torch.arange(T) + i) % period * 7 + 1
        out.append(Sequence(toks, prompt_len=3, features=torch.randn(T, 3 * H, generator=g, dtype=DT)))
    return out


def test_ttt_unroll_equals_cache_free_drafting():
    head = make_head(seed=1)
    seqs = _sequences(3)
    batch = collate(seqs)
    steps = 4
    outs = [head.logits(h) for h in ttt_unroll(head, batch, steps)]
    for b, s in enumerate(seqs):
        for t in (0, 4, len(s.tokens) - steps - 2):
            committed_feats, committed_toks = s.features[: t + 1], s.tokens[1 : t + 2]
            path = s.tokens[t + 2 : t + 1 + steps].tolist()  # true tokens fed to steps 1..steps-1
            ref = reference_logps(head, committed_feats, committed_toks, path)
            for j in range(steps):
                got = torch.log_softmax(outs[j][b, t].double(), -1)
                assert torch.allclose(got, ref[j], atol=1e-9), (b, t, j)


def test_accuracy_counts_every_answer_label_and_misses_out_of_vocab_ones():
    """Prompt and padding positions are not counted; an answer label outside the draft vocabulary
    is (the verifier would reject such a draft), and it is never a hit."""
    head = make_head()
    seqs = _sequences(2)
    _, correct, counted = ttt_loss(head, collate(seqs), steps=2)
    for j in range(2):
        labels = [s.tokens[max(s.prompt_len, j + 2) :] for s in seqs]
        assert int(counted[j]) == sum(len(x) for x in labels)
        assert int(correct[j]) <= sum(int(head.t2d[x].sum()) for x in labels) < int(counted[j])


def test_revocab_carries_the_earlier_head_over():
    """``--init-from --revocab``: every weight but the LM head is the earlier head's; the LM-head
    rows of tokens in both vocabularies move to their new rows, new tokens keep the fresh rows."""
    from sglang_echo.training.eagle3 import carry_over

    earlier, fresh = make_head(seed=1), make_head(seed=2)
    before = fresh.lm_head.weight.clone()
    carry_over(earlier, fresh)
    assert torch.equal(fresh.fc.weight, earlier.fc.weight) and torch.equal(fresh.norm.weight, earlier.norm.weight)
    assert torch.equal(fresh.t2d, make_head(seed=2).t2d)  # the new vocabulary stays
    old_ids, new_ids = earlier.t2d.nonzero().flatten().tolist(), fresh.t2d.nonzero().flatten().tolist()
    shared = set(old_ids) & set(new_ids)
    assert shared and set(new_ids) - shared  # the two vocabularies overlap and differ
    for row, tid in enumerate(new_ids):
        want = earlier.lm_head.weight[old_ids.index(tid)] if tid in shared else before[row]
        assert torch.equal(fresh.lm_head.weight[row], want), tid


def _label_teacher(head: Eagle3Head, sharpness: float = 1e4):
    """A teacher sure of the self-distilled label: position p's distribution puts all mass on x_{p+1}."""
    d_index = head.t2d.long().cumsum(0) - 1

    def teacher(batch):
        nxt = F.pad(batch.tokens[:, 1:], (0, 1))
        logits = torch.zeros(*nxt.shape, head.cfg.draft_vocab_size).scatter_(-1, d_index[nxt][..., None], sharpness)
        return torch.log_softmax(logits, -1)

    return teacher


def test_the_teacher_objective_is_the_kl_at_the_labels_position():
    """A teacher certain of the labels makes the KL the cross-entropy on them, step by step; a
    teacher row read one position off would not."""
    head = _fresh_head()
    seqs = [Sequence(s.tokens % VD * 2, s.prompt_len, s.features.float()) for s in _sequences(3, period=5)]
    batch = collate(seqs)
    ce, c_ce, n_ce = ttt_loss(head, batch, steps=3)
    kl, c_kl, n_kl = ttt_loss(head, batch, steps=3, teacher=_label_teacher(head))
    torch.testing.assert_close(kl, ce, atol=1e-4, rtol=1e-4)
    assert torch.equal(c_ce, c_kl) and torch.equal(n_ce, n_kl)
    shifted = _label_teacher(head)
    off_by_one = ttt_loss(head, batch, steps=3, teacher=lambda b: F.pad(shifted(b)[:, 1:], (0, 0, 0, 1)))[0]
    assert abs(off_by_one.item() - ce.item()) > 0.1


def test_draft_vocab_takes_the_most_frequent_answer_tokens():
    seqs = [Sequence(torch.tensor([1, 2, 5, 5, 5, 7, 7, 9]), prompt_len=2, features=torch.zeros(8, 3))]
    ids = draft_vocab(seqs, size=3, vocab_size=V, special=(2,))
    assert ids.tolist() == [2, 5, 7]  # special first, then by frequency; sorted by id
    assert len(draft_vocab(seqs, size=6, vocab_size=V)) == 6  # padded when the data has fewer


def _fresh_head() -> Eagle3Head:
    head = make_head(seed=3, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    init_head(head, torch.arange(VD) * 2, torch.randn(V, H, generator=g), torch.ones(H))
    return head


def test_training_learns_a_pattern_and_resumes_exactly(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    seqs = [Sequence(s.tokens % VD * 2, s.prompt_len, s.features.float()) for s in _sequences(8, period=5)]
    cfg = TrainConfig(epochs=6, lr=3e-3, warmup_steps=2, batch_tokens=64, save_every=4, seed=0)

    def loss_fn(model, batch):
        return ttt_loss(model, batch, steps=2)

    before = ttt_loss(_fresh_head(), collate(seqs), 2)[0].item()
    full, report = train_interrupted_and_resumed(_fresh_head, loss_fn, seqs, cfg, tmp_path)
    after = ttt_loss(full, collate(seqs), 2)[0].item()
    assert after < 0.5 * before
    assert report["eval_top1_per_step"][0] > 0.5


def test_bf16_autocast_trains_fp32_weights(tmp_path):
    """Mixed precision: the forward runs under bf16 autocast, the weights and moments stay fp32."""
    torch.set_num_threads(1)
    seqs = [Sequence(s.tokens % VD * 2, s.prompt_len, s.features.float()) for s in _sequences(8, period=5)]
    cfg = TrainConfig(epochs=6, lr=3e-3, warmup_steps=2, batch_tokens=64, save_every=100, seed=0)
    head = _fresh_head()
    before = ttt_loss(head, collate(seqs), 2)[0].item()
    train(
        head,
        lambda m, b: ttt_loss(m, b, steps=2),
        lambda out: head.save(out, dtype=torch.float32),
        seqs,
        [],
        cfg,
        tmp_path,
        precision="bf16",
    )
    assert ttt_loss(head, collate(seqs), 2)[0].item() < 0.5 * before
    assert all(p.dtype == torch.float32 for p in head.parameters())
    with pytest.raises(ValueError, match="precision"):
        train(head, None, None, seqs, [], cfg, tmp_path / "x", precision="fp8")
    assert resolve_precision("fp32", "cpu") == "fp32" and resolve_precision("auto", "cuda") == "bf16"


def test_cli_trains_a_head_sglang_can_load(tmp_path, smollm2_dir, capsys):
    """Self-distillation -> features -> training -> a head in sglang's layout, on a tiny target."""
    from sglang_echo.models.tiny import write_tiny_llama
    from sglang_echo.training.cli import main

    torch.set_num_threads(1)
    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=8).path
    out = tmp_path / "head"
    main(
        [
            "--model",
            str(target),
            "--out",
            str(out),
            "--num-prompts",
            "6",
            "--max-new-tokens",
            "12",
            "--gen-backend",
            "hf",
            "--epochs",
            "1",
            "--draft-vocab",
            "512",
            "--batch-tokens",
            "256",
            "--ttt-steps",
            "2",
        ]
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 512
    # sglang's ids name layer *outputs*; the trainer captured the inputs of layers 2, 4, 5.
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    report = json.loads((out / "training_report.json").read_text())
    assert report["captured_layers"] == [2, 4, 5] and report["steps"] >= 1
    # The learning curve: the dev split of every pool kind, before the first step and after the last.
    from sglang_echo.training.pool_kinds import KINDS

    curve = report["curve"]
    assert [c["step"] for c in (curve[0], curve[-1])] == [0, report["steps"]] and curve[-1]["tokens"] > 0
    assert set(curve[-1]["dev_top1"]) == set(KINDS) and len(curve[-1]["dev_top1_mean"]) == 2
    assert (out / "learning_curve.png").exists() or importlib.util.find_spec("matplotlib") is None
    embed = torch.randn(cfg["vocab_size"], cfg["hidden_size"])
    head = Eagle3Head.load(out, embed)
    assert head.t2d.sum() == 512 and bool((head.to_target(torch.arange(512)) < cfg["vocab_size"]).all())

    # Go on training that head against the target's distribution, on the same data.
    more = tmp_path / "more"
    args = [
        "--model",
        str(target),
        "--data",
        str(out / "data"),
        "--num-prompts",
        "6",
        "--max-new-tokens",
        "12",
        "--gen-backend",
        "hf",
        "--epochs",
        "1",
        "--draft-vocab",
        "512",
        "--batch-tokens",
        "256",
        "--ttt-steps",
        "2",
        "--init-from",
        str(out),
        "--eagle3-teacher",
        "target",
    ]
    main([*args, "--out", str(more)])
    report = json.loads((more / "training_report.json").read_text())
    assert report["init_from"] == str(out) and report["eagle3_teacher"] == "target"
    assert len(report["init_eval_top1_per_step"]) == 2  # the starting head, on the same held-out rows
    # Its learning curve goes on from the first run's (the same dev split).
    history = json.loads((more / "learning_curve.json").read_text())
    assert history[: len(curve)] == curve and history[-1]["run"] == 1
    assert history[-1]["tokens"] == curve[-1]["tokens"] + report["curve"][-1]["tokens"]
    again = Eagle3Head.load(more, embed)
    assert torch.equal(again.t2d, head.t2d) and not torch.equal(again.fc.weight, head.fc.weight)
    assert main([*args[:-4], "--draft-vocab", "256", "--init-from", str(out), "--out", str(tmp_path / "other")]) == 1
    assert "not the head these flags ask for" in capsys.readouterr().err


def test_feature_capture_equals_the_full_forward(tmp_path, smollm2_dir):
    from transformers import AutoModelForCausalLM

    from sglang_echo.models.tiny import write_tiny_llama
    from sglang_echo.training.features import capture

    torch.set_num_threads(1)
    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=6).path
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    seqs = [torch.randint(0, 1000, (n,)) for n in (5, 9, 7)]
    layers = (1, 3, 4)
    feats = capture(model, seqs, layers, batch_tokens=18)  # forces several padded batches
    assert len(model.model.layers) == 6  # the truncation is undone
    for s, f in zip(seqs, feats):
        with torch.no_grad():
            hs = model(input_ids=s[None], output_hidden_states=True).hidden_states
        ref = torch.cat([hs[i][0] for i in layers], -1)
        assert torch.allclose(f.float(), ref, atol=2e-3, rtol=1e-2)


def test_revocab_needs_a_head_to_start_from(tmp_path, capsys):
    from sglang_echo.training.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "o"), "--revocab"])
    assert e.value.code == 2 and "--revocab: needs --init-from" in capsys.readouterr().err
