"""DFlash training: the block objective with random anchors, the head's init, and the CLI builder.

Objective (DFlash Sec. 4, as z-lab's recipe and SpecForge's ``OnlineDFlashModel`` implement it).
For every sequence of a batch, ``n`` anchor positions ``a`` are drawn at random without replacement
among the answer tokens (``prompt_len <= a <= len - 2``: at inference the first anchor is the first
generated token, the target's own). Each anchor makes one block ``[x_a, MASK x (bs - 1)]`` at rotary
positions ``a .. a + bs - 1``; all blocks of a sequence run in *one* forward of the draft layers,
side by side after that sequence's context: block ``j`` attends to the context keys of positions
``< a_j`` (strictly: the target's feature of ``x_a`` itself does not exist yet when the block is
drafted) and bidirectionally to its own ``bs`` positions, never to another block (attention cost
linear in the number of blocks: :func:`~sglang_echo.drafters.dflash_head.grouped_block_attention`). This is exactly
what :class:`~sglang_echo.drafters.dflash.DFlashDrafter` computes after committing ``a`` positions
with root ``x_a`` (tests check it). Block position ``k >= 1`` is trained with cross-entropy against
``x_{a+k}`` (the target's own greedy tokens: the data is self-distilled) through the target's frozen
LM head, weighted by the paper's exponential decay

    w_k = exp(-(k - 1) / gamma),   gamma = 7 (bs 16), 5 (bs 10), 4 (bs 8)   (DFlash Eq. 4)

(the values SpecForge documents for ``--loss-decay-gamma``; other block sizes get ``gamma = bs / 2``),
and the loss is the weighted mean over labelled positions: later positions only pay off when the
earlier ones were accepted, so they weigh less.

Anchors per sequence: ``ceil(anchor_fraction * answer_tokens)`` (at most ``max_anchors``). The draws
come from a generator seeded by ``(seed, training step)``; the step count is saved with every
checkpoint (``dflash_anchors.json``), so an interrupted run resumes bit-exactly. Evaluation draws
from a fixed seed per batch, so the held-out numbers are comparable between runs.

Target layers. The captured features are EAGLE-3's (inputs of layers 2, L/2, L-3, i.e.
``target_layer_ids = (1, L/2 - 1, L - 4)`` in DFlash's output-layer convention, which
``config.json`` records) rather than DFlash's default spacing over ``1 .. L-3`` (``1, 14, 27`` for
SmolLM2's 30 layers): the same three evenly spread depths, one layer off at the top, and the features
this repo already captured for EAGLE-3 are reused instead of running the target again.

Initialisation: Qwen3's (every weight normal(0, 0.02), every norm 1), as z-lab's drafts start. The
EAGLE-3-style start this repo uses for its EAGLE-3 head (target's final norm, ``fc`` passing the
deepest feature through, zero residual branches) was measured on SmolLM2 and is worse here: the
block's residual stream starts as the token embedding, whose self-logit under the target's tied
LM head and final norm is huge (initial loss 178 vs 130), and it learned no faster afterwards;
hand-made attention inits (block-focused or recency-focused queries, a PCA copy of the context)
did not help in 50-step probes either.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from sglang_echo.drafters.dflash_head import DEFAULT_MASK_TOKEN, DFlashConfig, DFlashHead

from .batches import Batch
from .target import target_weights
from .trainer import require_geometry

PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
ANCHOR_STATE = "dflash_anchors.json"


def default_gamma(block_size: int) -> float:
    return PAPER_GAMMA.get(block_size, block_size / 2)


def captured_layers(num_layers: int) -> tuple[int, ...]:
    """Inputs of layers 2, L/2, L-3 (EAGLE-3's capture, so its features are reused)."""
    L = num_layers
    return (2, L // 2, L - 3)


def target_layer_ids(num_layers: int) -> tuple[int, ...]:
    """:func:`captured_layers` in DFlash's convention (outputs of layers ``i``: HF ``hidden_states[i + 1]``)."""
    return tuple(i - 1 for i in captured_layers(num_layers))


def resolve_mask_token(target: Path, vocab_size: int) -> tuple[int, Optional[str]]:
    """The mask token: DFlash's ``<|MASK|>`` or the tokenizer's mask token if the target has one, else
    the highest-id added special token that is not BOS/EOS/PAD/UNK (for SmolLM2 ``<empty_output>``),
    else the last vocabulary row. Its (frozen) target embedding is the mask embedding."""
    tok_file, cfg_file = Path(target) / "tokenizer.json", Path(target) / "tokenizer_config.json"
    added = []
    if tok_file.exists():
        added = [
            (int(a["id"]), a["content"])
            for a in json.loads(tok_file.read_text()).get("added_tokens", [])
            if a.get("special", True) and int(a["id"]) < vocab_size
        ]
    tcfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    named = {tcfg.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    by_name = {c: i for i, c in added}
    for want in (DEFAULT_MASK_TOKEN, tcfg.get("mask_token")):
        if isinstance(want, str) and want in by_name:
            return by_name[want], want
    spare = [(i, c) for i, c in added if c not in named]
    if spare:
        return max(spare)
    return vocab_size - 1, None


class AnchorSampler:
    """Random anchors per sequence (see the module docstring); ``calls`` counts training batches."""

    def __init__(self, seed: int = 0, fraction: float = 0.25, max_anchors: int = 512):
        if not 0 < fraction <= 1:
            raise ValueError(f"anchor fraction must be in (0, 1], got {fraction}")
        self.seed, self.fraction, self.max_anchors = seed, fraction, max_anchors
        self.calls = 0

    def sample(self, batch: Batch, training: bool) -> tuple[Tensor, Tensor]:
        """(anchors ``[B, N]`` sorted, keep ``[B, N]``): valid anchors are answer positions with a label."""
        tokens, lengths, plen = batch.tokens, batch.lengths.cpu(), batch.prompt_lengths.cpu()  # drawn on the host
        B, T = tokens.shape
        if training:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
            self.calls += 1
        else:  # evaluation: the same anchors for the same batch every time
            g = torch.Generator().manual_seed(int(lengths.sum()) * 7919 + int(tokens[:, :8].sum()))
        t = torch.arange(T)
        ok = (t[None, :] >= plen[:, None]) & (t[None, :] <= lengths[:, None] - 2)
        n_ok = ok.sum(1)
        want = torch.ceil(n_ok.float() * self.fraction).long().clamp(max=self.max_anchors)
        want = torch.minimum(want, n_ok)
        N = max(int(want.max()), 1)
        r = torch.rand(B, T, generator=g).masked_fill(~ok, 2.0)
        first = r.argsort(1)[:, :N]  # N random valid positions (invalid ones sort last)
        keep = torch.arange(N)[None, :] < want[:, None]
        anchors = torch.where(keep, first, torch.zeros_like(first))
        anchors, order = anchors.masked_fill(~keep, T).sort(1)  # sorted, padding last
        keep = keep.gather(1, order)
        return anchors.masked_fill(~keep, 0).to(tokens.device), keep.to(tokens.device)


def block_inputs(
    head: DFlashHead, batch: Batch, anchors: Tensor, keep: Tensor
) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]], Tensor]:
    """What :meth:`DFlashHead.forward_blocks` takes for every block of every sequence, side by side
    (module docstring): block tokens and positions ``[B, N * bs]``, the context K/V per layer, and
    the context mask ``[B, 1, N * bs, T]``; each block sees only itself (``group=block_size``)."""
    tokens = batch.tokens
    B, T = tokens.shape
    N, bs, dev = anchors.shape[1], head.cfg.block_size, tokens.device
    ctx = head.context(batch.features.to(head.fc.weight.dtype))
    kv = head.context_kv(ctx, torch.arange(T, device=dev)[None].expand(B, T))
    blocks = head.block_tokens(tokens.gather(1, anchors))  # [B, N, bs]
    pos = anchors[..., None] + torch.arange(bs, device=dev)  # [B, N, bs]
    q_anchor = anchors[:, :, None].expand(B, N, bs).reshape(B, N * bs)
    see_ctx = torch.arange(T, device=dev)[None, None, :] < q_anchor[:, :, None]  # [B, N*bs, T]
    # Padding blocks (keep False) see no context, only themselves (no empty softmax row); unlabelled.
    see_ctx &= keep.repeat_interleave(bs, 1)[:, :, None]
    return blocks.reshape(B, N * bs), pos.reshape(B, N * bs), kv, see_ctx[:, None]


