"""A battery of hostile requests, and how a server answered one: what a soak mixes into its traffic.

Every case is ``(name, method, path, body bytes)``, sent as written (``Content-Type:
application/json`` whatever the bytes are): malformed and truncated JSON, wrong types,
out-of-range lengths and sampling values, a prompt past the context, invalid UTF-8, broken
grammars, nesting past any JSON parser's depth limit, token ids outside the vocabulary, empty
prompts, oversized logprobs, and a streaming request whose client hangs up after the first chunk.

A server that validates its input answers each of them with a 4xx (the disconnecting client's
stream starts with a 200, and its server must carry on); a 5xx, a dropped connection or no
answer within the timeout is a failure, because one such request among thousands of users' is
enough to take a whole server down. Bodies depend on the served model only through
:class:`ServedModel` (its name, vocabulary size and context length), so a case means what its
name says for the model being soaked.

No locust here: the locustfile sends these from its users (``http.client`` over gevent's sockets),
tests send them from plain threads.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "*/*"}
SMOLLM2_VOCAB = 49152  # what `make serve` serves; a soak reads the served model's own where it can
NESTING = 100_000  # arrays inside arrays: past orjson's limit (1024) and Python's recursion limit
DISCONNECT_TOKENS = 256  # long enough that the stream is still running when the client hangs up


class Outcome(StrEnum):
    """How a hostile request was answered."""

    REJECTED = "rejected"  # 4xx: what a case expects
    ACCEPTED = "accepted"  # 2xx (a disconnect case: its stream started, then the client hung up)
    SERVER_ERROR = "server_error"  # 5xx
    CONNECTION = "connection"  # refused, reset, or closed without a status line
    TIMEOUT = "timeout"  # no answer within the timeout

    @property
    def failed(self) -> bool:
        """A 5xx, a dropped connection or a timeout: the server broke, whatever the request."""
        return self in (Outcome.SERVER_ERROR, Outcome.CONNECTION, Outcome.TIMEOUT)


@dataclass(frozen=True)
class ServedModel:
    """What the hostile bodies depend on: the name requests carry, the vocabulary ids must be in
    (``[0, vocab_size)``), and the context a prompt must fit."""

    name: str
    vocab_size: int = SMOLLM2_VOCAB
    context_len: int = 8192


@dataclass(frozen=True)
class HostileCase:
    """One hostile request. ``disconnect``: a valid streaming request whose client closes the
    connection after the first chunk, expected to start with a 200; every other case expects a 4xx."""

    name: str
    method: str
    path: str
    body: bytes
    disconnect: bool = False

    @property
    def expected(self) -> Outcome:
        return Outcome.ACCEPTED if self.disconnect else Outcome.REJECTED

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "body": self.body.decode("latin-1")}, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> HostileCase:
        data = json.loads(line)
        return cls(**{**data, "body": data["body"].encode("latin-1")})


@dataclass(frozen=True)
class HostileSample:
    """One hostile request sent: a line of a soak's hostile samples file."""

    name: str
    start: float  # wall clock (epoch seconds)
    latency_s: float
    status: int  # HTTP status; 0 where none came
    outcome: str  # an Outcome
    expected: str  # the case's expected Outcome

    @property
    def failed(self) -> bool:
        return Outcome(self.outcome).failed

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> HostileSample:
        return cls(**json.loads(line))


def _dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


