"""Run one concurrency level: a headless locust subprocess bounded in time and in requests.

A subprocess per level, rather than locust as a library: importing locust monkey-patches the
standard library with gevent, which must not leak into the runner (or into pytest), and a fresh
process per level starts every level from the same client state.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from rich.progress import Progress, TaskID

from .measure import read_samples
from .summary import LevelResult, summarise

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
# Locust's own start-up plus the wind-down after the time limit; past it the level is hung.
GRACE_S = 90.0
POLL_S = 0.5


class LevelFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class LevelFiles:
    """What one level leaves in the output folder."""

    samples: Path  # one JSON line per finished request: what the summary is computed from
    log: Path  # locust's output
    # Locust's own statistics at exit. Not its --csv files: those are rewritten once a second,
    # so they miss up to the last second of a level (and all of a level shorter than that).
    locust_stats: Path
    hostile_samples: Path  # one JSON line per hostile request sent (a soak's; loadtests/hostile.py)


@dataclass(frozen=True)
class Sweep:
    """Settings shared by every level of one sweep."""

    host: str
    model: str
    out: Path
    level_seconds: int
    level_requests: int
    max_tokens: int
    ignore_eos: bool = False
    max_tokens_jitter: int = 0  # each request's max_tokens drawn from max_tokens +- this (seeded)
    allow_remote: bool = False
    tags: tuple[str, ...] = ()
    prompts_per_set: int = 40
    request_timeout: float = 600.0
    flush_cache: bool = True
    # After the time limit users start nothing new and their requests in flight may finish for
    # this long. Without it a slow level would count only the requests that happen to end inside
    # the window (the short ones), overstating latency's floor and understating tokens/s.
    drain_seconds: int = 180
    # A soak's hostile traffic: one case of ``hostile_cases`` (a file of loadtests/hostile.py's
    # cases, sent in turn) before every ``hostile_every``-th normal request; 0: none.
    hostile_every: int = 0
    hostile_cases: Path | None = None
    hostile_timeout: float = 120.0

    def files(self, users: int) -> LevelFiles:
        stem = self.out / f"users_{users:03d}"
        return LevelFiles(
            samples=stem.with_suffix(".samples.jsonl"),
            log=stem.with_suffix(".log"),
            locust_stats=stem.with_suffix(".locust.json"),
            hostile_samples=stem.with_suffix(".hostile.jsonl"),
        )


def flush_prefix_cache(host: str, wait_s: float = 60.0) -> bool | None:
    """Empty sglang's radix (prefix) cache before a level.

    Every level sends the same prompts in the same order, so without this a level would find
    the previous level's prompts already prefilled and report a TTFT no fresh traffic sees.
    True: flushed; False: refused (requests still running after ``wait_s``, or an admin key is
    needed); None: the server has no such endpoint (not sglang).
    """
    try:
        r = requests.post(f"{host}/flush_cache", params={"timeout": wait_s}, timeout=wait_s + 30)
    except requests.RequestException:
        return False  # the level will say what is wrong with the server, error by error
    if r.status_code == 404:
        return None
    return r.status_code == 200


def locust_command(sweep: Sweep, users: int) -> list[str]:
    files = sweep.files(users)
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        sweep.host,
        # Every user starts at once: a level measures steady concurrency, not a ramp.
        "--users",
        str(users),
        "--spawn-rate",
        str(users),
        "--run-time",
        f"{sweep.level_seconds}s",
        "--stop-timeout",
        str(sweep.drain_seconds),
        # --only-summary: no stats table every few seconds in the log; locust appends ".json".
        "--only-summary",
        "--json-file",
        str(files.locust_stats.with_suffix("")),
        # Failed requests are data here, not a reason for locust to report failure.
        "--exit-code-on-error",
        "0",
        "--loglevel",
        "WARNING",
        "--model",
        sweep.model,
        "--max-tokens",
        str(sweep.max_tokens),
        "--max-requests",
        str(sweep.level_requests),
        "--samples-file",
        str(files.samples),
        "--prompts-per-set",
        str(sweep.prompts_per_set),
        "--request-timeout",
        str(sweep.request_timeout),
    ]
    if sweep.ignore_eos:
        cmd.append("--ignore-eos")
    if sweep.max_tokens_jitter:
        cmd += ["--max-tokens-jitter", str(sweep.max_tokens_jitter)]
    if sweep.allow_remote:
        cmd.append("--allow-remote")
    if sweep.tags:
        cmd += ["--tags", *sweep.tags]
    if sweep.hostile_every and sweep.hostile_cases is not None:
        cmd += [
            "--hostile-every",
            str(sweep.hostile_every),
            "--hostile-cases",
            str(sweep.hostile_cases),
            "--hostile-samples-file",
            str(files.hostile_samples),
            "--hostile-timeout",
            str(sweep.hostile_timeout),
        ]
    return cmd


def _count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def run_level(sweep: Sweep, users: int, progress: Progress | None = None, label: str = "") -> LevelResult:
    files = sweep.files(users)
    samples, log = files.samples, files.log
    samples.unlink(missing_ok=True)  # the locustfile appends
    files.hostile_samples.unlink(missing_ok=True)
    task: TaskID | None = None
    if progress is not None:
        task = progress.add_task(f"{label} {users:>4} users".lstrip(), total=sweep.level_requests)
    deadline = time.monotonic() + sweep.level_seconds + sweep.drain_seconds + GRACE_S
    with open(log, "w", encoding="utf-8") as log_fh:
        # cwd: locust puts the working directory on sys.path, which makes `loadtests` importable.
        proc = subprocess.Popen(locust_command(sweep, users), cwd=REPO_ROOT, stdout=log_fh, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise LevelFailed(
                        f"{users} users: locust still running {GRACE_S:.0f}s after "
                        f"the level's time limit and drain (log: {log})"
                    )
                if task is not None:
                    progress.update(task, completed=_count_lines(samples))
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(text.splitlines()[-20:])
        raise LevelFailed(f"{users} users: locust exited with {proc.returncode} (log: {log})\n{tail}")
    found = read_samples(samples)
    if task is not None:
        progress.update(task, completed=len(found))
    # Locust warns when its own process saturates a core; then the client, not the server, limits.
    return summarise(users, found, request_budget=sweep.level_requests, client_cpu_warning="CPU usage" in text)
