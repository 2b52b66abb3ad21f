"""Launcher CLI and command building (fast: nothing is started)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sglang_echo.serve import flags
from sglang_echo.serve.flags import (
    LaunchError,
    ServerOptions,
    SpecOptions,
    build_command,
    default_dtype,
    echo_plugin_available,
)
from sglang_echo.serve.server import ServerStartError, SGLangServer, find_free_port_pair


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_echo.serve.launch", *args], capture_output=True, text=True, timeout=120
    )


def _shipped_calibration(drafter: str) -> str:
    """The calibration `make serve` on this CPU uses: made for the checkpoint in the dtype it serves."""
    return f"smollm2-135m-instruct-{drafter}{'' if default_dtype('cpu') == 'bfloat16' else '-fp32'}.json (shipped"


def test_the_default_dtype_follows_the_hardware(monkeypatch) -> None:
    monkeypatch.setattr(flags, "cpu_has_amx_bf16", lambda: False)
    for bf16_dot in (False, True):  # AVX2, AVX-512 BF16: float32 is the faster one
        monkeypatch.setattr(flags, "cpu_has_bf16_gemm", lambda v=bf16_dot: v)
        assert default_dtype("cpu") == "float32" and default_dtype("cuda") == "bfloat16"
        assert ("AVX-512 BF16 but no AMX" in flags.dtype_reason("cpu")) == bf16_dot
    assert flags.resolve_dtype(None, "cpu", prepared_model=False) == "float32"  # never sglang's auto on a CPU
    assert flags.resolve_dtype(None, "cuda", prepared_model=False) is None  # a user's checkpoint on a GPU: auto
    assert flags.resolve_dtype(None, "cuda", prepared_model=True) == "bfloat16"
    assert flags.resolve_dtype("float16", "cpu", prepared_model=True) == "float16"  # asked for
    monkeypatch.setattr(flags, "cpu_has_amx_bf16", lambda: True)
    assert default_dtype("cpu") == "bfloat16" and "AMX" in flags.dtype_reason("cpu")


def test_a_cpu_server_names_its_dtype(smollm2_dir: Path, tmp_path: Path) -> None:
    """sglang's `--dtype auto` serves a float32 checkpoint in float16, the slowest choice on CPUs."""
    for extra in ((), ("--model", str(smollm2_dir))):
        r = _launch("--spec", "none", "--port", "32098", "--dry-run", "--device", "cpu", *extra)
        assert r.returncode == 0, r.stderr
        assert f"--dtype {default_dtype('cpu')}" in r.stdout.split("exec:")[1]
    r = _launch("--spec", "none", "--port", "32098", "--dry-run", "--device", "cpu", "--dtype", "float32")
    assert "SmolLM2-135M-Instruct-float32 " in r.stdout.split("exec:")[1]  # the checkpoint in that dtype


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
        assert "SGLANG_ECHO_CALIBRATION=" in r.stdout and _shipped_calibration("eagle3") in r.stdout
        env = r.stdout.split("env:")[1].splitlines()[0]
        assert "SGLANG_ECHO_BUDGET=cost" in env and "SGLANG_ECHO_HYBRID=1" in env  # the CPU defaults


