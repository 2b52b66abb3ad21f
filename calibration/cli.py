"""``echo-calibrate``: profile a drafter's confidence on the target and write ECHO's gating file.

    echo-calibrate --drafter eagle3 --prompts chat,humaneval --num-prompts 32 --out calib.json
    echo-calibrate --drafter ngram --prompts my_prompts.jsonl --depth 8 --width 4 --out calib.json
    echo-calibrate --from-samples calib.samples.jsonl --drafter eagle3 --out calib.json   # re-threshold

ECHO Sec. 3.2 ("Offline Calibration"): the real sglang server (the one ``make serve`` runs, same
worker and drafter) serves the prompts with a beam tree ``depth`` x ``width`` and records, per
request, step and depth, the layer confidence c_{i,d} (Eq. 6) and whether the target accepted a
node there (:mod:`.probe`). Per depth we take the AUC of c for accepted vs rejected
(Mann-Whitney, bootstrap CI), the sweet spots D_sig (root, target depth, AUC > xi) and tau_d
(Youden's J, or expected yield); K_max is suggested from the measured verify-cost knee.

Writes ``--out`` (the calibration JSON the plugin loads via ``SGLANG_ECHO_CALIBRATION``), and next
to it ``<out>.samples.jsonl`` (raw samples, resumable with ``--resume``), ``<out stem>.md`` and
the PNG plots. Exit code 2: bad input (prompts, drafter/model mismatch); 1: the probe failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sglang_echo.cli_args import (
    DTYPES,
    SERVER_DEVICES,
    CommandError,
    Parser,
    alias,
    at_least,
    between,
    existing_file,
    failure_line,
    model_dir,
    out_file,
    port,
    positive_int,
    run,
)
from sglang_echo.core.calibration_file import Calibration, fingerprint
from sglang_echo.core.kmax import Device
from sglang_echo.integration.config import DRAFTERS

from . import report, stats
from .probe import read_samples

PROG = "echo-calibrate"
log = logging.getLogger(PROG)


class InputError(ValueError):
    """Bad user input: reported as one line, exit code 2."""


def parser() -> Parser:
    ap = Parser(prog="echo-calibrate", description=__doc__.splitlines()[0])
    add = ap.add_argument
    add("--drafter", choices=DRAFTERS, required=True)
    add(
        "--model",
        type=model_dir,
        default=None,
        help="target checkpoint folder (default: the prepared SmolLM2, as make serve)",
    )
    add("--draft", type=model_dir, default=None, help="the drafter's head folder (default: the shipped head)")
    add(
        "--prompts",
        default="chat,humaneval",
        help="a JSONL file ({'prompt'} or {'messages'} per line) or built-in sets, comma-separated",
    )
    add("--num-prompts", type=positive_int, default=32, help="prompts in all (spread over the sets)")
    add("--max-new-tokens", type=positive_int, default=128, help="generated tokens per request")
    add("--depth", type=positive_int, default=8, help="probe tree depth (depths 1..depth get a row)")
    add("--width", type=at_least(2), default=4, help="probe beam width per depth (the verify path needs a tree)")
    add(
        "--target-depth",
        type=positive_int,
        default=4,
        help="the served tree depth (ECHO max_depth): always a sweet spot",
    )
    add("--concurrency", type=positive_int, default=8, help="probe requests in flight")
    add("--criterion", choices=tuple(stats.CRITERIA), default="youden")
    add(
        "--auc-min",
        type=between(0.0, 1.0, high_open=True),
        default=stats.DEFAULT_AUC_MIN,
        help="xi: depths with AUC > xi are sweet spots",
    )
    add(
        "--min-class-samples",
        type=positive_int,
        default=stats.MIN_CLASS_SAMPLES,
        help="a depth needs this many accepted and rejected samples to qualify by AUC",
    )
    add("--out", type=out_file, default=Path("echo-calibration.json"), help="the calibration JSON")
    add("--resume", action="store_true", help="keep the samples of an interrupted run and probe only the rest")
    add("--from-samples", type=existing_file, default=None, help="skip probing: summarise an existing samples file")
    add(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="as the server will run (default: what make serve runs: bfloat16 on GPUs and CPUs with bf16 GEMMs, "
        "else float32)",
    )
    add("--device", choices=SERVER_DEVICES, default=None, help="the probe server's device (default: cuda if available)")
    add("--port", type=port, default=None, help="the probe server's port (default: a free one)")
    alias(ap, "--model", "--target")
    alias(ap, "--max-new-tokens", "--max-new", "--max-tokens")
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args(argv)
    if args.drafter == "ngram" and args.draft is not None:
        ap.error("--draft is for the drafters with weights; ngram has none")
    if args.resume and args.from_samples is not None:
        ap.error("--resume continues a probe; --from-samples skips probing")
    try:
        if args.from_samples is None:
            prompt_items(args.prompts, args.num_prompts)
        if args.model is not None and args.draft is not None:
            from sglang_echo.models.drafts import check_head_for

            check_head_for(args.model, args.draft)
    except ValueError as e:  # InputError, DraftMismatch
        ap.error(f"--draft: {e}" if not isinstance(e, InputError) else str(e))
    return args


def prompt_items(spec: str, limit: int) -> list:
    """The first ``limit`` prompts ``--prompts`` names: a JSONL file's, or built-in sets' spread
    over ``limit`` (InputError for a file that cannot be read or parsed, unknown set names, or no
    prompts at all)."""
    from sglang_echo.models import prompts as P

    path = Path(spec)
    if path.suffix == ".jsonl" or path.exists():
        try:
            with open(path, encoding="utf-8") as fh:
                items = P.read_jsonl(fh, path.stem)[:limit]
        except OSError as e:
            raise InputError(f"--prompts {spec}: cannot read ({e.strerror})") from None
        except ValueError as e:  # json.JSONDecodeError is one
            raise InputError(f"--prompts {spec}: {e}") from None
    else:
        names = [n for n in spec.split(",") if n]
        if not names or any(n not in P.DATASETS for n in names):
            raise InputError(f"--prompts {spec!r}: not a file and not built-in sets ({', '.join(P.DATASETS)})")
        items = P.load_mixed(-(-limit // len(names)), names)[:limit]
    if not items:
        raise InputError(f"--prompts {spec}: no non-empty prompts")
    return items


def load_prompts(spec: str, limit: int, tokenizer) -> list[tuple[str, str]]:
    """``(id, rendered text)`` pairs of :func:`prompt_items`; InputError if none has any text."""
    rendered = [(p.id, p.as_text(tokenizer)) for p in prompt_items(spec, limit)]
    rendered = [(pid, text) for pid, text in rendered if text.strip()]
    if not rendered:
        raise InputError(f"--prompts {spec}: no non-empty prompts")
    return rendered


def resolve(args: argparse.Namespace) -> tuple[Path, Path | None]:
    from sglang_echo.models.prepare import prepare_for_serving
    from sglang_echo.serve.flags import resolve_device, resolve_dtype

    # the checkpoint and dtype make serve runs, so that the calibration's fingerprint matches it
    args.device = resolve_device(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device, args.model is None)
    model = args.model or prepare_for_serving(args.dtype).path
    if not (model / "config.json").is_file():
        raise InputError(f"--model {model}: no config.json there")
    draft = None
    if args.drafter != "ngram":
        from sglang_echo.models.drafts import DraftMismatch, check_head_for, shipped_head

        try:
            draft = shipped_head(model, args.drafter) if args.draft is None else args.draft
            check_head_for(model, draft)
        except DraftMismatch as e:
            raise InputError(f"--draft: {e}") from None
    return model, draft


def summarise(args, samples, model: Path, draft: Path | None, probe: dict) -> tuple[Calibration, list]:
    from sglang_echo.integration.served_calibration import drafter_fingerprint

    if samples.depth < 1:
        raise InputError("the samples have no depth columns")
    target_depth = min(args.target_depth, samples.depth)
    rows = tuple(
        stats.summarise_depth(d, samples.conf[:, d - 1], samples.labels(d), args.criterion)
        for d in range(1, samples.depth + 1)
    )
    k_max, curve = stats.verify_cost_knee(samples.verify_tokens, samples.verify_s)
    calib = Calibration(
        model={"name": model.name, "fingerprint": fingerprint(model)},
        drafter={
            "kind": args.drafter,
            "name": draft.name if draft else "ngram",
            "fingerprint": drafter_fingerprint(args.drafter, draft),
        },
        depths=rows,
        sweet_spots=stats.sweet_spots(list(rows), target_depth, args.auc_min, args.min_class_samples),
        criterion=args.criterion,
        auc_min=args.auc_min,
        probe={**probe, "depth": samples.depth, "target_depth": target_depth, "num_samples": samples.num_samples},
        k_max=k_max,
        device=None if k_max is None else asdict(Device.of(args.device)),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    return calib, curve


def meta_file(samples: Path) -> Path:
    """The probe's settings and command, written next to its samples once it has finished."""
    return samples.with_name(samples.name + ".meta.json")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[echo-calibrate] %(message)s")
    args = parse_args(argv)
    return run(PROG, lambda: _calibrate(args, argv), args.debug)


