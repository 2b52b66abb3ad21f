"""echo-bench serve --simulate STEM: the trace's prompts, each speculative server simulating by its
own convention (ECHO: SGLANG_ECHO_SIMULATE; sglang's EAGLE3: SGLANG_SIMULATE_ACC_LEN), plain
decoding untouched, every figure labelled; options that cannot hold are refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_echo.bench.load import Level
from sglang_echo.bench.serve_args import parse_args
from sglang_echo.bench.serve_endpoint import Bench, StartedServer
from sglang_echo.bench.serve_run import Report, Run
from sglang_echo.bench.serve_tables import markdown
from sglang_echo.serve.flags import build_command


@pytest.fixture
def sim(tmp_path: Path) -> Path:
    stem = tmp_path / "trace"
    (tmp_path / "trace.sim.json").write_text(
        json.dumps(
            {
                "schema": "sglang-echo/sim-inputs",
                "version": 1,
                "trace": "elsewhere/trace",
                "label": "simulated acceptance",
                "drafter": "eagle3",
                "vocab_size": 500,
                "max_new": 32,
                "env": {
                    "echo": {"SGLANG_ECHO_SIMULATE": "elsewhere/trace"},
                    "eagle3": {"SGLANG_SIMULATE_ACC_LEN": "1.6"},
                },
                "eagle3": {"shape": "3/3/5", "simulate_acc_len": 1.6},
                "prompts": [{"id": "chat/0", "input_ids": [1, 2, 3]}, {"id": "math/0", "input_ids": [4, 5]}],
            }
        )
    )
    return stem


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "target.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 1000}))
    return path


def _args(sim: Path, config: Path, *more: str):
    return parse_args(
        [
            "--simulate",
            str(sim),
            "--model",
            str(config),
            "--draft",
            str(config),
            "--max-new-tokens",
            "16",
            "--configs",
            "none,eagle3,echo",
            "--device",
            "cpu",
            *more,
        ]
    )


def test_each_server_simulates_by_its_own_convention(sim, config, monkeypatch):
    from sglang_echo.bench import serve

    args = _args(sim, config)
    assert args.ignore_eos and args.sim["stem"] == str(sim.resolve())  # the trace found from here, not as recorded
    items = serve._prompt_items(args, args.model_folder)
    assert [(i.id, i.input_ids) for i in items] == [("chat/0", (1, 2, 3)), ("math/0", (4, 5))]
    bench = Bench(args, args.model_folder, {"eagle3": args.model_folder}, None, [Level(2)], items)
    env = {name: dict(StartedServer(bench, name, 30400).opts.extra_env) for name in ("none", "eagle3", "echo")}
    assert env["echo"]["SGLANG_ECHO_SIMULATE"] == str(sim.resolve()) and "SGLANG_SIMULATE_ACC_LEN" not in env["echo"]
    assert env["eagle3"]["SGLANG_SIMULATE_ACC_LEN"] == "1.6" and "SGLANG_ECHO_SIMULATE" not in env["eagle3"]
    assert not {"SGLANG_ECHO_SIMULATE", "SGLANG_SIMULATE_ACC_LEN"} & set(env["none"])
    assert "--skip-tokenizer-init" in build_command(StartedServer(bench, "echo", 30400).opts).argv
    report = Report(machine={"platform": "test", "cpus": 2}, settings=serve._load_settings(bench))
    report.runs.append(Run("none", 2, 2, 1.0, 32, 32, None))
    assert "**Simulated acceptance** from " in markdown(report)


@pytest.mark.parametrize(
    "more, message",
    [
        (("--token-prompts", "2:4"), "--simulate and --token-prompts exclude each other"),
        (("--max-new-tokens", "64"), "the trace .* holds 32 tokens per prompt"),
        (("--configs", "none,echo-ngram"), "echo-ngram draft with another drafter than the trace's eagle3"),
    ],
)
def test_what_cannot_hold_is_refused(sim, config, more, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        _args(sim, config, *more)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in err
    import re

    assert re.search(message, err), err


def test_a_missing_trace_and_a_small_vocabulary_are_refused(sim, config, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _args(tmp_path / "nothing", config)
    assert "no nothing.sim.json there" in capsys.readouterr().err
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 100}))
    with pytest.raises(SystemExit):
        _args(sim, config)
    assert "need a vocabulary of 500" in capsys.readouterr().err
