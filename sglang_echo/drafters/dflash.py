"""The engine-agnostic DFlash drafter: one block forward per step, per-position marginals as a tree.

State. Committed position ``t`` of request ``b`` holds, in every draft layer, the context key/value
of the target's feature of token ``x_t`` (:meth:`DFlashHead.context_kv`, rotary position ``t``).
:meth:`DFlashDrafter.catch_up` appends the newly committed positions of every request in one batched
projection (WhiFlash's lazy catch-up: the drafter's state only ever grows by committed tokens, and
since nothing drafted is cached, nothing has to be dropped). After committing ``P_b`` features the
cache holds positions ``0 .. P_b - 1`` and the root of the next tree is ``x_{P_b}``, exactly the
context ``z-lab/dflash``'s ``spec_generate`` and sglang's DFlash worker keep.

Drafting. At depth 0 one batched forward runs every request's block ``[root, MASK x (bs - 1)]`` at
rotary positions ``P_b .. P_b + bs - 1`` over its cached context (bidirectional inside the block) and
keeps the ``bs - 1`` per-position log-softmax marginals over the target vocabulary. Depth ``d``
frontier nodes all get the same children: the top-``k`` of marginal ``d + 1`` (block position
``d + 1``) with its normalised log-probabilities, whatever their parent, so the tree is per-position
top-``k`` branching; with ``k = 1`` (chain policies, ECHO's truncated requests) it is DFlash's own
greedy block. Depths past ``block_size - 1`` have no marginal and yield no candidates. Children are
picked (``Candidates.proposal`` stays DETERMINISTIC), so this is the temperature-0 drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates

from .base import Drafter, check_catch_up
from .dflash_head import DFlashHead


class DFlashDrafter(Drafter):
    name = "dflash"

    def __init__(self, head: DFlashHead, device: torch.device | str | None = None):
        if device is not None:
            head = head.to(device)
        self.head = head.eval()
        self.device = head.fc.weight.device
        self.dtype = head.fc.weight.dtype
        self.captured_layers = head.cfg.captured_layers
        self.block_size = head.cfg.block_size
        self.start([])

    def describe(self) -> str:
        c = self.head.cfg
        return (
            f"block_size={c.block_size},layers={c.num_hidden_layers},target_layer_ids={list(c.target_layer_ids)},"
            f"mask_token_id={c.mask_token_id}"
        )

    # -- state ---------------------------------------------------------------------------------
    def start(self, prompts: Sequence[Tensor]) -> None:
        c, dev = self.head.cfg, self.device
        B = len(prompts)
        cap = max([int(p.numel()) for p in prompts], default=0) + 16
        self.batch_size = B
        self.lengths = torch.zeros(B, dtype=torch.int64, device=dev)  # committed context positions P_b
        shape = (B, c.num_key_value_heads, cap, c.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(c.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(c.num_hidden_layers)]
        self._reset_step()

    def _reset_step(self) -> None:
        self._next_depth = 0
        self._logp: Optional[Tensor] = None  # [B, bs - 1, V] this step's marginals

    def _reserve(self, n: int) -> None:
        cap = self.k_cache[0].shape[2] if self.k_cache else n
        if n <= cap:
            return
        pad = (0, 0, 0, max(n, 2 * cap) - cap)
        self.k_cache = [F.pad(t, pad) for t in self.k_cache]
        self.v_cache = [F.pad(t, pad) for t in self.v_cache]

    # -- the contract --------------------------------------------------------------------------
    @torch.no_grad()
    def catch_up(self, tokens: Sequence[Tensor], features: Sequence[Tensor] | None) -> None:
        B, dev, head = self.batch_size, self.device, self.head
        self._reset_step()
        checked = check_catch_up(tokens, features, B, head.cfg.num_context_features * head.cfg.hidden_size, "DFlash")
        if checked is None:
            return
        n, feats = checked
        n = n.to(dev)
        feat = pad_sequence([f.to(dev, self.dtype) for f in feats], batch_first=True)  # [B, M, n_ctx * H]
        M = feat.shape[1]
        ar = torch.arange(M, device=dev)
        real = ar[None, :] < n[:, None]
        pos = self.lengths[:, None] + ar[None, :]
        self._reserve(int((self.lengths + n).max()))
        b_idx = torch.arange(B, device=dev)[:, None].expand(B, M)[real]
        t_idx = pos[real]
        # features[b][i] belongs to the token before tokens[b][i], i.e. to committed position pos.
        for l, (k, v) in enumerate(head.context_kv(head.context(feat), pos)):
            self.k_cache[l][b_idx, :, t_idx] = k.transpose(1, 2)[real]
            self.v_cache[l][b_idx, :, t_idx] = v.transpose(1, 2)[real]
        self.lengths = self.lengths + n

    @torch.no_grad()
    def block_marginals(self, roots: Tensor) -> Tensor:
        """One block forward for every request: ``roots [B]`` (the last committed tokens) ->
        log-probabilities ``[B, block_size - 1, V]`` of the tokens 1 .. bs-1 past the root."""
        Lc = int(self.lengths.max()) if self.batch_size else 0
        kv = [(k[:, :, :Lc], v[:, :, :Lc]) for k, v in zip(self.k_cache, self.v_cache)]
        return block_marginals(self.head, roots.to(self.device, torch.int64), self.lengths, kv)

    @torch.no_grad()
    def propose(self, frontier: Frontier, k: int) -> Candidates:
        B = frontier.slots.shape[0]
        if B != self.batch_size:
            raise ValueError(f"frontier has {B} requests, the batch has {self.batch_size}")
        d = frontier.depth
        if d == 0:  # a new step: one block forward gives every depth's marginal
            self._logp = self.block_marginals(frontier.tokens[:, 0])
        elif d != self._next_depth or self._logp is None:
            raise RuntimeError(f"propose expected a depth-{self._next_depth} frontier, got depth {d}")
        self._next_depth = d + 1
        return marginal_candidates(self._logp, frontier, k, ready=self.lengths > 0)

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """Nothing to keep: a depth's children come from its marginal whatever their parent."""


