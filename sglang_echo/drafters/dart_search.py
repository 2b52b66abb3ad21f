"""DART's tree search over one step's ``d`` top-``K`` marginals, engine-agnostic: the offline
:class:`~sglang_echo.drafters.dart.DartDrafter` and the server (:mod:`sglang_echo.integration.dart`)
both run it.

Depth ``l + 1`` candidates of *every* frontier node are the top-``K`` (25) tokens of the marginal
``l + 1``; what differs between parents is the n-gram continuity score of each token after the
parent's path. Children are ranked by DART's COMBINE
(App. D, fvliang/DART ``searcher.cpp``) at level ``l`` (0-based depth of the parent)::

    e_c = w_logit(l) * log(p~_c + eps) + w_ng * log(Pr_ngram(c | path) + eps)
    w_logit(l) = 0.9^l,  w_ng = 0.5,  COMBINE = w_level(l) * e_c,  w_level(l) = (l + 1)^-0.7

with ``p~`` the marginal renormalised over its top-``K`` (DART softmaxes the top-``K`` logits). As in
DART's released build (``NO_NGRAM_ON_FIRST_TOKEN``) the root's children (level 0) use the logits only.

Log-probabilities. ECHO's gates and path scores (Eq. 5-7) need probabilities, and COMBINE is not one.
Each child gets the product of experts of the same two terms, normalised over the parent's ``K``
candidates and scaled by the marginal mass ``M = sum_K p`` those candidates cover::

    q(c | parent) = M * exp(e_c) / sum_{c' in K} exp(e_c')

so the siblings of a node sum to ``M <= 1``, the order among siblings is COMBINE's order (the two
differ by a per-parent constant and the positive factor ``w_level``), and without the n-gram term
(``use_ngram=False``, the ablation, and level 0) ``q`` is exactly the head's marginal ``p``. What this
cannot keep is COMBINE's *cross-parent* ranking (a parent none of whose children the n-gram
supports loses ``~0.5 * log(eps)`` on all of them in DART, but keeps its mass ``M`` here): that is
why the paper's static Algorithm 1 is a separate builder, :meth:`DartSearch.algorithm1`.

Algorithm 1 (static DART tree, beam ``w = 20``, ``K = 25`` per position, ``theta = 59`` nodes) ranks by
the *cumulative* COMBINE score, which is not a path log-probability, so it does not fit
:class:`~sglang_echo.core.policy.TreePolicy`'s seam (policies rank by ``S = sum log q``, which
:class:`~sglang_echo.core.tree.NodePool` computes from ``Candidates.logprob``). Rather than passing
COMBINE off as a log-probability, :class:`~sglang_echo.drafters.dart.DartTreePolicy` is a thin
adapter: it takes no proposals and builds the whole tree in ``finish`` with the vectorised
Algorithm 1 (nodes still carry the proper ``log q`` and ``S``, so verification and metrics read
them as usual).

Temperature 0 only: every proposal is DETERMINISTIC (top-``K`` picks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates, DraftTrees, NodePool

from .base import adopt_columns
from .ngram_trie import LocalNGrams, NGramTrie, continuation_prob


@dataclass(frozen=True)
class CombineConfig:
    """DART's tree-search constants (App. D; ``tree_search_config.py`` of fvliang/DART)."""

    topk: int = 25  # candidates per position (k_i)
    w_ng: float = 0.5  # n-gram weight
    logit_decay: float = 0.9  # w_logit = logit_decay ** level
    level_power: float = 0.7  # w_level = (level + 1) ** -level_power
    eps: float = 1e-10
    ngram_first: bool = False  # n-gram term at level 0 too (DART's release: off)
    beam: int = 20  # Algorithm 1: beam width w
    budget: int = 59  # Algorithm 1: tree size theta (draft nodes, the root excluded)

    def w_logit(self, level: int) -> float:
        return self.logit_decay**level

    def w_level(self, level: int) -> float:
        return (level + 1) ** -self.level_power