def test_echo_on_a_cpu_budgets_by_cost_unless_configured(monkeypatch, tmp_path: Path) -> None:
    """`make serve`'s ECHO on a CPU: budget cost; a configured budget or config file, or a GPU,
    keeps what ECHO would otherwise do."""
    from sglang_echo.serve.launch import with_cpu_budget

    opts = ServerOptions(model_path=tmp_path, spec="echo", draft_path=tmp_path)
    for var in ("SGLANG_ECHO_BUDGET", "SGLANG_ECHO_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    assert ("SGLANG_ECHO_BUDGET", "cost") in with_cpu_budget(opts, "cpu").extra_env
    assert with_cpu_budget(opts, "cuda") == opts
    for var, value in (("SGLANG_ECHO_BUDGET", "fixed"), ("SGLANG_ECHO_CONFIG", str(tmp_path / "echo.json"))):
        monkeypatch.setenv(var, value)
        assert with_cpu_budget(opts, "cpu") == opts
        monkeypatch.delenv(var)


def test_echo_with_a_head_on_a_cpu_drafts_hybrid_unless_configured(monkeypatch, tmp_path: Path) -> None:
    """`make serve`'s ECHO on a CPU: hybrid drafting; a configured one or config file, a GPU or the
    n-gram drafter alone keeps what ECHO would otherwise do."""
    from sglang_echo.serve.launch import with_cpu_hybrid

    opts = ServerOptions(model_path=tmp_path, spec="echo", draft_path=tmp_path)
    for var in ("SGLANG_ECHO_HYBRID", "SGLANG_ECHO_CONFIG", "SGLANG_ECHO_DRAFTER"):
        monkeypatch.delenv(var, raising=False)
    assert ("SGLANG_ECHO_HYBRID", "1") in with_cpu_hybrid(opts, "cpu").extra_env
    assert with_cpu_hybrid(opts, "cuda") == opts
    for var, value in (
        ("SGLANG_ECHO_HYBRID", "0"),
        ("SGLANG_ECHO_CONFIG", str(tmp_path / "echo.json")),
        ("SGLANG_ECHO_DRAFTER", "ngram"),
    ):
        monkeypatch.setenv(var, value)
        assert with_cpu_hybrid(opts, "cpu") == opts
        monkeypatch.delenv(var)


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
    assert _shipped_calibration("ngram") in r.stdout


def test_echo_with_the_dart_drafter_uses_the_shipped_dart_head(smollm2_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_ECHO_DRAFTER", "dart")
    r = _launch("--spec", "echo", "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "shipped DART head" in r.stdout
    assert "-dart-smollm2-135m-instruct" in r.stdout.split("exec:")[1]
    assert _shipped_calibration("dart") in r.stdout


def test_echo_with_the_dflash_drafter_uses_the_shipped_dflash_head_and_calibration(
    smollm2_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SGLANG_ECHO_DRAFTER", "dflash")
    r = _launch("--spec", "echo", "--port", "32098", "--dry-run", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "-dflash-smollm2-135m-instruct" in r.stdout.split("exec:")[1]
    assert _shipped_calibration("dflash") in r.stdout


def test_a_draft_dir_without_config_is_refused(tmp_path: Path) -> None:
    r = _launch("--spec", "eagle3", "--port", "32098", "--draft", str(tmp_path))
    assert r.returncode == 2
    assert "no config.json" in r.stderr


def test_dry_run_prints_cpu_command(smollm2_dir: Path) -> None:
    r = _launch("--spec", "ngram", "--port", "32098", "--dry-run", "--device", "cpu", "--", "--enable-cache-report")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(smollm2_dir) in out
    for needle in (
        "SGLANG_USE_CPU_ENGINE=1",
        "--device cpu",
        "--attention-backend echo_torch",
        "--speculative-algorithm NGRAM",
        "--host 127.0.0.1",
        "--port 32098",
        "--nccl-port 32099",
        "--enable-cache-report",
        "logs:",
        "--max-running-requests 256",
    ):
        assert needle in out, needle


def test_cpu_speculative_servers_are_not_capped_at_sglangs_48(tmp_path: Path) -> None:
    """sglang resets a speculative server's running requests to 48 unless given; on the CPU every
    spec gets CPU_SPEC_MAX_RUNNING_REQUESTS (an explicit value wins, plain decoding keeps sglang's)."""

    def running(**kw) -> str | None:
        argv = build_command(ServerOptions(model_path=tmp_path, device="cpu", draft_path=tmp_path, **kw)).argv
        return argv[argv.index("--max-running-requests") + 1] if "--max-running-requests" in argv else None

    for spec in ("ngram", "eagle3", "echo"):
        assert running(spec=spec) == str(flags.CPU_SPEC_MAX_RUNNING_REQUESTS)
    assert running(spec="echo", max_running_requests=8) == "8"
    assert running(spec="none") is None


def test_cpu_speculative_servers_get_their_draft_slots_on_top_of_the_kv_pool(tmp_path: Path) -> None:
    """A speculative CPU server's default pool is plain decoding's plus the slots sglang holds per
    running request for the next step, so both admit the same requests; an explicit size wins."""

    def pool(**kw) -> int:
        argv = build_command(ServerOptions(model_path=tmp_path, device="cpu", draft_path=tmp_path, **kw)).argv
        return int(argv[argv.index("--max-total-tokens") + 1])

    base = flags.CPU_MAX_TOTAL_TOKENS
    assert pool(spec="none") == base
    assert pool(spec="eagle3", spec_options=SpecOptions(3, 3, 5), max_running_requests=8) == base + 8 * 2 * 9
    assert pool(spec="ngram", spec_options=SpecOptions(num_draft_tokens=12), max_running_requests=8) == base + 8 * 24
    # ECHO's shape is its config's: depth 4, topk w_max 4, width 13 by default -> 2 x 16 slots
    assert pool(spec="echo") == base + flags.CPU_SPEC_MAX_RUNNING_REQUESTS * 32
    assert (
        pool(spec="echo", extra_env=(("SGLANG_ECHO_MAX_DEPTH", "6"),))
        == base + flags.CPU_SPEC_MAX_RUNNING_REQUESTS * 48
    )
    assert pool(spec="echo", max_total_tokens=4096) == 4096
    with pytest.raises(LaunchError, match="SGLANG_ECHO_MAX_DEPTH"):
        pool(spec="echo", extra_env=(("SGLANG_ECHO_MAX_DEPTH", "deep"),))


def test_cpu_kv_pool_counts_the_shape_and_running_requests_passed_after_the_double_dash(tmp_path: Path) -> None:
    """sglang reads the last ``--speculative-*`` / ``--max-running-requests`` it is given, so the
    pool is sized from what is passed through after ``--``, not from the options it overrides."""

    def launch(extra: tuple[str, ...], **kw) -> list[str]:
        return build_command(
            ServerOptions(model_path=tmp_path, device="cpu", draft_path=tmp_path, extra_args=extra, **kw)
        ).argv

    def pool(extra: tuple[str, ...], **kw) -> int:
        argv = launch(extra, **kw)
        return int(argv[argv.index("--max-total-tokens") + 1])

    base = flags.CPU_MAX_TOTAL_TOKENS
    paper_tree = ("--speculative-num-steps", "8", "--speculative-eagle-topk=10", "--speculative-num-draft-tokens", "60")
    assert pool(paper_tree, spec="eagle3", spec_options=SpecOptions(3, 3, 5), max_running_requests=8) == base + 8 * 160
    assert pool(("--speculative-num-draft-tokens", "12"), spec="ngram", max_running_requests=8) == base + 8 * 24
    # ECHO reads sglang's flags into its config (depth 6 -> 2 x max(6 x 4, 17) slots) ...
    assert pool(("--speculative-num-steps", "6"), spec="echo") == base + flags.CPU_SPEC_MAX_RUNNING_REQUESTS * 48
    # ... and a passed-through --max-running-requests replaces the CPU default of 256 instead of joining it
    argv = launch(("--max-running-requests", "32"), spec="echo")
    assert argv.count("--max-running-requests") == 1
    assert pool(("--max-running-requests", "32"), spec="echo") == base + 32 * 32
    assert pool(("--max-running-requests", "32"), spec="echo", max_running_requests=64) == base + 32 * 32
    with pytest.raises(LaunchError, match="--speculative-num-steps 'deep': expected an integer"):
        pool(("--speculative-num-steps", "deep"), spec="eagle3")


def test_draft_slots_per_request_match_sglangs_own_reservation(tmp_path: Path, monkeypatch) -> None:
    """The slots counted above are sglang's ``get_alloc_reserve_per_decode`` for the same shape."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache import allocation_sizing

    for steps, topk, tokens in ((3, 1, 4), (3, 3, 5), (2, 2, 8), (5, 4, 8)):
        monkeypatch.setattr(
            allocation_sizing,
            "get_spec",
            lambda: SimpleNamespace(
                speculative_algorithm="EAGLE3", speculative_num_steps=steps, speculative_eagle_topk=topk
            ),
        )
        monkeypatch.setattr(allocation_sizing, "max_speculative_num_draft_tokens", lambda: tokens)
        monkeypatch.setattr(allocation_sizing, "get_alloc_page_size", lambda: 1)
        opts = ServerOptions(model_path=tmp_path, spec="eagle3", spec_options=SpecOptions(steps, topk, tokens))
        assert flags.draft_slots_per_request(opts) == allocation_sizing.get_alloc_reserve_per_decode()


def test_cpu_servers_keep_mallocs_large_blocks_unless_told_otherwise(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the operator's own setting wins
    env = build_command(ServerOptions(model_path=tmp_path, device="cpu")).env
    assert env["MALLOC_TRIM_THRESHOLD_"] == flags.CPU_MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]
    assert "MALLOC_MMAP_THRESHOLD_" not in env
    assert not set(flags.CPU_MALLOC_ENV) & set(build_command(ServerOptions(model_path=tmp_path, device="cuda")).env)
    monkeypatch.setenv("SGLANG_ECHO_MALLOC_TUNING", "0")
    assert not set(flags.CPU_MALLOC_ENV) & set(build_command(ServerOptions(model_path=tmp_path, device="cpu")).env)


def test_build_command_eagle3_gpu_has_no_cpu_flags(tmp_path: Path) -> None:
    cmd = build_command(
        ServerOptions(
            model_path=tmp_path, spec="eagle3", draft_path=tmp_path, device="cuda", spec_options=SpecOptions(5, 4, 8)
        )
    )
    argv = " ".join(cmd.argv)
    assert "SGLANG_USE_CPU_ENGINE" not in cmd.env and "--device cpu" not in argv
    assert "--speculative-algorithm EAGLE3" in argv
    assert "--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8" in argv
    with pytest.raises(LaunchError):
        build_command(ServerOptions(model_path=tmp_path, spec="bogus"))


def test_failed_start_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    """A server that dies during start-up raises with its log tail and leaves no process."""
    srv = SGLangServer(
        ServerOptions(model_path=tmp_path / "missing", port=32096, device="cpu"),
        log_path=tmp_path / "log.txt",
        startup_timeout=120,
    )
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


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_process_dies_with_its_parent() -> None:
    """A benchmark or test killed by SIGKILL (no atexit, no __exit__) leaves no server running."""
    script = (
        "import subprocess, sys, time\n"
        "from sglang_echo.serve.server import die_with_parent\n"
        "p = subprocess.Popen(die_with_parent([sys.executable, '-c', "
        "'import time; print(1, flush=True); time.sleep(120)']),\n"
        "                     stdout=subprocess.PIPE, text=True)\n"
        "p.stdout.readline()  # the child runs its own code: past the prctl and the exec\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert _running(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child), "the child outlived its parent"


def test_server_cpu_seconds_count_the_whole_process_tree() -> None:
    """echo-bench serve's CPU per token: the server's CPU is its process plus its live children
    (sglang's scheduler does the work, in a child)."""
    child = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
        "print(1, flush=True)\ntime.sleep(60)\n"
    )
    parent = (
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
        "c.stdout.readline(); print(1, flush=True); time.sleep(60)\n"
    )
    srv = SGLangServer(ServerOptions(port=32098, model_path=Path("unused")))
    assert srv.cpu_seconds() == 0.0  # not started
    srv.proc = subprocess.Popen(
        [sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        srv.proc.stdout.readline()  # the child has burnt its 0.5 s
        assert srv.cpu_seconds() >= 0.5
        assert srv.cpu_seconds() < 5  # the parent only waits
    finally:
        srv.stop(grace=1)
    assert srv.cpu_seconds() == 0.0


def test_stop_does_not_wait_out_a_launcher_that_lingers_after_its_children() -> None:
    """sglang's launcher, seeing a child die of the SIGTERM, sleeps before exiting: stop() kills
    it once its children have exited instead of waiting out the grace period, and leaves nothing."""
    lingering = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)  # sglang's launcher: 'crash' diagnostics first\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(60)'],\n"
        "                     stdout=subprocess.PIPE, text=True)\n"
        "c.stdout.readline(); print(c.pid, flush=True); time.sleep(60)\n"
    )
    srv = SGLangServer(ServerOptions(port=32098, model_path=Path("unused")))
    srv.proc = subprocess.Popen(
        [sys.executable, "-c", lingering], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    parent, child = srv.proc, int(srv.proc.stdout.readline())
    t0 = time.monotonic()
    srv.stop(grace=60)
    assert time.monotonic() - t0 < 30, "stop() waited for the launcher after its children had exited"
    assert parent.poll() is not None and not _running(child)
