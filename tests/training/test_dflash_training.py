"""DFlash training: every training block is what the drafter computes at its anchor, anchors and loss
weights are what the paper says, training learns, runs resume exactly, the CLI writes a head."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from sglang_echo.drafters.dflash_head import DFlashHead
from sglang_echo.training.batches import collate
from sglang_echo.training.dflash import (
    AnchorSampler,
    block_hidden,
    captured_layers,
    default_gamma,
    dflash_loss,
    resumable_sampler,
    save_checkpoint,
    target_layer_ids,
)
from sglang_echo.training.features import Sequence
from sglang_echo.training.trainer import TrainConfig, train
from tests.drafters.test_dflash import BS, DT, H, V, make_head


def _sequences(n: int, seed: int = 0, period: int = 0, dtype=DT) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 12 + 3 * i
        toks = torch.randint(0, V, (T,), generator=g)
        if period:  # a learnable pattern: every text cycles through the same `period` tokens
            toks = (torch.arange(T) + i) % period * 7 + 1
        out.append(Sequence(toks, prompt_len=3, features=torch.randn(T, 3 * H, generator=g, dtype=dtype)))
    return out


def test_layers_and_gamma():
    assert captured_layers(30) == (2, 15, 27) and target_layer_ids(30) == (1, 14, 26)  # EAGLE-3's features
    assert [default_gamma(b) for b in (16, 10, 8)] == [7.0, 5.0, 4.0]  # DFlash Eq. 4 / SpecForge


def test_anchor_sampler_draws_valid_answer_positions():
    batch = collate(_sequences(4))
    s = AnchorSampler(seed=1, fraction=0.3)
    anchors, keep = s.sample(batch, training=True)
    assert s.calls == 1
    for b in range(4):
        a = anchors[b][keep[b]]
        n_ok = int(batch.lengths[b]) - 1 - int(batch.prompt_lengths[b])  # plen <= a <= len - 2
        assert len(a) == math.ceil(0.3 * n_ok) and len(set(a.tolist())) == len(a)
        assert bool((a >= batch.prompt_lengths[b]).all() and (a <= batch.lengths[b] - 2).all())
        assert a.tolist() == sorted(a.tolist()) and (anchors[b][~keep[b]] == 0).all()
    again, _ = s.sample(batch, training=True)
    assert not torch.equal(again, anchors)  # a new draw every training step ...
    replay = AnchorSampler(seed=1, fraction=0.3)
    assert torch.equal(replay.sample(batch, training=True)[0], anchors)  # ... reproducible from the step count
    e1, _ = s.sample(batch, training=False)
    e2, _ = s.sample(batch, training=False)
    assert torch.equal(e1, e2) and s.calls == 2  # evaluation: fixed anchors, no step counted


def test_training_blocks_equal_the_drafters_block():
    """Block j of a sequence (anchor a) = the drafter's block after committing positions 0..a-1."""
    head = make_head(seed=4)
    seqs = _sequences(3, seed=4)
    batch = collate(seqs)
    anchors, keep = AnchorSampler(seed=0, fraction=0.5).sample(batch, training=True)
    hid = block_hidden(head, batch, anchors, keep)
    checked = 0
    for b, s in enumerate(seqs):
        for j in range(anchors.shape[1]):
            if not keep[b, j]:
                continue
            a = int(anchors[b, j])
            ref = head.reference_block_logits(s.features[:a], int(s.tokens[a]))
            torch.testing.assert_close(head.logits(hid[b, j, 1:]), ref, atol=1e-9, rtol=0)
            checked += 1
    assert checked == int(keep.sum()) >= 10


def test_loss_is_the_decayed_weighted_mean_of_block_cross_entropies():
    head = make_head(seed=5)
    seqs = _sequences(2, seed=5)
    batch = collate(seqs)
    gamma = 2.5
    loss, correct, counted = dflash_loss(head.eval(), batch, AnchorSampler(fraction=0.4), gamma)
    anchors, keep = AnchorSampler(fraction=0.4).sample(batch, training=False)  # the same (evaluation) draw
    num = den = 0.0
    want_counted = torch.zeros(BS - 1)
    for b, s in enumerate(seqs):
        for j in range(anchors.shape[1]):
            if not keep[b, j]:
                continue
            a = int(anchors[b, j])
            lp = torch.log_softmax(head.reference_block_logits(s.features[:a], int(s.tokens[a])), -1)
            for k in range(1, BS):
                if a + k < len(s.tokens):
                    w = math.exp(-(k - 1) / gamma)
                    num += w * float(-lp[k - 1, s.tokens[a + k]])
                    den += w
                    want_counted[k - 1] += 1
    assert loss.item() == pytest.approx(num / den, rel=1e-9)
    assert counted.tolist() == want_counted.tolist() and (correct <= counted).all()


