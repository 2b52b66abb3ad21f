"""Minimal HTTP client for a running sglang server (tests and benchmarks).

Greedy comparisons use sglang's native /generate because it returns `output_ids`, i.e. token
ids rather than re-tokenised text, which is what "token for token" has to compare.
"""

from __future__ import annotations

import json
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
    r = requests.post(f"{base_url}/generate", json=body, timeout=timeout)
    r.raise_for_status()
    data = r.json()
    return Generation(list(data["output_ids"]), data["text"], data.get("meta_info", {}))


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
        payload = raw[len("data:"):].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
