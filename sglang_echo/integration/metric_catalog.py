"""Every ``echo_*`` Prometheus series ECHO exports, and what a correct ``/metrics`` page holds.

One table (:data:`SERIES`) is the source for :class:`~.metrics.EchoMetrics` (which creates
them), for the checks of a scraped page (:func:`check_page`, run by the real-server tests)
and for the static checks of ``deploy/monitoring`` (every series a dashboard panel or an alert
names must be one of :func:`exported_names`).

Labels. Every series carries sglang's scheduler labels (:data:`IDENTITY_LABELS`, plus
``dp_rank`` under data parallelism and any ``--extra-metric-labels``), with the values
sglang's own ``sglang:*`` scheduler series have in the same process, so ``echo_*`` and
``sglang:*`` join ``on(model_name, tp_rank, ...)``; ECHO's own labels (:attr:`Series.labels`:
``depth``, ``kind``, ``arm``, ``reason``) come after them.

This module imports neither sglang nor prometheus_client: the deploy tests read it alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

# sglang 0.5.23's SchedulerMetricsCollector labels, in its order (observability/metrics_collector.py).
IDENTITY_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
OPTIONAL_IDENTITY_LABELS = ("dp_rank",)  # only where sglang runs data-parallel replicas

# Tokens per request and step (accepted, incl. the bonus token): 1..64 with one bucket per
# token where acceptance lives (1-8), then coarser up to the deepest trees.
TOKEN_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)
# Verified tokens per step (sum of K_i, roots included): at least the batch size, up to
# max(K_max, bs), so the token buckets continue up to sglang's 1024 running requests.
STEP_TOKEN_BUCKETS = TOKEN_BUCKETS + (96, 128, 192, 256, 384, 512, 768, 1024)
# Tree depth per request and step: 0 is a root-only (plain decoding) step.
DEPTH_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)


class Kind(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"  # multiprocess mode "max": the largest value any scheduler process set
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Series:
    key: str  # EchoMetrics' handle (also its ``totals`` key where it keeps one)
    name: str  # the family name; a counter's sample is ``name + "_total"``
    kind: Kind
    doc: str
    labels: tuple[str, ...] = ()  # ECHO's own labels, after the identity labels
    buckets: tuple[float, ...] = ()  # histograms only (``+Inf`` is added by the client)


_C, _G, _H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

SERIES: tuple[Series, ...] = (
    Series("verified", "echo_verified_tokens", _C, "Tokens submitted to verification (sum of K_i, roots included)"),
    Series("target", "echo_target_tokens", _C, "Tokens computed by the target's verify forwards (padding included)"),
    Series("slots", "echo_verify_slots", _C, "Verify slots laid out (batch size x the step's padded width)"),
    Series("accepted", "echo_accepted_tokens", _C, "Tokens accepted by verification (incl. bonus)"),
    Series("steps", "echo_steps", _C, "ECHO verify steps"),
    Series("exceeded", "echo_budget_exceeded", _C, "Steps whose sum of K_i exceeded max(K_max, bs)"),
    Series("faults", "echo_draft_faults", _C, "Steps verified as plain decoding because the drafter failed", ("kind",)),
    Series("gate_eval", "echo_gate_evaluated", _C, "Confidence gates evaluated", ("depth",)),
    Series("gate_pass", "echo_gate_passed", _C, "Confidence gates passed", ("depth",)),
    Series("k_max", "echo_budget_k_max", _G, "The server's K_max (without its growth with the batch)"),
    Series("cap", "echo_budget_cap_tokens", _C, "Sum of the steps' verification caps (K_max or the cost model's)"),
    Series("step_max", "echo_step_verified_tokens_max", _G, "Largest per-step sum of K_i"),
    Series("deferred", "echo_deferred_extend_tokens", _C, "Tokens whose draft extend a plain step or prefill deferred"),
    Series("caught_up", "echo_caught_up_tokens", _C, "Deferred tokens a catch-up draft extend extended"),
    Series("ngram_nodes", "echo_hybrid_ngram_nodes", _C, "Draft nodes the requests' n-gram drafters added (hybrid)"),
    Series("timed_steps", "echo_timed_steps", _C, "Decode steps covered by the echo_*_seconds counters"),
    Series("budget_steps", "echo_budget_steps", _C, "Steps by the cost budget's decision", ("arm", "reason")),
    Series(
        "premium",
        "echo_budget_premium",
        _G,
        "Lead over plain decoding the cost budget last required of drafting (its premium plus the prefill charge)",
    ),
    Series(
        "budget_seconds",
        "echo_budget_step_seconds",
        _C,
        "Whole-step seconds by the cost budget's decision",
        ("arm", "reason"),
    ),
    Series(
        "control_seconds",
        "echo_control_seconds",
        _C,
        "ECHO control plane: build_trees minus drafter.propose, plus packing to sglang's layout",
    ),
    Series(
        "draft_seconds",
        "echo_draft_seconds",
        _C,
        "Drafting outside the control plane (draft forwards / n-gram lookups, their setup)",
    ),
    Series("verify_seconds", "echo_verify_seconds", _C, "Target verify pass with sglang's acceptance and KV commit"),
    Series("step_seconds", "echo_step_seconds", _C, "Whole speculative decode step, worker entry to return"),
    Series(
        "accept_length",
        "echo_accept_length",
        _H,
        "Tokens accepted per request and verify step (incl. the bonus token)",
        buckets=TOKEN_BUCKETS,
    ),
    Series(
        "step_verified",
        "echo_verified_tokens_per_step",
        _H,
        "Tokens submitted to verification per step (sum of K_i, roots included)",
        buckets=STEP_TOKEN_BUCKETS,
    ),
    Series(
        "tree_depth",
        "echo_tree_depth",
        _H,
        "Draft tree depth per request and verify step (0: root only)",
        buckets=DEPTH_BUCKETS,
    ),
)
BY_KEY: dict[str, Series] = {s.key: s for s in SERIES}
BY_NAME: dict[str, Series] = {s.name: s for s in SERIES}
# ECHO's own labels (and a histogram's ``le``): what survives summing over sglang's identity labels.
ECHO_LABELS = frozenset(label for s in SERIES for label in s.labels) | {"le"}


def sample_names(s: Series) -> tuple[str, ...]:
    """The names of the samples ``s`` shows on a page."""
    if s.kind is Kind.COUNTER:
        return (s.name + "_total",)
    if s.kind is Kind.HISTOGRAM:
        return tuple(s.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return (s.name,)


def exported_names() -> dict[str, Series]:
    """Every sample name ECHO exports, with its series."""
    return {name: s for s in SERIES for name in sample_names(s)}


def bucket_bounds(s: Series) -> tuple[float, ...]:
    """A histogram's upper bounds as the client lays them out (``+Inf`` last)."""
    return tuple(float(b) for b in s.buckets) + (math.inf,)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def check_page(samples: Iterable[Sample], always: Iterable[str] = ()) -> list[str]:
    """What is wrong with the ``echo_*`` samples of one server's page (empty: nothing).

    Checked: every ``echo_*`` sample is a series of :data:`SERIES` with exactly the identity
    labels and its own; the identity labels have the values of the page's ``sglang:*``
    scheduler series (one series per process: ``model_name`` and the ranks agree); a
    histogram's buckets are its bounds and cumulative, ``_count`` its ``+Inf`` bucket; and every
    series named in ``always`` (keys of :data:`BY_KEY`) is on the page."""
    samples = list(samples)
    known, problems = exported_names(), []
    # sglang's scheduler series are those with a tp_rank (the tokenizer's carry none).
    sglang_ids = {_identity(x.labels) for x in samples if x.name.startswith("sglang:") and "tp_rank" in x.labels}
    # prometheus_client's ``*_created`` timestamps (single-process registries only) are not series.
    echo = [
        x
        for x in samples
        if x.name.startswith("echo_")
        and not (x.name.endswith("_created") and x.name.removesuffix("_created") in BY_NAME)
    ]
    if echo and not sglang_ids:
        problems.append("no sglang:* scheduler series on the page to join the echo_* series with")
    for x in echo:
        s = known.get(x.name)
        if s is None:
            problems.append(f"{x.name}: not an ECHO series (metric_catalog.SERIES)")
            continue
        own = set(x.labels) - set(IDENTITY_LABELS) - set(OPTIONAL_IDENTITY_LABELS)
        want = set(s.labels) | ({"le"} if x.name.endswith("_bucket") else set())
        if not set(IDENTITY_LABELS) <= set(x.labels):
            problems.append(f"{x.name}: missing sglang labels {sorted(set(IDENTITY_LABELS) - set(x.labels))}")
        elif sglang_ids and _identity(x.labels) not in sglang_ids:
            problems.append(f"{x.name}: labels {dict(_identity(x.labels))} match no sglang scheduler series")
        if not want <= own:
            problems.append(f"{x.name}: missing ECHO labels {sorted(want - own)}")
    problems += _check_histograms(echo)
    present = {known[x.name].key for x in echo if x.name in known}
    problems += [f"{BY_KEY[k].name}: not on the page" for k in always if k not in present]
    return problems


