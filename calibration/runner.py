"""Run the calibration probe through the real server: sglang + the ECHO worker + the drafter.

The server is the one ``make serve`` starts, with the ``beam-tree`` policy (every depth up to
``depth`` drafted ``width`` wide and verified) and ``SGLANG_ECHO_PROBE_OUT`` set, so the worker
itself writes the samples (:mod:`.probe`). Prompts are sent greedily, ``concurrency`` at a time,
which also spreads the verified-token counts the K_max knee is read from.

Interrupt-safe: samples are flushed per step by the worker and finished prompts are listed in
``<samples>.done``; ``resume=True`` skips those prompts and appends to the same samples.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from tqdm import tqdm

from sglang_echo.serve.client import generate
from sglang_echo.serve.flags import ServerOptions, SpecOptions
from sglang_echo.serve.server import SGLangServer, find_free_port_pair

from .probe import ENV_PROBE_OUT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeJob:
    model: Path
    drafter: str  # "eagle3" | "dart" | "ngram"
    draft: Optional[Path]  # EAGLE-3 head dir (None for ngram)
    prompts: Sequence[tuple[str, str]]  # (id, rendered prompt text)
    samples: Path
    depth: int = 8
    width: int = 4
    max_new_tokens: int = 128
    concurrency: int = 8
    dtype: Optional[str] = None
    device: Optional[str] = None
    port: Optional[int] = None
    startup_timeout: float = 900.0

    def server_options(self, port: int) -> ServerOptions:
        env = {
            "SGLANG_ECHO_POLICY": "beam-tree",
            "SGLANG_ECHO_DRAFTER": self.drafter,
            "SGLANG_ECHO_MAX_DEPTH": str(self.depth),
            "SGLANG_ECHO_W_MAX": str(self.width),
            ENV_PROBE_OUT: str(self.samples.resolve()),
        }
        width = 1 + self.depth * self.width
        return ServerOptions(
            model_path=self.model,
            port=port,
            spec="echo",
            draft_path=self.draft,
            spec_options=SpecOptions(num_steps=self.depth, eagle_topk=self.width, num_draft_tokens=width),
            dtype=self.dtype,
            device=self.device,
            max_running_requests=self.concurrency,
            extra_env=tuple(env.items()),
        )


def done_file(samples: Path) -> Path:
    return samples.with_name(samples.name + ".done")


def run_probe(job: ProbeJob, *, resume: bool = False) -> int:
    """Serve every prompt not finished yet through the probing server; returns how many ran."""
    done_path = done_file(job.samples)
    if not resume:
        for p in (job.samples, done_path):
            p.unlink(missing_ok=True)
    done = set(done_path.read_text().splitlines()) if done_path.exists() else set()
    todo = [(pid, text) for pid, text in job.prompts if pid not in done]
    if not todo:
        log.warning("every prompt is already probed (%s); nothing to run", done_path)
        return 0
    job.samples.parent.mkdir(parents=True, exist_ok=True)
    port = job.port or find_free_port_pair(31000, 31999)
    server_log = job.samples.with_suffix(".server.log")
    with (
        SGLangServer(job.server_options(port), log_path=server_log, startup_timeout=job.startup_timeout) as srv,
        open(done_path, "a") as done_fh,
        ThreadPoolExecutor(max_workers=job.concurrency) as pool,
    ):
        futs = {
            pool.submit(generate, srv.base_url, text=text, max_new_tokens=job.max_new_tokens, timeout=1800): pid
            for pid, text in todo
        }
        bar = tqdm(as_completed(futs), total=len(futs), desc="probing", unit="prompt")
        for fut in bar:
            fut.result()  # a failed request is a failed calibration: raise with the server log named
            done_fh.write(futs[fut] + "\n")
            done_fh.flush()
    return len(todo)
