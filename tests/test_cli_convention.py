"""Every command line follows one convention (sglang_echo/cli_args.py): ``--help`` exits 0 on every
level and shows defaults; a bad value is one line ``<prog>: error: ...``, exit status 2, no
traceback and nothing written to ``--out``; old option spellings still work, with a one-line note;
a failure during the work is one line and exit status 1 (the traceback only with ``--debug``).

In-process ``main([...])`` calls: no server starts and no model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests import run as loadtests_run
from sglang_echo import cli_args
from sglang_echo.bench import acceptance_args, serve_args
from sglang_echo.bench import cli as bench_cli
from sglang_echo.bundle import cli as bundle_cli
from sglang_echo.calibration import cli as calibrate_cli
from sglang_echo.replay import cli as replay_cli
from sglang_echo.replay import options as replay_options
from sglang_echo.serve import launch
from sglang_echo.training import cli as train_cli
from sglang_echo.training import ngram_cli

MAINS = {
    "echo-bench": bench_cli.main,
    "echo-calibrate": calibrate_cli.main,
    "echo-train-drafter": train_cli.main,
    "echo-replay": replay_cli.main,
    "echo-build-ngram": ngram_cli.main,
    "echo-bundle": bundle_cli.main,
    "launch": launch.main,
    "loadtests/run.py": loadtests_run.main,
}
BENCH_SUBCOMMANDS = tuple(bench_cli.SUBCOMMANDS)
REPLAY_SUBCOMMANDS = ("record", "measure-cost", "run", "validate", "validate-server", "sim-inputs")
HELP = [
    ("echo-bench", []),
    *[("echo-bench", [s]) for s in BENCH_SUBCOMMANDS],
    ("echo-calibrate", []),
    ("echo-train-drafter", []),
    ("echo-replay", []),
    *[("echo-replay", [s]) for s in REPLAY_SUBCOMMANDS],
    ("echo-build-ngram", []),
    ("echo-bundle", []),
    ("launch", []),
    ("loadtests/run.py", []),
]
NO_DEFAULTS = {("echo-bench", ()), ("echo-replay", ())}  # command lists: nothing of their own to default


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A folder that passes for a checkpoint (config.json) and a tokenizer (tokenizer.json)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 100, "hidden_size": 8}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """A trace stem whose two files exist (the options check no more)."""
    for suffix in (".json", ".safetensors"):
        (tmp_path / f"trace{suffix}").write_text("")
    return tmp_path / "trace"


@pytest.mark.parametrize("cli, sub", HELP, ids=[" ".join([c, *s]) for c, s in HELP])
def test_help_exits_0_and_shows_defaults(cli, sub, capsys):
    with pytest.raises(SystemExit) as e:
        MAINS[cli]([*sub, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage:")
    if (cli, tuple(sub)) not in NO_DEFAULTS:
        assert "(default:" in out and "--debug" in out


# (command, argv with {out} / {model} / {trace} / {missing} filled in, what the one line says)
BAD = [
    ("echo-bench", [], "the following arguments are required: SUBCOMMAND"),
    ("echo-bench", ["bogus"], "invalid choice: 'bogus'"),
    ("echo-bench", ["serve", "--configs", "bogus", "--out", "{out}"], "--configs: unknown 'bogus'"),
    ("echo-bench", ["serve", "--max-new-tokens", "0", "--out", "{out}"], "argument --max-new-tokens: 0 is not >= 1"),
    ("echo-bench", ["serve", "--port", "70000", "--out", "{out}"], "argument --port: 70000 is not in [1, 65535]"),
    ("echo-bench", ["serve", "--model", "{missing}", "--out", "{out}"], "no such folder or config file"),
    ("echo-bench", ["scheduler", "--batch", "-1"], "argument --batch: -1 is not >= 1"),
    ("echo-bench", ["scheduler", "--device", "tpu"], "argument --device: 'tpu' is not cpu, cuda or cuda:N"),
    ("echo-bench", ["graphs", "--policies", "bogus", "--out", "{out}"], "argument --policies: unknown policy 'bogus'"),
    ("echo-bench", ["graphs", "--steps", "0", "--out", "{out}"], "argument --steps: 0 is not >= 1"),
    (
        "echo-bench",
        ["acceptance", "--model", "{missing}", "--drafter", "ngram", "--out", "{out}"],
        "argument --model: {missing}: no such folder",
    ),
    (
        "echo-bench",
        ["acceptance", "--model", "{model}", "--drafter", "eagle3", "--draft", "{missing}", "--out", "{out}"],
        "argument --draft: {missing}: no such folder",
    ),
    (
        "echo-bench",
        ["acceptance", "--model", "{model}", "--drafter", "ngram", "--policies", "chain3,bogus", "--out", "{out}"],
        "unknown policy 'bogus'",
    ),
    (
        "echo-bench",
        ["acceptance", "--model", "{model}", "--drafter", "ngram", "--prompts", "chat,poems", "--out", "{out}"],
        "unknown prompt set 'poems'",
    ),
    (
        "echo-bench",
        [
            "acceptance",
            "--model",
            "{model}",
            "--drafter",
            "ngram",
            "--per-set",
            "2",
            "--num-prompts",
            "4",
            "--out",
            "{out}",
        ],
        "not allowed with argument",
    ),
    (
        "echo-bench",
        ["acceptance", "--model", "{model}", "--drafter", "ngram", "--draft", "{model}", "--out", "{out}"],
        "--draft is a head folder of the drafters with weights",
    ),
    ("echo-bench", ["acceptance", "--drafter", "ngram", "--out", "{out}"], "required: --model"),
    ("echo-bench", ["figures", "{missing}", "--out", "{out}"], "no such file"),
    ("echo-calibrate", ["--drafter", "ngram", "--auc-min", "-4", "--out", "{out}"], "argument --auc-min: -4"),
    ("echo-calibrate", ["--drafter", "ngram", "--num-prompts", "0", "--out", "{out}"], "argument --num-prompts: 0"),
    ("echo-calibrate", ["--drafter", "ngram", "--prompts", "chat,poems", "--out", "{out}"], "not a file and not"),
    ("echo-calibrate", ["--drafter", "bogus", "--out", "{out}"], "argument --drafter: invalid choice"),
    ("echo-train-drafter", ["--model", "{missing}", "--out", "{out}"], "argument --model: {missing}: no such folder"),
    ("echo-train-drafter", ["--epochs", "0", "--out", "{out}"], "argument --epochs: 0 is not in (0.0, inf]"),
    ("echo-train-drafter", ["--kind", "medusa", "--out", "{out}"], "argument --kind: invalid choice"),
    ("echo-replay", [], "the following arguments are required: SUBCOMMAND"),
    ("echo-replay", ["record", "--model", "{missing}", "--drafter", "ngram", "--out", "{out}"], "no such folder"),
    (
        "echo-replay",
        ["record", "--model", "{model}", "--drafter", "ngram", "--beams", "1,x", "--out", "{out}"],
        "argument --beams: '1,x' is not a comma list of integers",
    ),
    ("echo-replay", ["run", "--trace", "{missing}", "--out", "{out}"], "no trace there"),
    ("echo-replay", ["run", "--trace", "{trace}", "--policies", "echo,bogus", "--out", "{out}"], "unknown policy"),
    ("echo-replay", ["run", "--trace", "{trace}", "--k-max", "x8", "--out", "{out}"], "argument --k-max: 'x8'"),
    ("echo-replay", ["run", "--trace", "{trace}", "--w-def", "5", "--w-max", "4", "--out", "{out}"], "w_def <= w_max"),
    (
        "echo-replay",
        ["validate-server", "--trace", "{trace}", "--ignore-eos", "--out", "{out}"],
        "--ignore-eos is not supported",
    ),
    (
        "echo-replay",
        ["sim-inputs", "--trace", "{trace}", "--eagle3-shape", "3/3", "--out", "{out}"],
        "argument --eagle3-shape: expected STEPS/TOPK/TOKENS",
    ),
    ("echo-build-ngram", ["{missing}", "--model", "{model}", "--out", "{out}"], "no such file or directory"),
    ("echo-build-ngram", ["{model}", "--model", "{model}", "--out", "{out}"], "without self-distillation shards"),
    ("echo-bundle", ["--find-links", "{missing}", "--out", "{out}"], "--find-links {missing}: no such folder"),
    ("echo-bundle", ["--max-mib", "lots", "--out", "{out}"], "argument --max-mib: invalid float value"),
    ("launch", ["--port", "0", "--dry-run"], "argument --port: 0 is not in [1, 65535]"),
    ("launch", ["--draft", "{missing}", "--dry-run"], "argument --draft: {missing}: no such folder"),
    ("launch", ["--dtype", "half", "--dry-run"], "argument --dtype: invalid choice: 'half'"),
    ("loadtests/run.py", ["--users", "8,0", "--out", "{out}"], "argument --users: '8,0': every value must be >= 1"),
    ("loadtests/run.py", ["--max-new-tokens", "0", "--out", "{out}"], "argument --max-new-tokens: 0 is not >= 1"),
    ("loadtests/run.py", ["--tags", "poems", "--out", "{out}"], "argument --tags: invalid choice: 'poems'"),
]


@pytest.mark.parametrize("cli, argv, says", BAD, ids=[f"{c} {' '.join(a)}" for c, a, _ in BAD])
def test_bad_arguments_stop_in_one_line_before_any_work(cli, argv, says, tmp_path, model, trace, capsys):
    fill = {
        "out": str(tmp_path / "out"),
        "model": str(model),
        "trace": str(trace),
        "missing": str(tmp_path / "missing"),
    }
    with pytest.raises(SystemExit) as e:
        MAINS[cli]([a.format(**fill) for a in argv])
    captured = capsys.readouterr()
    prog = "python -m sglang_echo.serve.launch" if cli == "launch" else cli
    assert e.value.code == 2, captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"{prog}") and ": error: " in captured.err
    assert says.format(**fill) in captured.err and "Traceback" not in captured.err, captured.err
    assert not (tmp_path / "out").exists()


PARSERS = {
    "serve": lambda argv: serve_args.parser().parse_args(argv),
    "acceptance": lambda argv: acceptance_args.parser().parse_args(argv),
    "calibrate": lambda argv: calibrate_cli.parser().parse_args(argv),
    "train": lambda argv: train_cli.parser().parse_args(argv),
    "replay": replay_options.parse_args,
    "ngram": lambda argv: ngram_cli.parser().parse_args(argv),
    "loadtests": loadtests_run.parse_args,
}
# (parser, the other arguments, the old spelling, where its value lands, the value)
ALIASES = [
    ("serve", [], ["--max-new", "5"], "max_new_tokens", 5),
    ("serve", [], ["--max-tokens", "6"], "max_new_tokens", 6),
    ("serve", [], ["--max-new-jitter", "2"], "max_new_tokens_jitter", 2),
    ("serve", [], ["--model-dir", "cfg.json"], "model", "cfg.json"),
    ("acceptance", ["--drafter", "ngram"], ["--target", "{model}"], "model", "{model}"),
    ("acceptance", ["--model", "{model}", "--drafter", "ngram"], ["--max-new", "7"], "max_new_tokens", 7),
    ("calibrate", ["--drafter", "ngram"], ["--target", "{model}"], "model", "{model}"),
    ("calibrate", ["--drafter", "ngram"], ["--max-tokens", "9"], "max_new_tokens", 9),
    ("train", ["--out", "{out}"], ["--target", "{model}"], "model", "{model}"),
    ("train", ["--out", "{out}"], ["--prompts", "6"], "num_prompts", 6),
    ("train", ["--out", "{out}"], ["--max-new", "12"], "max_new_tokens", 12),
    ("replay", ["record", "--drafter", "ngram", "--out", "{out}"], ["--target", "{model}"], "target", "{model}"),
    ("replay", ["sim-inputs", "--trace", "{trace}"], ["--max-new", "3"], "max_new", 3),
    ("replay", ["measure-cost", "--model", "{model}", "--out", "{out}"], ["--max-tokens", "64"], "max_tokens", 64),
    ("ngram", ["{model}/config.json", "--out", "{out}"], ["--tokenizer", "{model}"], "model", "{model}"),
    ("loadtests", [], ["--max-tokens", "5"], "max_new_tokens", 5),
    ("loadtests", [], ["--prompts-per-set", "3"], "per_set", 3),
    ("loadtests", [], ["--max-tokens-jitter", "2"], "max_new_tokens_jitter", 2),
]


@pytest.mark.parametrize("parser, others, old, dest, value", ALIASES, ids=[f"{a[0]} {a[2][0]}" for a in ALIASES])
def test_old_spellings_still_work_with_a_note(parser, others, old, dest, value, tmp_path, model, trace, capsys):
    fill = {"out": str(tmp_path / "out"), "model": str(model), "trace": str(trace)}
    parsed = PARSERS[parser]([a.format(**fill) for a in [*others, *old]])
    assert str(getattr(parsed, dest)) == (value.format(**fill) if isinstance(value, str) else str(value))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"note: {old[0]} is deprecated; use --" in err


def test_old_spellings_are_hidden_from_help(capsys):
    with pytest.raises(SystemExit):
        serve_args.parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--max-new-tokens" in out and "--max-new " not in out and "--model-dir" not in out


def _broken_serve_json(tmp_path: Path) -> Path:
    (tmp_path / "serve.json").write_text("{ not json")
    return tmp_path


def test_a_failure_during_the_work_is_one_line_and_status_1(tmp_path, capsys):
    folder = _broken_serve_json(tmp_path)
    assert bench_cli.main(["figures", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("echo-bench figures: error: JSONDecodeError: ") and err.count("\n") == 1
    with pytest.raises(json.JSONDecodeError):  # --debug: the traceback
        bench_cli.main(["figures", str(folder), "--debug"])


def test_the_debug_variable_shows_the_traceback_too(tmp_path, monkeypatch):
    monkeypatch.setenv(cli_args.DEBUG_ENV, "1")
    with pytest.raises(json.JSONDecodeError):
        bench_cli.main(["figures", str(_broken_serve_json(tmp_path))])


def test_run_reports_a_message_exit_and_passes_a_status_through(capsys):
    def fails():
        raise SystemExit("no head weights here")

    assert cli_args.run("prog", fails) == 1
    assert capsys.readouterr().err == "prog: error: no head weights here\n"
    assert cli_args.run("prog", lambda: 3) == 3 and cli_args.run("prog", lambda: None) == 0


@pytest.mark.parametrize(
    "sets, per_set, total, counts",
    [
        (["a", "b"], 4, None, [4, 4]),
        (["a", "b"], 4, 5, [3, 2]),
        (["a", "b", "c"], 1, 2, [1, 1, 0]),
        (["a"], 20, 7, [7]),
    ],
)
def test_prompt_counts_per_set_or_in_all(sets, per_set, total, counts):
    assert cli_args.prompt_counts(sets, per_set, total) == counts
