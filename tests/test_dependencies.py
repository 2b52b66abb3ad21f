"""pyproject.toml's dependencies tell the truth: every third-party import is declared, the ranges
admit both hosts the package runs on, and installing the package keeps the torch a host has.

The resolver check runs pip itself (``--dry-run --report``, ``--no-index``: nothing is downloaded)
with this test venv's torch as "sglang's torch" and a local wheel set holding a newer fake torch
that must not be chosen; a control run with a hard torch pin shows that the check can fail."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# sglang 0.5.23's pins (its METADATA) and the bare-GPU image's versions (device KINDS.md).
HOSTS = {
    "sglang 0.5.23": {"torch": "2.14.1", "transformers": "5.19.0"},
    "bare-GPU image": {"torch": "2.11.0", "transformers": "5.17.0"},
}
# Imported, deliberately not declared: sglang's own GPU dependency, looked up with find_spec first.
UNDECLARED = {"flashinfer": "kernels/tree_attention/flashinfer_path.py imports it only where find_spec finds it"}
FAKE_TORCH = "2.98.0"  # a "newer torch" in the local wheel set: never chosen over the installed one


def _requirements(extras: bool) -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    if extras:
        reqs += [Requirement(r) for group in project["optional-dependencies"].values() for r in group]
    return reqs


def test_ranges_admit_both_hosts_and_pin_no_torch():
    deps = {canonicalize_name(r.name): r for r in _requirements(extras=False)}
    for host, versions in HOSTS.items():
        for name, version in versions.items():
            assert deps[name].specifier.contains(version), f"{name} {version} ({host}) is outside {deps[name]}"
    assert not any(s.operator in ("==", "===") for s in deps["torch"].specifier), "torch must not be pinned"
    assert "sglang" not in deps, "sglang pins torch: it is the `sglang` extra (see pyproject.toml)"


def test_this_venv_satisfies_the_declared_ranges():
    for req in _requirements(extras=False):
        installed = md.version(req.name)
        assert req.specifier.contains(installed, prereleases=True), f"installed {req.name} {installed} is outside {req}"


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the package files importing it (absolute imports outside the stdlib)."""
    found: dict[str, set[str]] = {}
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "sglang_echo":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    declared = {canonicalize_name(r.name) for r in _requirements(extras=True)}
    dists = md.packages_distributions()
    missing = {}
    for module, files in sorted(_third_party_imports().items()):
        if module in UNDECLARED:
            continue
        names = {canonicalize_name(d) for d in dists.get(module, [module])}
        if not names & declared:
            missing[module] = sorted(files)[:3]
    assert not missing, f"imported but neither a dependency nor an extra: {missing}"


def _fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel that only declares ``name`` ``version``."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def _project_copy(dest: Path, dependencies: list[str]) -> Path:
    """pyproject.toml (its dependencies replaced) and the package folders it names, empty: enough
    for pip to build the metadata it resolves."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = "dependencies = [\n" + "".join(f'    "{d}",\n' for d in dependencies) + "]"
    text, n = re.subn(r"(?ms)^dependencies = \[\n.*?^\]", lambda _m: listed, text, count=1)
    assert n == 1
    dest.mkdir()
    (dest / "pyproject.toml").write_text(text)
    shutil.copy(ROOT / "README.md", dest / "README.md")
    tool = PYPROJECT["tool"]["setuptools"]
    for package in tool["packages"]:
        top = max((p for p in tool["package-dir"] if package == p or package.startswith(p + ".")), key=len)
        folder = dest / tool["package-dir"][top] / Path(*package[len(top) :].split(".")[1:])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").touch()
    return dest


def _resolve(project: Path, wheels: Path, report: Path) -> list[tuple[str, str]]:
    """(name, version) of everything pip would install for ``project`` into this venv."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--disable-pip-version-check",
        "--no-index",
        "--find-links",
        str(wheels),
        "--no-build-isolation",
        "--report",
        str(report),
        str(project),
    ]
    # This machine's pip configuration (constraints, find-links, indexes) stays out of it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    items = json.loads(report.read_text())["install"]
    return [(canonicalize_name(i["metadata"]["name"]), i["metadata"]["version"]) for i in items]


def test_installing_the_package_keeps_the_torch_the_host_has(tmp_path):
    installed = md.version("torch")
    assert installed != FAKE_TORCH
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, "torch", FAKE_TORCH)
    deps = PYPROJECT["project"]["dependencies"]

    chosen = _resolve(_project_copy(tmp_path / "as-is", deps), wheels, tmp_path / "as-is.json")
    assert [n for n, _ in chosen] == ["sglang-echo"], f"would install more than sglang-echo: {chosen}"

    # Control: the same check catches a torch pin other than the host's (it would replace it).
    pinned = [d for d in deps if canonicalize_name(Requirement(d).name) != "torch"] + [f"torch=={FAKE_TORCH}"]
    chosen = _resolve(_project_copy(tmp_path / "pinned", pinned), wheels, tmp_path / "pinned.json")
    assert ("torch", FAKE_TORCH) in chosen
