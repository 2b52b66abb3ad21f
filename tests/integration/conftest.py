"""Fixtures for the ECHO integration tests: tiny artefacts and real sglang servers.

Ports come from 33000-33099 (pairs: HTTP + sglang's rendezvous port), bound to 127.0.0.1.
Every core policy and the SmolLM2 case run by default (about 5 min on 2 cores);
``SGLANG_ECHO_QUICK=1`` keeps only echo + two baselines (``echo_matrix`` marks the rest).
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sglang_echo.models.cache import cache_root
from sglang_echo.serve.client import Generation, generate
from sglang_echo.serve.flags import SpecOptions
from sglang_echo.serve.server import SGLangServer

from ..conftest import launch_test_server

CACHE = Path(os.environ.get("SGLANG_ECHO_TEST_CACHE", cache_root() / "integration"))
# ECHO's speculative shape for the server tests: depth 4, W_max 2, padded width 7.
SPEC = SpecOptions(num_steps=4, eagle_topk=2, num_draft_tokens=7)
MAX_NEW_TOKENS = 32
WORKERS = 8
STAGGER_S = 0.15  # request i is sent at i*STAGGER_S (capped by the pool): joins mid-decode


def run_staggered(url: str, inputs, **kw) -> list[Generation]:
    """Greedy (unless ``kw`` says otherwise) generations, the first wave joining one by one."""

    def one(i, ids):
        time.sleep(min(i, WORKERS) * STAGGER_S)
        return generate(url, input_ids=ids, max_new_tokens=MAX_NEW_TOKENS, **kw)

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
    """Start (and wait for) a CPU server on a free port pair in 33000-33099; caller stops it."""
    return launch_test_server(
        (33000, 33099), f"integration-{tag or spec}",
        model_path=model, spec=spec, draft_path=draft, spec_options=SPEC, dtype="float32",
        enable_metrics=enable_metrics, max_total_tokens=8192, context_length=1024,
        extra_env=tuple(sorted((env or {}).items())),
        # Explicit ECHO shape (otherwise derived from the ECHO settings): depth 4, W_max 2, W 7.
        extra_args=(
            "--speculative-num-steps", str(SPEC.num_steps), "--speculative-eagle-topk", str(SPEC.eagle_topk),
            "--speculative-num-draft-tokens", str(SPEC.num_draft_tokens),
        ) if spec == "echo" else (),
    )
