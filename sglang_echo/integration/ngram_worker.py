"""ECHO with the parameter-free n-gram drafter: ``drafter: ngram`` (no draft model).

:class:`EchoNgramWorker` is sglang's ``NGRAMWorker`` (the smallest arbitrary-tree worker, memo
4.3) with one thing replaced: where the draft trees come from. NGRAM asks its C++ corpus for a
padded ``[bs*W]`` token block and a ``W x W`` ancestor-or-self mask per request; here
:meth:`EchoNgramWorker._prepare_draft_tokens` returns exactly that layout, built by

1. one :class:`~sglang_echo.drafters.ngram.NGramDrafter` per request, keyed by ``req.rid`` and
   fed the request's committed tokens (``origin_input_ids_unpadded + output_ids``, plus, under
   overlap scheduling, the previous step's accepted tokens that ``output_ids`` does not hold
   yet), catching up incrementally (:class:`RequestDrafters`);
2. the core's ``build_trees(policy, drafter, roots)`` with the configured ECHO policy (any core
   policy), the roots being each request's last committed token;
3. :func:`~sglang_echo.core.dense.to_sglang_dense` (padding = unreachable nodes with a
   diagonal-only mask row).

Everything else is NGRAM's, unchanged: ``reconstruct_indices_from_tree_mask`` derives positions
and retrieve links from the mask, the target verifies the ``bs*W`` block (QLEN mask on CPU, FULL
mask elsewhere), ``eagle_sample`` accepts, and the accepted KV is moved to the front. ECHO's
additions: ragged verify (the verify input is marked with ``K_i`` so the target forward skips the
padding, :mod:`.ragged`) and, through the worker's :class:`~.session.EchoSession` (the step
epilogue the EAGLE worker runs too), ``cap_lens = K_i`` on the result (sglang's
``spec_cap_length`` / histogram), the budget check, the ``echo_*`` metrics (step timing: control =
``build_trees`` minus the n-gram lookups plus packing, see :mod:`.metrics`), the cost budget and
the per-request ``echo_tree_depth``. With ragged verify and no CUDA graph or overlap relay pinning
``W``, the trees are drafted before NGRAM's prepare and the step is laid out ``max K_i`` wide
(:meth:`EchoNgramWorker._set_width`).

The corpus is not built (no C++ JIT, no shared corpus): ``ngram_corpus`` is a
:class:`RequestDrafters`, which implements the three corpus calls NGRAM's generic code still
makes (``synchronize``, ``erase_match_state`` for requests that left the batch, ``reset``).
``NGRAMWorker.__init__`` offers no seam for that, so :meth:`EchoNgramWorker.__init__` sets the
state it sets (:data:`~.compat.NGRAM_WORKER_INIT_ATTRS`; the start-up check refuses an sglang whose
constructor sets anything else). External corpora are NGRAM-only (sglang's API checks the
algorithm name) and refused here.

``NGRAMWorker``'s module imports sglang's compiled kernels (``sgl_kernel``) at import time, so
:class:`EchoNgramWorker` is defined on first access (PEP 562 module ``__getattr__``): the
drafting half of this module (:class:`RequestDrafters`, :func:`build_ngram_drafts`) imports
anywhere, e.g. in tests on a CPU box outside the CPU engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sglang_echo.core.dense import step_width, to_sglang_dense
from sglang_echo.core.policy import Frontier, build_trees
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.ngram import NGramDrafter

from .config import Drafter
from .faults import DraftGuard
from .history import History
from .metrics import TimedDrafter
from .ragged import MARK, VerifyMode, target_tokens
from .session import AcceptanceObservers, EchoSession, StepRecord

log = logging.getLogger(__name__)


# -- per-request drafter state ------------------------------------------------------------------
@dataclass
class _State:
    drafter: NGramDrafter
    held: int  # committed tokens the drafter holds
    last: int  # the last of them (to detect a rewritten history)


class RequestDrafters:
    """One :class:`NGramDrafter` per live request, keyed by rid; stands in for NGRAM's corpus."""

    def __init__(self, make: Callable[[], NGramDrafter] = NGramDrafter):
        self._make = make
        self._states: dict[str, _State] = {}
        self.rebuilds = 0  # histories that did not extend what the drafter held

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, rid) -> bool:
        return rid in self._states

    def sync(self, rid, hist: History) -> NGramDrafter:
        """The request's drafter, caught up to ``hist`` (built on first sight)."""
        n = len(hist)
        if n == 0:
            raise ValueError(f"request {rid!r} has no tokens")
        st = self._states.get(rid)
        if st is not None and not hist.extends(st.held, st.last):
            # Not an extension of what we hold (retracted and re-run, or a reused rid): rebuild.
            st, self.rebuilds = None, self.rebuilds + 1
        if st is None:
            d = self._make()
            # start() with the first token alone, so the first catch_up is plain (no prompt skip).
            d.start([torch.tensor([hist[0]], dtype=torch.int64)])
            st = self._states[rid] = _State(d, 1, hist[0])
        if n > st.held:
            st.drafter.catch_up([torch.tensor(hist.tail(st.held), dtype=torch.int64)])
            st.held, st.last = n, hist[n - 1]
        return st.drafter

    def retain(self, rids) -> None:
        """Forget every request but ``rids`` (the decode batch's: one that comes back is rebuilt)."""
        keep = set(rids)
        for rid in [r for r in self._states if r not in keep]:
            del self._states[rid]

    # -- the NgramCorpus calls NGRAMWorker's generic code makes ------------------------------
    def erase_match_state(self, rids) -> None:
        for rid in rids:
            self._states.pop(rid, None)

    def reset(self) -> None:
        self._states.clear()

    def synchronize(self) -> None:
        pass


