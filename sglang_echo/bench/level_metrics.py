"""What one benchmark level added to a server's own counters: ECHO's ``echo_*`` Prometheus
counters (scraped from ``/metrics``) and, on CPU-platform servers, the scheduler's step times
(``platform.step_times``, read from the server log)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from ..integration.metric_catalog import ECHO_LABELS, Kind, Sample, exported_names
from ..platform import step_times

# One sample line of the text exposition format: name, optional {labels}, value, optional timestamp.
_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def parse_page(text: str) -> list[Sample]:
    """Every sample of a Prometheus text page; a line that is not a sample (a comment, or a
    value that is not a number) is skipped."""
    samples = []
    for line in text.splitlines():
        m = None if line.startswith("#") else _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        samples.append(Sample(m.group(1), labels, value))
    return samples


def echo_totals(samples: Iterable[Sample], key: Callable[[str, dict[str, str]], str]) -> dict[str, float]:
    """The ``echo_*`` samples with sglang's identity labels (model, ranks) summed over, ECHO's
    own labels kept: one value per ``key(name, own_labels)``. Counters and histograms add up
    over the processes that wrote them; a gauge keeps the largest value (K_max, the largest step)."""
    kinds = {name: s.kind for name, s in exported_names().items()}
    out: dict[str, float] = {}
    for x in samples:
        if not x.name.startswith("echo_"):
            continue
        k = key(x.name, {n: v for n, v in sorted(x.labels.items()) if n in ECHO_LABELS})
        if kinds.get(x.name) is Kind.GAUGE:
            out[k] = max(out.get(k, x.value), x.value)
        else:
            out[k] = out.get(k, 0.0) + x.value
    return out


def _braced(name: str, labels: dict[str, str]) -> str:
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")


def parse_echo_metrics(text: str) -> dict[str, float]:
    """The ``echo_*`` totals of a Prometheus text page (:func:`echo_totals`), keyed by name, or
    ``name{label="value",...}`` with ECHO's own labels in name order (``depth``, ``kind``,
    ``arm``/``reason``, a histogram's ``le``)."""
    return echo_totals(parse_page(text), _braced)


def scrape_echo_metrics(base_url: str) -> dict[str, float]:
    """``parse_echo_metrics`` of ``/metrics`` ({} if the server exports none or is unreachable)."""
    import requests

    try:
        r = requests.get(base_url + "/metrics", timeout=30)
        return parse_echo_metrics(r.text) if r.ok else {}
    except requests.RequestException:
        return {}


def echo_deltas(before: dict[str, float], after: dict[str, float]) -> dict | None:
    """What one level added to the ``echo_*`` counters: steps, verified tokens per step (sum of
    K_i, roots included) against K_max, and seconds per phase with the control share of the
    step time. None if the server exported no ECHO counters."""
    if "echo_steps_total" not in after:
        return None

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    steps, timed, verified = d("echo_steps_total"), d("echo_timed_steps_total"), d("echo_verified_tokens_total")
    step_s, control_s = d("echo_step_seconds_total"), d("echo_control_seconds_total")
    out = {
        "steps": steps,
        "verified_tokens": verified,
        "target_tokens": d("echo_target_tokens_total"),
        "accepted_tokens": d("echo_accepted_tokens_total"),
        "verified_per_step": verified / steps if steps else None,
        # a max-mode gauge: the largest step since the server started, not only this level's
        "step_verified_max": after.get("echo_step_verified_tokens_max"),
        "k_max": after.get("echo_budget_k_max"),
        # the mean per-step cap: K_max with budget fixed, the cost model's caps with budget cost
        "cap_per_step": d("echo_budget_cap_tokens_total") / steps
        if steps and "echo_budget_cap_tokens_total" in after
        else None,
        "budget_exceeded": d("echo_budget_exceeded_total"),
        # lazy extend: committed tokens whose draft extend was deferred, and those caught up later
        "deferred_tokens": d("echo_deferred_extend_tokens_total"),
        "caught_up_tokens": d("echo_caught_up_tokens_total"),
        "timed_steps": timed,
        "control_s": control_s,
        "draft_s": d("echo_draft_seconds_total"),
        "verify_s": d("echo_verify_seconds_total"),
        "step_s": step_s,
        "control_share": control_s / step_s if step_s > 0 else None,
        "step_ms": 1e3 * step_s / timed if timed else None,
        "control_ms": 1e3 * control_s / timed if timed else None,
    }
    if out["verified_per_step"] is not None and out["k_max"]:
        out["budget_fill"] = out["verified_per_step"] / out["k_max"]
    decisions = budget_decisions(before, after)
    if decisions:
        out["budget_decisions"] = decisions
    return out


def budget_decisions(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """What a level added to ``echo_budget_steps_total{arm,reason}`` and its seconds: per
    ``"arm/reason"``, ``{"steps", "seconds"}`` (``budget: cost`` servers only; else {})."""
    out: dict[str, dict[str, float]] = {}
    for key, value in after.items():
        for name, field in (("echo_budget_steps_total", "steps"), ("echo_budget_step_seconds_total", "seconds")):
            if key.startswith(name + "{"):
                labels = dict(_LABEL.findall(key[len(name) + 1 : -1]))
                row = out.setdefault(f"{labels.get('arm')}/{labels.get('reason')}", {"steps": 0.0, "seconds": 0.0})
                row[field] += value - before.get(key, 0.0)
    return {k: v for k, v in sorted(out.items()) if v["steps"] > 0}


def settled_step_times(server) -> dict | None:
    """A server's step-time totals once its log has caught up with its last step (an
    :class:`SGLangServer`; None: not a CPU-platform server, which has no step timer)."""
    if server.command.device != "cpu":
        return None
    time.sleep(step_times.LOG_EVERY_S + 0.5)
    return step_times.read_step_times(server.log_path) or {}
