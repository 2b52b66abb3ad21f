"""OpenAI-compatible and native endpoints of a real sglang server (no speculation)."""

from __future__ import annotations

import pytest
import requests

from sglang_echo.serve.client import generate, sse_events
from sglang_echo.serve.server import SGLangServer

from .conftest import LazyServer

pytestmark = pytest.mark.server
TIMEOUT = 300


@pytest.fixture(scope="module")
def srv(baseline: LazyServer) -> SGLangServer:
    return baseline.get()


def _model(srv: SGLangServer) -> str:
    return requests.get(srv.url("/v1/models"), timeout=30).json()["data"][0]["id"]


def _assert_still_healthy(srv: SGLangServer) -> None:
    assert srv.alive()
    assert requests.get(srv.url("/health"), timeout=60).status_code == 200
    g = generate(srv.base_url, text="1, 2, 3,", max_new_tokens=4)
    assert len(g.output_ids) >= 1


def test_health(srv: SGLangServer) -> None:
    r = requests.get(srv.url("/health"), timeout=60)
    assert r.status_code == 200


def test_completions(srv: SGLangServer) -> None:
    r = requests.post(
        srv.url("/v1/completions"),
        timeout=TIMEOUT,
        json={
            "model": _model(srv),
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"].strip()
    assert body["usage"]["completion_tokens"] <= 8


def test_completions_stream_matches_non_stream(srv: SGLangServer) -> None:
    req = {"model": _model(srv), "prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0}
    full = requests.post(srv.url("/v1/completions"), json=req, timeout=TIMEOUT).json()
    with requests.post(srv.url("/v1/completions"), json={**req, "stream": True}, stream=True, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = list(sse_events(r))
    assert len(chunks) > 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]


def test_chat_completions(srv: SGLangServer) -> None:
    r = requests.post(
        srv.url("/v1/chat/completions"),
        timeout=TIMEOUT,
        json={
            "model": _model(srv),
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].strip()


def test_chat_completions_stream_matches_non_stream(srv: SGLangServer) -> None:
    req = {
        "model": _model(srv),
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three colours."},
        ],
        "max_tokens": 16,
        "temperature": 0,
    }
    full = requests.post(srv.url("/v1/chat/completions"), json=req, timeout=TIMEOUT).json()
    with requests.post(
        srv.url("/v1/chat/completions"), json={**req, "stream": True}, stream=True, timeout=TIMEOUT
    ) as r:
        assert r.status_code == 200
        chunks = list(sse_events(r))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert len(chunks) > 1
    assert text == full["choices"][0]["message"]["content"]


def test_metrics(srv: SGLangServer) -> None:
    generate(srv.base_url, text="Hello", max_new_tokens=2)  # make sure counters moved
    r = requests.get(srv.url("/metrics"), timeout=60)
    assert r.status_code == 200
    assert "sglang:" in r.text
    assert "sglang:prompt_tokens_total" in r.text or "sglang:num_requests_total" in r.text


def test_malformed_json_is_4xx(srv: SGLangServer) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        r = requests.post(
            srv.url(path),
            data=b'{"prompt": "hi", "max_tokens": ',
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:300])
    _assert_still_healthy(srv)


def test_negative_max_tokens_is_4xx(srv: SGLangServer) -> None:
    r = requests.post(
        srv.url("/v1/completions"), timeout=60, json={"model": _model(srv), "prompt": "hi", "max_tokens": -5}
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    r = requests.post(
        srv.url("/v1/chat/completions"),
        timeout=60,
        json={"model": _model(srv), "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    _assert_still_healthy(srv)


def test_over_long_prompt_is_4xx(srv: SGLangServer) -> None:
    info = requests.get(srv.url("/model_info"), timeout=60).json()
    ctx = int(info.get("max_context_length") or info.get("context_length") or 8192)
    prompt = "hello " * (ctx + 500)  # one token per word for this tokenizer, > context
    r = requests.post(
        srv.url("/v1/completions"),
        timeout=TIMEOUT,
        json={"model": _model(srv), "prompt": prompt, "max_tokens": 4, "temperature": 0},
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert any(w in r.text.lower() for w in ("context", "length", "too long", "exceed")), r.text[:300]
    _assert_still_healthy(srv)
