"""The engine-agnostic DART drafter: one forward per step gives ``d`` marginals; the tree policy
reads them depth by depth, re-ranked by DART's N-gram-enforced COMBINE score.

State. Like :class:`~sglang_echo.drafters.eagle3.Eagle3Drafter`, committed position ``t`` holds the
pair ``(fc(h_t), x_{t+1})`` at rotary position ``t`` in the drafter's own KV cache;
:meth:`DartDrafter.catch_up` appends the new pairs of every request in one batched projection
(lazy catch-up: nothing drafted is ever cached, so nothing has to be dropped). The drafter also
keeps every request's committed tokens (prompt + output) for the n-gram context.

Drafting. At depth 0 one batched forward runs, per request, the last pair and the ``d - 1`` mask
positions (rotary positions ``P-1 .. P+d-2``) over the committed cache: the ``d`` shifted logits
(:class:`~sglang_echo.drafters.dart_head.DartHead`). Depth ``l + 1`` candidates of *every* frontier
node are the top-``K`` (25) tokens of the marginal ``l + 1``; what differs between parents is the
n-gram continuity score of each token after the parent's path. Children are ranked by DART's COMBINE
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
why the paper's static Algorithm 1 is a separate builder, :meth:`DartDrafter.algorithm1`.

Algorithm 1 (static DART tree, beam ``w = 20``, ``K = 25`` per position, ``theta = 59`` nodes) ranks by
the *cumulative* COMBINE score, which is not a path log-probability, so it does not fit
:class:`~sglang_echo.core.policy.TreePolicy`'s seam (policies rank by ``S = sum log q``, which
:class:`~sglang_echo.core.tree.NodePool` computes from ``Candidates.logprob``). Rather than passing
COMBINE off as a log-probability, :class:`DartTreePolicy` is a thin adapter: it takes no proposals
and builds the whole tree in ``finish`` with the drafter's vectorised Algorithm 1 (nodes still carry
the proper ``log q`` and ``S``, so verification and metrics read them as usual).

Temperature 0 only: every proposal is DETERMINISTIC (top-``K`` picks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from sglang_echo.core.policy import BuildState, Frontier, TreePolicy
from sglang_echo.core.tree import Candidates, DraftTrees, NodePool

from .base import Drafter, adopt_columns, check_catch_up
from .dart_head import TRIE_FILE, DartHead
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
    (:class:`DartDrafter`'s plain-torch head offline, sglang's draft model in the server,
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


class DartDrafter(Drafter):
    name = "dart"

    def __init__(
        self,
        head: DartHead,
        trie: Optional[NGramTrie] = None,
        use_ngram: bool = True,
        combine_cfg: CombineConfig = CombineConfig(),
        local_weight: float = 1.0,
        ngram_order: int = 3,
        eos_id: Optional[int] = None,
        device: torch.device | str | None = None,
    ):
        if device is not None:
            head = head.to(device)
        self.head = head
        self.device = head.fc.weight.device
        self.dtype = head.fc.weight.dtype
        self.logit_dtype = torch.promote_types(self.dtype, torch.float32)
        self.captured_layers = tuple(head.cfg.aux_layer_ids)
        self.depth = head.cfg.depth
        self.search = DartSearch(
            head.cfg.vocab_size, trie, use_ngram, combine_cfg, local_weight, ngram_order, eos_id
        ).to(self.device)
        self.start([])

    # The search's settings, read by the bench and DartTreePolicy.
    cfg = property(lambda self: self.search.cfg)
    trie = property(lambda self: self.search.trie)
    use_ngram = property(lambda self: self.search.use_ngram)
    order = property(lambda self: self.search.order)

    def describe(self) -> str:
        return f"depth={self.depth},topk={self.cfg.topk},{self.search.describe()}"

    # -- state ---------------------------------------------------------------------------------
    def start(self, prompts: Sequence[Tensor]) -> None:
        c, dev = self.head.cfg, self.device
        B = len(prompts)
        cap = max([int(p.numel()) for p in prompts], default=0) + 16
        self.batch_size = B
        self.lengths = torch.zeros(B, dtype=torch.int64, device=dev)  # committed pairs P_b
        self.k_cache = torch.zeros(B, c.num_key_value_heads, cap, c.head_dim, dtype=self.dtype, device=dev)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.last_q = torch.zeros(B, c.num_attention_heads, c.head_dim, dtype=self.dtype, device=dev)
        self.last_res = torch.zeros(B, c.hidden_size, dtype=self.dtype, device=dev)
        self.has_last = torch.zeros(B, dtype=torch.bool, device=dev)
        # Committed tokens: the first prompt token now, the rest arrives with the first catch-up.
        self.hist = torch.zeros(B, cap, dtype=torch.int64, device=dev)
        self.hist_len = torch.zeros(B, dtype=torch.int64, device=dev)
        for b, p in enumerate(prompts):
            if p.numel():
                self.hist[b, 0] = int(p.reshape(-1)[0])
                self.hist_len[b] = 1
        self._step_open = False

    @staticmethod
    def _grow(t: Tensor, n: int, dim: int) -> Tensor:
        cap = t.shape[dim]
        if n <= cap:
            return t
        pad = [0, 0] * (t.dim() - 1 - dim) + [0, max(n, 2 * cap) - cap]
        return F.pad(t, pad)

    # -- the contract --------------------------------------------------------------------------
    @torch.no_grad()
    def catch_up(self, tokens: Sequence[Tensor], features: Sequence[Tensor] | None) -> None:
        B, dev, head = self.batch_size, self.device, self.head
        self._step_open = False
        checked = check_catch_up(tokens, features, B, len(self.captured_layers) * head.cfg.hidden_size, "DART")
        if checked is None:
            return
        n, feats = checked
        n = n.to(dev)
        tok = pad_sequence([t.reshape(-1).to(dev, torch.int64) for t in tokens], batch_first=True)  # [B, M]
        feat = pad_sequence([f.to(dev, self.dtype) for f in feats], batch_first=True)
        M = tok.shape[1]
        ar = torch.arange(M, device=dev)
        real = ar[None, :] < n[:, None]
        b_idx = torch.arange(B, device=dev)[:, None].expand(B, M)[real]

        # Token history (n-gram contexts).
        hpos = self.hist_len[:, None] + ar[None, :]
        self.hist = self._grow(self.hist, int((self.hist_len + n).max()), 1)
        self.hist[b_idx, hpos[real]] = tok[real]
        self.hist_len = self.hist_len + n

        # Pairs: k/v into the cache; q and residual of each request's last pair for the next step.
        pos = self.lengths[:, None] + ar[None, :]
        new_len = self.lengths + n
        self.k_cache = self._grow(self.k_cache, int(new_len.max()), 2)
        self.v_cache = self._grow(self.v_cache, int(new_len.max()), 2)
        x, res = head.pair_inputs(head.fuse(feat), tok)
        q, k, v = head.qkv(x, pos)  # [B, heads, M, D]
        t_idx = pos[real]
        self.k_cache[b_idx, :, t_idx] = k.transpose(1, 2)[real]
        self.v_cache[b_idx, :, t_idx] = v.transpose(1, 2)[real]
        got = n > 0
        last = (n - 1).clamp(min=0)
        idx = torch.arange(B, device=dev)
        self.last_q = torch.where(got[:, None, None], q[idx, :, last], self.last_q)
        self.last_res = torch.where(got[:, None], res[idx, last], self.last_res)
        self.has_last |= got
        self.lengths = new_len

    @torch.no_grad()
    def marginals(self) -> Tensor:
        """The step's forward: ``[B, d, Vd]`` draft-vocab log-probabilities of depths ``1..d``."""
        head, dev = self.head, self.device
        c = head.cfg
        B, m = self.batch_size, c.num_masks
        P = self.lengths
        L = int(P.max()) if B else 0
        if L == 0:  # nothing committed anywhere: uniform (every row is invalid anyway)
            return torch.full(
                (B, c.depth, c.draft_vocab_size), -math.log(c.draft_vocab_size), dtype=self.logit_dtype, device=dev
            )
        j = torch.arange(m, device=dev)
        xm, rm = head.mask_inputs(j)
        qm, km, vm = head.qkv(
            xm.to(self.dtype), (P - 1)[:, None] + 1 + j[None, :]
        )  # [B, h, m, D], [B, kvh, m, D], [kvh, m, D]
        q = torch.cat([self.last_q[:, :, None], qm], 2)  # [B, h, d, D]
        k = torch.cat([self.k_cache[:, :, :L], km], 2)
        v = torch.cat([self.v_cache[:, :, :L], vm.expand(B, -1, -1, -1)], 2)
        i = torch.arange(m + 1, device=dev)
        committed = torch.arange(L, device=dev)[None, None, :] < P[:, None, None]  # [B, 1, L]
        committed = committed | (torch.arange(L, device=dev) == 0)[None, None, :]  # no NaN rows for empty requests
        masks = (j[None, :] < i[:, None])[None]  # query i sees masks 1..i
        mask = torch.cat([committed.expand(B, m + 1, L), masks.expand(B, m + 1, m)], 2)[:, None]
        res = torch.cat([self.last_res[:, None], rm.to(self.dtype)[None].expand(B, m, -1)], 1)
        logits, _ = head.finish(head.attend(q, k, v, mask), res)
        return torch.log_softmax(logits.to(self.logit_dtype), -1)

    def _begin_step(self, k: int) -> None:
        K = min(max(self.cfg.topk, k), self.head.cfg.draft_vocab_size)
        lp, ids = self.marginals().topk(K, -1)  # [B, d, K]
        self.search.begin(lp, self.head.to_target(ids), self.hist, self.hist_len, self.has_last)

    @torch.no_grad()
    def propose(self, frontier: Frontier, k: int) -> Candidates:
        if frontier.slots.shape[0] != self.batch_size:
            raise ValueError(f"frontier has {frontier.slots.shape[0]} requests, the batch has {self.batch_size}")
        if frontier.depth == 0 and not self._step_open:  # one step per catch-up
            self._begin_step(k)
            self._step_open = True
        return self.search.propose(frontier, k)

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        self.search.adopt(parent, tokens, before=before)

    @torch.no_grad()
    def algorithm1(self, roots: Tensor, active: Optional[Tensor] = None, max_depth: Optional[int] = None) -> DraftTrees:
        """DART's static tree for this step: :meth:`DartSearch.algorithm1` over fresh marginals."""
        self._begin_step(self.cfg.topk)
        return self.search.algorithm1(roots, active, max_depth)