def block_hidden(head: DFlashHead, batch: Batch, anchors: Tensor, keep: Tensor) -> Tensor:
    """Every block of every sequence in one forward: ``norm(h)`` ``[B, N, bs, H]`` (module docstring)."""
    bs = head.cfg.block_size
    hid = head.forward_blocks(*block_inputs(head, batch, anchors, keep), group=bs)
    return hid.view(*anchors.shape, bs, -1)


def dflash_loss(
    head: DFlashHead, batch: Batch, sampler: AnchorSampler, gamma: float, lm_head_dtype: Optional[torch.dtype] = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(weighted CE, correct top-1 per block position 1..bs-1, labelled positions per block position).

    ``lm_head_dtype`` (bf16 for the CLI): in training mode the forward runs under autocast to it and
    the LM head GEMM in it; evaluation always runs in the head's own dtype."""
    anchors, keep = sampler.sample(batch, head.training)
    tokens, lengths = batch.tokens, batch.lengths
    bs, dev = head.cfg.block_size, tokens.device
    fast = head.training and lm_head_dtype is not None
    with torch.autocast(dev.type, dtype=lm_head_dtype or torch.bfloat16, enabled=fast):
        hid = block_hidden(head, batch, anchors, keep)  # [B, N, bs, H]
    idx = anchors[..., None] + torch.arange(bs, device=dev)  # label positions
    k = torch.arange(bs, device=dev)
    labelled = keep[..., None] & (idx < lengths[:, None, None]) & (k >= 1)
    labels = tokens.gather(1, idx.clamp(max=tokens.shape[1] - 1).flatten(1)).view_as(idx)
    weights = torch.exp(-(k - 1).clamp(min=0).double() / gamma).expand_as(idx)
    correct, counted = torch.zeros(bs - 1), torch.zeros(bs - 1)
    if not labelled.any():
        return head.fc.weight.new_zeros(()) + 0 * hid.sum(), correct, counted
    h = hid[labelled]
    if fast:  # training: bf16 GEMMs (fp32 weights and loss); the frozen LM head alone is half the step
        logits = (h.to(lm_head_dtype) @ head.lm_head.to(lm_head_dtype).T).float()
    else:
        logits = head.logits(h)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    target, w, kk = labels[labelled], weights[labelled], k.expand_as(idx)[labelled]
    ce = F.cross_entropy(logits, target, reduction="none")
    w = w.to(ce.dtype)
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        hit = (logits.argmax(-1) == target).float()
        correct.index_add_(0, (kk - 1).cpu(), hit.cpu())
        counted.index_add_(0, (kk - 1).cpu(), torch.ones_like(hit).cpu())
    return loss, correct, counted


def init_head(head: DFlashHead, target_norm: Optional[Tensor] = None, std: float = 0.02, seed: int = 0) -> None:
    """Qwen3's ``post_init`` (what z-lab's drafts start from): every weight normal(0, ``std``), every
    norm 1. ``target_norm`` is accepted for symmetry with EAGLE-3's init and deliberately unused (see
    the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def resumable_sampler(out: Path, seed: int = 0, fraction: float = 0.25) -> AnchorSampler:
    """An :class:`AnchorSampler` that continues where ``out/checkpoint`` (the trainer's) left off."""
    sampler = AnchorSampler(seed=seed, fraction=fraction)
    state = Path(out) / "checkpoint" / ANCHOR_STATE
    if state.exists():
        sampler.calls = int(json.loads(state.read_text())["calls"])
    return sampler


def save_checkpoint(head: DFlashHead, sampler: AnchorSampler, out: Path) -> None:
    """The trainer's ``save_fn``: the head (fp32) and the anchor stream's position."""
    head.save(out, dtype=torch.float32)
    (Path(out) / ANCHOR_STATE).write_text(json.dumps({"calls": sampler.calls}) + "\n")


def build(target: Path, seqs, args):
    """(model, loss_fn, save_fn) of a DFlash head for ``target`` (``echo-train-drafter --kind dflash``)."""

    t = target_weights(Path(target))
    cfg, embed, lm_head, norm = t.config, t.embed, t.lm_head, t.norm
    L = cfg["num_hidden_layers"]
    mask_id = getattr(args, "mask_token_id", None)
    mask_tok = None
    if mask_id is None:
        mask_id, mask_tok = resolve_mask_token(Path(target), cfg["vocab_size"])
    bs = getattr(args, "block_size", 8)
    head_cfg = DFlashConfig.for_target(
        cfg,
        num_hidden_layers=getattr(args, "draft_layers", 2),
        block_size=bs,
        target_layer_ids=target_layer_ids(L),
        mask_token_id=mask_id,
        mask_token=mask_tok,
    )
    if getattr(args, "init_from", None) is not None:  # go on training a head of this geometry
        head = require_geometry(DFlashHead.load(args.init_from, embed, lm_head, L), head_cfg, args.init_from)
    else:
        head = DFlashHead(head_cfg, embed, lm_head)
        init_head(head, norm, seed=args.seed)
    sampler = resumable_sampler(Path(args.out), seed=args.seed, fraction=getattr(args, "anchor_fraction", 0.25))
    gamma = getattr(args, "dflash_gamma", None) or default_gamma(bs)
    # The LM head GEMM is half the step: bf16 where the run is bf16 (AVX2 CPUs do bf16 GEMMs ~7x slower than fp32).
    lm_head_dtype = torch.bfloat16 if getattr(args, "precision", "bf16") == "bf16" else None
    loss_fn = partial(dflash_loss, sampler=sampler, gamma=gamma, lm_head_dtype=lm_head_dtype)
    return head, loss_fn, partial(save_checkpoint, head, sampler)


__all__ = [
    "AnchorSampler",
    "block_hidden",
    "block_inputs",
    "build",
    "captured_layers",
    "default_gamma",
    "dflash_loss",
    "init_head",
    "resolve_mask_token",
    "resumable_sampler",
    "save_checkpoint",
    "target_layer_ids",
]
