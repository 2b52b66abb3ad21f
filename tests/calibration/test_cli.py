"""echo-calibrate: bad input fails clearly; samples -> a calibration the plugin loads; and end to end
through a real sglang server on SmolLM2 with both shipped drafters."""

import json
from pathlib import Path

import numpy as np
import pytest

from sglang_echo.calibration.cli import main
from sglang_echo.integration.config import load_config
from sglang_echo.integration.served_calibration import load_calibration_for


def _calib_env(path: Path, drafter: str):
    return load_config(environ={"SGLANG_ECHO_CALIBRATION": str(path), "SGLANG_ECHO_DRAFTER": drafter})


def _status(argv: list[str]) -> int:
    """main's exit status, whether it returned it or argparse exited with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_draft_for_another_vocabulary_is_refused(tmp_path, capsys):
    model, draft = tmp_path / "model", tmp_path / "draft"
    for d, vocab in ((model, 100), (draft, 200)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"vocab_size": vocab, "hidden_size": 8}))
    assert (
        _status(
            ["--drafter", "eagle3", "--model", str(model), "--draft", str(draft), "--out", str(tmp_path / "c.json")]
        )
        == 2
    )
    assert "trained for a target with vocab_size=200" in capsys.readouterr().err
    assert (
        _status(["--drafter", "ngram", "--model", str(model), "--draft", str(draft), "--out", str(tmp_path / "c.json")])
        == 2
    )


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read"),
        ("", "no non-empty prompts"),
        ('{"prompt": "   "}\n', "no non-empty prompts"),
        ('{"text": "hi"}\n', "needs 'prompt' or 'messages'"),
        ('{"prompt": "a"\n', "Expecting"),
    ],
)
def test_bad_prompt_files_exit_2_with_a_reason(tmp_path, capsys, smollm2_dir, content, message):
    prompts = tmp_path / "p.jsonl"
    if content is not None:
        prompts.write_text(content)
    out = tmp_path / "c.json"
    assert (
        _status(["--drafter", "ngram", "--model", str(smollm2_dir), "--prompts", str(prompts), "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1
    assert not out.exists()


def _synthetic_samples(path: Path, n: int = 400, depth: int = 4, seed: int = 0) -> None:
    """Depth 1-2 confidence separates accepted from rejected; depths 3-4 are noise."""
    rng = np.random.default_rng(seed)
    acc = rng.integers(0, depth + 1, n)
    conf = np.empty((n, depth))
    for d in range(1, depth + 1):
        good = acc >= d
        conf[:, d - 1] = (
            np.where(good, rng.uniform(0.4, 1.0, n), rng.uniform(0.0, 0.6, n)) if d <= 2 else rng.uniform(0, 1, n)
        )
    with open(path, "w") as fh:
        for i in range(0, n, 4):
            fh.write(
                json.dumps(
                    {
                        "conf": conf[i : i + 4].tolist(),
                        "top1": conf[i : i + 4].tolist(),
                        "accepted": acc[i : i + 4].tolist(),
                        "verify_tokens": 9 * (1 + i % 3),
                        "verify_s": 0.01,
                    }
                )
                + "\n"
            )


def test_from_samples_writes_a_calibration_the_plugin_loads(tmp_path, smollm2_dir):
    samples = tmp_path / "s.jsonl"
    _synthetic_samples(samples)
    out = tmp_path / "ngram.json"
    argv = ["--drafter", "ngram", "--model", str(smollm2_dir), "--from-samples", str(samples), "--out", str(out)]
    assert main(argv + ["--target-depth", "4"]) == 0
    calib = load_calibration_for(_calib_env(out, "ngram"), model_path=str(smollm2_dir))
    # Root and target depth always; depth 2 by its AUC; depth 3 is noise.
    assert calib.sweet_spots == (1, 2, 4)
    assert calib.depths[0].auc > 0.8 and abs(calib.depths[2].auc - 0.5) < 0.15
    assert all(0.35 <= calib.threshold(d) <= 0.65 for d in (1, 2))
    assert calib.k_max is not None
    # The knee is this CPU's: it sets a server's cap here, and never one on another device.
    from sglang_echo.core.kmax import Device
    from sglang_echo.integration.config import server_kmax

    assert Device.from_json(calib.device) == Device.of("cpu")
    assert server_kmax(_calib_env(out, "ngram"), calib, "cpu").flat == calib.k_max
    assert "calibration" in server_kmax(_calib_env(out, "ngram"), calib, "cpu").source
    for suffix in (".md", ".confidence_density.png", ".auc_by_depth.png", ".verify_cost.png"):
        assert (tmp_path / f"ngram{suffix}").stat().st_size > 0
    # The same samples made for eagle3 are refused by an n-gram server, and vice versa.
    assert (
        main(
            [
                "--drafter",
                "eagle3",
                "--model",
                str(smollm2_dir),
                "--from-samples",
                str(samples),
                "--out",
                str(tmp_path / "e.json"),
            ]
        )
        == 0
    )
    from sglang_echo.core.calibration_file import CalibrationError

    with pytest.raises(CalibrationError, match="made for the 'eagle3' drafter"):
        load_calibration_for(_calib_env(tmp_path / "e.json", "ngram"), model_path=str(smollm2_dir))


@pytest.mark.server
@pytest.mark.parametrize("drafter", ["ngram", "eagle3"])
def test_calibrate_smollm2_end_to_end(tmp_path, smollm2_dir, drafter):
    """A few prompts through the real server; the file loads for the served model and drafter."""
    out = tmp_path / f"{drafter}.json"
    argv = [
        "--drafter",
        drafter,
        "--model",
        str(smollm2_dir),
        "--prompts",
        "chat,humaneval",
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "24",
        "--depth",
        "4",
        "--width",
        "2",
        "--concurrency",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    from sglang_echo.calibration.probe import read_samples

    s = read_samples(tmp_path / f"{drafter}.samples.jsonl")
    assert s.depth == 4 and s.num_samples >= 4 * 24 // 5  # every step of every request
    rates = [s.labels(d).mean() for d in range(1, 5)]
    assert rates == sorted(rates, reverse=True), "accepting depth d needs depth d-1 accepted"
    assert ((s.conf >= 0) & (s.conf <= 1)).all() and (np.diff(s.conf, axis=1) <= 1e-6).all(), (
        "c_{i,d} never grows with d"
    )
    last_pos: dict[str, int] = {}  # every sample names its request and root position, advancing step by step
    for line in (tmp_path / f"{drafter}.samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert len(row["rid"]) == len(row["pos"]) == len(row["conf"])
        for rid, pos in zip(row["rid"], row["pos"]):
            assert pos > last_pos.get(rid, -1)
            last_pos[rid] = pos
    draft = None
    if drafter == "eagle3":
        from sglang_echo.models.drafts import stage_head

        draft = str(stage_head(smollm2_dir))
    calib = load_calibration_for(_calib_env(out, drafter), model_path=str(smollm2_dir), draft_path=draft)
    assert 1 in calib.sweet_spots and 4 in calib.sweet_spots


def test_shipped_calibration_is_found_only_for_its_model_and_drafter(tmp_path, smollm2_dir):
    from sglang_echo.calibration.shipped import shipped_calibration

    samples = tmp_path / "s.jsonl"
    _synthetic_samples(samples)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    assert (
        main(
            [
                "--drafter",
                "ngram",
                "--model",
                str(smollm2_dir),
                "--from-samples",
                str(samples),
                "--out",
                str(shipped / "smollm2-ngram.json"),
            ]
        )
        == 0
    )
    assert shipped_calibration(smollm2_dir, "ngram", root=shipped) == shipped / "smollm2-ngram.json"
    assert shipped_calibration(smollm2_dir, "eagle3", root=shipped) is None
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert shipped_calibration(other, "ngram", root=shipped) is None


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("drafter", ["eagle3", "dart", "dflash", "ngram"])
def test_every_shipped_calibration_matches_its_shipped_head(drafter, dtype):
    """A retrained head must ship with new calibrations, one per dtype `make serve` may serve
    (bf16, or fp32 on CPUs without bf16 GEMMs): the fingerprint check would otherwise make it
    fall back to the default gates."""
    from sglang_echo.calibration.shipped import shipped_calibration
    from sglang_echo.models.drafts import shipped_head
    from sglang_echo.models.prepare import prepare

    model = prepare(dtype=dtype).path
    draft = None if drafter == "ngram" else shipped_head(model, drafter)
    path = shipped_calibration(model, drafter, draft)
    suffix = "" if dtype == "bfloat16" else "-fp32"
    assert path is not None and path.name == f"smollm2-135m-instruct-{drafter}{suffix}.json"
