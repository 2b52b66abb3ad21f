"""Fixtures for the ECHO integration tests: tiny artefacts and real sglang servers.

Ports come from ``INTEGRATION_PORTS`` (tests/conftest.py), bound to 127.0.0.1.
Every drafter runs echo, chain and static-tree in a server. The other policies (``echo_matrix``)
are drafter-agnostic in the core, so by default each runs with one drafter (:data:`DEFAULT_PAIRS`:
every policy and every drafter still meet a server, in a CI-sized run);
``SGLANG_ECHO_FULL_MATRIX=1`` runs every drafter x policy and ``SGLANG_ECHO_QUICK=1`` none of them
(nor the SmolLM2 EAGLE-3 case).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

import pytest
import requests
from filelock import FileLock

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
MATRIX_POLICIES = ("ar", "dense-gating", "fixed-threshold", "budgeted-chain")
# Gating variants go to drafters whose drafts SmolLM2 accepts; the tiny EAGLE-3 pair rarely is.
DEFAULT_PAIRS = {"eagle3": ("ar", "budgeted-chain"), "ngram": ("dense-gating",), "dart": ("fixed-threshold",),
                 "dflash": ()}


def matrix(drafter: str, policies: tuple[str, ...] = MATRIX_POLICIES) -> list:
    """``echo_matrix`` parameters for ``drafter``: the pairs outside :data:`DEFAULT_PAIRS` skip
    unless ``SGLANG_ECHO_FULL_MATRIX=1``."""
    full = os.environ.get("SGLANG_ECHO_FULL_MATRIX") == "1"
    params = []
    for policy in policies:
        marks = [pytest.mark.echo_matrix]
        if not full and policy not in DEFAULT_PAIRS[drafter]:
            marks.append(pytest.mark.skip(reason=f"{drafter} x {policy}: full matrix only (SGLANG_ECHO_FULL_MATRIX=1)"))
        params.append(pytest.param(policy, marks=marks))
    return params


def run_staggered(url: str, inputs, *, rids: Optional[Sequence[str]] = None,
                  max_new: Optional[Sequence[int]] = None, **kw) -> list[Generation]:
    """Greedy (unless ``kw`` says otherwise) generations, the first wave joining one by one;
    ``rids``: the requests' ids in the server (default: its own); ``max_new``: each request's
    max_new_tokens (default: MAX_NEW_TOKENS for all)."""

    def one(i, ids):
        time.sleep(min(i, WORKERS) * STAGGER_S)
        return generate(url, input_ids=ids, max_new_tokens=max_new[i] if max_new else MAX_NEW_TOKENS,
                        rid=rids[i] if rids else None, **kw)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futs = [pool.submit(one, i, ids) for i, ids in enumerate(inputs)]
        return [f.result() for f in futs]


def scrape(url: str) -> dict[str, float]:
    """The server's ``echo_*`` Prometheus series (``name[depth]`` for per-depth ones)."""
    out = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        m = re.match(r'^(echo_\w+)(\{depth="(\d+)"\})?\s+([0-9.eE+-]+)$', line)
        if m:
            out[m.group(1) + (f"[{m.group(3)}]" if m.group(3) else "")] = float(m.group(4))
    return out


def pytest_configure(config):
    config.addinivalue_line("markers", "echo_matrix: the policies beyond echo/chain/static-tree, and SmolLM2")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SGLANG_ECHO_QUICK") != "1":
        return
    skip = pytest.mark.skip(reason="SGLANG_ECHO_QUICK=1: full policy matrix skipped")
    for item in items:
        if "echo_matrix" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2_dir: Path) -> list[list[int]]:
    """16 prompts (chat, math, summarize, humaneval x 4, interleaved), their last 160 tokens."""
    from transformers import AutoTokenizer

    from sglang_echo.models import prompts

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return [tok(p.as_text(tok), add_special_tokens=False).input_ids[-SMOLLM2_PROMPT_TOKENS:]
            for p in prompts.load_mixed(4)]


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_dir: Path, smollm2_prompts, tmp_path_factory) -> list[Generation]:
    """A no-speculation SmolLM2 (float32) server's greedy outputs for :func:`smollm2_prompts`, 8
    staggered: the reference of every drafter's SmolLM2 server tests.

    One server per test run: under pytest-xdist each worker is a session of its own, so the first
    worker to need the outputs serves them into the run's shared temporary folder and the others
    read them there (a server start and 16 generations is minutes of CPU on a loaded CI host)."""
    def serve() -> list[Generation]:
        srv = start(smollm2_dir, tag="smollm2-nospec", enable_metrics=False)
        try:
            return run_staggered(srv.base_url, smollm2_prompts)
        finally:
            srv.stop()

    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing to share (and no run folder)
        return serve()
    shared = tmp_path_factory.getbasetemp().parent / "smollm2-reference.json"  # this run's, all workers'
    with FileLock(f"{shared}.lock"):
        if shared.exists():
            return [Generation(**row) for row in json.loads(shared.read_text())]
        outputs = serve()
        shared.write_text(json.dumps([dataclasses.asdict(g) for g in outputs]))
        return outputs


@pytest.fixture(scope="session")
def tiny_pair(smollm2_dir: Path) -> tuple[Path, Path]:
    """A 4-layer random Llama (SmolLM2 tokenizer) and an early-exit EAGLE-3 head for it."""
    from sglang_echo.models.tiny import write_tiny_eagle3_draft, write_tiny_llama

    target = write_tiny_llama(CACHE / "tiny-llama-4l", smollm2_dir, num_layers=4).path
    # "Early-exit" head (reuses the target's hidden state after layer 2, its norm and lm_head).
    # Measured: it is (almost) never accepted on this random target (as EAGLE3 on it), so these
    # tests mostly exercise the reject/bonus path (see test_echo_smollm2 for accepted drafts).
    draft = write_tiny_eagle3_draft(CACHE / "tiny-eagle3-early-exit", target, init="early_exit",
                                    aux_layer_ids=[0, 1, 2], draft_vocab_size=_vocab(target)).path
    return target, draft


def _vocab(model: Path) -> int:
    import json

    return json.loads((model / "config.json").read_text())["vocab_size"]  # full vocab: no hot-token misses


def start(model: Path, *, spec: str = "none", draft: Path | None = None, env: dict | None = None,
          enable_metrics: bool = True, tag: str = "") -> SGLangServer:
    """Start (and wait for) a CPU server on a free port pair in INTEGRATION_PORTS; caller stops it."""
    return launch_test_server(
        INTEGRATION_PORTS, f"integration-{tag or spec}",
        model_path=model, spec=spec, draft_path=draft, spec_options=SPEC, dtype="float32",
        enable_metrics=enable_metrics, max_total_tokens=8192, context_length=1024,
        extra_env=tuple(sorted((env or {}).items())),
        # Explicit ECHO shape (otherwise derived from the ECHO settings): depth 4, W_max 2, W 7.
        extra_args=(
            "--speculative-num-steps", str(SPEC.num_steps), "--speculative-eagle-topk", str(SPEC.eagle_topk),
            "--speculative-num-draft-tokens", str(SPEC.num_draft_tokens),
        ) if spec == "echo" else (),
    )
