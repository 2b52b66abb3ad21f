"""What one benchmark level added to a server's own counters: ECHO's ``echo_*`` Prometheus
counters (scraped from ``/metrics``) and, on CPU-platform servers, the scheduler's step times
(``platform.step_times``, read from the server log)."""

from __future__ import annotations

import re
import time

from ..platform import step_times

_SAMPLE = re.compile(r"^(echo_\w+)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|[+-]Inf)\s*$")


def parse_echo_metrics(text: str) -> dict[str, float]:
    """The unlabelled ``echo_*`` samples of a Prometheus text page (labelled ones: name{labels})."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


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
        "cap_per_step": d("echo_budget_cap_tokens_total") / steps if steps and "echo_budget_cap_tokens_total" in after else None,
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


_LABELS = re.compile(r'(\w+)="([^"]*)"')


def budget_decisions(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """What a level added to ``echo_budget_steps_total{arm,reason}`` and its seconds: per
    ``"arm/reason"``, ``{"steps", "seconds"}`` (``budget: cost`` servers only; else {})."""
    out: dict[str, dict[str, float]] = {}
    for key, value in after.items():
        for name, field in (("echo_budget_steps_total", "steps"), ("echo_budget_step_seconds_total", "seconds")):
            if key.startswith(name + "{"):
                labels = dict(_LABELS.findall(key))
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
