"""DART training: prefix-shared masked training with the annealed KL objective (DART Sec. 3.3).

For a training sequence of pairs ``t = (h_t, x_{t+1})`` (``t = 0..n-1``, ``n = T - 1``), *every*
pair is an anchor: at inference, after committing pairs ``0..t`` the drafter appends ``d - 1`` masks
at rotary positions ``t+1 .. t+d-1`` and reads ``d`` shifted logits. One forward trains all anchors
at once, sharing the prefix (DART Fig. 4 / App. B's Flex-Attention mask):

* pairs attend causally to pairs ("prompt causal");
* mask ``j`` of anchor ``t`` attends to pairs ``0..t`` ("mask preceding") and to masks ``1..j`` of
  its own block ("mask causal"); blocks never see each other.

The two key sets are scored separately and joined in one softmax, so the cost is
``O(n^2 (d-1))`` instead of a dense ``(n d)^2`` mask. Output ``k = 1..d`` of anchor ``t`` (``k = 1``: the
pair itself, ``k >= 2``: mask ``k - 1``) predicts ``x_{t+k+1}``; its teacher is the *target's* next-token
distribution at position ``t + k``, ``q_theta(. | x_{<=t+k})``, and the loss is

    L = sum_k gamma^(k-1) * mean_rows KL(q_theta || p_phi(. | x_{<=t+1}, k)),    gamma = 0.6

over answer positions (self-distilled tokens; prompts are context only). The teacher comes from
:class:`.teacher.TargetTail`: the target's last layers run on the deepest captured feature (the input of layer
``L - 3``), so no extra capture pass or logit storage is needed; its distribution is renormalised
over the draft vocabulary (the head cannot put mass elsewhere). Without a teacher the loss is the
cross-entropy on the greedy labels (KL to a one-hot target). Accuracy is top-1 against the label,
per output ``k`` (labels inside the draft vocabulary), like EAGLE-3's per-step accuracy.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from sglang_echo.drafters.dart_head import DartConfig, DartHead

from .batches import Batch
from .target import target_weights
from .teacher import TargetTail, kl_to_teacher

GAMMA = 0.6  # DART's annealing coefficient: output k is weighted gamma^(k-1)


def captured_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's layers (inputs of 2, L/2, L-3), so the existing feature capture is reused (DART
    App. B reads the same low/mid/high layers)."""
    return (2, num_layers // 2, num_layers - 3)


def _rep(t: Tensor, n: int) -> Tensor:
    """GQA: repeat the kv heads (dim -3) ``n`` times."""
    return t if n == 1 else t.repeat_interleave(n, dim=-3)


def prefix_shared_forward(head: DartHead, batch: Batch) -> Tensor:
    """Un-normalised layer outputs of every anchor's ``d`` positions, ``[B, n, d, H]``."""
    c = head.cfg
    tokens = batch.tokens
    B, T = tokens.shape
    n, m, dev = T - 1, c.num_masks, tokens.device
    rep = c.num_attention_heads // c.num_key_value_heads
    hidden = head.fuse(batch.features[:, :n].to(head.fc.weight.dtype))
    t = torch.arange(n, device=dev)
    xp, rp = head.pair_inputs(hidden, tokens[:, 1:])
    qp, kp, vp = head.qkv(xp, t[None].expand(B, n))  # [B, h, n, D], [B, kvh, n, D]
    causal = t[None, :] <= t[:, None]  # [query t, key s]
    out_p = head.layer_output(head.attend(qp, kp, vp, causal[None, None]), rp)  # [B, n, H]
    if m == 0:
        return out_p[:, :, None]

    j = torch.arange(m, device=dev)
    xm, rm = head.mask_inputs(j)  # [m, 2H], [m, H]
    pos = t[:, None] + j[None, :] + 1  # mask j+1 of anchor t sits at t + j + 1
    qm, km, vm = head.qkv(xm[None].to(xp.dtype), pos)  # [n, h, m, D], [n, kvh, m, D], [1, kvh, m, D]
    qm, km, vm = qm.transpose(0, 1), _rep(km, rep).transpose(0, 1), _rep(vm, rep)[0]  # [h, n, m, D], ., [h, m, D]
    scale = 1.0 / math.sqrt(c.head_dim)
    kp, vp = _rep(kp, rep), _rep(vp, rep)
    s_pre = torch.einsum("htjd,bhsd->bhtjs", qm, kp) * scale  # [B, h, n, m, n]: the prefix
    s_pre = s_pre.masked_fill(~causal[:, None, :], float("-inf"))  # anchor t sees pairs s <= t
    s_blk = torch.einsum("htjd,htkd->htjk", qm, km) * scale  # [h, n, m, m]: its own block
    s_blk = s_blk.masked_fill(~(j[None, :] <= j[:, None]), float("-inf"))
    p = torch.softmax(torch.cat([s_pre, s_blk.expand(B, -1, -1, -1, -1)], -1), -1)
    attn = torch.einsum("bhtjs,bhsd->bhtjd", p[..., :n], vp) + torch.einsum("bhtjk,hkd->bhtjd", p[..., n:], vm)
    out_m = head.layer_output(attn.reshape(B, -1, n * m, c.head_dim), rm.expand(B, n, m, -1).reshape(B, n * m, -1))
    return torch.cat([out_p[:, :, None], out_m.view(B, n, m, -1)], 2)


def dart_loss(head: DartHead, batch: Batch, gamma: float = GAMMA, teacher=None) -> tuple[Tensor, Tensor, Tensor]:
    """(annealed loss, correct top-1 per output k [d], counted labels per output k [d])."""
    d = head.cfg.depth
    tokens, lengths, plen = batch.tokens, batch.lengths, batch.prompt_lengths
    n = tokens.shape[1] - 1
    out = prefix_shared_forward(head, batch)  # [B, n, d, H]
    teach = teacher(batch) if teacher is not None else None  # [B, T, Vd]
    if teach is not None:
        teach = F.pad(teach, (0, 0, 0, d))  # positions t + k past the end (never read as rows)
    t = torch.arange(n, device=tokens.device)
    padded = F.pad(tokens, (0, d + 1))
    d_index = head.t2d.long().cumsum(0) - 1  # target id -> draft id (ids are sorted)
    loss = head.fc.weight.new_zeros(())
    correct, counted = torch.zeros(d), torch.zeros(d)
    for k in range(1, d + 1):
        label_pos = t + k + 1  # output k of anchor t predicts x_{t+k+1}
        labels = padded[:, k + 1 : k + 1 + n]
        rows = (label_pos[None, :] < lengths[:, None]) & (label_pos[None, :] >= plen[:, None])
        if not rows.any():
            continue
        logp = torch.log_softmax(head.logits(out[:, :, k - 1][rows]).float(), -1)  # [R, Vd]
        in_vocab = head.t2d[labels[rows]]
        target = d_index[labels[rows]]
        if teach is not None:  # KL(q_theta || p_phi), q_theta = the target at position t + k
            q_log = teach[:, k : k + n][rows]
            term = kl_to_teacher(q_log, logp)
        elif in_vocab.any():  # one-hot teacher: cross-entropy on the greedy labels
            term = F.cross_entropy(logp[in_vocab], target[in_vocab])
        else:
            continue
        loss = loss + gamma ** (k - 1) * term
        with torch.no_grad():
            correct[k - 1] = ((logp.argmax(-1) == target) & in_vocab).sum().float().cpu()
            counted[k - 1] = rows.sum().float().cpu()  # a label outside the draft vocabulary is a miss
    return loss, correct, counted


def build(target: Path, seqs, args):
    """(model, loss_fn, save_fn) of a DART head for ``target`` (like ``training.cli.build_eagle3``)."""
    from .eagle3 import start_head

    t = target_weights(target)
    cfg, embed, lm_head, norm = t.config, t.embed, t.lm_head, t.norm
    L = cfg["num_hidden_layers"]
    depth = getattr(args, "dart_depth", 8)
    head_cfg = DartConfig.for_target(
        cfg, args.draft_vocab, captured_layers(L), depth=depth, shared_mask=getattr(args, "dart_shared_mask", False)
    )
    head, ids = start_head(DartHead, head_cfg, cfg, (embed, lm_head, norm), seqs, args)
    if getattr(args, "init_from", None) is None:
        with torch.no_grad():  # masks start as "no information": zero residual -> uniform logits at init
            head.mask_rep[:, : head.cfg.hidden_size].zero_()
    teacher = None
    if getattr(args, "dart_teacher", "target") == "target":
        teacher = TargetTail.for_features(target, head_cfg.aux_layer_ids, ids)
    loss_fn = partial(dart_loss, gamma=getattr(args, "dart_gamma", GAMMA), teacher=teacher)
    return head, loss_fn, lambda out: head.save(out, dtype=torch.float32)
