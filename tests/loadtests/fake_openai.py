"""A stand-in for sglang's OpenAI endpoints: streams ``max_tokens`` one-word tokens with fixed
delays, and fails every ``fail_every``-th request in a chosen way, counting what it served so
tests can check the load test's own counts against it."""

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


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # locust drops its keep-alive connections when a level ends: expected, not news


class FakeOpenAI:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.served = self.failed = self.flushes = 0
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
                self._send(200, json.dumps({"data": [{"id": MODEL}]}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            if self.path.startswith("/flush_cache"):  # sglang's, with a ?timeout= query
                fake.flushes += 1
                return self._send(200, b"Cache flushed.", "text/plain")
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self._send(404, b"{}")
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            chat = self.path == "/v1/chat/completions"
            failure = fake.config.failure if fake.next_fails() else None
            if failure == "drop":
                self.close_connection = True  # nothing sent: the client sees the connection close
                return None
            if failure in ("500", "400"):
                return self._send(int(failure), b'{"error": "injected"}')
            if req.get("stream"):
                return self._stream(req, chat, malformed=failure == "malformed")
            # A whole generation's time, as a real server would take before answering.
            time.sleep(fake.config.first_token_delay_s + fake.config.token_delay_s * (req["max_tokens"] - 1))
            body = b"{not json" if failure == "malformed" else json.dumps({
                "choices": [{"index": 0, "text": "tok " * req["max_tokens"]}],
                "usage": {"completion_tokens": req["max_tokens"]},
            }).encode()
            return self._send(200, body)

        def _stream(self, req: dict[str, Any], chat: bool, malformed: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(data: Any) -> None:
                payload = data if isinstance(data, str) else json.dumps(data)
                raw = f"data: {payload}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
                self.wfile.flush()

            if chat:  # like sglang: the role first, with empty content (not a token)
                event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            if malformed:
                event("{not json")
            else:
                for i in range(req["max_tokens"]):
                    time.sleep(fake.config.first_token_delay_s if i == 0 else fake.config.token_delay_s)
                    event(_chunk(chat, "tok "))
                if (req.get("stream_options") or {}).get("include_usage"):
                    event(_chunk(chat, None, usage={"completion_tokens": req["max_tokens"]}))
                event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler
