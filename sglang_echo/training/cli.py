"""``echo-train-drafter``: train a draft model for a target, from data the target writes itself.

    echo-train-drafter --kind eagle3 --model DIR --out DIR [--data DIR] [--num-prompts 1280]
        [--dataset FILE.jsonl [--keep-answers]]
        [--epochs 2] [--ttt-steps 5] [--draft-vocab 8192] [--batch-tokens 4096] [--lr 5e-4]
        [--eagle3-teacher target] [--init-from HEAD]

Stages, each resumable (rerun the same command after an interruption):
  1. self-distillation: the target answers the offline prompt pool (``training.datagen``; through
     the sglang server by default, ``--gen-backend hf`` for transformers' ``generate``), or the
     conversations of ``--dataset`` (``training.dataset``; ``--keep-answers``: their own answers);
  2. feature capture: the target's hidden states for the drafter's layers (``training.features``);
  3. training with the kind's objective (EAGLE-3: training-time test), checkpoints in ``out/checkpoint``;
  4. the final head in ``out/`` in the layout sglang loads, with ``training_report.json``.

The report's learning curve: top-1 per unrolled step on the prompt pool's dev split (``--dev-per-kind``
prompts of every kind, answered by the target into ``DATA/dev/<kind>``, never trained on), before
the first step and every ``--probe-every`` steps, against the training tokens seen. The head's
``learning_curve.json`` (and ``.png``) continues the ``--init-from`` head's curve where both
probed the same dev split (``training.learning_curve``).

Kinds register in ``KINDS``; DART and DFlash slot in with their own objective.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from sglang_echo.cli_args import (
    DTYPES,
    CommandError,
    Parser,
    alias,
    at_least,
    between,
    check_device,
    count,
    existing_file,
    model_dir,
    out_dir,
    positive_int,
    run,
)
from sglang_echo.cli_args import device as device_arg
from sglang_echo.platform.packed_linear import pack_linears
from sglang_echo.serve.flags import resolve_device

from .datagen import BACKENDS, generate, generate_dev
from .features import capture_dir, load_sequences
from .trainer import PRECISIONS, TrainConfig, evaluate, resolve_precision, train


def build_dart(target: Path, seqs, args):
    """(model, loss_fn, save_fn) of a DART head (``training.dart``)."""
    from .dart import build

    return build(target, seqs, args)


def build_dflash(target: Path, seqs, args):
    """(model, loss_fn, save_fn) of a DFlash block-diffusion head (``training.dflash``)."""
    from .dflash import build

    return build(target, seqs, args)


def build_eagle3(target: Path, seqs, args):
    """(model, loss_fn, save_fn) of an EAGLE-3 head (``training.eagle3``)."""
    from .eagle3 import build

    return build(target, seqs, args)


KINDS = {"eagle3": build_eagle3, "dart": build_dart, "dflash": build_dflash}
POOL_PROMPTS = 1280  # --num-prompts without --dataset
DEV_PER_KIND = 16  # --dev-per-kind without --dataset


def layers_for(kind: str, target: Path) -> tuple[int, ...]:
    L = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    if kind == "dflash":  # EAGLE-3's layers too, so one feature capture serves every kind
        from .dflash import captured_layers

        return captured_layers(L)
    return (2, L // 2, L - 3)  # EAGLE-3 and DART: low / mid / high


def parser() -> Parser:
    ap = Parser(prog="echo-train-drafter", description=__doc__.splitlines()[0])
    add = ap.add_argument
    fraction = between(0.0, 1.0, low_open=True)
    positive = between(0.0, float("inf"), low_open=True)
    add("--kind", choices=sorted(KINDS), default="eagle3", help="the drafter to train")
    add("--model", type=model_dir, default=None, help="target checkpoint folder (default: prepared SmolLM2, float32)")
    add("--out", type=out_dir, required=True, help="the head's folder (checkpoints, data and report in it)")
    add("--data", type=out_dir, default=None, help="self-distillation folder (default: OUT/data)")
    add(
        "--num-prompts",
        type=positive_int,
        default=None,
        help=f"prompts of the pool the target answers (default: {POOL_PROMPTS}), or the first conversations of "
        "--dataset (default: all)",
    )
    add(
        "--dataset",
        type=existing_file,
        default=None,
        help='train on these conversations instead of the pool: JSONL, one {"messages": [{role, content}...]} '
        "a line (OpenAI chat format), the target's chat template applied",
    )
    add(
        "--keep-answers",
        action="store_true",
        help="--dataset: train on the file's assistant turns instead of the target's regenerated last answer",
    )
    add(
        "--prompt-offset",
        type=count,
        default=0,
        help="start at this pool prompt or --dataset conversation (e.g. past the data an --init-from head was "
        "trained on)",
    )
    add("--max-new-tokens", type=positive_int, default=192, help="tokens the target generates per prompt")
    add("--epochs", type=positive, default=2.0)
    add("--ttt-steps", type=positive_int, default=5, help="EAGLE-3: training-time test steps")
    add(
        "--eagle3-teacher",
        choices=("target", "labels"),
        default="labels",
        help="EAGLE-3: CE on the greedy labels, or KL to the target's distribution as SpecForge trains",
    )
    add(
        "--init-from",
        type=model_dir,
        default=None,
        help="go on training this head of --kind (same target, geometry and draft vocabulary) instead of a fresh one",
    )
    add(
        "--revocab",
        action="store_true",
        help="--init-from: pick the draft vocabulary afresh from this run's answers (shared tokens keep their "
        "LM-head rows, new ones start from the target's)",
    )
    add("--dart-depth", type=at_least(2), default=8, help="DART: shifted logits per forward (d; d-1 mask positions)")
    add("--dart-gamma", type=fraction, default=0.6, help="DART: KL weight of output k is gamma^(k-1)")
    add(
        "--dart-teacher",
        choices=("target", "labels"),
        default="target",
        help="DART: KL to the target's distribution (its last layers on the captured features) or CE on the "
        "greedy labels",
    )
    add(
        "--dart-shared-mask", action="store_true", help="DART: one mask vector for all positions (released DART layout)"
    )
    add("--block-size", type=at_least(2), default=8, help="DFlash: block size (anchor + block_size-1 masks)")
    add("--draft-layers", type=positive_int, default=2, help="DFlash: draft decoder layers")
    add("--anchor-fraction", type=fraction, default=0.25, help="DFlash: anchors per answer token per sequence")
    add(
        "--dflash-gamma",
        type=positive,
        default=None,
        help="DFlash: loss decay exp(-(k-1)/gamma) (default: the paper's 4/5/7 for bs 8/10/16)",
    )
    add(
        "--mask-token-id", type=count, default=None, help="DFlash: mask token id (default: from the target's tokenizer)"
    )
    add("--draft-vocab", type=positive_int, default=8192, help="the head's draft vocabulary")
    add("--batch-tokens", type=positive_int, default=4096, help="tokens per training batch")
    add("--lr", type=positive, default=5e-4, help="peak learning rate")
    add("--warmup-steps", type=count, default=50)
    add(
        "--eval-fraction",
        type=between(0.0, 1.0, low_open=True, high_open=True),
        default=0.03,
        help="held-out share of the sequences",
    )
    add("--save-every", type=positive_int, default=100, help="checkpoint every this many steps")
    add(
        "--dev-per-kind",
        type=count,
        default=None,
        help=f"dev-split prompts of each pool kind for the learning curve (0: none; default: {DEV_PER_KIND}, "
        "or 0 with --dataset)",
    )
    add("--probe-every", type=positive_int, default=None, help="learning-curve point every this many steps")
    add("--seed", type=int, default=0)
    add(
        "--device",
        type=device_arg,
        default=None,
        help="where the target and the head run (default: cuda if available, else cpu)",
    )
    add(
        "--precision",
        choices=("auto", *PRECISIONS),
        default="auto",
        help="training forward: bf16 autocast or fp32 (auto: bf16 on GPUs and on CPUs with bf16 units)",
    )
    add(
        "--gen-dtype",
        choices=DTYPES,
        default="float32",
        help="target dtype for self-distillation (bfloat16 is ~1.5x faster on bf16 CPUs)",
    )
    add(
        "--gen-backend",
        choices=BACKENDS,
        default="server",
        help="who answers the prompt pool: the sglang server (continuous batching) or transformers' generate",
    )
    add(
        "--gen-batch",
        type=positive_int,
        default=64,
        help="self-distillation requests in flight (server) or per generate call (hf)",
    )
    alias(ap, "--model", "--target")
    alias(ap, "--num-prompts", "--prompts")
    alias(ap, "--max-new-tokens", "--max-new", "--max-tokens")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    check_device(ap, args.device)
    args.conversations = None
    if args.dev_per_kind is None:
        args.dev_per_kind = 0 if args.dataset is not None else DEV_PER_KIND
    if args.keep_answers and args.dataset is None:
        ap.error("argument --keep-answers: needs --dataset")
    if args.revocab and (args.init_from is None or args.kind == "dflash"):
        ap.error("argument --revocab: needs --init-from of an eagle3 or dart head")
    if args.dataset is not None:
        from .dataset import DatasetError, read_dataset

        try:
            conversations = read_dataset(args.dataset, args.keep_answers)
        except DatasetError as e:
            ap.error(f"argument --dataset: {e}")
        end = None if args.num_prompts is None else args.prompt_offset + args.num_prompts
        args.conversations = conversations[args.prompt_offset : end]
        if not args.conversations:
            ap.error(f"argument --prompt-offset: {args.dataset} has {len(conversations)} conversations")
    return run(ap.prog, lambda: _train(args), args.debug)


def _train(args) -> None:
    device = resolve_device(args.device)
    precision = args.precision = resolve_precision(args.precision, device)  # the kinds' builders read it too

    target = args.model
    if target is None:
        from sglang_echo.models.prepare import prepare

        target = prepare(dtype="float32").path
    data = args.data or args.out / "data"
    t0 = time.time()
    gen = dict(batch=args.gen_batch, dtype=args.gen_dtype, device=device, backend=args.gen_backend)
    if args.conversations is not None:
        from .dataset import dataset_data

        dataset_data(
            args.dataset, args.conversations, target, data, args.keep_answers, max_new=args.max_new_tokens, **gen
        )
        prompts = len(args.conversations)
    else:
        prompts = args.num_prompts or POOL_PROMPTS
        generate(target, data, prompts, args.max_new_tokens, offset=args.prompt_offset, **gen)
    dev = generate_dev(target, data / "dev", args.dev_per_kind, args.max_new_tokens, **gen) if args.dev_per_kind else {}

    from transformers import AutoModelForCausalLM

    layers = layers_for(args.kind, target)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval().to(device)
    pack_linears(model)
    for folder in (data, *dev.values()):
        capture_dir(model, folder, layers)
    del model

    seqs = load_sequences(data, layers)
    if len(seqs) < 2:
        raise CommandError(f"{data} holds {len(seqs)} sequence: training needs 2 or more (one is held out)")
    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(len(seqs), generator=g).tolist()
    n_eval = max(1, int(len(seqs) * args.eval_fraction))
    eval_seqs, train_seqs = [seqs[i] for i in perm[:n_eval]], [seqs[i] for i in perm[n_eval:]]
    model, loss_fn, save_fn = KINDS[args.kind](target, train_seqs, args)
    cfg = TrainConfig(
        epochs=args.epochs,
        lr=args.lr,
        batch_tokens=args.batch_tokens,
        warmup_steps=args.warmup_steps,
        save_every=args.save_every,
        seed=args.seed,
    )
    start_acc = None
    if args.init_from is not None:  # the head before this run, on the same held-out sequences
        model.to(device).eval()
        start_acc = [
            round(a, 4) for a in evaluate(model, loss_fn, eval_seqs, cfg.batch_tokens, device, precision).tolist()
        ]
        print(f"[train] --init-from head, held-out top-1 per step: {start_acc}")
    dev_sets = {kind: load_sequences(folder, layers) for kind, folder in dev.items()}

    def dev_top1() -> dict:
        """Top-1 per unrolled step on each kind's dev split, and the mean over the kinds."""
        per_kind = {
            kind: evaluate(model, loss_fn, seqs, cfg.batch_tokens, device, precision) for kind, seqs in dev_sets.items()
        }
        mean = torch.stack(list(per_kind.values())).mean(0)
        return {
            "dev_top1_mean": [round(a, 4) for a in mean.tolist()],
            "dev_top1": {kind: [round(a, 4) for a in acc.tolist()] for kind, acc in per_kind.items()},
        }

    report = train(
        model,
        loss_fn,
        save_fn,
        train_seqs,
        eval_seqs,
        cfg,
        args.out,
        device=device,
        precision=precision,
        probe=dev_top1 if dev_sets else None,
        probe_every=args.probe_every or cfg.save_every,
    )
    model.save(args.out, dtype=torch.bfloat16)
    report.update(
        kind=args.kind,
        target=str(target),
        captured_layers=list(layers),
        ttt_steps=args.ttt_steps,
        draft_vocab=args.draft_vocab,
        train_config=asdict(cfg),
        prompts=prompts,
        prompt_offset=args.prompt_offset,
        dataset=str(args.dataset) if args.dataset else None,
        keep_answers=args.keep_answers,
        init_from=str(args.init_from) if args.init_from else None,
        revocab=args.revocab,
        init_eval_top1_per_step=start_acc,
        dev_per_kind=args.dev_per_kind,
        device=device,
        precision=precision,
        gen_dtype=args.gen_dtype,
        gen_backend=args.gen_backend,
        wall_seconds=round(time.time() - t0),
    )
    if args.kind == "eagle3":
        report.update(eagle3_teacher=args.eagle3_teacher)
    if args.kind == "dart":
        report.update(
            dart_depth=args.dart_depth,
            dart_gamma=args.dart_gamma,
            dart_teacher=args.dart_teacher,
            dart_shared_mask=args.dart_shared_mask,
        )
    if args.kind == "dflash":
        from .dflash import default_gamma

        report.update(
            block_size=args.block_size,
            draft_layers=args.draft_layers,
            anchor_fraction=args.anchor_fraction,
            dflash_gamma=args.dflash_gamma or default_gamma(args.block_size),
            target_layer_ids=list(model.cfg.target_layer_ids),
            mask_token_id=model.cfg.mask_token_id,
        )
    if report.get("curve"):
        from .learning_curve import CURVE_FILE, continued, earlier_curve, plot

        earlier, why = earlier_curve(args.init_from, args.dev_per_kind, set(dev)) if args.init_from else ([], "")
        if why:
            print(f"[train] learning curve: {why}")
        curve = continued(earlier, report["curve"])
        (args.out / CURVE_FILE).write_text(json.dumps(curve, indent=1) + "\n")
        if figure := plot(curve, args.out / "learning_curve.png", title=f"{args.kind} on {target.name}"):
            print(f"[train] learning curve: {figure}")
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
