"""deploy/monitoring, statically: the Grafana dashboard and the alerts are valid JSON/YAML and
PromQL, and every series and label they name is one ECHO (metric_catalog) or sglang exports.

Not tested here: loading them into a running Grafana or Prometheus (none in CI); the series
themselves are checked on a real server's /metrics by tests/integration (conftest.scrape)."""

from __future__ import annotations

import json
import re
from importlib.metadata import distribution
from pathlib import Path

import promql_parser
import pytest
import yaml

from sglang_echo.integration.metric_catalog import (
    ECHO_LABELS,
    IDENTITY_LABELS,
    OPTIONAL_IDENTITY_LABELS,
    exported_names,
)

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
DASHBOARD = MONITORING / "dashboards" / "sglang-echo.json"
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$model_name": ".*"}
LABELS = set(IDENTITY_LABELS) | set(OPTIONAL_IDENTITY_LABELS) | ECHO_LABELS
SERIES = re.compile(r"\b(echo_[a-z0-9_]+|sglang:[a-z0-9_:]+)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")


def sglang_series() -> set[str]:
    """The ``sglang:*`` names sglang 0.5.23's collectors declare (read from its source, not imported)."""
    text = Path(distribution("sglang").locate_file("sglang/srt/observability/metrics_collector.py")).read_text()
    names = set(re.findall(r'name="(sglang:[a-z0-9_:]+)"', text))
    assert "sglang:num_running_reqs" in names
    return names


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for p in dash["panels"]:
        out += [(p["title"], t["expr"]) for t in p.get("targets", [])]
    return out


def rule_exprs(groups: list[dict]) -> list[tuple[str, str]]:
    return [(r["alert"], r["expr"]) for g in groups for r in g["rules"]]


def problems(expr: str) -> list[str]:
    """What is wrong with one PromQL expression: its syntax, series nobody exports, labels no
    ECHO series carries (ECHO's series: only their own labels and sglang's)."""
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    try:
        promql_parser.parse(expr)
    except ValueError as e:
        return [f"PromQL: {e}"]
    echo, sglang = exported_names(), sglang_series()
    out = []
    for name in SERIES.findall(expr):
        if name.startswith("echo_") and name not in echo:
            out.append(f"{name}: not an ECHO series")
        if name.startswith("sglang:") and name not in sglang:
            out.append(f"{name}: not a sglang 0.5.23 series")
    used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    used |= {
        m.split("=")[0].rstrip("!~").strip() for block in MATCHER.findall(expr) for m in block.split(",") if m.strip()
    }
    out += [f"label {label}: carried by no ECHO series" for label in sorted(used - LABELS)]
    return out


@pytest.mark.parametrize("title, expr", dashboard_exprs(), ids=lambda x: x if len(x) < 60 else None)
def test_dashboard_queries(title, expr):
    assert problems(expr) == []


def test_dashboard_is_grafana_json():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "echo_steps_total" in variables["model_name"]["definition"]
    for p in dash["panels"]:
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys() and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}" and t["refId"]
    # what the issue asks to watch: each on the dashboard
    exprs = " ".join(e for _, e in dashboard_exprs())
    for name in (
        "echo_budget_exceeded_total",
        "echo_draft_faults_total",
        "echo_control_seconds_total",
        "echo_accept_length_bucket",
        "echo_verified_tokens_per_step_bucket",
        "echo_tree_depth_bucket",
    ):
        assert name in exprs


def _rules(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


def test_alerts_are_one_set_for_prometheus_and_the_operator():
    plain = _rules(MONITORING / "echo-rules.yaml")
    operator = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert operator["apiVersion"] == "monitoring.coreos.com/v1" and operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == plain


@pytest.mark.parametrize("alert, expr", rule_exprs(_rules(MONITORING / "echo-rules.yaml")))
def test_alert_queries(alert, expr):
    assert problems(expr) == []


def test_the_alerts_the_issue_asks_for():
    rules = {r["alert"]: r for g in _rules(MONITORING / "echo-rules.yaml") for r in g["rules"]}
    assert set(rules) == {"EchoBudgetExceeded", "EchoDraftFaults", "EchoControlPlaneShareHigh", "EchoNotDrafting"}
    assert "echo_budget_exceeded_total" in rules["EchoBudgetExceeded"]["expr"]
    assert rules["EchoBudgetExceeded"]["expr"].rstrip().endswith("> 0")
    assert rules["EchoBudgetExceeded"]["labels"]["severity"] == "critical"
    assert "increase(echo_draft_faults_total" in rules["EchoDraftFaults"]["expr"]
    assert "> 0.03" in rules["EchoControlPlaneShareHigh"]["expr"]
    assert "echo_accept_length_count" in rules["EchoNotDrafting"]["expr"]
    assert "sglang:num_running_reqs" in rules["EchoNotDrafting"]["expr"]  # only while requests run
    for r in rules.values():
        assert r["labels"]["severity"] in ("critical", "warning") and r["annotations"]["summary"]
        if "for" in r:
            assert re.fullmatch(r"\d+[smh]", r["for"])


def test_the_checks_catch_mistakes():
    assert problems("sum(rate(echo_steps_total[5m])") and "unclosed" in problems("sum(rate(echo_steps_total[5m])")[0]
    assert problems("rate(echo_step_total[5m])") == ["echo_step_total: not an ECHO series"]
    assert problems("sglang:num_runing_reqs") == ["sglang:num_runing_reqs: not a sglang 0.5.23 series"]
    assert problems("sum by (modelname) (echo_steps_total)") == ["label modelname: carried by no ECHO series"]
    assert problems('echo_draft_faults_total{kind="raise",model_name=~".*"}') == []


def test_prometheus_and_grafana_provisioning_fit_together():
    prom = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/rules/echo-rules.yaml"]
    targets = {c["job_name"]: c["static_configs"][0]["targets"] for c in prom["scrape_configs"]}
    assert targets == {"sglang-echo": ["server:30000"], "sglang-echo-router": ["router:29000"]}
    ds = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"][0]
    dash = json.loads(DASHBOARD.read_text())
    current = next(v for v in dash["templating"]["list"] if v["name"] == "datasource")["current"]["value"]
    assert ds["type"] == "prometheus" and ds["uid"] == current and ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/sglang-echo.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_podmonitors_scrape_the_named_ports():
    """The operator's PodMonitors name the container ports the Deployments declare."""
    k8s = MONITORING.parent / "k8s"
    deployments = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for name in ("server.yaml", "router.yaml")
        for d in yaml.safe_load_all((k8s / name).read_text())
        if d and d["kind"] == "Deployment"
    }
    for pm in yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text()):
        assert pm["kind"] == "PodMonitor"
        component = pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        pod = deployments[component]["spec"]["template"]
        assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= ports