def _over_context(context_len: int) -> str:
    """More words than the context has tokens; each space-separated word is at least one token."""
    return " ".join(["hello"] * (context_len + 64))


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def battery(model: ServedModel) -> list[HostileCase]:
    """The cases, each once, in a fixed order (names are unique)."""
    m, vocab = model.name, model.vocab_size
    chat = {"model": m, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    comp = {"model": m, "prompt": "Say hi.", "max_tokens": 4}
    gen = {"text": "Say hi.", "sampling_params": {"max_new_tokens": 4}}
    valid_chat = json.dumps(chat)
    post = [
        # --- not JSON, or not the JSON the route takes
        ("truncated-json", "/v1/chat/completions", valid_chat[: len(valid_chat) // 2].encode()),
        ("not-json", "/v1/completions", b"max_tokens=4&prompt=hi"),
        ("empty-body", "/v1/chat/completions", b""),
        ("array-body", "/v1/chat/completions", _dumps([chat])),
        (
            "invalid-utf8",
            "/v1/completions",
            b'{"model": ' + _dumps(m) + b', "prompt": "Say \xff\xfe hi \xc3\x28.", "max_tokens": 4}',
        ),
        (
            "deeply-nested-json",
            "/v1/chat/completions",
            _dumps(chat)[:-1] + b', "messages_extra": ' + _nested(NESTING) + b"}",
        ),
        # --- wrong types
        ("messages-as-string", "/v1/chat/completions", _dumps({**chat, "messages": "Say hi."})),
        ("max-tokens-as-string", "/v1/completions", _dumps({**comp, "max_tokens": "ten"})),
        ("prompt-as-object", "/v1/completions", _dumps({**comp, "prompt": {"text": "hi"}})),
        ("temperature-as-list", "/v1/chat/completions", _dumps({**chat, "temperature": [0.5]})),
        # --- lengths
        ("max-tokens-negative", "/v1/completions", _dumps({**comp, "max_tokens": -1})),
        ("max-tokens-huge", "/v1/chat/completions", _dumps({**chat, "max_tokens": 2**40})),
        ("max-tokens-fractional", "/v1/completions", _dumps({**comp, "max_tokens": 2.5})),
        ("prompt-over-context", "/v1/completions", _dumps({**comp, "prompt": _over_context(model.context_len)})),
        ("empty-prompt-generate", "/generate", _dumps({**gen, "text": ""})),
        ("empty-prompt-completions", "/v1/completions", _dumps({**comp, "prompt": ""})),
        ("empty-messages", "/v1/chat/completions", _dumps({**chat, "messages": []})),
        # --- sampling values
        ("temperature-negative", "/v1/chat/completions", _dumps({**chat, "temperature": -1})),
        ("top-p-over-one", "/v1/completions", _dumps({**comp, "top_p": 2})),
        ("top-k-negative", "/v1/chat/completions", _dumps({**chat, "top_k": -5})),
        ("top-k-past-int32", "/generate", _dumps({**gen, "sampling_params": {"max_new_tokens": 4, "top_k": 2**40}})),
        ("n-huge", "/v1/completions", _dumps({**comp, "n": 10_000})),
        ("frequency-penalty-out-of-range", "/v1/chat/completions", _dumps({**chat, "frequency_penalty": 5})),
        ("logit-bias-infinite", "/v1/completions", _dumps({**comp, "logit_bias": {"5": 1e308}})),
        # --- structured output
        ("broken-regex", "/v1/completions", _dumps({**comp, "regex": "(unclosed"})),
        (
            "broken-json-schema",
            "/v1/chat/completions",
            _dumps(
                {
                    **chat,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                    },
                }
            ),
        ),
        (
            "grammar-without-base-case",
            "/generate",
            _dumps({**gen, "sampling_params": {"max_new_tokens": 4, "ebnf": 'root ::= root "a"'}}),
        ),
        # --- token ids
        ("ids-negative", "/generate", _dumps({"input_ids": [1, -3, 2], "sampling_params": {"max_new_tokens": 4}})),
        ("ids-at-vocab-size", "/generate", _dumps({"input_ids": [vocab], "sampling_params": {"max_new_tokens": 4}})),
        ("ids-2-pow-40", "/generate", _dumps({"input_ids": [2**40], "sampling_params": {"max_new_tokens": 4}})),
        ("prompt-ids-out-of-vocab", "/v1/completions", _dumps({**comp, "prompt": [1, vocab + 7, 2]})),
        (
            "stop-token-id-out-of-vocab",
            "/generate",
            _dumps({**gen, "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 2, "stop_token_ids": [vocab]}}),
        ),
        # --- logprobs
        ("logprobs-oversized", "/v1/completions", _dumps({**comp, "logprobs": 100_000})),
        ("top-logprobs-oversized", "/v1/chat/completions", _dumps({**chat, "logprobs": True, "top_logprobs": 100_000})),
        (
            "top-logprobs-num-oversized",
            "/generate",
            _dumps({**gen, "return_logprob": True, "top_logprobs_num": 10 * vocab}),
        ),
    ]
    cases = [HostileCase(name, "POST", path, body) for name, path, body in post]
    cases.append(
        HostileCase(
            "disconnect-mid-stream",
            "POST",
            "/v1/chat/completions",
            _dumps({**chat, "max_tokens": DISCONNECT_TOKENS, "ignore_eos": True, "stream": True}),
            disconnect=True,
        )
    )
    return cases


def write_cases(cases: Iterable[HostileCase], path: Path) -> Path:
    path.write_text("".join(c.to_json() + "\n" for c in cases), encoding="utf-8")
    return path


def read_cases(path: Path) -> list[HostileCase]:
    return [HostileCase.from_json(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_hostile_samples(path: Path) -> list[HostileSample]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [HostileSample.from_json(line) for line in fh if line.strip()]


def _connection(host: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(host)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname or "", parts.port, timeout=timeout)


def _exchange(conn: http.client.HTTPConnection, case: HostileCase) -> int:
    """Send ``case``; its status, after reading the whole answer (or, for a disconnect case that
    got a 200, its first line only, the connection then closed by the caller)."""
    conn.request(case.method, case.path, body=case.body, headers=JSON_HEADERS)
    resp = conn.getresponse()
    if case.disconnect and resp.status == 200:
        resp.fp.readline()  # the stream has started; hang up in the middle of it
    else:
        resp.read()
    return resp.status


def send(host: str, case: HostileCase, timeout: float) -> HostileSample:
    """Send ``case`` to ``host`` on a connection of its own and classify the answer; never raises
    for what the server does (a refused, reset or silent connection is an outcome)."""
    start, t0 = time.time(), time.perf_counter()
    status = 0
    conn = _connection(host, timeout)
    try:
        status = _exchange(conn, case)
        outcome = Outcome.SERVER_ERROR if status >= 500 else Outcome.REJECTED if status >= 400 else Outcome.ACCEPTED
    except TimeoutError:  # socket.timeout is TimeoutError
        outcome = Outcome.TIMEOUT
    except (OSError, http.client.HTTPException):
        outcome = Outcome.CONNECTION
    finally:
        conn.close()
    return HostileSample(case.name, start, time.perf_counter() - t0, status, outcome.value, case.expected.value)
