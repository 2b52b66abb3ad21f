"""A stand-in for sglang's OpenAI endpoints: streams ``max_tokens`` one-word tokens with fixed
delays, and fails every ``fail_every``-th request in a chosen way, counting what it served so
tests can check the load test's own counts against it.

With ``native=True`` it also answers as sglang's own API does: ``/model_info`` and ``/generate``
(``text`` or ``input_ids``; streamed or not), whose output ids follow from the prompt (plus
``offset``: a server whose greedy outputs differ) and whose ``meta_info`` counts verify steps as
a speculative server committing ``accept_length`` tokens a step would (with ECHO's per-token
``echo_tree_depth``), streamed cumulatively as sglang does by default, or ``incremental``ly.
``metrics`` is served as ``/metrics`` (Prometheus text) where set.

For soaks: ``/health`` answers ``health_status``; a body that is not JSON is a 400, as is every body
in ``refuse`` (e.g. a hostile battery's), answered with ``refuse_status`` instead where set (500: a
server that breaks on them) and counted in ``refused``, not in ``served``."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MODEL = "fake-model"
# How a failing request fails: an HTTP status, a connection closed without a response, or a
# 200 response whose body is not what the API promises.
FAILURES = ("500", "400", "drop", "malformed")


@dataclass
class FakeConfig:
    first_token_delay_s: float = 0.05  # after the headers and the role-only chat chunk
    token_delay_s: float = 0.01
    fail_every: int = 0  # 0: never
    failure: str = "500"
    native: bool = False  # also sglang's /model_info and /generate
    accept_length: int = 1  # /generate: tokens per verify step and per streamed chunk
    offset: int = 0  # /generate: added to every output id
    incremental: bool = False  # /generate streams: each chunk's new ids and per-token records only
    metrics: str | None = None  # GET /metrics answers this where set
    model_path: str = "/fake/model"
    context_len: int = 2048  # /v1/models' max_model_len
    health_status: int = 200  # GET /health
    refuse: frozenset[bytes] = frozenset()  # request bodies answered with refuse_status
    refuse_status: int = 400


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # locust drops its keep-alive connections when a level ends: expected, not news


class FakeOpenAI:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.served = self.failed = self.flushes = self.refused = self.health_polls = 0
        self.bodies: list[dict[str, Any]] = []  # every generation request's JSON body, in arrival order
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def next_fails(self) -> bool:
        with self._lock:
            self.served += 1
            fails = bool(self.config.fail_every) and self.served % self.config.fail_every == 0
            self.failed += fails
            return fails


def _chunk(chat: bool, text: str | None, **extra: Any) -> dict[str, Any]:
    if text is None:
        return {"object": "chunk", "choices": [], **extra}
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    return {"object": "chunk", "choices": [choice], **extra}


def _handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 with chunked streams, as uvicorn serves sglang: a client that waits for a
        # buffer to fill rather than for each chunk would see late first tokens here too.
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:  # keep pytest output clean
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                card = {"id": MODEL, "max_model_len": fake.config.context_len}
                self._send(200, json.dumps({"data": [card]}).encode())
            elif self.path == "/health":
                with fake._lock:
                    fake.health_polls += 1
                self._send(fake.config.health_status, b"")
            elif self.path == "/model_info" and fake.config.native:
                self._send(200, json.dumps({"model_path": fake.config.model_path}).encode())
            elif self.path == "/metrics" and fake.config.metrics is not None:
                self._send(200, fake.config.metrics.encode(), "text/plain")
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if raw in fake.config.refuse:
                with fake._lock:
                    fake.refused += 1
                return self._send(fake.config.refuse_status, b'{"error": "refused"}')
            if self.path.startswith("/flush_cache"):  # sglang's, with a ?timeout= query
                fake.flushes += 1
                return self._send(200, b"Cache flushed.", "text/plain")
            native = self.path == "/generate" and fake.config.native
            if self.path not in ("/v1/chat/completions", "/v1/completions") and not native:
                return self._send(404, b"{}")
            try:
                req = json.loads(raw)
            except (ValueError, RecursionError):
                return self._send(400, b'{"error": "not JSON"}')
            with fake._lock:
                fake.bodies.append(req)
            chat = self.path == "/v1/chat/completions"
            failure = fake.config.failure if fake.next_fails() else None
            if failure == "drop":
                self.close_connection = True  # nothing sent: the client sees the connection close
                return None
            if failure in ("500", "400"):
                return self._send(int(failure), b'{"error": "injected"}')
            if native:
                return self._generate(req)
            if req.get("stream"):
                return self._stream(req, chat, malformed=failure == "malformed")
            # A whole generation's time, as a real server would take before answering.
            time.sleep(fake.config.first_token_delay_s + fake.config.token_delay_s * (req["max_tokens"] - 1))
            body = (
                b"{not json"
                if failure == "malformed"
                else json.dumps(
                    {
                        "choices": [{"index": 0, "text": "tok " * req["max_tokens"]}],
                        "usage": {"completion_tokens": req["max_tokens"], "prompt_tokens": _prompt_tokens(req)},
                    }
                ).encode()
            )
            return self._send(200, body)

        def _start_stream(self) -> Any:
            """Send the headers of a chunked event stream; the function that sends one event."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(data: Any) -> None:
                payload = data if isinstance(data, str) else json.dumps(data)
                raw = f"data: {payload}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
                self.wfile.flush()

            return event

        def _generate(self, req: dict[str, Any]) -> None:
            """sglang's /generate: output ids from the prompt, verify steps of ``accept_length`` tokens."""
            cfg = fake.config
            n = req["sampling_params"]["max_new_tokens"]
            prompt = req.get("input_ids") or [ord(c) for c in req["text"]]
            ids = [(sum(prompt) + i + cfg.offset) % 1000 for i in range(n)]

            # a step's tree depth on the first token it commits (the prefill's token: none)
            depths = [0] + [cfg.accept_length - 1 if i % cfg.accept_length == 0 else 0 for i in range(n - 1)]

            def meta(k: int, first: int = 0) -> dict[str, Any]:
                out = {
                    "completion_tokens": k,
                    "prompt_tokens": len(prompt),
                    "finish_reason": {"type": "length"} if k == n else None,
                }
                if cfg.accept_length > 1:  # a speculative server: ceil(k / accept_length) verify steps
                    out |= {"spec_verify_ct": -(-k // cfg.accept_length), "echo_tree_depth": depths[first:k]}
                return out

            if not req.get("stream"):
                time.sleep(cfg.first_token_delay_s + cfg.token_delay_s * (n - 1))
                return self._send(
                    200, json.dumps({"text": " ".join(map(str, ids)), "output_ids": ids, "meta_info": meta(n)}).encode()
                )
            event = self._start_stream()
            # the prefill's token, then accept_length a step; sglang's cumulative ids in every chunk, or
            # (incremental) only the new ones
            sent = 0
            for i, k in enumerate(sorted({1, *range(1 + cfg.accept_length, n, cfg.accept_length), n})):
                time.sleep(cfg.first_token_delay_s if i == 0 else cfg.token_delay_s)
                first = sent if cfg.incremental else 0
                event(
                    {"text": " ".join(map(str, ids[first:k])), "output_ids": ids[first:k], "meta_info": meta(k, first)}
                )
                sent = k
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

        def _stream(self, req: dict[str, Any], chat: bool, malformed: bool) -> None:
            event = self._start_stream()
            if chat:  # like sglang: the role first, with empty content (not a token)
                event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            if malformed:
                event("{not json")
            else:
                for i in range(req["max_tokens"]):
                    time.sleep(fake.config.first_token_delay_s if i == 0 else fake.config.token_delay_s)
                    event(_chunk(chat, "tok "))
                if (req.get("stream_options") or {}).get("include_usage"):
                    event(
                        _chunk(
                            chat,
                            None,
                            usage={"completion_tokens": req["max_tokens"], "prompt_tokens": _prompt_tokens(req)},
                        )
                    )
                event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def _prompt_tokens(req: dict[str, Any]) -> int:
    """An OpenAI request's prompt length: its token ids, else one token per word."""
    prompt = req.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt or req.get("messages", "")).split())