def _fresh_head() -> DFlashHead:
    head = make_head(seed=6, dtype=torch.float32)
    with torch.no_grad():
        for layer in head.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    return head


def test_training_learns_a_pattern_and_resumes_exactly(tmp_path):
    seqs = [Sequence(s.tokens, s.prompt_len, s.features.float()) for s in _sequences(8, period=5)]
    cfg = TrainConfig(epochs=12, lr=1e-2, warmup_steps=2, batch_tokens=64, save_every=4, seed=0)

    def run(out, crash_at=None):
        head = _fresh_head()
        sampler = resumable_sampler(out, seed=0, fraction=0.5)
        calls = {"n": 0}

        def loss_fn(model, batch):
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise KeyboardInterrupt
            return dflash_loss(model, batch, sampler, gamma=4.0)

        return head, lambda: train(head, loss_fn, lambda o: save_checkpoint(head, sampler, o), seqs, seqs[:2], cfg, out)

    full, go = run(tmp_path / "a")
    probe = collate(seqs)
    before = dflash_loss(full.eval(), probe, AnchorSampler(fraction=0.5), 4.0)[0].item()
    report = go()
    after = dflash_loss(full.eval(), probe, AnchorSampler(fraction=0.5), 4.0)[0].item()
    assert after < 0.5 * before
    assert len(report["eval_top1_per_step"]) == BS - 1 and report["eval_top1_per_step"][0] > 0.5

    # Interrupt a second run after its first checkpoint, then resume it: the same final weights.
    part, go = run(tmp_path / "b", crash_at=6)
    with pytest.raises(KeyboardInterrupt):
        go()
    ck = tmp_path / "b" / "checkpoint"
    assert json.loads((ck / "state.json").read_text())["step"] == 4
    assert json.loads((ck / "dflash_anchors.json").read_text())["calls"] == 4
    resumed, go = run(tmp_path / "b")
    go()
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_cli_trains_a_dflash_head(tmp_path, smollm2_dir, capsys):
    """Self-distillation -> features -> training -> a head in the z-lab layout, on a tiny target."""
    from sglang_echo.models.tiny import write_tiny_llama
    from sglang_echo.training.cli import main

    torch.set_num_threads(1)
    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=8).path
    out = tmp_path / "head"
    main(
        [
            "--kind",
            "dflash",
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
            "--batch-tokens",
            "256",
            "--block-size",
            "4",
            "--draft-layers",
            "1",
        ]
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["num_hidden_layers"] == 1
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 3, 4] and cfg["dflash_config"]["block_size"] == 4
    assert cfg["dflash_config"]["mask_token"] == "<empty_output>" and cfg["dflash_config"]["mask_token_id"] == 16
    report = json.loads((out / "training_report.json").read_text())
    assert report["captured_layers"] == [2, 4, 5] and report["steps"] >= 1 and report["dflash_gamma"] == 2.0
    assert len(report["eval_top1_per_step"]) == 3
    embed = torch.randn(cfg["vocab_size"], cfg["hidden_size"])
    head = DFlashHead.load(out, embed, num_target_layers=8)
    assert head.cfg.captured_layers == (2, 4, 5) and head.cfg.block_size == 4
    assert F.embedding(torch.tensor([0]), head.embed).shape == (1, cfg["hidden_size"])

    # Go on training that head on the same data; other flags' geometry is refused.
    args = [
        "--kind",
        "dflash",
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
        "--batch-tokens",
        "256",
        "--block-size",
        "4",
        "--init-from",
        str(out),
    ]
    more = tmp_path / "more"
    main([*args, "--draft-layers", "1", "--out", str(more)])
    report = json.loads((more / "training_report.json").read_text())
    assert report["init_from"] == str(out) and len(report["init_eval_top1_per_step"]) == 3
    again = DFlashHead.load(more, embed, num_target_layers=8)
    assert again.cfg == head.cfg and not torch.equal(again.fc.weight, head.fc.weight)
    assert main([*args, "--draft-layers", "2", "--out", str(tmp_path / "other")]) == 1
    assert "not the head these flags ask for" in capsys.readouterr().err


def test_the_lm_head_gemm_runs_in_the_training_precision(tmp_path, smollm2_dir):
    """bf16 only in a bf16 run: CPUs without bf16 units do bf16 GEMMs several times slower."""
    from types import SimpleNamespace

    from sglang_echo.models.tiny import write_tiny_llama
    from sglang_echo.training.dflash import build

    target = write_tiny_llama(tmp_path / "target", smollm2_dir, num_layers=8).path
    for precision, want in (("fp32", None), ("bf16", torch.bfloat16)):
        args = SimpleNamespace(seed=0, out=tmp_path / precision, block_size=4, draft_layers=1, precision=precision)
        _, loss_fn, _ = build(target, [], args)
        assert loss_fn.keywords["lm_head_dtype"] == want
