"""The engine-agnostic DART drafter: one forward per step gives ``d`` marginals; the tree policy
reads them depth by depth, re-ranked by DART's N-gram-enforced COMBINE score.

State. Like :class:`~sglang_echo.drafters.eagle3.Eagle3Drafter`, committed position ``t`` holds the
pair ``(fc(h_t), x_{t+1})`` at rotary position ``t`` in the drafter's own KV cache;
:meth:`DartDrafter.catch_up` appends the new pairs of every request in one batched projection
(lazy catch-up: nothing drafted is ever cached, so nothing has to be dropped). The drafter also
keeps every request's committed tokens (prompt + output) for the n-gram context.

Drafting. At depth 0 one batched forward runs, per request, the last pair and the ``d - 1`` mask
positions (rotary positions ``P-1 .. P+d-2``) over the committed cache: the ``d`` shifted logits
(:class:`~sglang_echo.drafters.dart_head.DartHead`). The tree search over those marginals (COMBINE
ranking, child log-probabilities, DART's Algorithm 1 and :class:`DartTreePolicy`'s reason to be) is
:class:`~sglang_echo.drafters.dart_search.DartSearch`, shared with the server.

Temperature 0 only: every proposal is DETERMINISTIC (top-``K`` picks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from sglang_echo.core.policy import BuildState, Frontier, TreePolicy
from sglang_echo.core.tree import Candidates, DraftTrees

from .base import Drafter, check_catch_up
from .dart_head import TRIE_FILE, DartHead
from .dart_search import CombineConfig, DartSearch
from .ngram_trie import NGramTrie


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
    "DartDrafter",
    "DartTreePolicy",
    "load_dart_drafter",
    "load_head_trie",
]
