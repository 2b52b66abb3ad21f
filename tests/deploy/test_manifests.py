"""Deployment files: Kubernetes manifests against the official schemas (offline), the ngram overlay,
the router's discovery scope and arguments, launch.sh, and consistency.

Not tested here: applying them to a cluster (admission, RBAC at run time, the router's Kubernetes
discovery itself) and kustomize rendering the overlay (its JSON patches are applied here)."""

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30.0"


def documents():
    """Every manifest of the base deployment (kustomization.yaml lists them)."""
    for name in yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()):
            if doc:
                yield name, doc


def by_kind(kind):
    return [d for _, d in documents() if d["kind"] == kind]


@pytest.mark.parametrize("name, doc", list(documents()), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_manifest_is_schema_valid(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_services_select_their_deployments():
    deployments = {d["metadata"]["name"]: d for d in by_kind("Deployment")}
    for svc in by_kind("Service"):
        sel = svc["spec"]["selector"]
        matching = [
            d for d in deployments.values() if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
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
    server_labels = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "sglang-echo")["spec"][
        "template"
    ]["metadata"]["labels"]
    for key, value in server_labels.items():
        assert f"{key}={value}" in args


def test_echo_config_is_consistent():
    baked = json.loads((DEPLOY / "echo-config.json").read_text())
    configmap = json.loads(by_kind("ConfigMap")[0]["data"]["echo-config.json"])
    assert baked.keys() == configmap.keys()
    assert baked["policy"] == "echo" and baked["k_max"] > 0


def test_every_manifest_is_in_the_kustomization():
    listed = set(yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}


def test_the_schema_check_catches_a_typo():
    doc = by_kind("Deployment")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = doc["spec"]["template"]["spec"]["containers"][
        0
    ].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# -- the router: discovery within the namespace its Role covers ---------------------------------------


def _router():
    return next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "sglang-echo-router")


def test_router_watches_only_the_namespace_its_role_allows():
    """sgl-router without --service-discovery-namespace watches every namespace, which a
    namespaced Role does not allow (403s, no workers). Here it watches its own namespace
    (downward API), and the RoleBinding gives its ServiceAccount list/watch on pods there."""
    spec = _router()["spec"]["template"]["spec"]
    container = spec["containers"][0]
    args = container["args"]
    assert "--service-discovery-namespace=$(POD_NAMESPACE)" in args
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert not by_kind("ClusterRole") and not by_kind("ClusterRoleBinding")
    role, binding = by_kind("Role")[0], by_kind("RoleBinding")[0]
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"]) and "pods" in role["rules"][0]["resources"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"]}]
    assert "namespace" not in binding["subjects"][0]  # the binding's own namespace, where the router runs


