"""Minimal HTTP client for a running sglang server (tests and benchmarks).

Greedy comparisons use sglang's native /generate because it returns `output_ids`, i.e. token
ids rather than re-tokenised text, which is what "token for token" has to compare.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    text: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def finish_reason(self) -> str | None:
        fr = self.meta.get("finish_reason") or {}
        return fr.get("type") if isinstance(fr, dict) else fr


def generate(
    base_url: str,
    *,
    input_ids: Sequence[int] | None = None,
    text: str | None = None,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    timeout: float = 300.0,
    rid: str | None = None,
    **sampling: Any,
) -> Generation:
    body = _generate_body(input_ids, text, max_new_tokens, temperature, rid, **sampling)
    r = requests.post(f"{base_url}/generate", json=body, timeout=timeout)
    r.raise_for_status()
    data = r.json()
    # a server started with --skip-tokenizer-init answers with ids only
    return Generation(list(data["output_ids"]), data.get("text") or "", data.get("meta_info", {}))


def _generate_body(
    input_ids: Sequence[int] | None = None,
    text: str | None = None,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    rid: str | None = None,
    **sampling: Any,
) -> dict[str, Any]:
    if (input_ids is None) == (text is None):
        raise ValueError("pass exactly one of input_ids / text")
    body: dict[str, Any] = {
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature, **sampling}
    }
    if input_ids is not None:
        body["input_ids"] = list(input_ids)
    else:
        body["text"] = text
    if rid is not None:  # the request's id in the server (its logs, metrics and probe samples)
        body["rid"] = rid
    return body


@dataclass(frozen=True)
class StreamedGeneration:
    """A streamed generation and when its tokens arrived: ``chunk_times[i]`` (``time.perf_counter``)
    is when chunk ``i`` was read, ``chunk_tokens[i]`` the output tokens received by then; ``start``
    is when the request was sent."""

    generation: Generation
    start: float
    chunk_times: list[float]
    chunk_tokens: list[int]


def generate_stream(base_url: str, *, timeout: float = 300.0, **request: Any) -> StreamedGeneration:
    """:func:`generate` (``request``: its keyword arguments) through sglang's streaming ``/generate``
    (``stream: true``).

    sglang sends each chunk's ``output_ids`` either cumulatively (its default) or as the increment
    (``--incremental-streaming-output``, which also slices list-valued ``meta_info`` fields per
    chunk); ``meta_info["completion_tokens"]`` counts the whole output in both, which tells them
    apart, so the result is the whole output either way."""
    body = _generate_body(**request) | {"stream": True}
    ids: list[int] = []
    texts: list[str] = []
    meta: dict[str, Any] = {}
    times: list[float] = []
    counts: list[int] = []
    start = time.perf_counter()
    with requests.post(f"{base_url}/generate", json=body, timeout=timeout, stream=True) as r:
        r.raise_for_status()
        for chunk in sse_events(r):
            if "error" in chunk:
                raise RuntimeError(f"{base_url}/generate: {chunk['error']}")
            delta, chunk_meta = list(chunk.get("output_ids") or []), chunk.get("meta_info") or {}
            total = int(chunk_meta.get("completion_tokens", len(delta)))  # without a count: cumulative
            if len(delta) < total:  # incremental
                ids.extend(delta)
                texts.append(chunk.get("text") or "")
                meta = _merge_meta(meta, chunk_meta)
            else:
                ids, texts, meta = delta, [chunk.get("text") or ""], chunk_meta
            times.append(time.perf_counter())
            counts.append(total)
    return StreamedGeneration(Generation(ids, "".join(texts), meta), start, times, counts)


def _merge_meta(meta: dict[str, Any], chunk: dict[str, Any]) -> dict[str, Any]:
    """An incremental chunk's ``meta_info`` over the earlier ones: list fields (per-token records
    such as ``echo_tree_depth``) are concatenated, the others replaced."""
    return {
        **meta,
        **chunk,
        **{k: meta[k] + v for k, v in chunk.items() if isinstance(v, list) and isinstance(meta.get(k), list)},
    }


def generate_many(
    base_url: str,
    inputs: Sequence[Sequence[int]],
    *,
    workers: int = 8,
    **kwargs: Any,
) -> list[Generation]:
    """Greedy-generate for many tokenised prompts concurrently (order preserved)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(generate, base_url, input_ids=ids, **kwargs) for ids in inputs]
        return [f.result() for f in futs]


def sse_events(resp: requests.Response) -> Iterator[dict[str, Any]]:
    """Parse an OpenAI-style `text/event-stream` response into JSON chunks (until [DONE])."""
    for raw in resp.iter_lines(chunk_size=None, decode_unicode=True):  # each chunk as it arrives
        if not raw or not raw.startswith("data:"):
            continue
        payload = raw[len("data:") :].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
