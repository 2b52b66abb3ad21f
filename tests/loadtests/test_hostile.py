"""loadtests/hostile.py: each case of the battery is the request its name says, and ``send``
tells the answers apart (4xx, 2xx, 5xx, a dropped connection, silence)."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest

from loadtests.hostile import (
    DISCONNECT_TOKENS,
    NESTING,
    SMOLLM2_VOCAB,
    Outcome,
    ServedModel,
    battery,
    read_cases,
    send,
    write_cases,
)

from .fake_openai import MODEL, FakeConfig, FakeOpenAI

SMOLLM2 = ServedModel("smollm2", SMOLLM2_VOCAB, 8192)
CASES = {c.name: c for c in battery(SMOLLM2)}
OPENAI_TOP_LOGPROBS = 20  # OpenAI's own bound on top_logprobs
MAX_PARALLEL_SAMPLES = 128  # OpenAI's bound on n


def body(name: str) -> Any:
    return json.loads(CASES[name].body)


def params(name: str) -> dict[str, Any]:
    """A case's sampling fields, wherever its route keeps them."""
    b = body(name)
    return b.get("sampling_params", b)


def out_of_vocab(ids: list[int], vocab: int = SMOLLM2_VOCAB) -> list[int]:
    return [i for i in ids if not 0 <= i < vocab]


def _not_json(name: str) -> bool:
    try:
        json.loads(CASES[name].body)
    except (ValueError, RecursionError):
        return True
    return False


def _truncated() -> bool:
    raw = CASES["truncated-json"].body
    return (
        _not_json("truncated-json")
        and len(raw) > 10
        and any(c.body.startswith(raw) and not _not_json(c.name) for c in CASES.values() if c.name != "truncated-json")
    )


def _invalid_utf8() -> bool:
    raw = CASES["invalid-utf8"].body
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:  # and the bytes are the only defect: replaced, it is a whole request
        return set(json.loads(raw.decode("utf-8", errors="replace"))) >= {"model", "prompt", "max_tokens"}
    return False


def _deeply_nested() -> bool:
    raw = CASES["deeply-nested-json"].body
    with pytest.raises(RecursionError):
        json.loads(raw)
    return raw.count(b"[") >= NESTING > 1024  # 1024: orjson's limit, what sglang parses with


def _broken_schema() -> bool:
    schema = body("broken-json-schema")["response_format"]["json_schema"]["schema"]
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.Draft202012Validator.check_schema(schema)
    return True


def _broken_regex() -> bool:
    with pytest.raises(re.error):
        re.compile(body("broken-regex")["regex"])
    return True


def _no_base_case() -> bool:
    """The grammar's only rule derives itself in every alternative: no finite string derives."""
    (rule,) = params("grammar-without-base-case")["ebnf"].splitlines()
    name, rhs = (s.strip() for s in rule.split("::="))
    return all(name in alternative.split() for alternative in rhs.split("|"))


def _disconnect() -> bool:
    case = CASES["disconnect-mid-stream"]
    b = json.loads(case.body)
    return case.disconnect and b["stream"] and b["max_tokens"] >= DISCONNECT_TOKENS and b["ignore_eos"]


CLAIMS: dict[str, Callable[[], bool]] = {
    "truncated-json": _truncated,
    "not-json": lambda: _not_json("not-json"),
    "empty-body": lambda: CASES["empty-body"].body == b"",
    "array-body": lambda: isinstance(body("array-body"), list),
    "invalid-utf8": _invalid_utf8,
    "deeply-nested-json": _deeply_nested,
    "messages-as-string": lambda: isinstance(body("messages-as-string")["messages"], str),
    "max-tokens-as-string": lambda: isinstance(body("max-tokens-as-string")["max_tokens"], str),
    "prompt-as-object": lambda: isinstance(body("prompt-as-object")["prompt"], dict),
    "temperature-as-list": lambda: isinstance(body("temperature-as-list")["temperature"], list),
    "max-tokens-negative": lambda: body("max-tokens-negative")["max_tokens"] < 0,
    "max-tokens-huge": lambda: body("max-tokens-huge")["max_tokens"] > 2**32,
    "max-tokens-fractional": lambda: not float(body("max-tokens-fractional")["max_tokens"]).is_integer(),
    # every space-separated word is at least one token
    "prompt-over-context": lambda: len(body("prompt-over-context")["prompt"].split()) > SMOLLM2.context_len,
    "empty-prompt-generate": lambda: body("empty-prompt-generate")["text"] == "",
    "empty-prompt-completions": lambda: body("empty-prompt-completions")["prompt"] == "",
    "empty-messages": lambda: body("empty-messages")["messages"] == [],
    "temperature-negative": lambda: body("temperature-negative")["temperature"] < 0,
    "top-p-over-one": lambda: body("top-p-over-one")["top_p"] > 1,
    "top-k-negative": lambda: body("top-k-negative")["top_k"] < -1,  # -1 means "all"
    "top-k-past-int32": lambda: params("top-k-past-int32")["top_k"] > 2**31 - 1,
    "n-huge": lambda: body("n-huge")["n"] > MAX_PARALLEL_SAMPLES,
    "frequency-penalty-out-of-range": lambda: abs(body("frequency-penalty-out-of-range")["frequency_penalty"]) > 2,
    "logit-bias-infinite": lambda: all(abs(v) > 100 for v in body("logit-bias-infinite")["logit_bias"].values()),
    "broken-regex": _broken_regex,
    "broken-json-schema": _broken_schema,
    "grammar-without-base-case": _no_base_case,
    "ids-negative": lambda: body("ids-negative")["input_ids"] == [1, -3, 2],
    "ids-at-vocab-size": lambda: body("ids-at-vocab-size")["input_ids"] == [49152],
    "ids-2-pow-40": lambda: body("ids-2-pow-40")["input_ids"] == [2**40],
    "prompt-ids-out-of-vocab": lambda: len(out_of_vocab(body("prompt-ids-out-of-vocab")["prompt"])) == 1,
    "stop-token-id-out-of-vocab": lambda: out_of_vocab(params("stop-token-id-out-of-vocab")["stop_token_ids"]) != [],
    "logprobs-oversized": lambda: body("logprobs-oversized")["logprobs"] > SMOLLM2_VOCAB,
    "top-logprobs-oversized": lambda: body("top-logprobs-oversized")["top_logprobs"] > OPENAI_TOP_LOGPROBS,
    "top-logprobs-num-oversized": lambda: body("top-logprobs-num-oversized")["top_logprobs_num"] > SMOLLM2_VOCAB,
    "disconnect-mid-stream": _disconnect,
}


