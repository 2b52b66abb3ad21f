"""What one OpenAI request measured, read from its response; no locust (the runner imports this).

Token counts come from the response's ``usage`` rather than from counting chunks: with
speculative decoding one SSE chunk can carry several accepted tokens, so chunks undercount.
Streaming requests ask for that usage with ``stream_options.include_usage``; a server that
ignores the option falls back to one token per content chunk.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

Clock = Callable[[], float]

# Error kinds besides "http_<status>". Requests killed by the level's time limit are not errors:
# they never finish, so they are not samples at all.
CONNECTION = "connection"  # refused, reset, or dropped before/while the response was read
TIMEOUT = "timeout"
MALFORMED_SSE = "malformed_sse"  # undecodable chunk, or the stream ended without [DONE]
STREAM_ERROR = "stream_error"  # the server reported an error inside a 200 stream
MALFORMED_JSON = "malformed_json"  # a non-streaming 200 body that is not a completion


@dataclass(frozen=True)
class Measured:
    """What a response body yielded; timings in seconds from the request's start."""

    output_tokens: int = 0
    ttft_s: float | None = None  # streaming only: until the first chunk with generated text
    tpot_s: float | None = None  # streaming only, and only with >= 2 tokens
    error: str | None = None


@dataclass(frozen=True)
class Sample:
    """One finished request: a line of a level's samples file."""

    endpoint: str  # "chat" or "completions"
    stream: bool
    start: float  # wall clock (epoch seconds): levels are windows of wall time
    latency_s: float
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def end(self) -> float:
        return self.start + self.latency_s

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Sample:
        return cls(**json.loads(line))


def read_samples(path: Path) -> list[Sample]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [Sample.from_json(line) for line in fh if line.strip()]


def exception_kind(exc: BaseException) -> str:
    # requests wraps a read timeout met while iterating a stream in a ConnectionError, so the
    # message is the only place that still says "timed out".
    if isinstance(exc, TimeoutError | requests.Timeout) or "timed out" in str(exc).lower():
        return TIMEOUT
    return CONNECTION


def _has_text(choice: dict[str, Any]) -> bool:
    """A completions choice carries ``text``; a chat choice a ``delta`` (the first one only
    the role, with empty content, which must not count as the first token)."""
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or delta.get("content") or delta.get("reasoning_content"))


def _sse_payloads(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The ``data:`` payloads of an event stream (other fields and keep-alives skipped)."""
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if line.startswith("data:"):
            yield line[len("data:") :].strip()


def measure_stream(lines: Iterable[bytes | str], t0: float, clock: Clock = time.perf_counter) -> Measured:
    """Read an OpenAI SSE stream to its end; ``t0`` is the request's start on ``clock``."""
    first = last = None
    text_chunks = 0
    usage_tokens: int | None = None
    try:
        for payload in _sse_payloads(lines):
            if payload == "[DONE]":
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                return Measured(error=MALFORMED_SSE)
            if not isinstance(chunk, dict):
                return Measured(error=MALFORMED_SSE)
            if "error" in chunk:
                return Measured(error=STREAM_ERROR)
            if isinstance(chunk.get("usage"), dict):
                usage_tokens = chunk["usage"].get("completion_tokens", usage_tokens)
            if any(_has_text(c) for c in chunk.get("choices") or ()):
                last = clock()
                first = first if first is not None else last
                text_chunks += 1
        else:  # no [DONE]: the server or a proxy cut the stream short
            return Measured(error=MALFORMED_SSE)
    except OSError as exc:  # requests' exceptions are OSErrors
        return Measured(error=exception_kind(exc))
    tokens = usage_tokens if usage_tokens is not None else text_chunks
    if first is None or last is None:
        return Measured(output_tokens=tokens)
    # Time per output token after the first, as in vLLM's and sglang's own benchmarks.
    tpot = (last - first) / (tokens - 1) if tokens >= 2 else None
    return Measured(output_tokens=tokens, ttft_s=first - t0, tpot_s=tpot)


def measure_json(body: bytes) -> Measured:
    """A non-streaming completion: only its token count (no first-token time exists)."""
    try:
        data = json.loads(body)
    except ValueError:
        return Measured(error=MALFORMED_JSON)
    if not isinstance(data, dict) or not data.get("choices"):
        return Measured(error=MALFORMED_JSON)
    usage = data.get("usage") or {}
    return Measured(output_tokens=int(usage.get("completion_tokens") or 0))
