"""The parts on their own: platform tags and markers, host files, and the slimming rules against
the sglang 0.5.23 installed here (its files, and its server import with the slimmed files gone)."""

from __future__ import annotations

import fnmatch
import importlib.metadata as metadata
import json
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement

from sglang_echo.bundle import BundleError
from sglang_echo.bundle.host import DEFAULT_HOST, load_host_packages
from sglang_echo.bundle.slim import SGLANG_RULES, slim_wheel
from sglang_echo.bundle.target import Target

from .wheelset import SO_NAME, make_wheel, sglang_files


def _platforms(target: Target) -> list[str]:
    args = target.pip_args()
    return [args[i + 1] for i, a in enumerate(args) if a == "--platform"]


def test_a_glibc_tag_takes_every_older_manylinux_tag():
    tags = _platforms(Target.parse("3.12", ["manylinux_2_28_x86_64"]))
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags and not any("aarch64" in t for t in tags)
    assert _platforms(Target.parse("3.12", ["linux_x86_64"])) == ["linux_x86_64"]


def test_markers_are_evaluated_for_the_host_not_for_this_interpreter():
    target = Target.parse("3.12.3", ["manylinux_2_39_aarch64"])
    assert target.applies(Requirement('a; python_version >= "3.12" and platform_machine == "aarch64"'))
    assert not target.applies(Requirement('a; python_full_version < "3.12.3"'))
    assert not target.applies(Requirement('a; sys_platform == "darwin"'))
    assert not target.applies(Requirement('a; extra == "fast"'))
    assert target.applies(Requirement('a; extra == "fast"'), frozenset({"fast"}))
    with pytest.raises(BundleError, match="several machines"):
        Target.parse("3.12", ["manylinux_2_39_x86_64", "manylinux_2_39_aarch64"])


def test_host_files_in_both_formats(tmp_path):
    pip_json = tmp_path / "host.json"
    pip_json.write_text(
        json.dumps([{"name": "Typing_Extensions", "version": "4.15.0"}, {"name": "torch", "version": "2.11.0+cu130"}])
    )
    host = load_host_packages(pip_json)
    assert host.version("typing-extensions") == "4.15.0" and host.version("TORCH") == "2.11.0+cu130"
    shipped = load_host_packages(DEFAULT_HOST)
    assert shipped.version("torch") == "2.11.0" and shipped.version("triton") == "3.6.0"
    assert shipped.version("transformers") == "5.17.0" and shipped.has("huggingface-hub")
    assert shipped.has("numpy") and shipped.version("aiohttp") is None and not shipped.has("pyzmq")


def test_slim_wheel_drops_only_what_the_rules_name(tmp_path):
    src = make_wheel(tmp_path, "sglang", "0.5.23", files=sglang_files())
    report = slim_wheel(src, tmp_path / "out.whl")
    assert report.removed_files == 4 and report.removed_bytes == sum(
        len(data)
        for path, data in sglang_files().items()
        if path.startswith(("sglang/multimodal_gen/", "sglang/test/")) or path == SO_NAME
    )


def _sglang_files() -> list[str]:
    return [str(f) for f in metadata.distribution("sglang").files]


def _dropped(files: list[str]) -> list[str]:
    return [f for f in files if any(fnmatch.fnmatchcase(f, r.pattern) for r in SGLANG_RULES)]


def test_every_rule_matches_the_installed_sglang():
    """A renamed folder in a later sglang would make a rule silently match nothing."""
    files = _sglang_files()
    for rule in SGLANG_RULES:
        assert any(fnmatch.fnmatchcase(f, rule.pattern) for f in files), rule.pattern


def test_the_server_imports_without_the_slimmed_files():
    """``sglang.launch_server`` and the plugins load with every module the rules drop unimportable."""
    modules = sorted(
        {
            f.removesuffix("/__init__.py").split(".")[0].replace("/", ".")
            for f in _dropped(_sglang_files())
            if f.endswith((".py", ".so"))
        }
    )
    assert "sglang.multimodal_gen" in modules and "sglang.test" in modules
    assert "sglang.srt.mem_cache.rust_tree_core.mem_cache" in modules
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name in {set(modules)!r}:
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Block())
        import sglang.launch_server
        from sglang.srt.plugins import load_plugins
        load_plugins()
        print("imported")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("imported"), proc.stderr[-2000:]
