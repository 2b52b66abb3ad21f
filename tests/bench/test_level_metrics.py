"""echo-bench's reading of /metrics: sglang's identity labels summed over, ECHO's labels kept."""

from __future__ import annotations

import pytest

from sglang_echo.bench.level_metrics import budget_decisions, echo_deltas, parse_echo_metrics, parse_page

RANK = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="{r}"'


def _page(steps: int, explore: int) -> str:
    """Two processes' series (ranks 0 and 1, e.g. --enable-metrics-for-all-schedulers with
    attention DP), as sglang's multiprocess registry writes them."""
    lines = ["# TYPE echo_steps counter"]
    for r, share in ((0, 0.75), (1, 0.25)):
        ids = RANK.format(r=r)
        lines += [
            f"echo_steps_total{{{ids}}} {steps * share}",
            f"echo_verified_tokens_total{{{ids}}} {10 * steps * share}",
            f"echo_step_seconds_total{{{ids}}} {steps * share * 0.1}",
            f"echo_timed_steps_total{{{ids}}} {steps * share}",
            f"echo_control_seconds_total{{{ids}}} {steps * share * 0.001}",
            f"echo_budget_k_max{{{ids}}} {64 if r == 0 else 32}.0",
            f'echo_budget_steps_total{{arm="draft",{ids},reason="explore"}} {explore * share}',
            f'echo_budget_step_seconds_total{{arm="draft",{ids},reason="explore"}} {explore * share * 0.1}',
            f'echo_gate_evaluated_total{{depth="2",{ids}}} 7.0',
            f'echo_accept_length_bucket{{{ids},le="+Inf"}} {steps * share}',
        ]
    lines.append('sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0')
    return "\n".join(lines) + "\n"


def test_identity_labels_are_summed_over_and_echo_labels_kept():
    got = parse_echo_metrics(_page(40, 8))
    assert got["echo_steps_total"] == 40 and got["echo_verified_tokens_total"] == 400
    assert got["echo_budget_k_max"] == 64  # a gauge: the largest, not the sum
    assert got['echo_gate_evaluated_total{depth="2"}'] == 14
    assert got['echo_budget_steps_total{arm="draft",reason="explore"}'] == 8
    assert got['echo_accept_length_bucket{le="+Inf"}'] == 40
    assert not any(k.startswith("sglang") for k in got)


def test_deltas_over_labelled_pages():
    d = echo_deltas(parse_echo_metrics(_page(40, 8)), parse_echo_metrics(_page(100, 20)))
    assert d["steps"] == 60 and d["verified_per_step"] == pytest.approx(10)
    assert d["control_share"] == pytest.approx(0.01) and d["k_max"] == 64
    assert budget_decisions(parse_echo_metrics(_page(40, 8)), parse_echo_metrics(_page(100, 20))) == {
        "draft/explore": {"steps": 12, "seconds": pytest.approx(1.2)}
    }


def test_parse_page_reads_the_exposition_format():
    text = (
        '# HELP x a "quoted" help\n'
        'echo_steps_total{model_name="a \\"b\\" \\\\ c, d}",tp_rank="0"} 2.5e1 1700000000000\n'
        "echo_budget_k_max 64\n"
        'echo_bad_value{a="1"} not-a-number\n'
    )
    samples = parse_page(text)
    assert [(x.name, x.value) for x in samples] == [("echo_steps_total", 25.0), ("echo_budget_k_max", 64.0)]
    assert samples[0].labels == {"model_name": 'a "b" \\ c, d}', "tp_rank": "0"}