def combine(
    log_ptilde: Tensor, ng: Optional[Tensor], level: int, cfg: CombineConfig = CombineConfig()
) -> tuple[Tensor, Tensor]:
    """The un-weighted COMBINE term ``e`` and the child log-probabilities ``log q`` of one level.

    ``log_ptilde [..., K]``: log of the top-``K`` marginal renormalised over ``K`` plus ``log M`` is
    *not* included (callers add it); ``ng [..., K]`` n-gram probabilities or None (no n-gram term).
    Returns ``(e [..., K], log_softmax_K(e))``; DART's COMBINE score is ``cfg.w_level(level) * e``.
    """
    if ng is None:
        e = log_ptilde
    else:
        e = cfg.w_logit(level) * torch.log(log_ptilde.exp() + cfg.eps) + cfg.w_ng * torch.log(ng + cfg.eps)
    return e, torch.log_softmax(e, -1)


class DartSearch:
    """One step's tree search over DART's ``d`` top-``K`` marginals: COMBINE-ranked
    :meth:`propose` (the core's drafter protocol, any tree policy) and :meth:`algorithm1`.

    Engine-agnostic: :meth:`begin` takes the step's marginals wherever they were computed
    (:class:`~sglang_echo.drafters.dart.DartDrafter`'s plain-torch head offline, sglang's draft model in the server,
    :mod:`sglang_echo.integration.dart`) and every request's committed tokens (the n-gram context).
    """

    def __init__(
        self,
        vocab_size: int,
        trie: Optional[NGramTrie] = None,
        use_ngram: bool = True,
        combine_cfg: CombineConfig = CombineConfig(),
        local_weight: float = 1.0,
        ngram_order: int = 3,
        eos_id: Optional[int] = None,
    ):
        if ngram_order < 2 and trie is None:
            raise ValueError(f"the n-gram order must be >= 2, got {ngram_order}")
        if trie is not None:
            if trie.vocab_size != vocab_size:
                raise ValueError(
                    f"n-gram trie built for a {trie.vocab_size}-token vocabulary, the head's target has {vocab_size}"
                )
            ngram_order = trie.order
        self.vocab_size, self.trie, self.use_ngram, self.cfg = vocab_size, trie, use_ngram, combine_cfg
        self.local_weight, self.order, self.eos_id = local_weight, ngram_order, eos_id
        self._top_tok: Optional[Tensor] = None
        self._next_depth = 0

    def describe(self) -> str:
        if not self.use_ngram:
            return "ngram=off"
        return f"ngram=order={self.order},trie={'yes' if self.trie is not None else 'no'},local={self.local_weight:g}"

    def to(self, device) -> DartSearch:
        if self.trie is not None:
            self.trie = self.trie.to(device)
        return self

    def begin(self, top_lp: Tensor, top_tok: Tensor, hist: Tensor, hist_len: Tensor, ready: Tensor) -> None:
        """A new step. ``top_lp, top_tok [B, d, K]``: each marginal's top-``K`` log-probabilities
        and *target* ids (``-inf`` pads a shorter marginal); ``hist [B, L]`` / ``hist_len [B]``: the
        committed tokens (the root last); ``ready [B]``: requests with marginals (others propose nothing)."""
        self._top_lp, self._top_tok = top_lp.float(), top_tok
        self.hist, self.hist_len, self.ready = hist, hist_len, ready
        self.batch_size, self.depth, self.device = top_lp.shape[0], top_lp.shape[1], top_lp.device
        self._local: Optional[LocalNGrams] = None
        self._cand_ctx: Optional[Tensor] = None  # [B, C, order-1] n-gram context ending at each candidate
        self._frontier_ctx: Optional[Tensor] = None  # [B, F, order-1] that of each node the last propose expanded
        self._next_depth = 0

    def _root_context(self) -> Tensor:
        """``[B, order-1]`` last committed tokens (-1 before the start)."""
        n = self.order - 1
        pos = self.hist_len[:, None] - n + torch.arange(n, device=self.device)[None, :]
        got = self.hist.gather(1, pos.clamp(min=0))
        return torch.where(pos >= 0, got, torch.full_like(got, -1))

    def _ngram(self, ctx: Tensor, tokens: Tensor) -> Tensor:
        """``ctx [B, F, order-1]``, ``tokens [B, K]`` -> ``Pr_ngram [B, F, K]``."""
        B, Fw, _ = ctx.shape
        K = tokens.shape[1]
        if self._local is None and self.local_weight > 0:
            self._local = LocalNGrams(self.hist, self.hist_len, self.order, self.vocab_size)
        c = ctx[:, :, None, :].expand(B, Fw, K, ctx.shape[-1]).reshape(B, Fw * K, -1)
        t = tokens[:, None, :].expand(B, Fw, K).reshape(B, Fw * K)
        p, _ = continuation_prob(c, t, self.order, self.vocab_size, self.trie, self._local, self.local_weight)
        return p.view(B, Fw, K)

    def _level(self, level: int, ctx: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Scores of the top-``K`` tokens of marginal ``level + 1`` after each context:
        (COMBINE term ``e [B, F, K]``, ``log q [B, F, K]``, target ids ``[B, K]``)."""
        lp, tok = self._top_lp[:, level], self._top_tok[:, level]  # [B, K]
        log_m = torch.logsumexp(lp, -1, keepdim=True)
        ng = None
        if self.use_ngram and (level >= 1 or self.cfg.ngram_first) and ctx is not None:
            ng = self._ngram(ctx, tok)
        Fw = 1 if ctx is None else ctx.shape[1]
        e, logq = combine((lp - log_m)[:, None, :].expand(-1, Fw, -1), ng, level, self.cfg)
        return e, logq + log_m[:, None], tok

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        dev = self.device
        B, Fw = frontier.slots.shape
        if self._top_tok is None or B != self.batch_size:
            raise RuntimeError(f"DART search: begin() the step first (frontier has {B} requests)")
        d = frontier.depth
        if d != self._next_depth:
            raise RuntimeError(f"propose expected a depth-{self._next_depth} frontier, got depth {d}")
        self._next_depth = d + 1
        valid = frontier.valid & self.ready[:, None]
        if d >= self.depth:  # past the head's last marginal: nothing to propose
            z = torch.zeros(B, Fw * k, dtype=torch.int64, device=dev)
            self._cand_ctx = None
            return Candidates(
                z,
                torch.full((B, Fw * k), float("-inf"), device=dev),
                torch.arange(Fw, device=dev).repeat_interleave(k).expand(B, -1).contiguous(),
                z.bool(),
            )
        if d == 0:
            ctx = self._root_context()[:, None].expand(B, Fw, -1)
        else:
            ctx = self._cand_ctx.gather(1, frontier.source.clamp(min=0)[..., None].expand(B, Fw, self.order - 1))
        e, logq, tok = self._level(d, ctx)  # [B, F, K]
        kk = min(k, e.shape[-1])
        order = torch.sort(e, dim=-1, descending=True, stable=True).indices[..., :kk]  # COMBINE order
        tokens = tok[:, None, :].expand(B, Fw, -1).gather(2, order)
        lq = logq.gather(2, order)
        self._frontier_ctx = ctx
        self._cand_ctx = self._child_ctx(ctx, tokens).reshape(B, Fw * kk, -1)
        return Candidates(
            tokens=tokens.reshape(B, Fw * kk),
            logprob=lq.reshape(B, Fw * kk),
            parent=torch.arange(Fw, device=dev)[None, :, None].expand(B, Fw, kk).reshape(B, Fw * kk),
            valid=(valid[:, :, None] & torch.isfinite(lq)).reshape(B, Fw * kk),  # -inf: a padded marginal entry
        )

    def _child_ctx(self, ctx: Tensor, tokens: Tensor) -> Tensor:
        """The n-gram contexts ``[B, F, K, order-1]`` ending at children ``tokens [B, F, K]`` of
        nodes whose contexts are ``ctx [B, F, order-1]``."""
        B, Fw, K = tokens.shape
        return torch.cat([ctx[:, :, None, 1:].expand(B, Fw, K, self.order - 2), tokens[..., None]], -1)

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """Foreign children get the n-gram context their token ends (:class:`.base.Drafter`)."""
        if self._cand_ctx is None:  # past the head's last marginal: nothing is expanded further
            return
        B, E = parent.shape
        ctx = self._frontier_ctx.gather(1, parent[..., None].expand(B, E, self.order - 1))
        theirs = self._child_ctx(ctx.reshape(B * E, 1, -1), tokens.reshape(B * E, 1, 1)).reshape(B, E, -1)
        self._cand_ctx = adopt_columns(self._cand_ctx, theirs, before)

    def algorithm1(self, roots: Tensor, active: Optional[Tensor] = None, max_depth: Optional[int] = None) -> DraftTrees:
        """DART's continuity-aware tree pruning (Alg. 1), vectorised over the batch and the beam.

        Level ``l`` expands every beam sequence with the top-``K`` tokens of marginal ``l + 1``,
        scored ``parent + w_level(l) * e`` (COMBINE); every candidate joins the global tree, the best
        ``beam`` (sequences ending in EOS last, as in DART's searcher) are expanded next. The tree keeps
        the ``budget`` best nodes by that cumulative score (ancestor-closed: increments are <= 0 and
        ties keep the parent, which comes first). Nodes carry the proper ``log q`` of :meth:`propose`.
        """
        cfg, dev, B = self.cfg, self.device, self.batch_size
        K = self._top_tok.shape[-1]
        active = (torch.ones(B, dtype=torch.bool, device=dev) if active is None else active.to(dev)) & self.ready
        pool = NodePool(roots.to(dev).reshape(B))
        beam_slots = torch.zeros(B, 1, dtype=torch.int64, device=dev)
        beam_score = torch.zeros(B, 1, device=dev)
        beam_valid = active[:, None].clone()
        ctx = self._root_context()[:, None]  # [B, W, order-1]
        scores = [torch.zeros(B, 1, device=dev)]  # COMBINE score of every pool slot (root: 0)
        for level in range(min(self.depth, max_depth or self.depth)):
            W = beam_slots.shape[1]
            e, logq, tok = self._level(level, ctx)  # [B, W, K]
            inc = (cfg.w_level(level) * e).clamp(max=0.0)
            ok = beam_valid[..., None] & torch.isfinite(logq)
            score = torch.where(ok, beam_score[..., None] + inc, torch.full_like(inc, float("-inf")))
            tokens = tok[:, None, :].expand(B, W, K)
            cands = Candidates(
                tokens.reshape(B, W * K),
                logq.reshape(B, W * K),
                torch.arange(W, device=dev)[None, :, None].expand(B, W, K).reshape(B, W * K),
                ok.reshape(B, W * K),
            )
            slots = pool.append(cands, beam_slots, level + 1)
            flat = score.reshape(B, W * K)
            scores.append(flat)
            # Next beam: best scores, sequences ending in EOS after every other one.
            order = torch.sort(flat, dim=1, descending=True, stable=True).indices
            if self.eos_id is not None:
                is_eos = cands.tokens.gather(1, order) == self.eos_id
                order = order.gather(1, torch.sort(is_eos.long(), dim=1, stable=True).indices)
            w = min(cfg.beam, W * K)
            cols = order[:, :w]
            beam_slots = slots.gather(1, cols)
            beam_score = flat.gather(1, cols)
            beam_valid = torch.isfinite(beam_score)
            ctx_all = torch.cat([ctx[:, :, None, 1:].expand(B, W, K, self.order - 2), tokens[..., None]], -1).reshape(
                B, W * K, -1
            )
            ctx = ctx_all.gather(1, cols[..., None].expand(B, w, self.order - 1))
        allscore = torch.cat(scores, 1)
        allscore[:, 0] = float("-inf")  # the root is always kept; rank the drafts
        order = torch.sort(allscore, dim=1, descending=True, stable=True).indices[:, : cfg.budget]
        keep = torch.isfinite(allscore.gather(1, order))
        pool.mark(order, keep)
        return pool.compact()
