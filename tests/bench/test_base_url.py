"""echo-bench serve --base-url against stand-in servers (tests/loadtests/fake_openai.py): sglang's
native API and an OpenAI-only one side by side, open and closed loops, streamed or not, what each
kind of server can tell (MAT, the lossless check, ECHO's counters), and the errors that stop a run
before any work."""

from __future__ import annotations

import json
import socket
from contextlib import ExitStack
from pathlib import Path

import pytest

from sglang_echo.bench import serve
from sglang_echo.bench.requester import send
from sglang_echo.bench.targets import Target, TargetError, parse_base_urls, probe
from sglang_echo.bench.workload import PromptItem, model_folder, parse_token_prompts, token_prompts, vocab_size

from ..loadtests.fake_openai import FakeConfig, FakeOpenAI

FAST = {"first_token_delay_s": 0.003, "token_delay_s": 0.001}
METRICS = "echo_steps_total 10\necho_verified_tokens_total 40\necho_budget_k_max 64\n"


@pytest.fixture
def vocab_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-config.json"  # a bare config file, as benchmarks/configs/ holds
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 500}))
    return path


def _servers(stack: ExitStack, **configs: FakeConfig) -> dict[str, FakeOpenAI]:
    return {name: stack.enter_context(FakeOpenAI(cfg)) for name, cfg in configs.items()}


def test_running_servers_side_by_side_at_request_rates(tmp_path, vocab_config, capsys):
    """Three running servers at two Poisson rates, two passes: sglang's API gives MAT and ids (a
    lossless and a lossy server), an OpenAI-only one gives neither; ECHO counters only where
    /metrics answers; every request in requests.jsonl with its TTFT and ITLs."""
    out = tmp_path / "out"
    with ExitStack() as stack:
        fakes = _servers(
            stack,
            none=FakeConfig(native=True, **FAST),
            echo=FakeConfig(native=True, accept_length=3, metrics=METRICS, **FAST),
            lossy=FakeConfig(native=True, offset=1, **FAST),
            oai=FakeConfig(**FAST),
        )
        urls = ",".join(f"{name}={f.url}" for name, f in fakes.items())
        serve.main(
            [
                "--base-url",
                urls,
                "--request-rate",
                "100,inf",
                "--max-concurrency",
                "3",
                "--num-requests",
                "5",
                "--token-prompts",
                "4:6",
                "--model",
                str(vocab_config),
                "--max-new-tokens",
                "7",
                "--repeats",
                "2",
                "--warmup-requests",
                "1",
                "--ignore-eos",
                "--out",
                str(out),
            ]
        )
        bodies = {name: f.bodies for name, f in fakes.items()}
    data = json.loads((out / "serve.json").read_text())
    runs = {(r["config"], r["request_rate"], r["repeat"]): r for r in data["runs"]}
    assert len(runs) == 4 * 2 * 2 and {r["requests"] for r in data["runs"]} == {5}
    assert {r["concurrency"] for r in data["runs"]} == {3}  # the cap
    echo, oai = runs["echo", 100.0, 0], runs["oai", "inf", 1]
    assert echo["verify_steps"] == 5 * 3 and echo["lossless"] is True  # 7 tokens, 3 a step: 3 steps each
    assert runs["lossy", 100.0, 0]["lossless"] is False and runs["none", 100.0, 0]["lossless"] is None
    assert oai["verify_steps"] == 0 and oai["completion_tokens"] == 5 * 7  # usage only: MAT unknown
    assert echo["echo"]["steps"] == 0 and echo["echo"]["k_max"] == 64  # counters scraped around the level
    assert runs["none", 100.0, 0]["echo"] is None  # no /metrics
    for r in (echo, oai):
        assert r["latency"]["ttft"]["n"] == 5 and r["latency"]["itl"]["n"] == 5 * 6
        assert "itl" not in r["per_request"][0] and r["per_request"][0]["ttft"] > 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 * 2 * 5 and {r["level"] for r in rows} == {100.0, "inf"}
    echo_row = next(r for r in rows if r["config"] == "echo")
    assert echo_row["prompt_tokens"] == 6 and echo_row["verify_steps"] == 3 and len(echo_row["itl_s"]) == 6
    assert echo_row["mat"] == pytest.approx(7 / 3)
    # what the servers were asked: token ids, streamed, every token generated
    native, openai = bodies["none"][-1], bodies["oai"][-1]
    assert len(native["input_ids"]) == 6 and native["stream"] and native["sampling_params"]["ignore_eos"]
    assert len(openai["prompt"]) == 6 and openai["stream"] and openai["model"] == "fake-model" and openai["ignore_eos"]
    md = (out / "serve.md").read_text()
    assert "Lossless check: greedy outputs of every --base-url server against the `none` URL's" in md
    assert "| config | request rate (req/s) | requests | req/s | tokens/s | e2e s | TTFT ms | ITL ms |" in md
    assert "| echo | inf |" in md and "| oai | 100 |" in md
    assert "oai" in capsys.readouterr().out


