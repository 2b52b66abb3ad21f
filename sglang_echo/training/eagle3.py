"""EAGLE-3's training-time test (TTT): the objective, the draft vocabulary and the head's init.

Training-time test (EAGLE-3, Sec. 3.2) unrolls the head for ``steps`` draft steps on every
position at once, so it learns from its own hidden states rather than the target's. For pair
index ``t`` (target feature ``h_t`` with token ``x_{t+1}``):

* step 0 reads ``fc(h_t)`` and attends causally over every earlier step-0 pair, as a draft extend
  does after verification; it predicts ``x_{t+2}``;
* step ``j >= 1`` reads the head's own step ``j-1`` output at ``t`` with the true token
  ``x_{t+j+1}`` at position ``t + j``; it attends to the step-0 keys of pairs ``<= t`` (the committed
  context at inference) plus its own earlier steps at ``t`` (the draft path) -- the diagonal part
  of the mask -- and predicts ``x_{t+j+2}``.

This is exactly what the drafter computes at depth ``j + 1`` when every earlier draft was right,
which is the only case in which depth ``j + 1`` can be accepted. Losses are weighted ``0.8^j``
(as in SpecForge) and count only answer tokens (self-distilled: the target's own greedy choices).
Each term is the KL to the target's distribution over the draft vocabulary (``teacher``, as
SpecForge trains), or the cross-entropy on the greedy labels the draft vocabulary contains.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from sglang_echo.drafters.eagle3_head import Eagle3Head

from .batches import Batch
from .features import Sequence
from .target import target_weights
from .teacher import TargetTail, kl_to_teacher
from .trainer import require_geometry

STEP_DECAY = 0.8


def draft_vocab(seqs: list[Sequence], size: int, vocab_size: int, special: tuple[int, ...] = ()) -> Tensor:
    """The ``size`` target ids most frequent in the answers (plus special tokens), sorted by id."""
    counts = Counter()
    for s in seqs:
        counts.update(s.tokens[s.prompt_len :].tolist())
    keep = list(dict.fromkeys([*special, *(t for t, _ in counts.most_common())]))[:size]
    if len(keep) < size:  # pad with the lowest unused ids so the head has exactly `size` rows
        used = set(keep)
        keep += [t for t in range(vocab_size) if t not in used][: size - len(keep)]
    return torch.tensor(sorted(keep), dtype=torch.long)


def start_head(
    cls: type[Eagle3Head],
    head_cfg,
    target_cfg: dict,
    weights: tuple[Tensor, Tensor, Tensor],
    seqs: list[Sequence],
    args,
) -> tuple[Eagle3Head, Tensor]:
    """(head, its draft vocabulary ids) to train: ``args.init_from``'s head, which must have this
    geometry (its draft vocabulary is kept), or a fresh one with :func:`init_head`'s start.
    ``cls`` is :class:`Eagle3Head` or a subclass (DART's); ``weights`` the target's embedding, LM
    head and final norm."""
    embed, lm_head, norm = weights
    earlier = None
    if getattr(args, "init_from", None) is not None:
        earlier = require_geometry(
            cls.load(args.init_from, embed, target_cfg["num_hidden_layers"]), head_cfg, args.init_from
        )
        if not getattr(args, "revocab", False):
            return earlier, earlier.t2d.nonzero().flatten()
    special = tuple(t for t in (target_cfg.get("bos_token_id"), target_cfg.get("eos_token_id")) if t is not None)
    ids = draft_vocab(seqs, args.draft_vocab, target_cfg["vocab_size"], special)
    torch.manual_seed(args.seed)
    head = cls(head_cfg, embed)
    init_head(head, ids, lm_head, norm)
    if earlier is not None:
        carry_over(earlier, head)
    return head, ids


def carry_over(earlier: Eagle3Head, head: Eagle3Head) -> None:
    """``--init-from --revocab``: ``head`` (fresh, with this run's draft vocabulary) takes every
    weight of the ``earlier`` head, and the LM-head rows of the tokens both vocabularies hold;
    tokens new to the vocabulary keep the target's rows from :func:`init_head`."""
    mine = head.state_dict()
    with torch.no_grad():
        for name, value in earlier.state_dict().items():
            if name not in ("lm_head.weight", "d2t", "t2d", "embed"):
                mine[name].copy_(value)
        row = torch.full_like(earlier.t2d, -1, dtype=torch.long)  # target id -> row of `earlier`
        old_ids = earlier.t2d.nonzero().flatten()
        row[old_ids] = torch.arange(len(old_ids))
        new_ids = head.t2d.nonzero().flatten()
        shared = row[new_ids] >= 0
        head.lm_head.weight[shared] = earlier.lm_head.weight[row[new_ids][shared]].to(head.lm_head.weight.dtype)


def init_head(head: Eagle3Head, ids: Tensor, target_lm_head: Tensor, target_norm: Tensor) -> None:
    """Vocabulary maps, and a start that is already a (misaligned) early exit of the target.

    The LM head and final norm are the target's (rows ``ids``); ``fc`` passes the deepest captured
    feature through and the layer's residual branches (o_proj, down_proj) start at zero, so the
    head starts from meaningful hidden states and learns the one-token shift from the residual
    branches instead of from noise (zero-initialised residual branches train faster and stabler).
    """
    H = head.cfg.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()[:, -H:] = torch.eye(H)
        head.o_proj.weight.zero_()
        head.down_proj.weight.zero_()
        head.d2t.copy_(ids - torch.arange(len(ids)))
        head.t2d.zero_().index_fill_(0, ids, True)
        head.lm_head.weight.copy_(target_lm_head[ids].to(head.lm_head.weight.dtype))
        head.norm.weight.copy_(target_norm.to(head.norm.weight.dtype))


def _attend_ttt(
    q: Tensor, k0: Tensor, v0: Tensor, diag_k: list[Tensor], diag_v: list[Tensor], causal: Tensor
) -> Tensor:
    """Step-j attention: causal over step-0 keys plus each earlier step's key at the same index."""
    rep = q.shape[1] // k0.shape[1]
    k0, v0 = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
    dk = torch.stack([k.repeat_interleave(rep, 1) for k in diag_k], -2)  # [B, h, n, j, D]
    dv = torch.stack([v.repeat_interleave(rep, 1) for v in diag_v], -2)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s0 = (q @ k0.transpose(-1, -2)) * scale
    s0 = s0.masked_fill(~causal, float("-inf"))
    sd = (q[..., None, :] * dk).sum(-1) * scale  # [B, h, n, j]
    p = torch.softmax(torch.cat([s0, sd], -1), -1)
    n = k0.shape[2]
    return p[..., :n] @ v0 + (p[..., n:, None] * dv).sum(-2)


def ttt_unroll(head: Eagle3Head, batch: Batch, steps: int) -> Iterator[Tensor]:
    """The head's output hidden state of every pair index, step by step: ``steps`` x ``[B, T-1, H]``."""
    tokens = batch.tokens
    B, T = tokens.shape
    n = T - 1  # pair t = (h_t, x_{t+1})
    hidden = head.fuse(batch.features[:, :n].to(head.fc.weight.dtype))
    t = torch.arange(n, device=tokens.device)
    causal = (t[None, :] <= t[:, None])[None, None]
    padded = F.pad(tokens, (0, steps + 1))
    k0 = v0 = None
    diag_k: list[Tensor] = []
    diag_v: list[Tensor] = []
    for j in range(steps):
        proj = head.project(hidden, padded[:, j + 1 : j + 1 + n], (t + j)[None, :].expand(B, n))
        if j == 0:
            k0, v0 = proj.k, proj.v
            attn = head.attend(proj.q, k0, v0, causal)
        else:
            diag_k.append(proj.k)
            diag_v.append(proj.v)
            attn = _attend_ttt(proj.q, k0, v0, diag_k, diag_v, causal)
        hidden = head.layer_output(attn, proj.residual)
        yield hidden


def ttt_loss(
    head: Eagle3Head, batch: Batch, steps: int, teacher: TargetTail | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(weighted loss, correct top-1 per step [steps], counted labels per step [steps]).

    Without a teacher each step's term is the cross-entropy on the greedy labels inside the draft
    vocabulary; with one (SpecForge's objective) it is the KL to the target's distribution over
    the draft vocabulary at every answer position. Accuracy is top-1 over every answer label, a
    label outside the draft vocabulary counting as a miss (the verifier rejects such a draft too)."""
    tokens, lengths, plen = batch.tokens, batch.lengths, batch.prompt_lengths
    n = tokens.shape[1] - 1
    t = torch.arange(n, device=tokens.device)
    padded = F.pad(tokens, (0, steps + 2))
    teach = None if teacher is None else F.pad(teacher(batch), (0, 0, 0, steps + 2))  # [B, T + steps + 2, Vd]
    d_index = head.t2d.long().cumsum(0) - 1  # target id -> draft id (ids are sorted)
    loss = head.fc.weight.new_zeros(())
    correct, counted = torch.zeros(steps), torch.zeros(steps)
    for j, hidden in enumerate(ttt_unroll(head, batch, steps)):
        label_pos = t + j + 2  # step j at pair t predicts x_{t+j+2}, the target's choice at t + j + 1
        labels = padded[:, j + 2 : j + 2 + n]
        answers = (label_pos[None, :] < lengths[:, None]) & (label_pos[None, :] >= plen[:, None])
        rows = answers & head.t2d[labels] if teach is None else answers
        counted[j] = answers.sum().float().cpu()
        if not rows.any():
            continue
        lg = head.logits(hidden[rows]).float()  # LM head on labelled rows only
        in_vocab, target = head.t2d[labels[rows]], d_index[labels[rows]]
        if teach is not None:
            term = kl_to_teacher(teach[:, j + 1 : j + 1 + n][rows], torch.log_softmax(lg, -1))
        else:
            term = F.cross_entropy(lg, target)
        loss = loss + STEP_DECAY**j * term
        with torch.no_grad():
            correct[j] = ((lg.argmax(-1) == target) & in_vocab).sum().float().cpu()
    return loss, correct, counted


def build(target: Path, seqs, args):
    """(model, loss_fn, save_fn) of an EAGLE-3 head for ``target``: ``echo-train-drafter --kind eagle3``."""
    from sglang_echo.drafters.eagle3_head import Eagle3Config

    t = target_weights(target)
    head_cfg = Eagle3Config.for_target(t.config, args.draft_vocab)
    head, ids = start_head(Eagle3Head, head_cfg, t.config, (t.embed, t.lm_head, t.norm), seqs, args)
    teacher = TargetTail.for_features(target, head_cfg.aux_layer_ids, ids) if args.eagle3_teacher == "target" else None
    loss_fn = partial(ttt_loss, steps=args.ttt_steps, teacher=teacher)
    return head, loss_fn, lambda out: head.save(out, dtype=torch.float32)
