"""The host side, offline: the bundle's install.py into a target folder and into an environment
that already holds a (fake) torch, which must come out untouched; then the project's editable
install with the bundle's build backend, as the printed install line does it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass

import pytest

OFFLINE = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}


def _run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, env=kw.pop("env", OFFLINE), **kw)


@dataclass(frozen=True)
class HostEnv:
    python: str
    install: subprocess.CompletedProcess

    def versions(self) -> dict[str, str]:
        listed = _run(self.python, "-m", "pip", "list", "--format=json")
        return {row["name"]: row["version"] for row in json.loads(listed.stdout)}


@pytest.fixture(scope="module")
def host_env(built, wheelset, tmp_path_factory) -> HostEnv:
    """A venv as the "host": torch 2.11.0 (sglang's metadata asks ==9.9; a 9.9 wheel is in the wheel
    set) and omega already installed; then the bundle's install.py in its default mode."""
    wheels, _ = wheelset
    env_dir = tmp_path_factory.mktemp("host") / "env"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    pre = _run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        str(wheels / "torch-2.11.0-py3-none-any.whl"),
        str(wheels / "omega-1.0-py3-none-any.whl"),
    )
    assert pre.returncode == 0, pre.stderr
    return HostEnv(python, _run(python, str(built.unpacked / "echo-bundle" / "install.py")))


def test_installs_into_a_target_and_imports(built, tmp_path):
    target = tmp_path / "site"
    # -S: install.py sees none of this venv's packages (the real sglang among them would be skipped);
    # the pip it starts is this interpreter's as usual.
    proc = _run(sys.executable, "-S", str(built.unpacked / "echo-bundle" / "install.py"), "--target", str(target))
    assert proc.returncode == 0, proc.stderr
    assert f"installed 6 wheels into {target}" in proc.stdout and f"export PYTHONPATH={target}" in proc.stdout
    assert not (target / "sglang" / "multimodal_gen").exists() and (target / "sglang" / "srt" / "keep.py").exists()
    assert not any(p.name.startswith(("torch", "beta", "backend")) for p in target.iterdir())
    check = _run(
        sys.executable,
        "-c",
        "import sglang.launch_server as s; print(s.READY)",
        env=os.environ | {"PYTHONPATH": str(target)},
    )
    assert check.stdout.strip() == "('1.0', '1.0')", check.stderr


def test_host_torch_stays_and_present_packages_are_skipped(host_env):
    assert host_env.install.returncode == 0, host_env.install.stderr
    out = host_env.install.stdout
    assert "installed 5 wheels" in out and "kept the host's torch 2.11.0" in out
    assert "skipped (already there): omega 1.0" in out
    versions = host_env.versions()
    assert versions["torch"] == "2.11.0" and versions["sglang"] == "0.5.23" and versions["eta"] == "1.0"
    assert "transformers" not in versions and "beta" not in versions and "backend-tool" not in versions


def test_the_project_installs_editable_with_the_bundled_backend(built, wheelset, host_env):
    """The install line's third step: build isolation fetches the backend (and its dependency) from
    the bundle's build/ folder, offline; the editable .pth lands in the environment's site-packages."""
    _, inputs = wheelset
    build = built.unpacked / "echo-bundle" / "build"
    proc = _run(
        host_env.python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        "--find-links",
        str(build),
        "-e",
        str(inputs["project"]),
        cwd=inputs["project"],
    )
    assert proc.returncode == 0, proc.stderr
    check = _run(host_env.python, "-c", "import projmod; print(projmod.WHERE)", cwd="/")
    assert check.stdout.strip() == "the project folder", check.stderr
    assert "backend-tool" not in host_env.versions()  # the backend was only in the isolated build environment


def test_without_the_backend_dependency_the_build_fails_offline(built, wheelset, tmp_path):
    _, inputs = wheelset
    build = tmp_path / "build"
    shutil.copytree(built.unpacked / "echo-bundle" / "build", build)
    next(build.glob("backend_helper-*.whl")).unlink()
    proc = _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--no-deps",
        "--no-index",
        "--find-links",
        str(build),
        "-e",
        str(inputs["project"]),
        cwd=inputs["project"],
    )
    assert proc.returncode != 0 and "backend-helper" in proc.stdout + proc.stderr


def test_refuses_another_python(built, tmp_path):
    bundle = tmp_path / "echo-bundle"
    shutil.copytree(built.unpacked / "echo-bundle", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["target"]["python"] = "3.99"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    proc = _run(sys.executable, str(bundle / "install.py"), "--target", str(tmp_path / "site"))
    assert proc.returncode == 2 and not (tmp_path / "site").exists()
    assert proc.stderr.count("\n") == 1 and "this bundle is for Python 3.99" in proc.stderr