def _identity(labels: Mapping[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k in IDENTITY_LABELS or k in OPTIONAL_IDENTITY_LABELS))


def _check_histograms(samples: list[Sample]) -> list[str]:
    problems: list[str] = []
    groups: dict[tuple, dict] = {}
    for x in samples:
        for s in SERIES:
            if s.kind is Kind.HISTOGRAM and x.name in sample_names(s):
                rest = tuple(sorted((k, v) for k, v in x.labels.items() if k != "le"))
                g = groups.setdefault((s.name, rest), {"buckets": {}, "count": None})
                if x.name.endswith("_bucket"):
                    g["buckets"][float(x.labels.get("le", "nan"))] = x.value
                elif x.name.endswith("_count"):
                    g["count"] = x.value
    for (name, _), g in groups.items():
        bounds, got = bucket_bounds(BY_NAME[name]), sorted(g["buckets"])
        if tuple(got) != bounds:
            problems.append(f"{name}: buckets {got}, want {list(bounds)}")
            continue
        values = [g["buckets"][b] for b in got]
        if any(b < a for a, b in zip(values, values[1:])):
            problems.append(f"{name}: buckets not cumulative {values}")
        if g["count"] is not None and g["count"] != values[-1]:
            problems.append(f"{name}: _count {g['count']} != +Inf bucket {values[-1]}")
    return problems
