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
padding, :mod:`.ragged`), ``cap_lens = K_i`` on the result (sglang's ``spec_cap_length`` /
histogram), the ``echo_*`` metrics (step timing: control = ``build_trees`` minus the n-gram
lookups plus packing, see :mod:`.metrics`) and the per-request ``echo_tree_depth``. With ragged
verify and no CUDA graph or overlap relay pinning ``W``, the trees are drafted before NGRAM's
prepare and the step is laid out ``max K_i`` wide (:meth:`EchoNgramWorker._set_width`).

The corpus is not built (no C++ JIT, no shared corpus): ``ngram_corpus`` is a
:class:`RequestDrafters`, which implements the three corpus calls NGRAM's generic code still
makes (``synchronize``, ``erase_match_state`` for requests that left the batch, ``reset``).
External corpora are NGRAM-only (sglang's API checks the algorithm name) and refused here.

``NGRAMWorker``'s module imports sglang's compiled kernels (``sgl_kernel``) at import time, so
:class:`EchoNgramWorker` is defined on first access (PEP 562 module ``__getattr__``): the
drafting half of this module (:class:`RequestDrafters`, :func:`build_ngram_drafts`) imports
anywhere, e.g. in tests on a CPU box outside the CPU engine.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sglang_echo.calibration.probe import ProbeRecorder
from sglang_echo.core.dense import step_width, to_sglang_dense
from sglang_echo.core.policy import Frontier, build_trees
from sglang_echo.core.tree import Candidates, NodePool
from sglang_echo.drafters.ngram import NGramDrafter

from .config import (
    EchoConfig,
    check_consistent,
    load_calibration_for,
    load_config,
    make_echo_policy,
    make_step_budget,
    resolve_control_kernel,
    server_kmax,
)
from .faults import DraftGuard
from .history import History
from .metrics import AcceptanceObservers, EchoMetrics, TimedDrafter, timing_sync
from .ragged import MARK, resolve_verify_mode, target_tokens

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

    # -- the NgramCorpus calls NGRAMWorker's generic code makes ------------------------------
    def erase_match_state(self, rids) -> None:
        for rid in rids:
            self._states.pop(rid, None)

    def reset(self) -> None:
        self._states.clear()

    def synchronize(self) -> None:
        pass


class BatchDrafter:
    """The core's drafter protocol over per-request drafters (row ``b`` = ``drafters[b]``)."""

    def __init__(self, drafters: Sequence[NGramDrafter]):
        self.drafters = list(drafters)
        self.forwards = 0  # depths proposed (no model forwards; kept for the metrics' shape)

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        self.forwards += 1
        parts = [d.propose(_row(frontier, b), k) for b, d in enumerate(self.drafters)]
        return Candidates(
            tokens=torch.cat([c.tokens for c in parts]),
            logprob=torch.cat([c.logprob for c in parts]),
            parent=torch.cat([c.parent for c in parts]),
            valid=torch.cat([c.valid for c in parts]),
        )


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


@dataclass
class NgramStep:
    """What one draft step hands to verify and the metrics (EchoMetrics.on_step reads it)."""

    sizes: torch.Tensor  # [bs] int32 K_i, roots included
    gate_evaluated: torch.Tensor | None = None
    gate_passed: torch.Tensor | None = None
    draft_forwards: int = 0
    pool: NodePool | None = None  # every drafted candidate (the calibration probe reads it)
    depths: torch.Tensor | None = None  # [bs] deepest node of each request's tree
    cap: int | None = None  # this step's verification cap, roots included
    width: int = 0  # the padded verify width W the step was laid out in
    verified: int = 0  # sum K_i, roots included
    control_s: float = 0.0  # build_trees minus the drafters' propose, plus packing (see .metrics)
    propose_s: float = 0.0  # inside the drafters' propose (n-gram lookups)
    draft_s: float = 0.0  # set by the worker: its drafting phase minus control_s
    prepare_s: float = 0.0  # set by the worker: the whole _prepare_draft_tokens


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
    bool, step)`` (host numpy arrays, as NGRAM's corpus returns them). ``step.control_s`` is the
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
    step = NgramStep(dense.sizes, state.gate_evaluated, state.gate_passed, drafter.forwards, state.pool)
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
# What NGRAMWorker.__init__ assigns besides the corpus; EchoNgramWorker.__init__ assigns these
# too and refuses to start if the installed sglang assigns anything else (see init_drift()).
NGRAM_INIT_ATTRS = frozenset(
    {
        "server_args",
        "enable_overlap",
        "_target_worker",
        "model_runner",
        "page_size",
        "draft_token_num",
        "max_trie_depth",
        "speculative_num_draft_tokens",
        "topk",
        "speculative_num_steps",
        "device",
        "adaptive_controller",
        "_prev_decode_rids",
        "grammar_tree_host",
        "ngram_corpus",
    }
)


def init_drift() -> set[str]:
    """Attributes the installed ``NGRAMWorker.__init__`` assigns that ours does not (empty = ok)."""
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    src = inspect.getsource(NGRAMWorker.__init__)
    return set(re.findall(r"self\.(\w+)(?:\s*:\s*[^=\n]+)?\s*=(?!=)", src)) - NGRAM_INIT_ATTRS


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
            drift = init_drift()
            if drift:
                from .compat import EchoCompatError

                raise EchoCompatError(f"ECHO ngram worker: sglang's NGRAMWorker.__init__ now also sets {sorted(drift)}")
            BaseSpecWorker.__init__(self)
            # NGRAMWorker.__init__, minus the C++ corpus (external corpora are NGRAM-only).
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

            cfg = load_config(
                num_steps=self.speculative_num_steps, topk=self.topk, num_draft_tokens=self.speculative_num_draft_tokens
            )
            if cfg.drafter != "ngram":
                raise ValueError(f"ECHO ngram worker built for drafter='{cfg.drafter}'")
            check_consistent(cfg, self.speculative_num_steps, self.topk, self.speculative_num_draft_tokens)
            calib = load_calibration_for(cfg, model_path=server_args.model_path)
            # The n-gram drafter's trees are built on the host: the tensor-op control plane.
            cfg = resolve_control_kernel(cfg, "cpu")
            self.echo_cfg: EchoConfig = cfg
            self.echo_kmax = server_kmax(cfg, calib, self.device)
            self.echo_policy = make_echo_policy(cfg, calib, self.echo_kmax)
            self.echo_width = cfg.resolved_width()
            self.ngram_corpus = RequestDrafters()
            self.echo_metrics = EchoMetrics(
                self.echo_kmax.flat, enabled=bool(getattr(server_args, "enable_metrics", False))
            )
            self.echo_guard = DraftGuard(self.model_runner.model_config.vocab_size, self.echo_metrics.draft_fault)
            self._echo_step: NgramStep | None = None
            self.echo_probe = ProbeRecorder.from_env(self.device)
            self._echo_draft_s = 0.0
            self.echo_sync = timing_sync(self.device)
            self.echo_verify = "padded"  # until init_attention_backends: the target's backend decides
            self.echo_budget = None  # budget cost: set with the verify mode
            self.echo_step_width = False  # lay each step out max K_i wide (set by init_cuda_graphs)
            self._echo_drafts = None  # this step's (tokens, mask), drafted before NGRAM's prepare
            log.info(
                "ECHO ngram worker: policy %s (%s), W=%d, no draft model",
                self.echo_policy.name,
                cfg.describe(),
                self.echo_width,
            )

        def init_attention_backends(self):
            super().init_attention_backends()
            self.echo_verify = resolve_verify_mode(self.echo_cfg.verify, self.model_runner.attn_backend)
            padded = None if self.echo_verify == "ragged" else self.echo_width
            self.echo_budget = make_step_budget(self.echo_cfg, self.echo_policy, padded, self.echo_kmax)
            if self.echo_budget is not None:  # the cost model needs true device times
                self.echo_sync = timing_sync(self.device, force=True)
            log.info("ECHO ngram worker: %s verify, %s budget", self.echo_verify, self.echo_cfg.budget)

        def init_cuda_graphs(self):
            super().init_cuda_graphs()
            # As EchoWorker's: a captured W-wide verify graph (or the overlap relay's W-strided
            # accepted tokens) pins the width; otherwise every step is max K_i wide.
            self.echo_step_width = (
                self.echo_verify == "ragged"
                and not self.enable_overlap
                and self.model_runner.decode_cuda_graph_runner is None
            )
            log.info(
                "ECHO ngram worker: verify width %s",
                "per step (max K_i)" if self.echo_step_width else f"{self.echo_width}",
            )

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
            cap = self.echo_kmax(bs) if self.echo_budget is None else self.echo_budget.cap(bs)
            tokens, mask, step = build_ngram_drafts(
                self.echo_policy,
                drafters,
                torch.tensor(roots, dtype=torch.int64),
                self.echo_width,
                k_max=cap,
                per_step_width=self.echo_step_width,
                guard=self.echo_guard,
            )
            step.draft_s = time.perf_counter() - t0 - step.control_s  # catch-up + lookups
            self._echo_step = step
            self.echo_metrics.on_tree_depths(batch.reqs, step.depths)
            if self.echo_probe is not None:
                self.echo_probe.on_draft(
                    step.pool, self.echo_policy.max_depth, [r.rid for r in batch.reqs], root_positions
                )
                self._echo_draft_s = time.perf_counter() - t0
            step.prepare_s = time.perf_counter() - t0
            return tokens, mask

        def _prepare_for_speculative_decoding(self, batch) -> None:
            if self.echo_step_width:  # the trees decide the width NGRAM's prepare lays out
                self._echo_drafts = self._draft(batch) if batch.forward_mode.is_decode() else None
                self._set_width(self._echo_step.width if self._echo_drafts is not None else self.echo_width)
            super()._prepare_for_speculative_decoding(batch)
            step = self._echo_step
            if (
                self.echo_verify == "ragged"
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
            t0 = time.perf_counter()
            result = super().forward_batch_generation(batch, *args, **kwargs)
            self.echo_sync()
            step_s = time.perf_counter() - t0
            st, self._echo_step = self._echo_step, None
            if st is not None and batch.forward_mode is not None and not batch.forward_mode.is_idle():
                # verify: NGRAM's tree reconstruction, target verify, accept and KV move.
                self.echo_metrics.on_timing(
                    control=st.control_s, draft=st.draft_s, verify=step_s - st.prepare_s, step=step_s
                )
                forward_tokens = target_tokens(self.echo_verify, st.sizes, st.width)
                if self.echo_probe is not None:  # the verify pass is the step minus its drafting
                    self.echo_probe.on_verify(forward_tokens, time.perf_counter() - t0 - self._echo_draft_s)
                result.cap_lens = st.sizes.to(self.device)
                self.echo_metrics.check_budget(self.echo_policy, st)
                self.echo_metrics.on_step(st, forward_tokens)
                if self.echo_budget is not None:
                    decision = self.echo_budget.observe_step(
                        batch_size=st.sizes.numel(),
                        target_tokens=forward_tokens,
                        verified_tokens=st.verified,
                        draft_forwards=st.draft_forwards,
                        draft_s=st.draft_s + st.control_s,
                        verify_s=step_s - st.prepare_s,
                        step_s=step_s,
                        cap=st.cap,
                    )
                    self.echo_metrics.on_budget_step(decision, step_s)
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