class DartTreePolicy(TreePolicy):
    """DART's static tree (Alg. 1) as a tree policy: ``finish`` builds the whole tree with the bound
    drafter's :meth:`DartDrafter.algorithm1`; nothing is proposed depth by depth (see the module
    docstring for why it is not a ranking policy over ``Candidates``). Bind the drafter first."""

    def __init__(self, drafter: Optional[DartDrafter] = None, max_depth: int = 8):
        self.drafter = drafter
        self.max_depth = max_depth
        self.name = "dart-tree"

    def bind(self, drafter: Drafter) -> None:
        if not isinstance(drafter, DartDrafter):
            raise TypeError(f"dart-tree needs the DART drafter, got {type(drafter).__name__}")
        self.drafter = drafter
        c = drafter.cfg
        self.name = f"dart-tree-{min(self.max_depth, drafter.depth)}x{c.beam}x{c.budget}"

    def start(self, roots: Tensor, k_max: int | None = None) -> BuildState:
        state = super().start(roots, k_max)
        state.depth = state.max_depth  # done: the tree is built in finish()
        return state

    def advance(self, state: BuildState, cands: Candidates) -> None:  # never called
        raise AssertionError("dart-tree builds its tree in finish()")

    def finish(self, state: BuildState) -> DraftTrees:
        if self.drafter is None:
            raise RuntimeError("dart-tree: bind(drafter) before building trees")
        return self.drafter.algorithm1(state.pool.tokens[:, 0], state.active, self.max_depth)