def test_closed_loop_without_streaming_gives_end_to_end_latency_only(tmp_path, vocab_config):
    out = tmp_path / "out"
    with ExitStack() as stack:
        fakes = _servers(
            stack, none=FakeConfig(native=True, **FAST), echo=FakeConfig(native=True, accept_length=2, **FAST)
        )
        serve.main(
            [
                "--base-url",
                ",".join(f"{n}={f.url}" for n, f in fakes.items()),
                "--concurrency",
                "1,2",
                "--no-stream",
                "--token-prompts",
                "3:4",
                "--model",
                str(vocab_config),
                "--max-new-tokens",
                "4",
                "--warmup-requests",
                "0",
                "--out",
                str(out),
            ]
        )
        assert not any(b.get("stream") for b in fakes["echo"].bodies)
    data = json.loads((out / "serve.json").read_text())
    assert [(r["config"], r["concurrency"], r["request_rate"]) for r in data["runs"]] == [
        ("none", 1, None),
        ("echo", 1, None),
        ("none", 2, None),
        ("echo", 2, None),
    ]
    echo = data["runs"][1]
    assert echo["lossless"] is True and echo["completion_tokens"] / echo["verify_steps"] == pytest.approx(2.0)
    assert echo["latency"]["e2e"]["n"] == 1 and echo["latency"]["ttft"] is None and echo["latency"]["itl"] is None


def test_incremental_streams_rebuild_the_whole_output():
    """sglang's --incremental-streaming-output sends each chunk's new ids and per-token records: the
    client joins them into what a cumulative stream gives."""
    item = PromptItem("p", "tokens", input_ids=(5, 6, 7))
    with (
        FakeOpenAI(FakeConfig(native=True, accept_length=3, **FAST)) as a,
        FakeOpenAI(FakeConfig(native=True, accept_length=3, incremental=True, **FAST)) as b,
    ):
        whole, pieces = (send(Target("x", f.url), item, 8, stream=True) for f in (a, b))
    assert pieces.output_ids == whole.output_ids and len(whole.output_ids) == 8
    assert pieces.meta["echo_tree_depth"] == whole.meta["echo_tree_depth"] and len(whole.meta["echo_tree_depth"]) == 8
    assert pieces.meta["spec_verify_ct"] == whole.meta["spec_verify_ct"] == 3
    assert len(pieces.itl) == len(whole.itl) == 7


