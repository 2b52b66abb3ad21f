"""One hostile request must not kill a real server: the request guard
(``sglang_echo/integration/request_guard.py``) answers what the model cannot run with a 400 that
names the field, on a plain server, on an ECHO server as ``make serve`` runs it, and on a
``--skip-tokenizer-init`` server; a Hypothesis fuzzer over the `/generate`, `/v1/completions` and
`/v1/chat/completions` schemas then gets only 2xx/4xx answers, and the server still answers a
greedy request with the tokens it gave before the run."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from sglang_echo.serve.client import generate
from sglang_echo.serve.server import SGLangServer

from ..conftest import SERVER_PORTS, launch_test_server
from .conftest import SERVER_DTYPE, LazyServer
from .request_strategies import Case, hostile_requests

pytestmark = pytest.mark.server

TIMEOUT = 120.0  # seconds per request: a server that takes longer on a <= 4-token request hangs
JSON = {"content-type": "application/json"}
# Per server: examples, and a wall-clock cap after which the remaining examples are skipped.
FUZZ_EXAMPLES = int(os.environ.get("SGLANG_ECHO_TEST_FUZZ_EXAMPLES", "250"))
FUZZ_SECONDS = float(os.environ.get("SGLANG_ECHO_TEST_FUZZ_SECONDS", "75"))
FUZZ_SEED = os.environ.get("SGLANG_ECHO_TEST_FUZZ_SEED")  # unset: the same examples every run (CI)
REFERENCE_PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def vocab(smollm2_dir: Path) -> int:
    return json.loads((smollm2_dir / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module")
def plain(baseline: LazyServer) -> SGLangServer:
    return baseline.get()


@pytest.fixture(scope="module")
def echo(smollm2_dir: Path) -> Iterator[SGLangServer]:
    """ECHO as ``make serve`` runs it on a CPU: the shipped EAGLE-3 head and calibration, budget cost,
    hybrid drafting."""
    from sglang_echo.models.drafts import shipped_head
    from sglang_echo.serve.flags import ServerOptions
    from sglang_echo.serve.launch import with_echo_defaults

    head = shipped_head(smollm2_dir, "eagle3")
    served = with_echo_defaults(ServerOptions(smollm2_dir, spec="echo", draft_path=head), "cpu")
    srv = launch_test_server(
        SERVER_PORTS,
        "echo-guard",
        model_path=smollm2_dir,
        spec="echo",
        draft_path=head,
        dtype=SERVER_DTYPE,
        extra_env=served.extra_env,
    )
    try:
        yield srv
    finally:
        srv.stop()


def post(srv: SGLangServer, case: Case) -> requests.Response:
    return requests.post(srv.url(case.path), data=case.dumps(), headers=JSON, timeout=TIMEOUT)


def strings(value) -> str:
    """Every string in a decoded JSON answer, joined (error messages sit at different depths)."""
    if isinstance(value, dict):
        return "\n".join(strings(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(strings(v) for v in value)
    return value if isinstance(value, str) else ""


def assert_rejected(srv: SGLangServer, case: Case, needle: str) -> None:
    """A 400 whose message contains ``needle``."""
    r = post(srv, case)
    assert r.status_code == 400, (case, r.status_code, r.text[:300])
    assert needle in strings(r.json()), (case, r.text[:300])


def greedy(srv: SGLangServer, **prompt) -> list[int]:
    return generate(srv.base_url, max_new_tokens=8, timeout=TIMEOUT, **prompt).output_ids


def assert_healthy(srv: SGLangServer) -> None:
    assert srv.alive(), "the server died"
    assert requests.get(srv.url("/health"), timeout=TIMEOUT).status_code == 200


def hostile_id_cases(vocab: int, bad: int, *, tokenizer: bool) -> list[tuple[Case, str]]:
    """The issue's request and its twins on every endpoint that carries ids, with the field the
    answer must name."""
    ids = [1, bad, 2]
    where = f"= {bad} is outside the vocabulary [0, {vocab})"
    params = {"max_new_tokens": 4}
    cases = [
        (Case("/generate", {"input_ids": ids, "sampling_params": params}), f"input_ids[1] {where}"),
        (Case("/generate", {"input_ids": [[5, 6], ids], "sampling_params": params}), f"input_ids[1] {where}"),
        (
            Case("/generate", {"input_ids": [3, 4], "sampling_params": {**params, "stop_token_ids": [bad]}}),
            f"sampling_params.stop_token_ids[0] {where}",
        ),
    ]
    if tokenizer:  # the OpenAI endpoints need the tokenizer (chat template, detokenized text)
        chat = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        cases += [
            (Case("/v1/completions", {"model": "default", "prompt": ids, "max_tokens": 4}), f"input_ids[1] {where}"),
            (
                Case("/v1/completions", {"model": "default", "prompt": [[7], ids], "max_tokens": 4}),
                f"input_ids[1] {where}",
            ),
            (Case("/v1/chat/completions", {**chat, "input_ids": ids}), f"input_ids[1] {where}"),
        ]
    return cases


def test_hostile_ids_without_tokenizer(smollm2_dir: Path, vocab: int) -> None:
    """``--skip-tokenizer-init``: the vocabulary still comes from the served model's config."""
    srv = launch_test_server(
        SERVER_PORTS, "plain-no-tokenizer", model_path=smollm2_dir, dtype=SERVER_DTYPE, skip_tokenizer_init=True
    )
    try:
        check_hostile_ids(srv, vocab, tokenizer=False)
        assert_rejected(
            srv,
            Case(
                "/generate",
                {"input_ids": [1, 2], "return_logprob": True, "top_logprobs_num": vocab + 1, "sampling_params": {}},
            ),
            f"top_logprobs_num (OpenAI: logprobs / top_logprobs) = {vocab + 1} must be in [0, {vocab}]",
        )
    finally:
        srv.stop()


