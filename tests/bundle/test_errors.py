"""Bad input: a one-line error naming the flag (exit 2) or the package (exit 1), and nothing written."""

from __future__ import annotations

import shutil

import pytest

from .conftest import bundle_args, run_cli


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2 :]]


BAD = [
    ("--python", "3", "--python '3'"),
    ("--python", "2.7", "--python '2.7'"),
    ("--platform", "win_amd64", "--platform 'win_amd64'"),
    ("--host-packages", "/nonexistent/host.json", "--host-packages /nonexistent/host.json: no such file"),
    ("--find-links", "/nonexistent/wheels", "--find-links /nonexistent/wheels: no such folder"),
    ("--runtime", "/nonexistent/req.txt", "--runtime /nonexistent/req.txt: no such file"),
    ("--project", "/nonexistent", "--project /nonexistent: no pyproject.toml"),
]


@pytest.mark.parametrize("flag,value,message", BAD, ids=[f"{f}={v}" for f, v, _ in BAD])
def test_bad_flag_values(wheelset, tmp_path, flag, value, message):
    wheels, inputs = wheelset
    out = tmp_path / "out"
    proc = run_cli(_replace(bundle_args(inputs, wheels, out), flag, value))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--extra", "torch==2.14"], "--extra torch==2.14: torch must come from the host"),
        (["--extra", "not a requirement!"], "--extra:"),
        (["--max-mib", "0"], "--max-mib 0: must be > 0"),
        (["--max-mib", "lots"], "--max-mib: invalid float value"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_flags(wheelset, tmp_path, extra, message):
    wheels, inputs = wheelset
    out = tmp_path / "out"
    proc = run_cli([*bundle_args(inputs, wheels, out), *extra])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not out.exists()


def test_out_is_a_file(wheelset, tmp_path):
    wheels, inputs = wheelset
    out = tmp_path / "out"
    out.write_text("mine")
    proc = run_cli(bundle_args(inputs, wheels, out))
    assert proc.returncode == 2 and "--out" in proc.stderr and out.read_text() == "mine"


@pytest.mark.parametrize(
    "content,message",
    [
        ("beta>=1\n", "host.txt:1: 'beta>=1': only `==version` is allowed"),
        ('[{"version": "1.0"}]', "not `pip list --format=json` output"),
        ("# nothing\n", "lists no packages"),
    ],
)
def test_bad_host_files(wheelset, tmp_path, content, message):
    wheels, inputs = wheelset
    host = tmp_path / "host.txt"
    host.write_text(content)
    proc = run_cli(_replace(bundle_args(inputs, wheels, tmp_path / "out"), "--host-packages", str(host)))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_a_missing_wheel_names_the_package_and_who_wants_it(wheelset, tmp_path):
    wheels, inputs = wheelset
    partial = tmp_path / "wheels"
    shutil.copytree(wheels, partial)
    next(partial.glob("zeta-*.whl")).unlink()
    out = tmp_path / "out"
    proc = run_cli(bundle_args(inputs, partial, out))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "No matching distribution found for zeta" in proc.stderr and "wanted by epsilon 0.5" in proc.stderr
    assert not out.exists()


def test_over_the_size_limit_writes_nothing(wheelset, tmp_path):
    wheels, inputs = wheelset
    out = tmp_path / "out"
    proc = run_cli([*bundle_args(inputs, wheels, out), "--max-mib", "0.001"])
    assert proc.returncode == 1 and "over --max-mib 0.001; nothing written" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not out.exists()


def test_a_constraint_applies_to_carried_packages(wheelset, tmp_path):
    """pip-freeze-style constraints: option lines skipped, unknown names ignored, a carried one's pin merged
    (here into a conflict with epsilon's eta<2, which names eta and who wants it)."""
    wheels, inputs = wheelset
    constraint = tmp_path / "freeze.txt"
    constraint.write_text("-e /somewhere/sglang-echo\nunheard-of==1.0\neta>=2\n")
    proc = run_cli([*bundle_args(inputs, wheels, tmp_path / "out"), "--constraint", str(constraint)])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "No matching distribution found for eta" in proc.stderr and "unheard-of" not in proc.stderr
    assert "wanted by alpha 1.0: eta; epsilon 0.5: eta<2" in proc.stderr
