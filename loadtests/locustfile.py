"""Locust users for sglang's OpenAI-compatible API: chat and completions, streaming and not.

    python -m locust -f loadtests/locustfile.py --host http://127.0.0.1:30000 --max-tokens 64

(run from the repo root: locust puts the working directory on ``sys.path``, which is how
``loadtests.*`` imports here). Every request is greedy (temperature 0) with ``max_tokens``
fixed or, with ``--max-tokens-jitter J``, drawn from ``max_tokens +- J`` by a seeded generator
(the same lengths in the same order at every level and server); prompts cycle through the repo's
dev prompt sets. Streaming requests also report
"TTFT" and "TPOT" entries to locust's statistics (so they show in its web UI and CSVs, and
inflate its "Aggregated" row); ``loadtests/run.py`` reads the exact per-request figures from
``--samples-file`` instead.

Tags select the traffic: ``--tags stream``, ``--tags chat``, ``--exclude-tags nostream``, ...

``--hostile-every N --hostile-cases FILE`` (a soak, ``loadtests/soak.py``) mixes hostile requests in:
before every N-th normal request its user sends the next case of the file (``loadtests/hostile.py``),
the cases in turn, and appends how it was answered to ``--hostile-samples-file``.
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path
from typing import IO, Any

import gevent
import requests
from locust import HttpUser, constant, events, tag, task
from locust.env import Environment
from locust.exception import StopUser

from loadtests.hostile import HostileCase, HostileSample, read_cases, send
from loadtests.hosts import check_host
from loadtests.measure import Measured, Sample, exception_kind, measure_json, measure_stream
from sglang_echo.models.prompts import Prompt, load_mixed


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument(
        "--max-tokens", type=int, default=64, env_var="LOCUST_MAX_TOKENS", help="max_tokens of every request"
    )
    parser.add_argument(
        "--max-tokens-jitter",
        type=int,
        default=0,
        env_var="LOCUST_MAX_TOKENS_JITTER",
        help="draw each request's max_tokens from max_tokens +- this (seeded)",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        env_var="LOCUST_IGNORE_EOS",
        help="sglang's ignore_eos: every request generates exactly max_tokens",
    )
    parser.add_argument(
        "--prompts-per-set",
        type=int,
        default=40,
        env_var="LOCUST_PROMPTS_PER_SET",
        help="prompts taken from each dev prompt set",
    )
    parser.add_argument(
        "--model", default="", env_var="LOCUST_MODEL", help="model name to send (default: the first of GET /v1/models)"
    )
    parser.add_argument(
        "--max-requests",
        type=int,
        default=0,
        env_var="LOCUST_MAX_REQUESTS",
        help="stop after this many finished requests (0: no limit)",
    )
    parser.add_argument(
        "--samples-file",
        default="",
        env_var="LOCUST_SAMPLES_FILE",
        help="append one JSON line per finished request here",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        env_var="LOCUST_REQUEST_TIMEOUT",
        help="seconds without data before a request fails",
    )
    parser.add_argument(
        "--allow-remote", action="store_true", env_var="LOCUST_ALLOW_REMOTE", help="allow a --host other than localhost"
    )
    parser.add_argument(
        "--hostile-every",
        type=int,
        default=0,
        env_var="LOCUST_HOSTILE_EVERY",
        help="send a hostile request before every N-th normal one (0: never)",
    )
    parser.add_argument(
        "--hostile-cases",
        default="",
        env_var="LOCUST_HOSTILE_CASES",
        help="the hostile cases, one JSON line each (loadtests/hostile.py), sent in turn",
    )
    parser.add_argument(
        "--hostile-samples-file",
        default="",
        env_var="LOCUST_HOSTILE_SAMPLES_FILE",
        help="append one JSON line per hostile request here",
    )
    parser.add_argument(
        "--hostile-timeout",
        type=float,
        default=120.0,
        env_var="LOCUST_HOSTILE_TIMEOUT",
        help="seconds a hostile request may wait for its answer (a disconnecting stream: --request-timeout)",
    )


class _Run:
    """Per-process state: model and prompts (once), request budget and samples file (per test)."""

    def __init__(self) -> None:
        self.model = ""
        self.chat: itertools.cycle[list[dict[str, str]]] | None = None
        self.text: itertools.cycle[str] | None = None
        self.budget = self.started = self.finished = 0
        self.samples: IO[str] | None = None
        self.lengths = random.Random(0)

    def setup(self, env: Environment) -> None:
        opts = env.parsed_options
        host = check_host(env.host or "", allow_remote=opts.allow_remote)
        self.model = opts.model or _first_model(host)
        prompts: list[Prompt] = load_mixed(opts.prompts_per_set)
        self.chat = itertools.cycle([p.as_messages() for p in prompts])
        # /v1/completions gets raw text: a prompt's own text, else its last chat turn's content
        # (rendering the chat template would need the server's tokenizer).
        self.text = itertools.cycle([p.prompt or p.as_messages()[-1]["content"] for p in prompts])

    def begin(self, env: Environment) -> None:
        opts = env.parsed_options
        self.budget, self.started, self.finished = opts.max_requests, 0, 0
        self.lengths = random.Random(0)  # every level draws the same lengths in the same order
        if opts.samples_file and self.samples is None:
            # Line-buffered: a level killed at its time limit still leaves whole lines behind.
            self.samples = open(Path(opts.samples_file), "a", encoding="utf-8", buffering=1)

    def max_tokens(self, opts: Any) -> int:
        """This request's ``max_tokens``. Jitter matters with ``--ignore-eos``: requests of one
        length that start together also end together, and keep arriving in waves whose prefills
        batch, which real traffic does not."""
        jitter = opts.max_tokens_jitter
        return max(1, opts.max_tokens + self.lengths.randint(-jitter, jitter)) if jitter else opts.max_tokens

    def take(self) -> bool:
        """Claim one request of the budget; False once all of it is claimed."""
        if self.budget and self.started >= self.budget:
            return False
        self.started += 1
        return True

    def record(self, env: Environment, sample: Sample) -> None:
        if self.samples is not None:
            self.samples.write(sample.to_json() + "\n")
        self.finished += 1
        if self.budget and self.finished >= self.budget and env.runner is not None:
            # Every claimed request has finished: the level is complete. quit() stops every
            # user greenlet, this one included, so it runs in a greenlet of its own: called
            # here, stopping this user could cut quit() short, and the level ran to --run-time.
            gevent.spawn(env.runner.quit)

    def close(self) -> None:
        if self.samples is not None:
            self.samples.close()
            self.samples = None


RUN = _Run()


class _Hostile:
    """Per-process hostile traffic: the cases, sent in turn, and the file their answers go to."""

    def __init__(self) -> None:
        self.cases: list[HostileCase] = []
        self.every = 0
        self.sent = 0
        self.samples: IO[str] | None = None

    def setup(self, env: Environment) -> None:
        opts = env.parsed_options
        if opts.hostile_every > 0 and opts.hostile_cases:
            self.cases, self.every = read_cases(Path(opts.hostile_cases)), opts.hostile_every
        if self.cases and opts.hostile_samples_file and self.samples is None:
            self.samples = open(Path(opts.hostile_samples_file), "a", encoding="utf-8", buffering=1)

    def due(self, started: int) -> HostileCase | None:
        """The case to send before the ``started``-th normal request, if one is due."""
        if not self.cases or started % self.every:
            return None
        case = self.cases[self.sent % len(self.cases)]
        self.sent += 1
        return case

    def record(self, sample: HostileSample) -> None:
        if self.samples is not None:
            self.samples.write(sample.to_json() + "\n")

    def close(self) -> None:
        if self.samples is not None:
            self.samples.close()
            self.samples = None


HOSTILE = _Hostile()


def _first_model(host: str) -> str:
    r = requests.get(f"{host}/v1/models", timeout=60)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    try:
        RUN.setup(environment)
        HOSTILE.setup(environment)
    except (ValueError, OSError, KeyError) as exc:  # refused host, server down, no models
        # SystemExit passes through locust's event hook and ends the process before any user.
        raise SystemExit(f"loadtests: {exc}") from exc


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    RUN.begin(environment)


@events.quitting.add_listener
def _on_quit(**_: Any) -> None:
    RUN.close()
    HOSTILE.close()


class OpenAIUser(HttpUser):
    """A closed-loop client: sends its next request as soon as the previous one finished."""

    wait_time = constant(0)

    @tag("chat", "stream")
    @task(3)
    def chat_stream(self) -> None:
        self._request("chat", stream=True)

    @tag("completions", "stream")
    @task(3)
    def completions_stream(self) -> None:
        self._request("completions", stream=True)

    @tag("chat", "nostream")
    @task(1)
    def chat(self) -> None:
        self._request("chat", stream=False)

    @tag("completions", "nostream")
    @task(1)
    def completions(self) -> None:
        self._request("completions", stream=False)

    def _body(self, endpoint: str, stream: bool) -> dict[str, Any]:
        opts = self.environment.parsed_options
        body: dict[str, Any] = {"model": RUN.model, "max_tokens": RUN.max_tokens(opts), "temperature": 0}
        if endpoint == "chat":
            body["messages"] = next(RUN.chat)
        else:
            body["prompt"] = next(RUN.text)
        if opts.ignore_eos:
            body["ignore_eos"] = True
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body

    def _request(self, endpoint: str, *, stream: bool) -> None:
        if not RUN.take():
            raise StopUser()
        if (case := HOSTILE.due(RUN.started)) is not None:
            opts = self.environment.parsed_options
            # A disconnecting stream queues for its first token like any request; a refusal should not.
            HOSTILE.record(send(self.host, case, opts.request_timeout if case.disconnect else opts.hostile_timeout))
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        name = f"{path} [{'stream' if stream else 'no stream'}]"
        start, t0 = time.time(), time.perf_counter()
        with self.client.post(
            path,
            json=self._body(endpoint, stream),
            name=name,
            stream=stream,
            catch_response=True,
            timeout=self.environment.parsed_options.request_timeout,
        ) as resp:
            if resp.status_code == 0:  # locust's stand-in response for a connection failure
                got = Measured(error=exception_kind(getattr(resp, "error", None) or OSError()))
            elif resp.status_code != 200:
                got = Measured(error=f"http_{resp.status_code}")
            elif stream:
                # chunk_size=None: lines as each chunk arrives. The default (512 bytes) would hold
                # the first tokens back until 512 bytes had come, and time them late.
                got = measure_stream(resp.iter_lines(chunk_size=None), t0)
            else:
                got = measure_json(resp.content)
            latency = time.perf_counter() - t0
            # Locust timed a streaming request to its headers only; report the whole stream.
            resp.request_meta["response_time"] = latency * 1e3
            if got.error:
                resp.failure(got.error)
            else:
                resp.success()
        if got.error is None:
            self._report("TTFT", name, got.ttft_s)
            self._report("TPOT", name, got.tpot_s)
        RUN.record(
            self.environment,
            Sample(endpoint, stream, start, latency, got.output_tokens, got.ttft_s, got.tpot_s, got.error),
        )

    def _report(self, kind: str, name: str, seconds: float | None) -> None:
        if seconds is not None:
            self.environment.events.request.fire(
                request_type=kind, name=name, response_time=seconds * 1e3, response_length=0, exception=None, context={}
            )