def check_hostile_ids(srv: SGLangServer, vocab: int, *, tokenizer: bool) -> None:
    """Every hostile id on every endpoint is a 400 naming it; the server then answers as before."""
    prompt = {"text": REFERENCE_PROMPT} if tokenizer else {"input_ids": [504, 3575, 282, 4649, 314]}
    before = greedy(srv, **prompt)
    for bad in (-3, vocab, 2**40):
        for case, needle in hostile_id_cases(vocab, bad, tokenizer=tokenizer):
            assert_rejected(srv, case, needle)
    assert_healthy(srv)
    assert greedy(srv, **prompt) == before


@pytest.mark.parametrize("name", ["plain", "echo"])
def test_hostile_ids(name: str, request: pytest.FixtureRequest, vocab: int) -> None:
    check_hostile_ids(request.getfixturevalue(name), vocab, tokenizer=True)


def killers(vocab: int) -> list[tuple[Case, str]]:
    """What the fuzzer found beyond token ids: each killed an unguarded server (or got a 500)."""
    gen = {"max_new_tokens": 4}
    chat = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return [
        (Case("/generate", {"text": "", "sampling_params": gen}), "the prompt is empty"),
        (
            Case(
                "/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 10**6, "sampling_params": gen}
            ),
            f"top_logprobs_num (OpenAI: logprobs / top_logprobs) = 1000000 must be in [0, {vocab}]",
        ),
        (Case("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 10**5}), "top_logprobs_num"),
        (
            Case("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 4, "logprobs": 10**5}),
            "top_logprobs_num",
        ),
        (
            Case("/generate", {"text": "hi", "sampling_params": {**gen, "min_new_tokens": 2, "stop_token_ids": [-5]}}),
            "sampling_params.stop_token_ids[0] = -5",
        ),
        (
            Case("/generate", {"text": "hi", "sampling_params": {**gen, "top_k": 2**40}}),
            f"sampling_params.top_k (-1: all) = {2**40} must be in [1, 2147483647]",
        ),
        (
            Case("/generate", {"text": "hi", "positional_embed_overrides": {"a": 1}, "sampling_params": gen}),
            (
                "positional_embed_overrides must be a PositionalEmbeds object (Engine API); a request cannot carry it "
                "as an object"
            ),
        ),
        (
            Case("/generate", {"input_ids": [[1], [2]], "positional_embed_overrides": [], "sampling_params": gen}),
            "positional_embed_overrides has 0 entries, not one per prompt of a batch of 2",
        ),
        (
            Case("/generate", {"input_ids": [[1], [2]], "top_logprobs_num": [1], "sampling_params": gen}),
            "top_logprobs_num has 1 entries, not one per prompt of a batch of 2",
        ),
        (
            Case("/generate", {"input_ids": [1, 2], "sampling_params": [gen]}),
            "sampling_params must not be a list for a single prompt, got an array",
        ),
        (
            Case("/generate", {"input_ids": [1, 2], "lora_path": [], "sampling_params": {**gen, "n": 2}}),
            "lora_path must not be a list for a single prompt",
        ),
        (
            Case(
                "/v1/completions",
                {"model": "default", "prompt": "hi", "max_tokens": 4, "top_p": 0.3, "logit_bias": {"5": 1e308}},
            ),
            "sampling_params.logit_bias['5'] = 1e+308 must be a number in [-100, 100]",
        ),
        (Case("/generate", {"text": "hi", "sampling_params": {**gen, "n": 10**9}}), "sampling_params.n = 1000000000"),
        (
            Case("/generate", {"text": "hi", "session_params": {"+": {}}, "sampling_params": gen}),
            "session_params has unknown field(s) ['+']",
        ),
        (
            Case("/generate", {"text": "hi", "sampling_params": {**gen, "ebnf": 'root ::= root "a"'}}),
            "the grammar admits no output",
        ),
        (
            Case("/generate", {"text": "hi", "sampling_params": {**gen, "stop_regex": "\\p{Lu}+"}}),
            "sampling_params.stop_regex = '\\\\p{Lu}+' is not a valid regular expression: bad escape \\p",
        ),
        (
            Case("/generate", {"text": "hi", "sampling_params": {**gen, "n": None}}),
            "sampling_params.n must be an integer, got null",
        ),
        (Case("/v1/chat/completions", [chat]), "the request body must be a JSON object, got an array"),
        (Case("/v1/chat/completions", {**chat, "response_format": [1]}), "response_format must be a JSON object"),
    ]


@pytest.mark.parametrize("name", ["plain", "echo"])
def test_the_other_killers_are_400s(name: str, request: pytest.FixtureRequest, vocab: int) -> None:
    srv: SGLangServer = request.getfixturevalue(name)
    for case, needle in killers(vocab):
        assert_rejected(srv, case, needle)
    assert_healthy(srv)


def fuzz(srv: SGLangServer, vocab: int) -> Counter:
    """Send :data:`FUZZ_EXAMPLES` hostile requests (no more than :data:`FUZZ_SECONDS` of them);
    every answer must be 2xx or 4xx and the server must survive each. Returns the status counts."""
    seen: Counter = Counter()
    stop_at = time.monotonic() + FUZZ_SECONDS
    sent: list[Case] = []  # a crash can surface on the request after the one that caused it

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=FUZZ_SEED is None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    @given(case=hostile_requests(vocab))
    def one(case: Case) -> None:
        if time.monotonic() > stop_at:
            return
        sent.append(case)
        try:
            r = post(srv, case)
            _ = r.content  # a stream the server drops raises here
        except requests.RequestException as e:
            last = "\n".join(f"  {c.path} {c.dumps()[:300]}" for c in sent[-3:])
            pytest.fail(f"no answer ({e!r}; server alive: {srv.alive()}) to the last of:\n{last}")
        seen[(case.path, r.status_code // 100)] += 1
        assert r.status_code < 500, (case.path, case.dumps()[:400], r.status_code, r.text[:300])
        assert srv.alive(), f"the server died after {case.path} {case.dumps()[:400]}"

    if FUZZ_SEED is not None:
        one = hypothesis_seed(int(FUZZ_SEED))(one)
    one()
    return seen


@pytest.mark.parametrize("name", ["plain", "echo"])
def test_fuzzed_requests_never_kill_the_server(name: str, request: pytest.FixtureRequest, vocab: int) -> None:
    srv: SGLangServer = request.getfixturevalue(name)
    before = greedy(srv, text=REFERENCE_PROMPT)
    t0 = time.monotonic()
    seen = fuzz(srv, vocab)
    took = time.monotonic() - t0
    print(f"\n[fuzz {name}] {sum(seen.values())} requests in {took:.0f}s: {dict(sorted(seen.items()))}")
    assert_healthy(srv)
    assert greedy(srv, text=REFERENCE_PROMPT) == before
    # The strategies reach both sides of the guard (a fuzzer that only sends junk proves nothing).
    assert sum(n for (_, cls), n in seen.items() if cls == 2) >= 5, seen
    assert sum(n for (_, cls), n in seen.items() if cls == 4) >= 5, seen