def test_every_case_has_a_claim_and_names_are_unique() -> None:
    names = [c.name for c in battery(SMOLLM2)]
    assert len(names) == len(set(names)) == len(CASES)
    assert set(names) == set(CLAIMS)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_each_case_is_what_its_name_says(name: str) -> None:
    assert CLAIMS[name]()


def test_the_out_of_vocabulary_ids_are_out_of_smollm2s_vocabulary() -> None:
    for name in ("ids-negative", "ids-at-vocab-size", "ids-2-pow-40"):
        assert out_of_vocab(body(name)["input_ids"]), name
    assert SMOLLM2_VOCAB == 49152  # SmolLM2-135M-Instruct's config.json (the real server test reads it)


def test_valid_looking_cases_are_valid_but_for_their_defect() -> None:
    """The cases carry the served model's name and a small max_tokens, so that a server that
    ran one by mistake would answer soon rather than generate for minutes."""
    for case in CASES.values():
        if not _not_json(case.name) and isinstance(b := json.loads(case.body), dict) and "model" in b:
            assert b["model"] == SMOLLM2.name, case.name
    assert all(
        c.method == "POST" and c.path in ("/generate", "/v1/completions", "/v1/chat/completions")
        for c in CASES.values()
    )
    assert [c.name for c in CASES.values() if c.expected is Outcome.ACCEPTED] == ["disconnect-mid-stream"]


def test_the_model_decides_the_limits() -> None:
    big = {c.name: c for c in battery(ServedModel("m", vocab_size=100_000, context_len=100))}
    assert json.loads(big["ids-at-vocab-size"].body)["input_ids"] == [100_000]
    assert len(json.loads(big["prompt-over-context"].body)["prompt"].split()) > 100
    assert len(big["prompt-over-context"].body) < len(CASES["prompt-over-context"].body)


def test_cases_survive_their_file(tmp_path) -> None:
    path = write_cases(CASES.values(), tmp_path / "cases.jsonl")
    assert read_cases(path) == list(CASES.values())  # invalid UTF-8 bytes included


# --- send ----------------------------------------------------------------------------------------


def test_send_classifies_a_fakes_answers() -> None:
    refused = CASES["ids-negative"]
    for status, outcome in ((400, Outcome.REJECTED), (500, Outcome.SERVER_ERROR)):
        with FakeOpenAI(FakeConfig(refuse=frozenset({refused.body}), refuse_status=status)) as fake:
            got = send(fake.url, refused, timeout=10)
        assert (got.status, got.outcome, got.expected, got.failed) == (
            status,
            outcome,
            "rejected",
            outcome is Outcome.SERVER_ERROR,
        )
        assert fake.refused == 1


def test_send_hangs_up_in_the_middle_of_a_stream() -> None:
    case = battery(ServedModel(MODEL))[-1]
    with FakeOpenAI(FakeConfig(token_delay_s=0.05)) as fake:
        got = send(fake.url, case, timeout=10)
    # The fake would take 256 x 50 ms to stream the whole answer; the client left at the first line.
    assert (got.status, got.outcome, got.failed) == (200, "accepted", False)
    assert got.latency_s < 5.0 and fake.served == 1


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A TCP server that treats each connection with a given function; yields a starter -> URL."""
    listeners: list[socket.socket] = []

    def start(handle: Callable[[socket.socket], None]) -> str:
        srv = socket.create_server(("127.0.0.1", 0))
        listeners.append(srv)

        def serve() -> None:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                handle(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{srv.getsockname()[1]}"

    yield start
    for srv in listeners:
        srv.close()


def test_send_counts_a_dropped_connection_and_silence_as_failures(raw_server) -> None:
    case = CASES["n-huge"]
    dropped = send(raw_server(lambda conn: conn.recv(65536)), case, timeout=10)  # read, then close: no answer
    assert (dropped.status, dropped.outcome, dropped.failed) == (0, "connection", True)
    gate = threading.Event()
    silent = send(raw_server(lambda conn: gate.wait(10)), case, timeout=0.5)
    gate.set()
    assert (silent.status, silent.outcome, silent.failed) == (0, "timeout", True)
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert send(f"http://127.0.0.1:{port}", case, timeout=5).outcome == "connection"
