"""ECHO's own Prometheus metrics (created lazily, only with ``--enable-metrics``).

They live in the scheduler process; sglang serves a ``prometheus_client`` multiprocess registry
on ``/metrics``, so anything created here after ``PROMETHEUS_MULTIPROC_DIR`` is set is exported.
sglang's own ``spec_cap_length`` / ``spec_cap_lens_histogram`` come from ``cap_lens = K_i``.

* ``echo_verified_tokens_total``: sum of K_i (roots included) over all steps;
* ``echo_target_tokens_total``: tokens the target's verify forwards computed (sum of K_i with
  ragged verify, or its CUDA-graph token tier; batch size x W padded);
* ``echo_verify_slots_total``: slots the steps laid out for sglang's verify and draft extend
  (batch size x the step's width: ``W``, or ``max K_i`` with the per-step width);
* ``echo_accepted_tokens_total``: accepted tokens incl. the bonus token;
* ``echo_steps_total``: verify steps;
* ``echo_gate_evaluated_total{depth}`` / ``echo_gate_passed_total{depth}``;
* ``echo_budget_k_max``: the server's K_max (:class:`~sglang_echo.core.kmax.KMax`'s flat part);
* ``echo_budget_cap_tokens_total``: sum of the steps' caps (K_max, or the cost model's per-step
  cap under ``budget: cost``), so ``cap / steps`` is the mean cap;
* ``echo_step_verified_tokens_max``: the largest per-step sum of K_i seen;
* ``echo_budget_exceeded_total``: steps over ``max(K_max, bs)`` (must stay 0);
* ``echo_budget_steps_total{arm,reason}`` / ``echo_budget_step_seconds_total{arm,reason}``:
  ``budget: cost`` only: steps, and their wall seconds, by the cost budget's decision (``arm``
  ``draft`` or ``plain``; ``reason`` one of
  :attr:`sglang_echo.core.budget.CostModelBudget.REASONS`), so what the model's measuring
  costs is on the page;
* ``echo_budget_premium``: ``budget: cost`` only: the lead over plain decoding the cost budget
  required of drafting at its last decided step (its 10% premium plus the prefill charge at that
  batch size, :mod:`sglang_echo.core.prefill_share`); where it exceeds what drafting gains, steps
  are plain;
* ``echo_deferred_extend_tokens_total`` / ``echo_caught_up_tokens_total``: lazy extend
  (:mod:`.lazy_extend`): tokens whose draft extend a plain step or a prefill deferred, and those a
  later catch-up extended (the rest were never needed: the request ended first, or is pending).
* ``echo_draft_faults_total{kind}``: steps verified as plain decoding because the drafter
  failed (:mod:`.faults`).

Histograms (``_bucket{le}`` / ``_sum`` / ``_count``; buckets in :mod:`.metric_catalog`):

* ``echo_accept_length``: tokens accepted per request and verify step, the bonus token
  included (its ``_sum`` is ``echo_accepted_tokens_total``);
* ``echo_verified_tokens_per_step``: sum of K_i per step (``_sum`` = ``echo_verified_tokens_total``,
  ``_count`` = ``echo_steps_total``);
* ``echo_tree_depth``: the deepest node of each request's tree per step (0: root only).

Labels: every series carries sglang's scheduler labels with the values sglang's ``sglang:*``
series have in the same process (:func:`sglang_labels`: ``model_name``, ``engine_type``,
``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``dp_rank`` under data parallelism, and
``--extra-metric-labels``), ECHO's own (``depth``, ``kind``, ``arm``, ``reason``) after them.
Under tensor parallelism only the ranks where sglang writes its scheduler series write
(:func:`sglang_writes_metrics`): each TP rank runs the same step over the same batch, so
one writer per batch counts every step once.

Step timing (seconds, wall clock on the scheduler's host thread, summed over decode steps; see
``sglang_echo/integration/README.md`` "Metrics" for exactly what each covers):

* ``echo_step_seconds_total``: the worker's whole decode step (draft + verify + accept, plus the
  EAGLE-3 draft extend), from the worker's entry to its return;
* ``echo_control_seconds_total``: ECHO's control plane: ``build_trees`` minus the time inside the
  drafter's ``propose`` (gating, Algorithm 1, node bookkeeping), plus packing the trees into
  sglang's verify layout (``to_sglang_dense``, the verify input, the ragged mark);
* ``echo_draft_seconds_total``: the rest of drafting (draft-model forwards or n-gram lookups and
  their setup);
* ``echo_verify_seconds_total``: the target's verify pass with sglang's acceptance and KV commit;
* ``echo_timed_steps_total``: steps these sums cover.

Control share = ``control / step``. With CUDA, kernels launch asynchronously and these are host
times unless ``SGLANG_ECHO_TIMING_SYNC=1`` makes the worker synchronise the device at every
boundary (costs throughput; for measurement only). On CPU no synchronisation is needed.

Per request, the ECHO workers also return ``meta_info["echo_tree_depth"]`` (through sglang's
per-token ``customized_info`` channel): one entry per output token, each verify step's tree
depth on the first token the step commits and 0 elsewhere, so its sum is the request's summed
tree depth and ``sum / spec_verify_ct`` its mean depth (``SGLANG_ECHO_REQUEST_DEPTH=0`` turns it
off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from sglang_echo import env

from .metric_catalog import BY_KEY, SERIES, Kind, bucket_bounds

log = logging.getLogger(__name__)

SYNC_ENV = "SGLANG_ECHO_TIMING_SYNC"  # "1": synchronise CUDA at every timing boundary
DEPTH_ENV = "SGLANG_ECHO_REQUEST_DEPTH"  # "0": no per-request echo_tree_depth in meta_info
DEPTH_KEY = "echo_tree_depth"  # meta_info / Req.customized_info key
TIMERS = ("control", "draft", "verify", "step")


def _noop() -> None:
    pass


def _env_flag(name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    return default if raw == "" else raw not in ("0", "false", "no", "off")


def timing_sync(device, force: bool = False) -> Callable[[], None]:
    """What the workers call at each timing boundary: ``torch.cuda.synchronize`` when
    ``SGLANG_ECHO_TIMING_SYNC=1`` (or ``force``: the cost-model budget needs true times) and
    ``device`` is a CUDA device, else a no-op (CPU work is synchronous, and without the variable
    GPU step times are host times)."""
    if not (force or _env_flag(SYNC_ENV, False)) or not str(device).startswith("cuda"):
        return _noop
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else _noop


class TimedDrafter:
    """A core drafter (``propose(frontier, k)``) that sums the wall seconds spent inside
    ``propose``; ``build_trees`` time minus :attr:`seconds` is the policy's (control) time."""

    def __init__(self, inner, sync: Callable[[], None] = _noop) -> None:
        self.inner = inner
        self.sync = sync
        self.seconds = 0.0

    def propose(self, frontier, k):
        self.sync()  # pending policy kernels belong to control, not to the drafter
        t = time.perf_counter()
        try:
            return self.inner.propose(frontier, k)
        finally:
            self.sync()
            self.seconds += time.perf_counter() - t

    def __getattr__(self, name):  # forwards, etc.
        return getattr(self.inner, name)


