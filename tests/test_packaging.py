"""The explicit package list in pyproject.toml covers every package folder."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, mapping = set(tool["packages"]), tool["package-dir"]
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            sub = ".".join((name, *rel.parts)) if rel.parts else name
            if not any(part in ("__pycache__",) for part in rel.parts):
                found.add(sub)
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_kernels_is_never_a_top_level_package():
    # sglang depends on an unrelated PyPI package called `kernels`.
    assert (
        not (ROOT / "kernels" / "__init__.py").exists()
        or "kernels" not in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
