"""Fixtures for the ECHO integration tests: tiny artefacts and real sglang servers.

Ports come from ``INTEGRATION_PORTS`` (tests/conftest.py), bound to 127.0.0.1.
Every drafter runs echo, chain and static-tree in a server. The other policies (``echo_matrix``)
are drafter-agnostic in the core, so by default each runs with one drafter (:data:`DEFAULT_PAIRS`:
every policy and every drafter still meet a server, in a CI-sized run);
``SGLANG_ECHO_TEST_FULL_MATRIX=1`` runs every drafter x policy and ``SGLANG_ECHO_TEST_QUICK=1`` none of them
(nor the SmolLM2 EAGLE-3 case).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

import pytest
import requests
from filelock import FileLock

from sglang_echo.bench.level_metrics import echo_totals, parse_page
from sglang_echo.integration.metric_catalog import SERIES, check_page
from sglang_echo.models.cache import cache_root
from sglang_echo.serve.client import Generation, generate
from sglang_echo.serve.flags import SpecOptions
from sglang_echo.serve.server import SGLangServer

from ..conftest import INTEGRATION_PORTS, launch_test_server

CACHE = Path(os.environ.get("SGLANG_ECHO_TEST_CACHE", cache_root() / "integration"))
# ECHO's speculative shape for the server tests: depth 4, W_max 2, padded width 7.
SPEC = SpecOptions(num_steps=4, eagle_topk=2, num_draft_tokens=7)
MAX_NEW_TOKENS = 32
WORKERS = 8
STAGGER_S = 0.15  # request i is sent at i*STAGGER_S (capped by the pool): joins mid-decode
SMOLLM2_PROMPT_TOKENS = 160
# Temperature > 0 (test_sampled_server.py): token 1 nearly fixed, token 2 spread (E[max p(t2|t1)] = 0.16).
SAMPLED_PROMPT = "I went to the market and bought"
SAMPLES = 300
TEMPERATURE = 1.0
MATRIX_POLICIES = ("ar", "dense-gating", "fixed-threshold", "budgeted-chain")
# Gating variants go to drafters whose drafts SmolLM2 accepts; the tiny EAGLE-3 pair rarely is.
DEFAULT_PAIRS = {
    "eagle3": ("ar", "budgeted-chain"),
    "ngram": ("dense-gating",),
    "dart": ("fixed-threshold",),
    "dflash": (),
}


def matrix(drafter: str, policies: tuple[str, ...] = MATRIX_POLICIES) -> list:
    """``echo_matrix`` parameters for ``drafter``: the pairs outside :data:`DEFAULT_PAIRS` skip
    unless ``SGLANG_ECHO_TEST_FULL_MATRIX=1``."""
    full = os.environ.get("SGLANG_ECHO_TEST_FULL_MATRIX") == "1"
    params = []
    for policy in policies:
        marks = [pytest.mark.echo_matrix]
        if not full and policy not in DEFAULT_PAIRS[drafter]:
            marks.append(
                pytest.mark.skip(reason=f"{drafter} x {policy}: full matrix only (SGLANG_ECHO_TEST_FULL_MATRIX=1)")
            )
        params.append(pytest.param(policy, marks=marks))
    return params


def run_staggered(
    url: str, inputs, *, rids: Optional[Sequence[str]] = None, max_new: Optional[Sequence[int]] = None, **kw
) -> list[Generation]:
    """Greedy (unless ``kw`` says otherwise) generations, the first wave joining one by one;
    ``rids``: the requests' ids in the server (default: its own); ``max_new``: each request's
    max_new_tokens (default: MAX_NEW_TOKENS for all)."""

    def one(i, ids):
        time.sleep(min(i, WORKERS) * STAGGER_S)
        return generate(
            url,
            input_ids=ids,
            max_new_tokens=max_new[i] if max_new else MAX_NEW_TOKENS,
            rid=rids[i] if rids else None,
            **kw,
        )

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futs = [pool.submit(one, i, ids) for i, ids in enumerate(inputs)]
        return [f.result() for f in futs]


def result_in_scheduler(code: str) -> str:
    """What ``code`` (one line of Python) prints after ``RESULT `` where the scheduler runs
    (sglang's CPU engine, which shims the kernels sglang's worker modules import)."""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, p.stdout[-2000:] + p.stderr[-3000:]
    return line[0].removeprefix("RESULT ")


def scrape(url: str) -> dict[str, float]:
    """The server's ``echo_*`` series summed over sglang's identity labels (model, ranks):
    ``name`` for a series without ECHO labels, ``name[v1,v2]`` with its ECHO labels' values
    in label-name order (``echo_gate_evaluated_total[2]`` for depth 2,
    ``echo_draft_faults_total[raise]``, ``echo_budget_steps_total[draft,explore]``).

    Every page is checked first (:func:`~sglang_echo.integration.metric_catalog.check_page`):
    each ``echo_*`` sample is a catalogued series with sglang's labels, the values of the page's
    ``sglang:*`` scheduler series, its histogram buckets in order, and every series without
    ECHO labels is there from the start."""
    samples = parse_page(requests.get(url + "/metrics", timeout=30).text)
    problems = check_page(samples, always=[s.key for s in SERIES if not s.labels])
    assert not problems, "/metrics: " + "; ".join(problems[:10])
    return echo_totals(samples, lambda name, own: name + (f"[{','.join(own.values())}]" if own else ""))


def pytest_configure(config):
    config.addinivalue_line("markers", "echo_matrix: the policies beyond echo/chain/static-tree, and SmolLM2")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SGLANG_ECHO_TEST_QUICK") != "1":
        return
    skip = pytest.mark.skip(reason="SGLANG_ECHO_TEST_QUICK=1: full policy matrix skipped")
    for item in items:
        if "echo_matrix" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2_dir: Path) -> list[list[int]]:
    """16 prompts (chat, math, summarize, humaneval x 4, interleaved), their last 160 tokens."""
    from transformers import AutoTokenizer

    from sglang_echo.models import prompts

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return [
        tok(p.as_text(tok), add_special_tokens=False).input_ids[-SMOLLM2_PROMPT_TOKENS:] for p in prompts.load_mixed(4)
    ]


@dataclasses.dataclass
class NoSpecReference:
    """What a no-speculation SmolLM2 (float32) server answered: the greedy generations of
    :func:`smollm2_prompts` (8 staggered) and :data:`SAMPLES` temperature-1 samples of
    :data:`SAMPLED_PROMPT`'s first two tokens."""

    greedy: list[Generation]
    sampled: list[tuple[int, int]]

    def to_json(self) -> str:
        return json.dumps({"greedy": [dataclasses.asdict(g) for g in self.greedy], "sampled": self.sampled})

    @classmethod
    def from_json(cls, text: str) -> "NoSpecReference":
        row = json.loads(text)
        return cls([Generation(**g) for g in row["greedy"]], [tuple(p) for p in row["sampled"]])


