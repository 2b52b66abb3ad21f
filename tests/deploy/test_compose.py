"""deploy/compose.yaml, statically: server + router + Prometheus + Grafana on one machine.

Checked: the YAML, the services and their wiring (the router's worker URL and its arguments as
sgl-router parses them, Prometheus' targets, what each bind mount and build names exists, the
server's GPU). Not tested here: `docker compose up` (no Docker engine in CI), the images' pulls
and builds; the router's command itself runs in front of a real ECHO server in
tests/integration/test_metrics.py."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# The compose file keys this file uses (the Compose specification's names).
SERVICE_KEYS = {
    "build",
    "image",
    "command",
    "environment",
    "volumes",
    "shm_size",
    "expose",
    "ports",
    "deploy",
    "depends_on",
}


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def router_command(worker_url: str | None = None) -> list[str]:
    """The router service's arguments (its image's entrypoint is sgl-router), optionally with
    another worker URL."""
    cmd = list(compose()["services"]["router"]["command"])
    if worker_url is not None:
        cmd[cmd.index("--worker-urls") + 1] = worker_url
    return cmd


def _expand(value: str) -> str:
    """``${VAR:-default}`` / ``${VAR-default}`` as compose expands them with VAR unset."""
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", value)


def test_services_and_their_keys():
    c = compose()
    assert set(c["services"]) == {"server", "router", "prometheus", "grafana"}
    for name, svc in c["services"].items():
        assert set(svc) <= SERVICE_KEYS, f"{name}: {set(svc) - SERVICE_KEYS}"
        assert "image" in svc
        if not svc.get("build"):
            assert re.fullmatch(r"[\w./-]+:v?\d[\w.]*", svc["image"]), f"{name}: pin the image ({svc['image']})"


def test_builds_use_the_deploy_dockerfiles():
    c = compose()["services"]
    for name, dockerfile in (("server", "Dockerfile"), ("router", "Dockerfile.router")):
        build = c[name]["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert (context / build["dockerfile"]).resolve() == DEPLOY / dockerfile
    assert c["server"]["image"].startswith("sglang-echo:") and c["router"]["image"].startswith("sglang-echo-router:")


def test_server_has_a_gpu_and_both_drafter_kinds():
    server = compose()["services"]["server"]
    devices = server["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    env = server["environment"]
    assert env["MODEL_PATH"].startswith("/models/") and _expand(env["DRAFT_PATH"]).startswith("/models/")
    # DRAFT_PATH= (set, empty) must reach launch.sh empty for the n-gram drafter: "-", not ":-"
    assert re.fullmatch(r"\$\{DRAFT_PATH-[^}]+\}", env["DRAFT_PATH"])
    assert env["SGLANG_ECHO_DRAFTER"].startswith("${SGLANG_ECHO_DRAFTER")


def test_router_fronts_the_server_after_it_is_healthy():
    from sglang_router.launch_router import parse_router_args

    c = compose()["services"]
    args = parse_router_args(router_command())
    assert args.worker_urls == ["http://server:30000"] and not args.service_discovery
    assert c["server"]["expose"] == ["30000"]
    assert c["router"]["depends_on"]["server"]["condition"] == "service_healthy"
    published = {p.split(":")[1] for p in c["router"]["ports"]}
    assert str(args.port) in published and args.prometheus_port == 29000


def test_bind_mounts_exist_and_prometheus_scrapes_the_services():
    c = compose()["services"]
    for name in ("prometheus", "grafana"):
        for volume in c[name]["volumes"]:
            host, _, _ = volume.partition(":")
            assert (DEPLOY / host).exists(), f"{name}: {host} does not exist"
    prom = yaml.safe_load((DEPLOY / "monitoring/prometheus.yml").read_text())
    mounted = {v.split(":")[1]: v.split(":")[0] for v in c["prometheus"]["volumes"]}
    for rule_file in prom["rule_files"]:
        assert rule_file in mounted, f"rule file {rule_file} is not mounted"
    for cfg in prom["scrape_configs"]:
        host, port = cfg["static_configs"][0]["targets"][0].split(":")
        assert host in c
    grafana_home = c["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    dashboards = next(v.split(":") for v in c["grafana"]["volumes"] if v.split(":")[1] in grafana_home)
    assert (DEPLOY / dashboards[0] / Path(grafana_home).name).is_file()
