"""Pressure on a speculating server loses no request: with a KV pool far smaller than the load,
ECHO's requests wait or are retracted and re-run, and every one still finishes with plain
decoding's greedy tokens; clients that hang up mid-stream free their slots, so the same load
runs again afterwards: sglang aborts each hung-up request (its counter says so) instead of
generating the tokens nobody reads into the small pool."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sglang_echo.bench.level_metrics import parse_page
from sglang_echo.models import prompts
from sglang_echo.serve.client import Generation, generate_many
from sglang_echo.serve.server import SGLangServer

from ..conftest import SERVER_PORTS, launch_test_server
from .conftest import SERVER_DTYPE, LazyServer

pytestmark = pytest.mark.server

PER_SET = 4  # x 4 sets = 16 prompts, all in flight at once
MAX_NEW_TOKENS = 48
POOL_TOKENS = 1024  # the load needs about twice that: prompts of 30-200 tokens plus 48 new each
HANG_UPS = 8
HANG_UP_TOKENS = 400  # what each hung-up stream asked for: 8 of them alone would not fit the pool
TIMEOUT = 600.0


@pytest.fixture(scope="module")
def prompt_ids(smollm2_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return [tok(p.as_text(tok), add_special_tokens=False).input_ids for p in prompts.load_mixed(PER_SET)]


@pytest.fixture(scope="module")
def reference(baseline: LazyServer, prompt_ids: list[list[int]]) -> list[Generation]:
    return _run(baseline.get(), prompt_ids)


@pytest.fixture(scope="module")
def echo_small_pool(smollm2_dir: Path) -> Iterator[SGLangServer]:
    """ECHO with the shipped EAGLE-3 head and calibration at a fixed K_max (every step may draft),
    its KV pool ``POOL_TOKENS`` tokens."""
    from sglang_echo.models.drafts import shipped_head
    from sglang_echo.serve.flags import ServerOptions
    from sglang_echo.serve.launch import with_shipped_calibration

    head = shipped_head(smollm2_dir, "eagle3")
    served = with_shipped_calibration(ServerOptions(smollm2_dir, spec="echo", draft_path=head))
    srv = launch_test_server(
        SERVER_PORTS,
        "echo-small-pool",
        model_path=smollm2_dir,
        spec="echo",
        draft_path=head,
        dtype=SERVER_DTYPE,
        max_total_tokens=POOL_TOKENS,
        enable_metrics=True,
        extra_env=(*served.extra_env, ("SGLANG_ECHO_BUDGET", "fixed")),
    )
    try:
        yield srv
    finally:
        srv.stop()


def _run(srv: SGLangServer, prompt_ids: list[list[int]]) -> list[Generation]:
    return generate_many(
        srv.base_url, prompt_ids, workers=len(prompt_ids), max_new_tokens=MAX_NEW_TOKENS, timeout=TIMEOUT
    )


def _metric(srv: SGLangServer, name: str) -> float:
    """The sum of sglang's series ``name`` over its labels."""
    page = requests.get(srv.url("/metrics"), timeout=30).text
    return sum(s.value for s in parse_page(page) if s.name == name)


def _hang_up(srv: SGLangServer, ids: list[int]) -> None:
    """A stream read up to its first tokens, then closed."""
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": HANG_UP_TOKENS, "temperature": 0.0, "ignore_eos": True},
    }
    with requests.post(srv.url("/generate"), json=body, stream=True, timeout=TIMEOUT) as r:
        r.raise_for_status()
        next(line for line in r.iter_lines() if line.startswith(b"data:"))


def test_a_pool_smaller_than_the_load_makes_requests_wait_not_fail(echo_small_pool, prompt_ids, reference):
    got = _run(echo_small_pool, prompt_ids)
    assert [g.output_ids for g in got] == [r.output_ids for r in reference]
    # Accepted drafts: tokens beyond one per verify step (sglang's spec_verify_ct).
    accepted = sum(int(g.meta["completion_tokens"]) - int(g.meta.get("spec_verify_ct") or 0) for g in got)
    assert accepted > 0, "no draft accepted: the pressure was not on a speculating server"
    log = echo_small_pool.log_path.read_text(errors="replace")
    assert re.search(r"#queue-req: [1-9]", log) or "etract" in log, "the pool never ran short"


def test_clients_that_hang_up_mid_stream_free_their_slots(echo_small_pool, prompt_ids, reference):
    aborted = _metric(echo_small_pool, "sglang:num_aborted_requests_total")
    for ids in prompt_ids[:HANG_UPS]:
        _hang_up(echo_small_pool, ids)
    got = _run(echo_small_pool, prompt_ids)  # behind 8 streams that kept running it would crawl
    assert [g.output_ids for g in got] == [r.output_ids for r in reference]
    assert _metric(echo_small_pool, "sglang:num_aborted_requests_total") - aborted == HANG_UPS
