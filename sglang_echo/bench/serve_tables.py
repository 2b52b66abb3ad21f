"""`echo-bench serve`'s Markdown report: the main table (speedup against the ``none`` of the
same pass), the per-pass summary (``--repeats``), draft utilisation, ECHO's per-step budget and
control share, and ECHO Table 1's per-prompt-set shape."""

from __future__ import annotations

import json
import math
import statistics
from typing import Callable

from .latency import quartiles
from .serve_run import CONTROL_GOAL, Report, Run


def level_name(runs: list[Run]) -> str:
    """The level column's heading: concurrency (closed loops), or the request rate (open loops)."""
    return "concurrency" if all(r.request_rate is None for r in runs) else "request rate (req/s)"


def _label(r: Run) -> str:
    return f"{r.config} (pass {r.repeat + 1})" if r.repeat else r.config


def _f(x, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{suffix}"


def _none_values(runs: list[Run], metric: Callable[[Run], float | None]) -> dict[tuple[int, int], float]:
    """``none``'s ``metric`` per (pass, level), where it has one: what ratios are taken against."""
    return {(r.repeat, r.level): v for r in runs if r.config == "none" and (v := metric(r)) is not None}


def _ratios_to_none(runs: list[Run], metric: Callable[[Run], float | None]) -> dict[tuple[str, int], list[float]]:
    """Each config's ``metric`` over ``none``'s at each level, one ratio per pass (``--repeats``)."""
    base = _none_values(runs, metric)
    out: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        ref, v = base.get((r.repeat, r.level)), metric(r)
        if r.config != "none" and ref and v is not None:
            out.setdefault((r.config, r.level), []).append(v / ref)
    return out


def _tokens_per_cpu_s(r: Run) -> float | None:
    """Tokens per server CPU second: its ratio to none's is none's CPU per token over the config's."""
    return 1000 / r.cpu_ms_per_token if r.cpu_ms_per_token else None


def none_rates(runs: list[Run]) -> dict[tuple[int, int], float]:
    """``none``'s tokens/s per (pass, level): what every speedup is taken against."""
    return _none_values(runs, lambda r: r.tokens_per_s)


def speedups(runs: list[Run]) -> dict[tuple[str, int], list[float]]:
    """Each config's tokens/s over ``none``'s at each level, one ratio per pass (``--repeats``)."""
    return _ratios_to_none(runs, lambda r: r.tokens_per_s)


def cpu_savings(runs: list[Run]) -> dict[tuple[str, int], list[float]]:
    """Each config's server CPU per token against ``none``'s, as ``none / config`` (above 1: the
    config spends less CPU per token), one ratio per pass."""
    return _ratios_to_none(runs, _tokens_per_cpu_s)


def ratio_interval(ratios: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of per-pass ratios and its two-sided ``level`` confidence interval.

    Passes are paired measurements (config and ``none`` a level apart, see ``--interleave``) whose
    ratios drift multiplicatively, so the interval is Student's t on the log ratios; it says
    whether a config is slower or faster than ``none`` beyond what the passes' spread allows.
    Needs two passes or more."""
    from scipy.stats import t

    logs = [math.log(r) for r in ratios]
    n, mean = len(logs), statistics.fmean(logs)
    half = t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def repeats_table(runs: list[Run]) -> list[str]:
    """With several passes: each speedup per pass, their median, minimum, geometric mean and its
    95% interval; the same for server CPU per token. ``none-twin`` (a second plain server) shows
    the interval that the host's noise alone gives."""
    out = []
    for ratios, what in (
        (speedups(runs), "Speedup vs none (tokens/s)"),
        (cpu_savings(runs), "Server CPU per token, none's over the config's"),
    ):
        if not any(len(v) > 1 for v in ratios.values()):
            continue
        out += ([""] if out else []) + [
            f"{what} per pass (the order alternates between passes), their median, minimum and geometric mean "
            "with its 95% interval (Student's t on the log ratios):",
            "",
            f"| config | {level_name(runs)} | per pass | median | min | geo mean | 95% interval |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for (name, c), rs in ratios.items():
            geo, lo, hi = ratio_interval(rs) if len(rs) > 1 else (rs[0], None, None)
            interval = f"{lo:.2f}-{hi:.2f}x" if lo is not None else "-"
            out.append(
                f"| {name} | {c:g} | {' / '.join(f'{x:.2f}x' for x in rs)} | {statistics.median(rs):.2f}x | "
                f"{min(rs):.2f}x | {geo:.2f}x | {interval} |"
            )
    return out


def markdown(report: Report) -> str:
    base, base_cpu = none_rates(report.runs), _none_values(report.runs, _tokens_per_cpu_s)
    lines = [
        f"Machine: {report.machine['platform']}, {report.machine['cpus']} CPUs. "
        f"Settings: {json.dumps(report.settings)}",
        *([f"Lossless check: {report.settings['lossless']}."] if report.settings.get("lossless") else []),
        *(
            [
                f"**{report.settings['simulated']['label'].capitalize()}** from "
                f"{report.settings['simulated']['trace']}: "
                "the speculative servers' accepted tokens are the recorded trace's, every cost is measured."
            ]
            if report.settings.get("simulated")
            else []
        ),
        "",
        (
            f"| config | {level_name(report.runs)} | tokens/s | speedup vs none | MAT | lossless vs none | startup s | "
            "server CPU ms/token | CPU per token, none / config | yield |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.runs:
        ref, ref_cpu = base.get((r.repeat, r.level)), base_cpu.get((r.repeat, r.level))
        speed = f"{r.tokens_per_s / ref:.2f}x" if ref else "-"
        mat = f"{r.mat:.2f}" if r.mat else "-"
        startup = f"{r.startup_seconds:.0f}" if r.startup_seconds else "-"
        cpu = r.cpu_ms_per_token
        saving = f"{_tokens_per_cpu_s(r) / ref_cpu:.2f}x" if ref_cpu and cpu else "-"
        lines.append(
            f"| {_label(r)} | {r.level:g} | {r.tokens_per_s:.2f} | {speed} | {mat} | {r.lossless} | "
            f"{startup} | {_f(cpu, '.1f')} | {saving} | {_f(r.draft_yield, '.3f')} |"
        )
    for section in (
        latency_table(report.runs),
        repeats_table(report.runs),
        utilisation_table(report.runs),
        budget_table(report.runs),
        decisions_table(report.runs),
        step_table(report.runs),
        table1(report.runs),
    ):
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"


def _pcts(summary: dict | None, scale: float, fmt: str) -> str:
    """``p50 / p90 / p99`` of a latency summary entry, times ``scale`` ("-" without one)."""
    if not summary:
        return "-"
    return " / ".join(f"{scale * summary[p]:{fmt}}" for p in ("p50", "p90", "p99"))


def latency_table(runs: list[Run]) -> list[str]:
    """Request throughput and latency percentiles per level (:mod:`.latency`): end to end, and
    TTFT and inter-token latency where the responses were streamed."""
    rows = [r for r in runs if r.latency]
    if not rows:
        return []
    out = [
        "Requests and latency per level (p50 / p90 / p99; TTFT and ITL need streamed responses; ITL spreads a "
        "chunk's gap over the tokens it brings):",
        "",
        f"| config | {level_name(rows)} | requests | req/s | tokens/s | e2e s | TTFT ms | ITL ms |",
        "|" + " --- |" * 8,
    ]
    for r in rows:
        lat = r.latency
        out.append(
            f"| {_label(r)} | {r.level:g} | {r.requests} | {r.requests_per_s:.2f} | {r.tokens_per_s:.2f} | "
            f"{_pcts(lat.get('e2e'), 1, '.2f')} | {_pcts(lat.get('ttft'), 1e3, '.0f')} | "
            f"{_pcts(lat.get('itl'), 1e3, '.1f')} |"
        )
    return out


def utilisation_table(runs: list[Run]) -> list[str]:
    """Per-request draft utilisation u = MAT / depth over the steps that drafted (ECHO Fig. 4: box =
    quartiles, whiskers p5-p95)."""
    rows = [r for r in runs if r.utilisation]
    if not rows:
        return []
    out = [
        (
            "Draft utilisation per request, u = MAT / depth over the steps that drafted (MAT includes the bonus "
            "token; depth: ECHO's mean tree depth per step, root-only steps included, EAGLE-3's num_steps):"
        ),
        "",
        f"| config | {level_name(rows)} | requests | depth (median) | u median | u q1-q3 | u p5-p95 | u mean |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        u = r.utilisation
        depth = quartiles([x["depth"] for x in r.per_request if x.get("depth") is not None])
        out.append(
            f"| {_label(r)} | {r.level:g} | {u['n']} | {_f(depth and depth['median'])} | {u['median']:.2f} | "
            f"{u['q1']:.2f}-{u['q3']:.2f} | {u['p5']:.2f}-{u['p95']:.2f} | {u['mean']:.2f} |"
        )
    return out


def budget_table(runs: list[Run]) -> list[str]:
    """ECHO servers: verified tokens per step vs K_max, and the control plane's share of the step."""
    rows = [r for r in runs if r.echo]
    if not rows:
        return []
    out = [
        (
            f"ECHO per step (from the echo_* counters; control = gating + scheduling + packing, goal <= "
            f"{100 * CONTROL_GOAL:.0f}% of the step):"
        ),
        "",
        (
            f"| config | {level_name(rows)} | steps | verified tokens/step | max so far | K_max | mean cap | step ms | "
            "control ms | control share | <= 3% |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        e = r.echo
        share = e.get("control_share")
        ok = "-" if share is None else ("yes" if share <= CONTROL_GOAL else "no")
        out.append(
            f"| {_label(r)} | {r.level:g} | {e['steps']:.0f} | {_f(e.get('verified_per_step'), '.1f')} | "
            f"{_f(e.get('step_verified_max'), '.0f')} | {_f(e.get('k_max'), '.0f')} | "
            f"{_f(e.get('cap_per_step'), '.1f')} | {_f(e.get('step_ms'))} | "
            f"{_f(e.get('control_ms'), '.3f')} | {_f(share and 100 * share, '.2f', '%')} | {ok} |"
        )
    return out


def decisions_table(runs: list[Run]) -> list[str]:
    """``budget: cost`` servers: steps and seconds by the cost budget's decision (arm/reason), so
    the price of its warm-up, explorations and probes is visible beside the model's own choices."""
    rows = [r for r in runs if r.echo and r.echo.get("budget_decisions")]
    if not rows:
        return []
    out = [
        "Cost budget's decisions per level (`echo_budget_steps_total{arm,reason}`; ms/step is the whole "
        "step; share: of the level's ECHO step seconds):",
        "",
        f"| config | {level_name(rows)} | decision | steps | seconds | ms/step | share |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        total = sum(d["seconds"] for d in r.echo["budget_decisions"].values())
        for name, d in r.echo["budget_decisions"].items():
            share = _f(total and 100 * d["seconds"] / total, ".1f", "%")
            out.append(
                f"| {_label(r)} | {r.level:g} | {name} | {d['steps']:.0f} | {d['seconds']:.2f} | "
                f"{1e3 * d['seconds'] / d['steps']:.1f} | {share} |"
            )
    return out


def _steps(cells: dict[str, list[float]]) -> tuple[int, float, float]:
    """Steps, seconds and mean batch size of one kind's ``{batch size: [steps, seconds]}``."""
    n = sum(c[0] for c in cells.values())
    return int(n), sum(c[1] for c in cells.values()), sum(int(b) * c[0] for b, c in cells.items()) / n if n else 0.0


def _full_batch_ms(r: Run, kind: str = "decode") -> float | None:
    """ms per ``kind`` (a whole decode step, or the target's forward in it) with all
    ``concurrency`` requests in the batch (None if none ran)."""
    n, s = (r.step_times or {}).get(kind, {}).get(str(r.concurrency), [0, 0.0])
    return 1e3 * s / n if n else None


def _full_batch_forward_ms(r: Run) -> float | None:
    return _full_batch_ms(r, "target_forward")


def step_table(runs: list[Run]) -> list[str]:
    """The scheduler's own step times per level (``platform.step_times``, CPU servers): a decode
    step's cost at a full batch side by side with ``none``'s, and the prefill forwards that
    admitted the level's requests, with what they spent beyond the target's forward (a
    speculative server's draft extend over the prompts)."""
    rows = [r for r in runs if r.step_times]
    if not rows:
        return []
    base, base_fwd = _none_values(rows, _full_batch_ms), _none_values(rows, _full_batch_forward_ms)

    def vs_none(v: float | None, ref: float | None, r: Run) -> str:
        return f"{v / ref:.3f}x" if v and ref and r.config != "none" else "-"

    out = [
        "Scheduler steps per level (server log, `SGLANG_ECHO_STEP_TIMES`; a decode step of a speculative "
        "server is its whole draft-verify-extend step; its target forward is the target model's decode or "
        "verify forward in it, the rest of the step is everything else; a prefill's rest is what it "
        "spent beyond the target's forward):",
        "",
        (
            f"| config | {level_name(rows)} | decode steps | decode s | mean decode batch | "
            "ms/step at batch = concurrency | "
            "vs none | target forward ms | vs none | rest ms | prefill forwards | prefill s | prefill rest s |"
        ),
        "|" + " --- |" * 13,
    ]
    for r in rows:
        dn, ds, db = _steps(r.step_times.get("decode", {}))
        pn, ps, _ = _steps(r.step_times.get("prefill", {}))
        target_prefill = r.step_times.get("target_prefill")  # older logs: not timed
        prefill_rest = ps - _steps(target_prefill)[1] if target_prefill else None
        full, fwd = _full_batch_ms(r), _full_batch_forward_ms(r)
        key = (r.repeat, r.level)
        rest = full - fwd if full is not None and fwd is not None else None
        out.append(
            f"| {_label(r)} | {r.level:g} | {dn} | {ds:.1f} | {db:.1f} | {_f(full, '.1f')} | "
            f"{vs_none(full, base.get(key), r)} | {_f(fwd, '.1f')} | {vs_none(fwd, base_fwd.get(key), r)} | "
            f"{_f(rest, '.1f')} | {pn} | {ps:.1f} | {_f(prefill_rest, '.2f')} |"
        )
    return out


def table1(runs: list[Run]) -> list[str]:
    """ECHO Table 1's shape at the lowest concurrency: MAT and speedup per prompt set, per config.

    Speedup per set = (its tokens / its summed request latency) against ``none`` on the same
    prompts; meaningful at concurrency 1, where requests run one at a time.
    """
    if not runs:
        return []
    c = min(r.level for r in runs)
    level = [r for r in runs if r.level == c and r.per_request and "dataset" in r.per_request[0]]
    if not level:
        return []
    sets = sorted({x["dataset"] for r in level for x in r.per_request})

    def rate(r: Run, ds: str) -> float | None:
        xs = [x for x in r.per_request if x.get("dataset") == ds and x.get("seconds")]
        sec = sum(x["seconds"] for x in xs)
        return sum(x["tokens"] for x in xs) / sec if sec else None

    head = "| config | " + " | ".join(f"{s} MAT | {s} speedup" for s in sets) + " | avg speedup |"
    out = [
        f"Per prompt set at {level_name(level)} {c:g} (ECHO Table 1's shape; speedup vs none from per-request "
        "latency):",
        "",
        head,
        "|" + " --- |" * (2 + 2 * len(sets)),
    ]
    for r in level:
        base = next((b for b in level if b.config == "none" and b.repeat == r.repeat), None)
        cells, speeds = [], []
        for ds in sets:
            xs = [x for x in r.per_request if x.get("dataset") == ds]
            steps = sum(x["verify_ct"] for x in xs)
            mat = sum(x["tokens"] for x in xs) / steps if steps else None
            mine, ref = rate(r, ds), (rate(base, ds) if base else None)
            sp = mine / ref if mine and ref else None
            if sp is not None:
                speeds.append(sp)
            cells += [_f(mat), _f(sp, ".2f", "x")]
        avg = statistics.fmean(speeds) if speeds else None
        out.append(f"| {_label(r)} | " + " | ".join(cells) + f" | {_f(avg, '.2f', 'x')} |")
    return out