def load_head_trie(draft, vocab_size: int, ngram: Optional[str] = None) -> Optional[NGramTrie]:
    """A DART head's n-gram trie: ``ngram`` if given (it must exist), else ``DIR/ngram-trie.safetensors``
    when the head directory has one, else None (only the request's own n-grams count)."""
    path = Path(ngram) if ngram else Path(draft) / TRIE_FILE
    return NGramTrie.load(path, vocab_size=vocab_size) if ngram or path.is_file() else None


def load_dart_drafter(
    draft,
    embed: Tensor,
    num_target_layers: int,
    ngram: Optional[str] = None,
    use_ngram: bool = True,
    eos_id: Optional[int] = None,
    device=None,
) -> DartDrafter:
    """A DART head directory (+ its n-gram trie, :func:`load_head_trie`) -> drafter."""
    head = DartHead.load(Path(draft), embed=embed, num_target_layers=num_target_layers)
    trie = load_head_trie(draft, head.cfg.vocab_size, ngram) if use_ngram else None
    return DartDrafter(head, trie=trie, use_ngram=use_ngram, eos_id=eos_id, device=device)


__all__ = [
    "CombineConfig",
    "DartDrafter",
    "DartSearch",
    "DartTreePolicy",
    "combine",
    "load_dart_drafter",
    "load_head_trie",
]