@pytest.fixture(scope="session")
def smollm2_nospec(smollm2_dir: Path, smollm2_prompts, sampled_prompt_ids, tmp_path_factory) -> NoSpecReference:
    """The reference of every SmolLM2 server test, greedy and sampled, from one server per test run.

    Under pytest-xdist each worker is a session of its own, so the first worker to need the
    answers serves them into the run's shared temporary folder and the others read them there (a
    server start is about 35 CPU seconds, minutes on a loaded CI host)."""

    def serve() -> NoSpecReference:
        srv = start(smollm2_dir, tag="smollm2-nospec", enable_metrics=False)
        try:
            return NoSpecReference(
                run_staggered(srv.base_url, smollm2_prompts), sample_pairs(srv.base_url, sampled_prompt_ids)[0]
            )
        finally:
            srv.stop()

    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing to share (and no run folder)
        return serve()
    shared = tmp_path_factory.getbasetemp().parent / "smollm2-nospec.json"  # this run's, all workers'
    with FileLock(f"{shared}.lock"):
        if shared.exists():
            return NoSpecReference.from_json(shared.read_text())
        reference = serve()
        shared.write_text(reference.to_json())
        return reference


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_nospec: NoSpecReference) -> list[Generation]:
    """No speculation's greedy outputs for :func:`smollm2_prompts`."""
    return smollm2_nospec.greedy


@pytest.fixture(scope="session")
def sampled_prompt_ids(smollm2_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))(SAMPLED_PROMPT, add_special_tokens=False).input_ids


def sample_pairs(url: str, ids: list[int]) -> tuple[list[tuple[int, int]], list[dict]]:
    """:data:`SAMPLES` generations of 2 tokens at :data:`TEMPERATURE` in one batch: the token
    pairs and their meta_info."""
    body = {
        "input_ids": [ids] * SAMPLES,
        "sampling_params": {"max_new_tokens": 2, "temperature": TEMPERATURE, "ignore_eos": True},
    }
    r = requests.post(url + "/generate", json=body, timeout=900)
    r.raise_for_status()
    out = r.json()
    return [tuple(o["output_ids"][:2]) for o in out], [o["meta_info"] for o in out]


@pytest.fixture(scope="session")
def tiny_pair(smollm2_dir: Path) -> tuple[Path, Path]:
    """A 4-layer random Llama (SmolLM2 tokenizer) and an early-exit EAGLE-3 head for it."""
    from sglang_echo.models.tiny import write_tiny_eagle3_draft, write_tiny_llama

    target = write_tiny_llama(CACHE / "tiny-llama-4l", smollm2_dir, num_layers=4).path
    # "Early-exit" head (reuses the target's hidden state after layer 2, its norm and lm_head).
    # Measured: it is (almost) never accepted on this random target (as EAGLE3 on it), so these
    # tests mostly exercise the reject/bonus path (see test_echo_smollm2 for accepted drafts).
    draft = write_tiny_eagle3_draft(
        CACHE / "tiny-eagle3-early-exit",
        target,
        init="early_exit",
        aux_layer_ids=[0, 1, 2],
        draft_vocab_size=_vocab(target),
    ).path
    return target, draft


def _vocab(model: Path) -> int:
    import json

    return json.loads((model / "config.json").read_text())["vocab_size"]  # full vocab: no hot-token misses


def start(
    model: Path,
    *,
    spec: str = "none",
    draft: Path | None = None,
    env: dict | None = None,
    enable_metrics: bool = True,
    tag: str = "",
    server_args: tuple[str, ...] = (),
) -> SGLangServer:
    """Start (and wait for) a CPU server on a free port pair in INTEGRATION_PORTS; caller stops it.
    ``server_args``: more sglang flags."""
    # Explicit ECHO shape (otherwise derived from the ECHO settings): depth 4, W_max 2, W 7.
    shape = (
        ("--speculative-num-steps", str(SPEC.num_steps))
        + ("--speculative-eagle-topk", str(SPEC.eagle_topk))
        + ("--speculative-num-draft-tokens", str(SPEC.num_draft_tokens))
    )
    return launch_test_server(
        INTEGRATION_PORTS,
        f"integration-{tag or spec}",
        model_path=model,
        spec=spec,
        draft_path=draft,
        spec_options=SPEC,
        dtype="float32",
        enable_metrics=enable_metrics,
        max_total_tokens=8192,
        context_length=1024,
        extra_env=tuple(sorted((env or {}).items())),
        extra_args=(shape if spec == "echo" else ()) + server_args,
    )
