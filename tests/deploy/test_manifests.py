"""Deployment files: Kubernetes manifests against the official schemas (offline), and consistency."""

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30.0"


def documents():
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def by_kind(kind):
    return [d for _, d in documents() if d["kind"] == kind]


@pytest.mark.parametrize("name, doc", list(documents()), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_manifest_is_schema_valid(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_services_select_their_deployments():
    deployments = {d["metadata"]["name"]: d for d in by_kind("Deployment")}
    for svc in by_kind("Service"):
        sel = svc["spec"]["selector"]
        matching = [d for d in deployments.values() if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert matching, f"service {svc['metadata']['name']} selects no deployment"


def test_server_is_gpu_backed_and_ready_on_health():
    server = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "sglang-echo")
    container = server["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SGLANG_ECHO_CONFIG"].endswith("echo-config.json")


def test_router_discovers_the_server_pods():
    router = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "sglang-echo-router")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    server_labels = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "sglang-echo")["spec"]["template"]["metadata"]["labels"]
    for key, value in server_labels.items():
        assert f"{key}={value}" in args


def test_echo_config_is_consistent():
    baked = json.loads((DEPLOY / "echo-config.json").read_text())
    configmap = json.loads(by_kind("ConfigMap")[0]["data"]["echo-config.json"])
    assert baked.keys() == configmap.keys()
    assert baked["policy"] == "echo" and baked["k_max"] > 0


def test_launch_script_uses_echo_and_parses():
    script = (DEPLOY / "launch.sh").read_text()
    assert "--speculative-algorithm ECHO" in script
    subprocess.run(["bash", "-n", str(DEPLOY / "launch.sh")], check=True)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "lmsysorg/sglang:v0.5.23" in dockerfile and "--no-deps" in dockerfile


def test_the_schema_check_catches_a_typo():
    doc = by_kind("Deployment")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = doc["spec"]["template"]["spec"]["containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