class BatchDrafter:
    """The core's drafter protocol over per-request drafters (row ``b`` = ``drafters[b]``; ``None``:
    a row that proposes nothing)."""

    def __init__(self, drafters: Sequence[NGramDrafter | None]):
        self.drafters = list(drafters)
        self.forwards = 0  # depths proposed (no model forwards; kept for the metrics' shape)

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        self.forwards += 1
        parts = [
            _nothing(frontier, k) if d is None else d.propose(_row(frontier, b), k) for b, d in enumerate(self.drafters)
        ]
        return Candidates(
            tokens=torch.cat([c.tokens for c in parts]),
            logprob=torch.cat([c.logprob for c in parts]),
            parent=torch.cat([c.parent for c in parts]),
            valid=torch.cat([c.valid for c in parts]),
        )

    def adopt(self, parent: torch.Tensor, tokens: torch.Tensor, *, before: bool) -> None:
        for b, d in enumerate(self.drafters):
            if d is not None:
                d.adopt(parent[b : b + 1], tokens[b : b + 1], before=before)


def _nothing(f: Frontier, k: int) -> Candidates:
    """One row's ``F * k`` candidates, none valid (the layout :meth:`NGramDrafter.propose` returns)."""
    F, dev = f.slots.shape[1], f.slots.device
    z = torch.zeros(1, F * k, dtype=torch.int64, device=dev)
    parent = torch.arange(F, device=dev).repeat_interleave(k)[None]
    return Candidates(z, torch.full((1, F * k), float("-inf"), device=dev), parent, z.bool())


def _row(f: Frontier, b: int) -> Frontier:
    s = slice(b, b + 1)
    return Frontier(
        depth=f.depth,
        slots=f.slots[s],
        source=f.source[s],
        tokens=f.tokens[s],
        path_score=f.path_score[s],
        active=f.active[s],
    )


def build_ngram_drafts(
    policy,
    drafters: Sequence[NGramDrafter],
    roots: torch.Tensor,
    width: int,
    k_max: int | None = None,
    per_step_width: bool = False,
    guard: DraftGuard | None = None,
):
    """ECHO trees over n-gram drafters, in NGRAM's layout: ``(tokens [bs*W] int64, mask [bs*W*W]
    bool, step)`` (host numpy arrays, as NGRAM's corpus returns them; ``step`` a
    :class:`~.session.StepRecord`). ``step.control_s`` is the
    wall time of all this minus the drafters' ``propose`` (host work: no device sync needed).
    ``k_max``: this step's cap, roots included (None: the policy's own). ``per_step_width``: lay the
    step out ``W_s = max K_i`` wide instead of ``width`` (``step.width`` says which). ``guard``: the
    worker's :class:`~.faults.DraftGuard` (a failing drafter's step is verified as plain decoding)."""
    t0 = time.perf_counter()
    drafter = TimedDrafter(BatchDrafter(drafters))
    if guard is None:
        trees, state = build_trees(policy, drafter, roots, k_max=k_max)
    else:
        trees, state, _ = guard.build(policy, drafter, roots, k_max)
    width = step_width(trees.sizes, width, per_step_width)
    dense = to_sglang_dense(trees, torch.zeros_like(roots), width)  # positions: NGRAM rebuilds them
    step = StepRecord(
        sizes=dense.sizes,
        gate_evaluated=state.gate_evaluated,
        gate_passed=state.gate_passed,
        draft_forwards=drafter.forwards,
        pool=state.pool,
    )
    tokens = dense.draft_token.to(torch.int64).numpy()
    mask = dense.tree_mask.reshape(-1).numpy()
    step.propose_s = drafter.seconds
    step.control_s = time.perf_counter() - t0 - drafter.seconds
    step.depths, step.cap, step.width, step.verified = trees.max_depth(), k_max, width, int(dense.sizes.sum())
    return tokens, mask, step


