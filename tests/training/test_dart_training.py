"""DART training: the prefix-shared pass is what the drafter computes at every anchor, the annealed
loss weights and masks what the paper says, training learns, runs resume, the CLI writes a head."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from sglang_echo.drafters.dart_head import DartHead
from sglang_echo.training.batches import collate
from sglang_echo.training.dart import (
    GAMMA,
    captured_layers,
    dart_loss,
    prefix_shared_forward,
)
from sglang_echo.training.eagle3 import init_head
from sglang_echo.training.features import Sequence
from sglang_echo.training.trainer import TrainConfig
from tests.drafters.test_dart import DT, VD, H, V, make_head, naive_shifted_logits
from tests.training.resume import train_interrupted_and_resumed


def _sequences(n: int, seed: int = 0, period: int = 0, dtype=DT) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 10 + 3 * i
        toks = torch.randint(0, V, (T,), generator=g)
        if period:  # a learnable pattern: every text cycles through the same `period` tokens
            toks = (torch.arange(T) + i) % period * 7 + 1
        out.append(Sequence(toks, prompt_len=3, features=torch.randn(T, 3 * H, generator=g, dtype=dtype)))
    return out


def test_captured_layers_are_eagle3s():
    assert captured_layers(30) == (2, 15, 27) and captured_layers(8) == (2, 4, 5)


@pytest.mark.parametrize("shared", [False, True])
def test_prefix_shared_pass_equals_drafting_at_every_anchor(shared):
    head = make_head(seed=1, shared=shared)
    seqs = _sequences(3)
    out = prefix_shared_forward(head, collate(seqs))  # [B, n, d, H] (padded batch)
    logp = torch.log_softmax(head.logits(out), -1)
    for b, s in enumerate(seqs):
        for t in range(len(s.tokens) - 1):  # anchor t: pairs 0..t committed, root x_{t+1}
            ref = naive_shifted_logits(head, s.features[: t + 2], s.tokens[: t + 2])
            torch.testing.assert_close(logp[b, t], ref, atol=1e-10, rtol=0)


def test_loss_weights_masks_and_the_kl_teacher():
    head = make_head(seed=2)
    seqs = _sequences(2)
    batch = collate(seqs)
    d = head.cfg.depth
    uniform = lambda b: torch.full((*b.tokens.shape, VD), -math.log(VD), dtype=DT)
    loss, _, counted = dart_loss(head, batch, teacher=uniform)
    # Output k of anchor t predicts x_{t+k+1}: every answer label (>= prompt_len) counts, one
    # outside the draft vocabulary as a miss.
    for k in range(1, d + 1):
        assert int(counted[k - 1]) == sum(len(s.tokens[max(s.prompt_len, k + 1) :]) for s in seqs)
    # KL(uniform || p) by hand over the same rows, weighted gamma^(k-1).
    logp = torch.log_softmax(head.logits(prefix_shared_forward(head, batch)), -1)
    n = batch.tokens.shape[1] - 1
    pos = torch.arange(n)
    want = 0.0
    for k in range(1, d + 1):
        rows = ((pos + k + 1)[None, :] < batch.lengths[:, None]) & (
            (pos + k + 1)[None, :] >= batch.prompt_lengths[:, None]
        )
        kl = (-math.log(VD) - logp[:, :, k - 1][rows].mean(-1)).mean()
        want += GAMMA ** (k - 1) * float(kl.detach())
    assert float(loss) == pytest.approx(want, rel=1e-6)  # the loss takes log_softmax in float32
    # Without a teacher: cross-entropy on the labels, same weights.
    ce, _, _ = dart_loss(head, batch)
    assert float(ce) > 0 and torch.isfinite(ce)


def _fresh_head() -> DartHead:
    head = make_head(seed=3, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    init_head(head, torch.arange(VD) * 2, torch.randn(V, H, generator=g), torch.ones(H))
    return head


def test_training_learns_a_pattern_and_resumes_exactly(tmp_path):
    seqs = [Sequence(s.tokens % VD * 2, s.prompt_len, s.features) for s in _sequences(8, period=5, dtype=torch.float32)]
    cfg = TrainConfig(epochs=12, lr=5e-3, warmup_steps=2, batch_tokens=64, save_every=4, seed=0)

    def loss_fn(model, batch):
        return dart_loss(model, batch)

    before = dart_loss(_fresh_head(), collate(seqs))[0].item()
    full, report = train_interrupted_and_resumed(_fresh_head, loss_fn, seqs, cfg, tmp_path)
    after = dart_loss(full, collate(seqs))[0].item()
    assert after < 0.5 * before
    assert report["eval_top1_per_step"][0] > 0.5 and len(report["eval_top1_per_step"]) == full.cfg.depth


def test_cli_trains_a_dart_head_with_the_target_as_teacher(tmp_path, smollm2_dir, capsys):
    """Self-distillation -> features -> KL training against the target's tail -> a DART head."""
    from sglang_echo.models.tiny import write_tiny_llama
    from sglang_echo.training.cli import main
    from sglang_echo.training.teacher import TargetTail

    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=8).path
    # The teacher (layers 5..7 on the captured input of layer 5) is the target's own distribution.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    ids = torch.tensor([0, 5, 17, 300, 1000])
    tail = TargetTail(target, 5, ids, slice(0, 64))
    seq = torch.randint(0, 2000, (1, 9))
    with torch.no_grad():
        out = model(seq, output_hidden_states=True)
    from sglang_echo.training.batches import Batch

    got = tail(Batch(seq, out.hidden_states[5], torch.tensor([9]), torch.tensor([0])))
    torch.testing.assert_close(got, torch.log_softmax(out.logits[..., ids], -1), atol=1e-5, rtol=1e-5)

    out_dir = tmp_path / "head"
    main(
        [
            "--kind",
            "dart",
            "--model",
            str(target),
            "--out",
            str(out_dir),
            "--num-prompts",
            "4",
            "--max-new-tokens",
            "10",
            "--gen-backend",
            "hf",
            "--epochs",
            "1",
            "--draft-vocab",
            "256",
            "--batch-tokens",
            "256",
            "--dart-depth",
            "3",
        ]
    )
    cfg = json.loads((out_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMDart"] and cfg["draft_length"] == 2
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    report = json.loads((out_dir / "training_report.json").read_text())
    assert report["kind"] == "dart" and report["captured_layers"] == [2, 4, 5] and report["dart_teacher"] == "target"
    assert len(report["eval_top1_per_step"]) == 3
    head = DartHead.load(out_dir, torch.randn(cfg["vocab_size"], cfg["hidden_size"]))
    assert head.cfg.depth == 3 and int(head.t2d.sum()) == 256
    assert torch.isfinite(F.normalize(head.mask_rep, dim=-1)).all()

    # Go on training that head (its draft vocabulary kept) with CE on the labels; another depth is refused.
    args = [
        "--kind",
        "dart",
        "--model",
        str(target),
        "--data",
        str(out_dir / "data"),
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "10",
        "--gen-backend",
        "hf",
        "--epochs",
        "1",
        "--draft-vocab",
        "256",
        "--batch-tokens",
        "256",
        "--dart-teacher",
        "labels",
        "--init-from",
        str(out_dir),
    ]
    more = tmp_path / "more"
    main([*args, "--dart-depth", "3", "--out", str(more)])
    report = json.loads((more / "training_report.json").read_text())
    assert report["init_from"] == str(out_dir) and len(report["init_eval_top1_per_step"]) == 3
    again = DartHead.load(more, torch.randn(cfg["vocab_size"], cfg["hidden_size"]))
    assert torch.equal(again.t2d, head.t2d) and not torch.equal(again.mask_rep, head.mask_rep)
    assert main([*args, "--dart-depth", "4", "--out", str(tmp_path / "other")]) == 1
    assert "not the head these flags ask for" in capsys.readouterr().err