@torch.no_grad()
def block_marginals(head: DFlashHead, roots: Tensor, lengths: Tensor, ctx_kv: list[tuple[Tensor, Tensor]]) -> Tensor:
    """DFlash's step forward, shared by the offline drafter and the server's.

    Request ``b`` has committed context positions ``0 .. lengths[b] - 1`` (per layer, ``ctx_kv``
    ``[B, kv_heads, Lc, D]``, entries past ``lengths[b]`` ignored); its block ``[roots[b], MASK x
    (bs - 1)]`` sits at positions ``lengths[b] ..`` and sees that context plus the whole block.
    Returns log-probabilities ``[B, bs - 1, V]`` of the tokens 1 .. bs-1 past the root (softmax in at
    least fp32)."""
    B, bs, dev = roots.shape[0], head.cfg.block_size, roots.device
    Lc = ctx_kv[0][0].shape[2] if ctx_kv else 0
    pos = lengths[:, None] + torch.arange(bs, device=dev)[None, :]
    ctx_ok = torch.arange(Lc, device=dev)[None, :] < lengths[:, None]  # [B, Lc]
    mask = torch.cat([ctx_ok, torch.ones(B, bs, dtype=torch.bool, device=dev)], 1)[:, None, None, :]
    hid = head.forward_blocks(head.block_tokens(roots), pos, ctx_kv, mask)
    return torch.log_softmax(head.logits(hid[:, 1:]).to(torch.promote_types(hid.dtype, torch.float32)), -1)


def marginal_candidates(logp: Tensor, frontier: Frontier, k: int, ready: Tensor) -> Candidates:
    """Per-position top-``k`` branching: every depth-``d`` frontier node gets the top-``k`` of
    marginal ``d + 1`` (``logp [B, bs - 1, V]``) as children, whatever its parent; requests that
    are not ``ready`` (no context yet) and depths past the block propose nothing."""
    B, Fw = frontier.slots.shape
    d, dev = frontier.depth, logp.device
    k = max(1, min(k, logp.shape[-1]))
    valid = frontier.valid & ready[:, None]  # [B, F]
    parent = torch.arange(Fw, device=dev).repeat_interleave(k)[None, :].expand(B, Fw * k)
    if d >= logp.shape[1]:  # past the block: nothing to propose
        return Candidates(
            tokens=torch.zeros(B, Fw * k, dtype=torch.int64, device=dev),
            logprob=torch.zeros(B, Fw * k, device=dev),
            parent=parent.clone(),
            valid=torch.zeros(B, Fw * k, dtype=torch.bool, device=dev),
        )
    top, ids = logp[:, d].topk(k, -1)  # marginal of depth d + 1, [B, k]
    return Candidates(
        tokens=ids[:, None, :].expand(B, Fw, k).reshape(B, Fw * k),
        logprob=top[:, None, :].expand(B, Fw, k).reshape(B, Fw * k).float(),
        parent=parent.clone(),
        valid=valid[:, :, None].expand(B, Fw, k).reshape(B, Fw * k),
    )


def load_dflash_drafter(
    draft: Path, embed: Tensor, lm_head: Optional[Tensor] = None, num_target_layers: Optional[int] = None, device=None
) -> DFlashDrafter:
    """A DFlash draft directory -> drafter sharing the target's embedding and LM head."""
    head = DFlashHead.load(Path(draft), embed=embed, lm_head=lm_head, num_target_layers=num_target_layers)
    return DFlashDrafter(head, device=device)


__all__ = ["DFlashDrafter", "block_marginals", "load_dflash_drafter", "marginal_candidates"]