def test_probe_tells_the_apis_apart():
    with FakeOpenAI(FakeConfig(native=True)) as native, FakeOpenAI(FakeConfig()) as oai:
        assert probe("a", native.url) == Target("a", native.url, "native", None, "/fake/model")
        assert probe("b", oai.url) == Target("b", oai.url, "openai", "fake-model")
        assert probe("b", oai.url, model="mine").model == "mine"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--configs", "none,warp"], "--configs: unknown 'warp'"),
        (["--base-url", "none=localhost:30000"], "--base-url none: 'localhost:30000' is not http(s)://HOST[:PORT]"),
        (["--base-url", "http://h:1,http://h:2"], "several servers need a name each"),
        (["--base-url", "a=http://h:1,a=http://h:2"], "every server needs its own name"),
        (["--request-rate", "0"], "--request-rate '0': must be > 0"),
        (["--request-rate=-3"], "--request-rate '-3': must be > 0"),
        (["--request-rate", "fast"], "--request-rate 'fast': expected requests per second"),
        (["--concurrency", "8", "--request-rate", "2"], "--concurrency and --request-rate exclude each other"),
        (["--max-concurrency", "4"], "--max-concurrency applies to --request-rate levels"),
        (["--base-url", "none=http://h:1", "--load-format", "dummy"], "--load-format: options of the servers"),
        (["--token-prompts", "8x128"], "--token-prompts '8x128': expected N:LEN"),
        (["--model", "/no/such/model"], "--model /no/such/model: no such folder or config file"),
        (["--base-url", "http://h:1", "--model", "m"], "is --served-model-name"),
        (["--served-model-name", "m"], "--served-model-name names the model of OpenAI-only --base-url servers"),
        (["--repeats", "0"], "argument --repeats: 0 is not >= 1"),
        (["--calibration", "/no/such/calibration.json"], "--calibration /no/such/calibration.json: no such file"),
        (["--server-args", "--x 'unclosed"], "--server-args"),
    ],
)
def test_bad_options_stop_with_one_line_before_any_work(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(serve, "run", lambda _args: pytest.fail("ran despite bad options"))
    with pytest.raises(SystemExit) as e:
        serve.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("echo-bench serve: error: ")
    assert says in err


def test_a_server_that_does_not_answer_stops_the_run_with_one_line(tmp_path, capsys):
    code = serve.main(
        [
            "--base-url",
            f"none=http://127.0.0.1:{_closed_port()}",
            "--token-prompts",
            "2:2",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "neither sglang's /model_info nor an OpenAI" in err
    assert not (tmp_path / "out").exists()


def test_token_prompts_with_base_url_need_a_vocabulary(capsys):
    with FakeOpenAI(FakeConfig()) as oai:
        code = serve.main(["--base-url", oai.url, "--token-prompts", "2:2"])
    assert code == 2 and "pass --model" in capsys.readouterr().err


def test_base_urls_and_token_prompts_parse():
    assert parse_base_urls("http://h:30000/") == [("server", "http://h:30000")]
    assert parse_base_urls("none=http://h:1, echo=https://g/v") == [("none", "http://h:1"), ("echo", "https://g/v")]
    with pytest.raises(TargetError, match="letters, digits"):
        parse_base_urls("a b=http://h:1")
    assert parse_token_prompts("64:512") == (64, 512)
    for bad in ("0:5", "5", "a:b", "5:-1"):
        with pytest.raises(ValueError, match="N:LEN"):
            parse_token_prompts(bad)


def test_token_prompts_are_seeded_and_within_the_vocabulary(vocab_config):
    folder = model_folder(vocab_config)
    assert (folder / "config.json").read_text() == vocab_config.read_text() and vocab_size(folder) == 500
    assert model_folder(vocab_config) == folder  # staged once per content
    items = token_prompts(50, 40, vocab_size(folder), seed=3)
    ids = [t for it in items for t in it.input_ids]
    assert len(items) == 50 and {len(it.input_ids) for it in items} == {40} and items[0].prompt_tokens == 40
    assert 0 <= min(ids) and max(ids) < 500 and len(set(ids)) > 400  # spread over the vocabulary
    assert items == token_prompts(50, 40, 500, seed=3) and items != token_prompts(50, 40, 500, seed=4)


def test_other_targets_need_their_heads_and_a_vocabulary(tmp_path, vocab_config, capsys, monkeypatch):
    """--model: the shipped heads draft for SmolLM2, so a speculative config needs its head
    given; token prompts need the config's vocab_size; the prompt sets need a tokenizer."""
    monkeypatch.setattr(serve, "run", lambda _args: pytest.fail("ran despite bad options"))
    no_vocab = tmp_path / "no-vocab.json"
    no_vocab.write_text("{}")
    cases = [
        (
            ["--configs", "none,echo", "--model", str(vocab_config), "--token-prompts", "2:4"],
            "--configs echo with --model: pass its eagle3 head (--draft",
        ),
        (
            [
                "--configs",
                "none,echo-dart",
                "--model",
                str(vocab_config),
                "--token-prompts",
                "2:4",
                "--draft",
                str(vocab_config),
            ],
            "--configs echo-dart with --model: pass its dart head (--dart-draft",
        ),
        (["--configs", "none", "--model", str(no_vocab), "--token-prompts", "2:4"], "no vocab_size"),
        (["--configs", "none", "--model", str(vocab_config)], "no tokenizer there"),
        (["--draft", str(tmp_path / "missing")], "--draft"),
    ]
    for argv, says in cases:
        with pytest.raises(SystemExit) as e:
            serve.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and err.count("\n") == 1, (argv, err)
    from sglang_echo.bench.serve_args import parse_args

    ok = parse_args(
        [
            "--configs",
            "none,echo-ngram,eagle3",
            "--model",
            str(vocab_config),
            "--token-prompts",
            "2:4",
            "--draft",
            str(vocab_config),
        ]
    )  # n-gram drafts need no head
    assert ok.head_folders == {"eagle3": model_folder(vocab_config)} and ok.model_folder == model_folder(vocab_config)
