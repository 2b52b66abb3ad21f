"""One benchmark request to one server, streamed or not, and what came back (:class:`Outcome`).

sglang's native ``/generate`` (:mod:`sglang_echo.serve.client`) answers with output token ids and
``meta_info`` (completion tokens, verify steps, ECHO's per-token records). An OpenAI-compatible
server is asked through ``/v1/completions`` (prompt text, or the token ids as its prompt list) and
answers with text and ``usage``; its outcome's ``meta`` holds the token counts only. Streaming
gives TTFT and ITLs (:func:`latency.stream_timing`); an OpenAI stream counts tokens from
``usage`` where the server reports it per chunk (``continuous_usage_stats``), else one per chunk.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..serve.client import generate, generate_stream, sse_events
from .latency import stream_timing
from .targets import Target
from .workload import PromptItem

TIMEOUT_S = 1800.0  # one request's limit: a deep queue at a high request rate waits long


@dataclass(frozen=True)
class Outcome:
    """A finished request: output ids (None from an OpenAI server), text, sglang's ``meta_info``
    (OpenAI: ``completion_tokens`` / ``prompt_tokens`` from ``usage``), end-to-end latency, and
    TTFT / ITLs in seconds when streamed (else None / [])."""

    output_ids: list[int] | None
    text: str
    meta: dict[str, Any]
    latency: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return int(self.meta.get("completion_tokens", len(self.output_ids or [])))


def same_outputs(outs: Sequence[Outcome], reference: Sequence[Outcome]) -> bool | None:
    """The lossless check of one level: every output equal to the reference's, by token ids where
    both servers give them, else by text where both give it (an OpenAI server against sglang's
    API); None where neither can be compared (ids from a server without a tokenizer beside text)."""
    if all(o.output_ids is not None for o in (*outs, *reference)):
        return [o.output_ids for o in outs] == [o.output_ids for o in reference]
    if all(o.text for o in (*outs, *reference)):
        return [o.text for o in outs] == [o.text for o in reference]
    return None


def send(target: Target, item: PromptItem, max_new: int, stream: bool, ignore_eos: bool = False) -> Outcome:
    """Send ``item`` greedily for ``max_new`` tokens (``ignore_eos``: all of them) and wait for it."""
    extra = {"ignore_eos": True} if ignore_eos else {}
    if target.api == "openai":
        return _openai(target, item, max_new, stream, extra)
    prompt = {"input_ids": item.input_ids} if item.input_ids is not None else {"text": item.text}
    kwargs = dict(prompt, max_new_tokens=max_new, temperature=0.0, timeout=TIMEOUT_S, **extra)
    if stream:
        s = generate_stream(target.url, **kwargs)
        end = time.perf_counter()
        timing = stream_timing(s.start, s.chunk_times, s.chunk_tokens)
        g = s.generation
        return Outcome(g.output_ids, g.text, g.meta, end - s.start, timing.ttft, timing.itl)
    start = time.perf_counter()
    g = generate(target.url, **kwargs)
    return Outcome(g.output_ids, g.text, g.meta, time.perf_counter() - start)


def _openai(target: Target, item: PromptItem, max_new: int, stream: bool, extra: dict) -> Outcome:
    import requests

    body = {
        "model": target.model,
        "prompt": list(item.input_ids) if item.input_ids is not None else item.text,
        "max_tokens": max_new,
        "temperature": 0.0,
        "stream": stream,
        **extra,
    }
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    start = time.perf_counter()
    with requests.post(target.url + "/v1/completions", json=body, timeout=TIMEOUT_S, stream=stream) as r:
        r.raise_for_status()
        if not stream:
            data = r.json()
            return Outcome(None, data["choices"][0]["text"], _usage(data), time.perf_counter() - start)
        texts: list[str] = []
        times: list[float] = []
        counts: list[int] = []
        usage: dict[str, Any] = {}
        for chunk in sse_events(r):
            usage = _usage(chunk) or usage
            piece = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
            if piece:
                texts.append(piece)
                times.append(time.perf_counter())
                counts.append(usage.get("completion_tokens", (counts[-1] if counts else 0) + 1))
    end = time.perf_counter()
    timing = stream_timing(start, times, counts)
    meta = usage or {"completion_tokens": counts[-1] if counts else 0}
    return Outcome(None, "".join(texts), meta, end - start, timing.ttft, timing.itl)


def _usage(data: dict) -> dict[str, Any]:
    """``completion_tokens`` / ``prompt_tokens`` of an OpenAI response's ``usage`` ({} without)."""
    usage = data.get("usage") or {}
    return {k: int(usage[k]) for k in ("completion_tokens", "prompt_tokens") if usage.get(k) is not None}