def test_router_args_are_sgl_routers():
    """The manifest's arguments parse with the sglang-router that Dockerfile.router installs
    (the version tests/deploy/test_images.py pins), with discovery scoped to the namespace."""
    from sglang_router.launch_router import parse_router_args

    container = _router()["spec"]["template"]["spec"]["containers"][0]
    args = [a.replace("$(POD_NAMESPACE)", "inference") for a in container["args"]]
    ra = parse_router_args(args)
    server = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "sglang-echo")
    assert ra.service_discovery and ra.service_discovery_namespace == "inference"
    assert ra.selector == server["spec"]["template"]["metadata"]["labels"]
    assert ra.service_discovery_port == server["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (ra.port, ra.prometheus_port) == (ports["http"], ports["metrics"])
    assert container["image"].startswith("sglang-echo-router:")  # the small image, not the GPU one


# -- the n-gram drafter: the ngram/ overlay --------------------------------------------------------------


def _json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902's test/replace/add/remove, what kustomize applies for the overlay's patches."""
    doc = json.loads(json.dumps(doc))
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        key = int(last) if isinstance(node, list) and last != "-" else last
        if op["op"] == "test":
            assert node[key] == op["value"], f"patch test failed at {op['path']}: {node[key]!r}"
        elif op["op"] == "replace":
            node[key] = op["value"]
        elif op["op"] == "remove":
            del node[key]
        elif op["op"] == "add":
            node.append(op["value"]) if key == "-" else (
                node.insert(key, op["value"]) if isinstance(node, list) else node.__setitem__(key, op["value"])
            )
    return doc


def ngram_documents() -> list[dict]:
    overlay = yaml.safe_load((DEPLOY / "k8s" / "ngram" / "kustomization.yaml").read_text())
    assert overlay["resources"] == [".."]
    docs = [d for _, d in documents()]
    for patch in overlay["patches"]:
        target = patch["target"]
        hits = [
            i for i, d in enumerate(docs) if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]
        ]
        assert len(hits) == 1, f"patch target {target} matches {len(hits)} documents"
        docs[hits[0]] = _json_patch(docs[hits[0]], yaml.safe_load(patch["patch"]))
    return docs


def _in_volumes(args: list[str], root: Path) -> list[str]:
    """The Job's arguments with its volumes' paths under ``root``, holding what echo-calibrate
    checks before it starts: a target and a draft head of one geometry, and a prompts file."""
    for folder in ("models/target", "models/draft"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "config.json").write_text(json.dumps({"vocab_size": 64, "hidden_size": 8}))
    (root / "models/draft/model.safetensors").touch()
    (root / "models/calibration-prompts.jsonl").write_text('{"prompt": "Hi"}\n')
    (root / "calibration").mkdir(exist_ok=True)
    return [a.replace("=/models/", f"={root}/models/").replace("=/calibration/", f"={root}/calibration/") for a in args]


def test_ngram_overlay_serves_without_a_draft_head(tmp_path):
    """The overlay's server passes no draft path (launch.sh then gives sglang none) and runs
    the n-gram drafter; its calibration Job calibrates that drafter, with arguments
    echo-calibrate accepts; every patched manifest is still schema-valid."""
    from sglang_echo.calibration.cli import parse_args

    docs = ngram_documents()
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    server = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sglang-echo")
    env = {e["name"]: e.get("value") for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SGLANG_ECHO_DRAFTER"] == "ngram" and "DRAFT_PATH" not in env
    job = next(d for d in docs if d["kind"] == "Job")
    args = parse_args(_in_volumes(job["spec"]["template"]["spec"]["containers"][0]["args"], tmp_path))
    assert args.drafter == "ngram" and args.draft is None
    base_job = by_kind("Job")[0]
    base = parse_args(_in_volumes(base_job["spec"]["template"]["spec"]["containers"][0]["args"], tmp_path))
    assert base.drafter == "eagle3" and base.draft is not None and base.out == args.out


# -- launch.sh ----------------------------------------------------------------------------------------


def _launch(tmp_path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    """Run deploy/launch.sh with a python3 stand-in that prints what sglang would be started
    with (and runs the real interpreter for the script's reading of the ECHO settings)."""
    import os
    import sys

    fake = tmp_path / "python3"
    fake.write_text(
        f'#!/usr/bin/env bash\nif [[ "$1" == "-m" ]]; then printf "%s\\n" "$@"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_ECHO_") and k != "DRAFT_PATH"}
    return subprocess.run(
        ["bash", str(DEPLOY / "launch.sh"), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**keep, "PYTHON": str(fake), "MODEL_PATH": "/models/target", **env},
    )


def test_launch_script_passes_a_draft_head_only_to_drafters_with_one(tmp_path):
    subprocess.run(["bash", "-n", str(DEPLOY / "launch.sh")], check=True)
    eagle = _launch(tmp_path, {"DRAFT_PATH": "/models/draft"}, "--log-level", "info")
    assert eagle.returncode == 0, eagle.stderr
    args = eagle.stdout.split()
    assert args[:2] == ["-m", "sglang.launch_server"] and "--enable-metrics" in args
    assert args[args.index("--speculative-algorithm") + 1] == "ECHO"
    assert args[args.index("--speculative-draft-model-path") + 1] == "/models/draft"
    assert args[-2:] == ["--log-level", "info"]
    ngram = _launch(tmp_path, {"SGLANG_ECHO_DRAFTER": "ngram"})
    assert ngram.returncode == 0, ngram.stderr
    assert "--speculative-algorithm" in ngram.stdout and "--speculative-draft-model-path" not in ngram.stdout
    in_file = _launch(tmp_path, {"SGLANG_ECHO_CONFIG": json.dumps({"drafter": "ngram"})})
    assert in_file.returncode == 0 and "--speculative-draft-model-path" not in in_file.stdout


def test_launch_script_refuses_in_one_line(tmp_path):
    missing = _launch(tmp_path, {})
    assert missing.returncode != 0 and "DRAFT_PATH" in missing.stderr and "ngram" in missing.stderr
    both = _launch(tmp_path, {"SGLANG_ECHO_DRAFTER": "ngram", "DRAFT_PATH": "/models/draft"})
    assert both.returncode == 2 and "takes no draft head" in both.stderr
    typo = _launch(tmp_path, {"SGLANG_ECHO_DRAFTER": "ngrm"})
    assert typo.returncode == 2 and len(typo.stderr.strip().splitlines()) == 1 and "ngrm" in typo.stderr