def _calibrate(args: argparse.Namespace, argv: list[str] | None) -> int:
    command = "echo-calibrate " + shlex.join(sys.argv[1:] if argv is None else argv)
    out = args.out
    samples_path = args.from_samples or out.with_name(out.stem + ".samples.jsonl")
    try:
        model, draft = resolve(args)
        if args.from_samples is None:
            probe = _probe(args, model, draft, samples_path, command)
        else:  # the probe's own settings, as it recorded them
            meta = meta_file(samples_path)
            probe = json.loads(meta.read_text()) if meta.is_file() else {"command": None}
        try:
            samples = read_samples(samples_path)
        except ValueError as e:
            raise InputError(str(e)) from None
        calib, curve = summarise(args, samples, model, draft, probe)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    calib.save(out)
    md = out.with_suffix(".md")
    md.write_text(report.markdown(calib, samples, curve, command))
    pngs = report.plots(calib, samples, curve, out.with_suffix(""))
    print(report.markdown(calib, samples, curve, command))
    print(f"wrote {out}, {md}" + "".join(f", {p}" for p in pngs))
    return 0


def _probe(args: argparse.Namespace, model: Path, draft: Path | None, samples_path: Path, command: str) -> dict:
    """Serve the prompts with the probe tree; the probe's settings (also written next to the samples)."""
    from transformers import AutoTokenizer

    from .runner import ProbeJob, run_probe

    tok = AutoTokenizer.from_pretrained(model)
    prompts = load_prompts(args.prompts, args.num_prompts, tok)
    probe = {
        "command": command,
        "prompts": args.prompts,
        "num_prompts": len(prompts),
        "width": args.width,
        "max_new_tokens": args.max_new_tokens,
        "concurrency": args.concurrency,
    }
    job = ProbeJob(
        model=model,
        drafter=args.drafter,
        draft=draft,
        prompts=prompts,
        samples=samples_path,
        depth=args.depth,
        width=args.width,
        max_new_tokens=args.max_new_tokens,
        concurrency=args.concurrency,
        dtype=args.dtype,
        device=args.device,
        port=args.port,
    )
    log.info(
        "probing %d prompts through sglang (beam tree %dx%d); samples -> %s",
        len(prompts),
        args.depth,
        args.width,
        samples_path,
    )
    try:
        run_probe(job, resume=args.resume)
    except Exception as e:  # the probe server failed: say where its log is
        raise CommandError(
            f"calibration probe failed ({failure_line(e)}); server log: {samples_path.with_suffix('.server.log')}"
        ) from e
    meta_file(samples_path).write_text(json.dumps(probe, indent=2) + "\n")
    return probe


if __name__ == "__main__":
    sys.exit(main())
