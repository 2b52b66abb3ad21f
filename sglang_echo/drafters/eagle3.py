"""The engine-agnostic EAGLE-3 drafter: :class:`Eagle3Head` with its own KV cache and tree attention.

What it computes is what sglang's EAGLE-3 worker computes with the same head
(``llama_eagle3.py``), with exact tree attention instead of sglang's per-lane approximation:

* **Pairs.** Every committed position ``t`` of request ``b`` holds the pair
  ``(fuse(h_t), x_{t+1})`` (target feature of token ``x_t`` and the token after it) at rotary
  position ``t``; its output predicts ``x_{t+2}``. :meth:`Eagle3Drafter.catch_up` appends the new
  pairs of every request in one batched forward (ragged lengths padded), so after committing
  ``P_b`` pairs the cache holds positions ``0 .. P_b - 1``; the output of the last pair (logits,
  un-normalised hidden) drafts the children of the root, the last committed token ``x_{P_b}``.
  The head is a single layer, so a pair's k/v depend on the pair alone and only that last pair
  runs attention (over the request's whole cache), the MLP and the LM head.
* **Drafting.** Depth 0 needs no forward: the roots' children are the top-``k`` of the last
  pair's logits. Expanding a node ``n`` at depth ``d >= 1`` feeds the pair
  ``(hidden output that proposed n, token of n)`` at position ``P_b + d - 1``; it attends to the
  committed cache, to the step entries of its own ancestors at depths ``1 .. d - 1`` and to itself.
  The step's entries live in the cache past the longest request (slots ``base .. base + N``) and
  every candidate remembers which of them are its ancestors, so a whole depth is one batched
  forward over ``[B, F]`` whatever the tree's shape. The next :meth:`catch_up` overwrites them
  (WhiFlash's lazy catch-up: drafted state past the committed tokens is simply dropped).

Temperature 0 only: children are picked by top-``k`` (``Candidates.proposal`` stays
DETERMINISTIC); their log-probabilities are the head's (``log_softmax`` of its logits over the
draft vocabulary), mapped to target ids through ``d2t``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates

from .base import Drafter, adopt_columns, check_catch_up
from .eagle3_head import Eagle3Head


class Eagle3Drafter(Drafter):
    name = "eagle3"

    def __init__(self, head: Eagle3Head, device: torch.device | str | None = None):
        if device is not None:
            head = head.to(device)
        self.head = head
        self.device = head.fc.weight.device
        self.dtype = head.fc.weight.dtype
        self.logit_dtype = torch.promote_types(self.dtype, torch.float32)  # softmax in >= fp32
        self.captured_layers = tuple(head.cfg.aux_layer_ids)
        self.start([])

    # -- state ---------------------------------------------------------------------------------
    def start(self, prompts: Sequence[Tensor]) -> None:
        c, dev = self.head.cfg, self.device
        B = len(prompts)
        cap = max([int(p.numel()) for p in prompts], default=0) + 16
        self.batch_size = B
        self.lengths = torch.zeros(B, dtype=torch.int64, device=dev)  # committed pairs P_b
        self.k_cache = torch.zeros(B, c.num_key_value_heads, cap, c.head_dim, dtype=self.dtype, device=dev)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.last_logits = torch.zeros(B, c.draft_vocab_size, dtype=self.logit_dtype, device=dev)
        self.last_hidden = torch.zeros(B, c.hidden_size, dtype=self.dtype, device=dev)
        self.has_last = torch.zeros(B, dtype=torch.bool, device=dev)  # caught up at least once
        self._reset_step()

    def _reset_step(self) -> None:
        self._next_depth = 0  # depth of the frontier the next propose() must expand
        self._base = 0  # first cache slot of this step's entries
        self._n_step = 0  # entries written this step
        self._node_hidden: Tensor | None = None  # [B, F, H] output hidden of each expanded node
        self._node_anc: Tensor | None = None  # [B, F, N] step entries on its path, itself included
        self._cand_node: Tensor | None = None  # [B, C] expanded node (column) that proposed each candidate

    def _reserve(self, n: int) -> None:
        """Make room for ``n`` cache slots (amortised doubling)."""
        cap = self.k_cache.shape[2]
        if n <= cap:
            return
        new = max(n, 2 * cap)
        pad = (0, 0, 0, new - cap)
        self.k_cache = F.pad(self.k_cache, pad)
        self.v_cache = F.pad(self.v_cache, pad)

    # -- the contract --------------------------------------------------------------------------
    @torch.no_grad()
    def catch_up(self, tokens: Sequence[Tensor], features: Sequence[Tensor] | None) -> None:
        B, dev, head = self.batch_size, self.device, self.head
        self._reset_step()
        checked = check_catch_up(tokens, features, B, len(self.captured_layers) * head.cfg.hidden_size, "EAGLE-3")
        if checked is None:
            return
        n, feats = checked
        n = n.to(dev)
        tok = pad_sequence([t.reshape(-1).to(dev, torch.int64) for t in tokens], batch_first=True)  # [B, M]
        feat = pad_sequence([f.to(dev, self.dtype) for f in feats], batch_first=True)  # [B, M, 3H]
        M = tok.shape[1]
        ar = torch.arange(M, device=dev)
        real = ar[None, :] < n[:, None]  # [B, M]
        pos = self.lengths[:, None] + ar[None, :]  # [B, M]
        new_len = self.lengths + n
        L = int(new_len.max())
        self._reserve(L)

        hidden = head.fuse(feat)
        pr = head.project(hidden, tok, pos)
        b_idx = torch.arange(B, device=dev)[:, None].expand(B, M)[real]
        t_idx = pos[real]
        self.k_cache[b_idx, :, t_idx] = pr.k.transpose(1, 2)[real]
        self.v_cache[b_idx, :, t_idx] = pr.v.transpose(1, 2)[real]
        # The head is one layer, so k/v depend on the pairs alone and only each request's last
        # pair needs attention and the rest of the layer: it sees the whole (new) cache.
        last = (n - 1).clamp(min=0)
        got = n > 0
        idx = torch.arange(B, device=dev)
        keys = torch.arange(L, device=dev)[None, :]
        mask = (keys < new_len[:, None]) | (keys == 0)  # slot 0: no NaN for rows with nothing new
        q = pr.q[idx, :, last][:, :, None]  # [B, heads, 1, D]
        attn = head.attend(q, self.k_cache[:, :, :L], self.v_cache[:, :, :L], mask[:, None, None])
        logits, out = head.finish(attn, pr.residual[idx, last][:, None])
        self.last_logits = torch.where(got[:, None], logits[:, 0].to(self.logit_dtype), self.last_logits)
        self.last_hidden = torch.where(got[:, None], out[:, 0], self.last_hidden)
        self.has_last |= got
        self.lengths = new_len

    @torch.no_grad()
    def propose(self, frontier: Frontier, k: int) -> Candidates:
        head, dev = self.head, self.device
        B, Fw = frontier.slots.shape
        if B != self.batch_size:
            raise ValueError(f"frontier has {B} requests, the batch has {self.batch_size}")
        d = frontier.depth
        if d != self._next_depth:
            raise RuntimeError(f"propose expected a depth-{self._next_depth} frontier, got depth {d}")
        k = min(k, head.cfg.draft_vocab_size)
        valid = frontier.valid & self.has_last[:, None]  # [B, F]

        if d == 0:  # the roots' children come from the last committed pair
            logp = torch.log_softmax(self.last_logits, -1)
            top, ids = logp.topk(k, -1)  # [B, k]
            self._base, self._n_step = int(self.lengths.max()), 0
            self._node_hidden = self.last_hidden[:, None]  # node 0 = the root
            self._node_anc = torch.zeros(B, 1, 0, dtype=torch.bool, device=dev)
            self._cand_node = torch.zeros(B, k, dtype=torch.int64, device=dev)
            self._next_depth = 1
            return Candidates(
                tokens=head.to_target(ids),
                logprob=top,
                parent=torch.zeros(B, k, dtype=torch.int64, device=dev),
                valid=valid[:, :1].expand(B, k).clone(),
            )

        # Frontier node f was candidate column source[f] of the last call, proposed by node cand_node.
        src = frontier.source.clamp(min=0)
        node = self._cand_node.gather(1, src)  # [B, F]
        H, N = self._node_hidden.shape[-1], self._n_step
        hidden = self._node_hidden.gather(1, node[..., None].expand(B, Fw, H))
        anc = self._node_anc.gather(1, node[..., None].expand(B, Fw, N))  # [B, F, N]
        toks = torch.where(valid, frontier.tokens, torch.zeros_like(frontier.tokens))
        pos = (self.lengths + (d - 1))[:, None].expand(B, Fw)
        pr = head.project(hidden, toks, pos)

        base = self._base
        end = base + N + Fw
        self._reserve(end)
        self.k_cache[:, :, base + N : end] = pr.k
        self.v_cache[:, :, base + N : end] = pr.v
        me = torch.eye(Fw, dtype=torch.bool, device=dev).expand(B, Fw, Fw)
        path = torch.cat([anc, me], -1)  # [B, F, N + F]: step entries on the node's path
        committed = torch.arange(base, device=dev)[None, None, :] < self.lengths[:, None, None]
        mask = torch.cat([committed.expand(B, Fw, base), path], -1)[:, None]  # [B, 1, F, end]
        attn = head.attend(pr.q, self.k_cache[:, :, :end], self.v_cache[:, :, :end], mask)
        logits, out = head.finish(attn, pr.residual)

        logp = torch.log_softmax(logits.to(self.logit_dtype), -1)  # [B, F, Vd]
        top, ids = logp.topk(k, -1)  # [B, F, k]
        self._n_step = N + Fw
        self._node_hidden, self._node_anc = out, path
        cols = torch.arange(Fw, device=dev)[None, :, None].expand(B, Fw, k).reshape(B, Fw * k)
        self._cand_node = cols
        self._next_depth = d + 1
        return Candidates(
            tokens=head.to_target(ids).reshape(B, Fw * k),
            logprob=top.reshape(B, Fw * k),
            parent=cols.clone(),
            valid=valid[:, :, None].expand(B, Fw, k).reshape(B, Fw * k),
        )

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """A foreign child of frontier slot ``f`` is expanded from the hidden output that expanded
        ``f`` (node ``f``; node 0, the root, at depth 0), as the head's own children of ``f`` are."""
        if self._cand_node is None:
            raise RuntimeError("adopt() follows a propose() of the same step")
        self._cand_node = adopt_columns(self._cand_node, parent.to(self._cand_node), before)
