"""Launcher CLI and command building (fast: nothing is started)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sglang_echo.serve.flags import (
    LaunchError,
    ServerOptions,
    SpecOptions,
    build_command,
    echo_plugin_available,
)
from sglang_echo.serve.server import SGLangServer, ServerStartError, find_free_port_pair


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_echo.serve.launch", *args],
                          capture_output=True, text=True, timeout=120)


def test_echo_flags_leave_the_tree_shape_to_echo(tmp_path: Path) -> None:
    assert echo_plugin_available()
    cmd = build_command(ServerOptions(model_path=tmp_path, spec="echo", draft_path=tmp_path))
    argv = " ".join(cmd.argv)
    assert f"--speculative-algorithm ECHO --speculative-draft-model-path {tmp_path}" in argv
    assert "--speculative-eagle-topk" not in argv  # ECHO picks its own tree shape


@pytest.mark.parametrize("spec", ["eagle3", "echo"])
def test_without_draft_the_shipped_head_is_used(spec: str, smollm2_dir: Path) -> None:
    r = _launch("--spec", spec, "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "shipped EAGLE-3 head" in r.stdout
    assert "-eagle3-smollm2-135m-instruct" in r.stdout.split("exec:")[1]
    if spec == "echo":  # the calibration shipped for exactly this model + head (fingerprints match)
        assert "SGLANG_ECHO_CALIBRATION=" in r.stdout and "smollm2-135m-instruct-eagle3.json (shipped" in r.stdout


def test_a_configured_calibration_wins_over_the_shipped_one(smollm2_dir: Path, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLANG_ECHO_CALIBRATION", str(tmp_path / "mine.json"))
    r = _launch("--spec", "echo", "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "(shipped" not in r.stdout


def test_echo_with_the_ngram_drafter_needs_no_head(smollm2_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_ECHO_DRAFTER", "ngram")
    r = _launch("--spec", "echo", "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "--speculative-draft-model-path" not in r.stdout.split("exec:")[1]
    assert "smollm2-135m-instruct-ngram.json (shipped" in r.stdout


def test_echo_with_the_dart_drafter_uses_the_shipped_dart_head(smollm2_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_ECHO_DRAFTER", "dart")
    r = _launch("--spec", "echo", "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "shipped DART head" in r.stdout
    assert "-dart-smollm2-135m-instruct" in r.stdout.split("exec:")[1]
    assert "smollm2-135m-instruct-dart.json (shipped" in r.stdout


def test_echo_with_the_dflash_drafter_uses_the_shipped_dflash_head_and_calibration(smollm2_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_ECHO_DRAFTER", "dflash")
    r = _launch("--spec", "echo", "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "-dflash-smollm2-135m-instruct" in r.stdout.split("exec:")[1]
    assert "smollm2-135m-instruct-dflash.json (shipped" in r.stdout


def test_a_draft_dir_without_config_is_refused(tmp_path: Path) -> None:
    r = _launch("--spec", "eagle3", "--port", "32098", "--draft", str(tmp_path))
    assert r.returncode == 2
    assert "no config.json" in r.stderr


def test_dry_run_prints_cpu_command(smollm2_dir: Path) -> None:
    r = _launch("--spec", "ngram", "--port", "32098", "--dry-run", "--device", "cpu",
                "--", "--enable-cache-report")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(smollm2_dir) in out
    for needle in ("SGLANG_USE_CPU_ENGINE=1", "--device cpu", "--attention-backend echo_torch",
                   "--speculative-algorithm NGRAM", "--host 127.0.0.1", "--port 32098",
                   "--nccl-port 32099", "--enable-cache-report", "logs:"):
        assert needle in out, needle


def test_build_command_eagle3_gpu_has_no_cpu_flags(tmp_path: Path) -> None:
    cmd = build_command(ServerOptions(model_path=tmp_path, spec="eagle3", draft_path=tmp_path,
                                      device="cuda", spec_options=SpecOptions(5, 4, 8)))
    argv = " ".join(cmd.argv)
    assert "SGLANG_USE_CPU_ENGINE" not in cmd.env and "--device cpu" not in argv
    assert "--speculative-algorithm EAGLE3" in argv
    assert "--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8" in argv
    with pytest.raises(LaunchError):
        build_command(ServerOptions(model_path=tmp_path, spec="bogus"))


def test_failed_start_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    """A server that dies during start-up raises with its log tail and leaves no process."""
    srv = SGLangServer(ServerOptions(model_path=tmp_path / "missing", port=32096, device="cpu"),
                       log_path=tmp_path / "log.txt", startup_timeout=120)
    with pytest.raises(ServerStartError) as ei:
        with srv:
            pass
    assert "exited with code" in str(ei.value)
    assert srv.proc is None


def test_a_reply_that_is_not_http_is_not_healthy(tmp_path: Path) -> None:
    """A socket that echoes the request back (what a TCP self-connect looks like) is 'not yet', not a crash."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def echo_once() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(conn.recv(4096))

        threading.Thread(target=echo_once, daemon=True).start()
        port = listener.getsockname()[1]
        srv = SGLangServer(ServerOptions(model_path=tmp_path, port=port, device="cpu"))
        assert srv.healthy(timeout=5) is False


def test_server_ports_stay_below_the_ephemeral_range() -> None:
    with pytest.raises(ValueError, match="ephemeral"):
        find_free_port_pair(33000, 33099)