def record_tree_depths(reqs: Sequence, depths: Sequence[int]) -> None:
    """Append each request's tree depth of this step to ``req.customized_info[DEPTH_KEY]``.

    sglang slices ``customized_info`` per output token (``[send_offset, len(output_ids))``) into
    ``meta_info``, so the list is kept token-aligned: zeros up to the request's current output
    length, then this step's depth at the index of the first token the step will commit (under
    overlap scheduling ``output_ids`` lags a step: the entry lands earlier, the sum is the same).
    The list may end before the output does (the last step's other tokens): zeros, not sent.
    """
    for req, d in zip(reqs, depths):
        info = req.customized_info
        if info is None:
            info = req.customized_info = {}
        values = info.get(DEPTH_KEY)
        if values is None:
            values = info[DEPTH_KEY] = []
        n = len(req.output_ids)
        if len(values) < n:
            values.extend([0] * (n - len(values)))
        values.append(int(d))


def sglang_labels() -> dict[str, str]:
    """The labels sglang 0.5.23 puts on its scheduler series in this process (model_name,
    engine_type, tp_rank, pp_rank, moe_ep_rank; dp_rank under data parallelism; then
    ``--extra-metric-labels``), read from sglang's runtime context as its
    ``SchedulerMetricsCollector.init_new`` reads them, as strings (how Prometheus shows them)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.runtime_context import get_disagg, get_observability, get_parallel, get_serving

    parallel = get_parallel()
    engine = (
        "dynamic"
        if get_disagg().enable_pd_role_switch
        else DisaggregationMode.to_engine_type(get_disagg().disaggregation_mode)
    )
    labels = {
        "model_name": get_serving().served_model_name,
        "engine_type": engine,
        "tp_rank": parallel.tp_rank,
        "pp_rank": parallel.pp_rank,
        "moe_ep_rank": parallel.moe_ep_rank,
    }
    if parallel.dp_rank is not None:
        labels["dp_rank"] = parallel.dp_rank
    labels.update(get_observability().extra_metric_labels or {})
    return {k: str(v) for k, v in labels.items()}


def sglang_writes_metrics() -> bool:
    """Whether sglang's scheduler in this process exports its series: the first rank of each
    attention-TP group (attn_tp_rank 0, attn_cp_rank 0), or every rank with
    ``--enable-metrics-for-all-schedulers``. ECHO writes exactly where sglang does: every TP
    rank runs the same ECHO step over the same batch, so one writer per batch keeps each step
    counted once, and every ``echo_*`` series has its ``sglang:*`` twin to join with."""
    from sglang.srt.runtime_context import get_observability, get_parallel

    parallel = get_parallel()
    lead = parallel.attn_tp_rank == 0 and parallel.attn_cp_rank == 0
    return bool(lead or get_observability().enable_metrics_for_all_schedulers)


def observe_many(hist, values, bounds: Sequence[float]) -> None:
    """Observe every value of ``values`` (a tensor, array or list) into the histogram child
    ``hist`` at once: one count per bucket and one sum, as ``hist.observe`` would leave them
    value by value (``tests/integration/test_metrics.py`` compares the two pages), without a
    Python loop over the batch. Falls back to ``observe`` where the client lays histograms out
    differently (``_buckets`` / ``_sum`` / ``_upper_bounds`` are prometheus_client's)."""
    import numpy as np

    if hasattr(values, "detach"):  # a torch tensor, possibly on the device
        values = values.detach().cpu().numpy()
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return
    if list(getattr(hist, "_upper_bounds", ())) != list(bounds) or not hasattr(hist, "_buckets"):
        for x in v.tolist():
            hist.observe(x)
        return
    # bucket i holds bounds[i-1] < x <= bounds[i], Prometheus' ``le``; the last bound is +Inf
    counts = np.bincount(np.searchsorted(np.asarray(bounds), v, side="left"), minlength=len(bounds))
    for i in np.flatnonzero(counts).tolist():
        hist._buckets[i].inc(int(counts[i]))
    hist._sum.inc(float(v.sum()))


class EchoMetrics:
    def __init__(
        self,
        k_max: int,
        enabled: bool,
        *,
        labels: Mapping[str, str] | None = None,
        writer: bool | None = None,
        registry=None,
    ) -> None:
        """``k_max``: the server's K_max (its flat part: :class:`~sglang_echo.core.kmax.KMax`).

        ``enabled``: ``--enable-metrics``. ``labels`` (default :func:`sglang_labels`) go on every
        series; ``writer`` (default :func:`sglang_writes_metrics`): whether this process exports
        (the totals are kept either way); ``registry``: prometheus_client's default one unless
        given (tests)."""
        self.k_max = k_max
        self.enabled = enabled
        self.step_max = 0
        self.totals = {
            "verified": 0,
            "target": 0,
            "slots": 0,
            "accepted": 0,
            "steps": 0,
            "exceeded": 0,
            "cap": 0,
            "faults": 0,
            "timed_steps": 0,
            "deferred": 0,
            "caught_up": 0,
            "ngram_nodes": 0,
            **{f"{k}_seconds": 0.0 for k in TIMERS},
        }
        self.request_depth = _env_flag(DEPTH_ENV, True)
        self.labels: dict[str, str] = {}
        self._m = None  # key -> the family (ECHO-labelled series) or the child under self.labels
        self._warned: set[str] = set()
        if enabled:
            try:
                self.labels = dict(sglang_labels() if labels is None else labels)
                if writer is None:
                    writer = sglang_writes_metrics()
                if writer:
                    self._create(registry)
                else:
                    log.info("ECHO: this rank exports no echo_* series (sglang's metrics rank does)")
            except Exception as e:  # metrics must never take the server down
                log.warning("ECHO: could not create Prometheus metrics (%s: %s)", type(e).__name__, e)
                self._m = None

    def _create(self, registry) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg, names, m = REGISTRY if registry is None else registry, tuple(self.labels), {}
        for s in SERIES:
            kw = {"labelnames": names + s.labels, "registry": reg}
            if s.kind is Kind.COUNTER:
                family = Counter(s.name, s.doc, **kw)
            elif s.kind is Kind.GAUGE:
                family = Gauge(s.name, s.doc, multiprocess_mode="max", **kw)
            else:
                family = Histogram(s.name, s.doc, buckets=bucket_bounds(s), **kw)
            # A series without ECHO labels is exported from the start (a counter at 0).
            m[s.key] = family if s.labels else family.labels(**self.labels)
        self._m = m
        m["k_max"].set(self.k_max)

    def _labelled(self, key: str, **own: str):
        """The child of an ECHO-labelled series (``depth``, ``kind``, ``arm``/``reason``)."""
        return self._m[key].labels(**self.labels, **own)

    def on_step(self, st, target_tokens: int) -> None:
        total = st.verified
        cap = self.k_max if st.cap is None else st.cap
        slots = int(st.sizes.numel()) * st.width
        self.totals["verified"] += total
        self.totals["slots"] += slots
        self.totals["cap"] += cap
        self.totals["target"] += target_tokens
        self.totals["steps"] += 1
        ngram_nodes = getattr(st, "ngram_nodes", 0)  # hybrid drafting only
        self.totals["ngram_nodes"] += ngram_nodes
        self.step_max = max(self.step_max, total)
        if self._m is None:
            return
        if ngram_nodes:
            self._m["ngram_nodes"].inc(ngram_nodes)
        self._m["verified"].inc(total)
        self._m["target"].inc(target_tokens)
        self._m["slots"].inc(slots)
        self._m["steps"].inc()
        self._m["cap"].inc(cap)
        self._m["step_max"].set(self.step_max)
        if st.gate_evaluated is not None:
            ev, pa = st.gate_evaluated.tolist(), st.gate_passed.tolist()
            for d, (e, p) in enumerate(zip(ev, pa)):
                if e:
                    self._labelled("gate_eval", depth=str(d)).inc(e)
                    self._labelled("gate_pass", depth=str(d)).inc(p)
        try:
            self._m["step_verified"].observe(total)
            depths = getattr(st, "depths", None)  # [bs] deepest node of each request's tree
            if depths is not None:
                observe_many(self._m["tree_depth"], depths, bucket_bounds(BY_KEY["tree_depth"]))
        except Exception as e:  # metrics must never take the server down
            self.warn_once("histogram", e)

    def on_lazy_extend(self, *, deferred: int = 0, caught_up: int = 0) -> None:
        """Tokens a plain step deferred and a catch-up extended (:mod:`.lazy_extend`)."""
        for key, n in (("deferred", deferred), ("caught_up", caught_up)):
            if n:
                self.totals[key] += n
                if self._m is not None:
                    self._m[key].inc(n)

    def on_timing(self, *, control: float, draft: float, verify: float, step: float) -> None:
        """One decode step's wall seconds (see the module docstring); never raises."""
        try:
            t = self.totals
            t["timed_steps"] += 1
            for k, v in (("control", control), ("draft", draft), ("verify", verify), ("step", step)):
                t[f"{k}_seconds"] += v
            if self._m is None:
                return
            self._m["timed_steps"].inc()
            for k, v in (("control", control), ("draft", draft), ("verify", verify), ("step", step)):
                self._m[f"{k}_seconds"].inc(max(v, 0.0))  # a Counter refuses negative increments
        except Exception as e:  # metrics must never take the server down
            self.warn_once("timing", e)

    def on_budget_step(self, decision, seconds: float, premium: Optional[float] = None) -> None:
        """One step of the cost budget: its ``(arm, reason)`` (None: undecided), wall seconds and
        the premium it required of drafting (None: not weighed, as at a full batch)."""
        if decision is None or self._m is None:
            return
        try:
            arm, reason = decision
            self._labelled("budget_steps", arm=arm, reason=reason).inc()
            self._labelled("budget_seconds", arm=arm, reason=reason).inc(max(seconds, 0.0))
            if premium is not None:
                self._m["premium"].set(premium)
        except Exception as e:  # metrics must never take the server down
            self.warn_once("budget", e)

    def on_tree_depths(self, reqs, depths) -> None:
        """Per-request tree depth of this step into ``meta_info["echo_tree_depth"]``; never raises."""
        if not self.request_depth:
            return
        try:
            record_tree_depths(reqs, depths.tolist() if hasattr(depths, "tolist") else depths)
        except Exception as e:
            self.warn_once("tree_depth", e)

    def warn_once(self, what: str, e: Exception) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("ECHO: %s metrics failed (%s: %s); further failures are not logged", what, type(e).__name__, e)

    def on_accept(self, num_correct_drafts_per_req) -> None:
        n = sum(int(x) for x in num_correct_drafts_per_req) + len(num_correct_drafts_per_req)
        self.totals["accepted"] += n
        if self._m is not None:
            self._m["accepted"].inc(n)
            try:
                import numpy as np

                lengths = np.asarray(num_correct_drafts_per_req).reshape(-1) + 1  # the bonus token
                observe_many(self._m["accept_length"], lengths, bucket_bounds(BY_KEY["accept_length"]))
            except Exception as e:  # metrics must never take the server down
                self.warn_once("histogram", e)

    def budget_exceeded(self) -> None:
        self.totals["exceeded"] += 1
        if self._m is not None:
            self._m["exceeded"].inc()

    def draft_fault(self, kind: str) -> None:
        """A step whose drafter failed (:mod:`.faults`): verified as plain decoding."""
        self.totals["faults"] += 1
        if self._m is not None:
            self._labelled("faults", kind=str(kind)).inc()

    def check_budget(self, policy, st) -> None:
        """Count (and log) a step of a budgeted policy that verified over max(its cap, bs) (Eq. 4)."""
        if not getattr(policy, "budgeted", False) or st.cap is None:
            return
        total, bs = st.verified, st.sizes.numel()
        if total > max(st.cap, bs):
            self.budget_exceeded()
            log.error(
                "ECHO: step verified %d tokens for %d requests, over the budget max(cap=%d, bs)", total, bs, st.cap
            )