class _WidthViews:
    """NGRAM's per-batch-size buffer views (``self.<name>_batch[bs]``) for a width other than the
    one its buffers were allocated for: the first ``bs * per_request`` elements, ``[bs, *shape]``."""

    def __init__(self, buffer: torch.Tensor, shape: tuple[int, ...], per_request: int | None = None) -> None:
        self.flat, self.shape = buffer.view(-1), shape
        self.per_request = per_request if per_request is not None else int(np.prod(shape))

    def __getitem__(self, bs: int) -> torch.Tensor:
        view = self.flat[: bs * self.per_request]
        return view.view(bs, *self.shape) if self.shape else view


# -- the worker ----------------------------------------------------------------------------------
def __getattr__(name: str):
    if name == "EchoNgramWorker":
        cls = globals()["EchoNgramWorker"] = _define_worker()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define_worker():
    from sglang.srt.runtime_context import get_device, get_schedule, get_spec
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    class EchoNgramWorker(AcceptanceObservers, NGRAMWorker):
        """NGRAM's worker whose draft trees are ECHO policy trees over per-request n-gram drafters."""

        def __init__(self, server_args, gpu_id, nccl_port, target_worker):
            BaseSpecWorker.__init__(self)
            # NGRAMWorker.__init__'s state (compat.NGRAM_WORKER_INIT_ATTRS), minus the C++ corpus
            # (external corpora are NGRAM-only).
            spec = get_spec()
            self.server_args = server_args
            self.enable_overlap = not get_schedule().disable_overlap_schedule
            self._target_worker = target_worker
            self.model_runner = target_worker.model_runner
            self.page_size = get_schedule().page_size
            self.draft_token_num = spec.speculative_num_draft_tokens
            self.max_trie_depth = spec.speculative_ngram_max_trie_depth
            self.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
            self.topk = spec.speculative_eagle_topk
            self.speculative_num_steps = spec.speculative_num_steps
            self.device = get_device().device
            self.adaptive_controller = None
            self._prev_decode_rids = set()
            self.grammar_tree_host = None

            # The n-gram drafter's trees are built on the host: the tensor-op control plane.
            self.echo = EchoSession(
                server_args,
                steps=self.speculative_num_steps,
                topk=self.topk,
                num_draft_tokens=self.speculative_num_draft_tokens,
                device=self.device,
                vocab_size=self.model_runner.model_config.vocab_size,
                control_device="cpu",
            )
            if self.echo.cfg.drafter != Drafter.NGRAM:
                raise ValueError(f"ECHO ngram worker built for drafter='{self.echo.cfg.drafter}'")
            self.ngram_corpus = RequestDrafters()
            self._echo_step: StepRecord | None = None
            self._echo_draft_s = 0.0
            self._echo_drafts = None  # this step's (tokens, mask), drafted before NGRAM's prepare
            log.info(
                "ECHO ngram worker: policy %s (%s), W=%d, no draft model",
                self.echo.policy.name,
                self.echo.cfg.describe(),
                self.echo.width,
            )

        def init_attention_backends(self):
            super().init_attention_backends()
            self.echo.settle_verify(self.model_runner.attn_backend)
            log.info("ECHO ngram worker: %s verify, %s budget", self.echo.verify, self.echo.cfg.budget)

        def init_cuda_graphs(self):
            super().init_cuda_graphs()
            # As EchoWorker's: a captured W-wide verify graph (or the overlap relay's W-strided
            # accepted tokens) pins the width; otherwise every step is max K_i wide.
            self.echo.per_step_width = (
                self.echo.verify == VerifyMode.RAGGED
                and not self.enable_overlap
                and self.model_runner.decode_cuda_graph_runner is None
            )
            log.info("ECHO ngram worker: verify width %s", self.echo.describe_width())

        def _set_width(self, width: int) -> None:
            """NGRAM's step reads its width from ``draft_token_num`` (verify slots, acceptance,
            its per-batch-size buffer views) and ``speculative_num_draft_tokens`` (the result's
            output stride, which the scheduler reads): both follow the step's width."""
            if width == self.draft_token_num:
                return
            self.draft_token_num = self.speculative_num_draft_tokens = width
            self.retrieve_indexes_batch = _WidthViews(self.retrieve_indexes, (width,))
            self.retrieve_next_token_batch = _WidthViews(self.retrieve_next_token, (width,))
            self.retrieve_next_sibling_batch = _WidthViews(self.retrieve_next_sibling, (width,))
            self.positions_batch = _WidthViews(self.positions, (), width)
            self.draft_tokens_batch = _WidthViews(self.draft_tokens, (), width)
            self.tree_mask_batch = _WidthViews(self.tree_mask, (), width * width)

        # -- the one real override: where the trees come from -------------------------------------
        def _prepare_draft_tokens(self, batch) -> tuple[np.ndarray, np.ndarray]:
            drafts, self._echo_drafts = self._echo_drafts, None
            return drafts if drafts is not None else self._draft(batch)

        def _draft(self, batch) -> tuple[np.ndarray, np.ndarray]:
            t0 = time.perf_counter()
            bs, stride = len(batch.reqs), self.draft_token_num
            # As NGRAM: under overlap scheduling output_ids lags one step behind; the accepted tokens
            # of the previous step are on spec_info. (Sync mode: output_ids is complete.)
            use_prev = self.enable_overlap and not batch.grammar_needs_sync()
            if use_prev:
                prev_ids, prev_lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
                self.prev_token_ids, self.prev_accept_lens = prev_ids.cpu().tolist(), prev_lens.cpu().tolist()
            else:
                self.prev_token_ids, self.prev_accept_lens = [], [0] * bs
            drafters, roots, root_positions = [], [], []
            for i, req in enumerate(batch.reqs):
                extra = self.prev_token_ids[i * stride : i * stride + self.prev_accept_lens[i]] if use_prev else ()
                hist = History(req.origin_input_ids_unpadded, req.output_ids, extra)
                drafters.append(self.ngram_corpus.sync(req.rid, hist))
                roots.append(hist[-1])  # the last committed token: its KV is written by this verify
                root_positions.append(len(hist) - 1)
            echo = self.echo
            tokens, mask, step = build_ngram_drafts(
                echo.policy,
                drafters,
                torch.tensor(roots, dtype=torch.int64),
                echo.width,
                k_max=echo.step_cap(bs),
                per_step_width=echo.per_step_width,
                guard=echo.guard,
            )
            step.draft_s = time.perf_counter() - t0 - step.control_s  # catch-up + lookups
            self._echo_step = step
            echo.metrics.on_tree_depths(batch.reqs, step.depths)
            if echo.probe is not None:
                echo.probe.on_draft(step.pool, echo.policy.max_depth, [r.rid for r in batch.reqs], root_positions)
                self._echo_draft_s = time.perf_counter() - t0
            step.prepare_s = time.perf_counter() - t0
            return tokens, mask

        def _prepare_for_speculative_decoding(self, batch) -> None:
            if self.echo.per_step_width:  # the trees decide the width NGRAM's prepare lays out
                self._echo_drafts = self._draft(batch) if batch.forward_mode.is_decode() else None
                self._set_width(self._echo_step.width if self._echo_drafts is not None else self.echo.width)
            super()._prepare_for_speculative_decoding(batch)
            step = self._echo_step
            if (
                self.echo.verify == VerifyMode.RAGGED
                and step is not None
                and batch.forward_mode.is_target_verify()
                and int(step.sizes.min()) < step.width
            ):  # all K_i == W_s: dense is ragged
                setattr(batch.spec_info, MARK, step.sizes.to(self.device))  # see .ragged

        def _update_ngram_corpus(self, batch) -> None:
            pass  # the per-request drafters catch up from the request's tokens at the next step

        # -- ECHO's reporting around NGRAM's unchanged step ------------------------------------------
        def forward_batch_generation(self, batch, *args, **kwargs):
            self._echo_step = None
            prefill = batch.forward_mode is not None and batch.forward_mode.is_extend()  # NGRAM's step resets it
            t0 = time.perf_counter()
            result = super().forward_batch_generation(batch, *args, **kwargs)
            self.echo.sync()
            step_s = time.perf_counter() - t0
            st, self._echo_step = self._echo_step, None
            if prefill:
                self.echo.on_prefill(len(batch.extend_lens), step_s)  # what the cost budget charges drafting
            elif st is not None and batch.forward_mode is not None and not batch.forward_mode.is_idle():
                # verify: NGRAM's tree reconstruction, target verify, accept and KV move.
                st.verify_s = step_s - st.prepare_s
                st.forward_tokens = target_tokens(self.echo.verify, st.sizes, st.width)
                if self.echo.probe is not None:  # the verify pass is the step minus its drafting
                    self.echo.probe.on_verify(st.forward_tokens, time.perf_counter() - t0 - self._echo_draft_s)
                self.echo.on_verified(result, st)
                self.echo.on_step_end(st, step_s)
            return result

        # -- NGRAM's external-corpus API: not for ECHO ---------------------------------------------------
        def _no_external_corpus(self, *_a, **_k):
            raise NotImplementedError(
                "ECHO's n-gram drafter reads each request's own tokens; external corpora are NGRAM-only"
            )

        add_external_corpus = commit_corpus_load = remove_external_corpus = _no_external_corpus

        def list_external_corpora(self) -> dict[str, int]:
            return {}

    EchoNgramWorker.__module__ = __name__
    EchoNgramWorker.__qualname__ = "EchoNgramWorker"
    return EchoNgramWorker
