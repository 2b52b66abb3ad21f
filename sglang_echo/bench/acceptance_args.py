"""`echo-bench acceptance`'s command line: the options, and every check that can fail before the
target loads (one line ``echo-bench acceptance: error: ...``, exit status 2): the target and head
folders, the draft head that ships for the target, policy and prompt-set names, and the
calibration file (made for this target and drafter)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Optional

from ..cli_args import (
    DTYPES,
    Parser,
    add_prompt_counts,
    alias,
    at_least,
    check_device,
    count,
    device,
    existing_file,
    model_dir,
    name_list,
    out_file,
    positive_int,
)
from ..core.baselines import Chain
from ..core.factory import POLICIES, PolicyConfig, make_policy
from ..core.policy import TreePolicy
from ..models.prompts import DATASETS, is_file_set

DRAFTERS = ("eagle3", "ngram", "dart", "dflash")
# chainN (a chain of depth N), dart-tree (DART's static tree), and every core.factory policy.
policy_names = name_list((*POLICIES, "dart-tree"), (r"chain-?\d+",), what="policy")
_set_names = name_list(DATASETS, (r".+\.jsonl",), what="prompt set")


def prompt_sets(text: str) -> list[str]:
    """Names of DATASETS or paths of JSONL files in the format of `prompts/`, which must exist."""
    names = _set_names(text)
    for n in names:
        if is_file_set(n):
            existing_file(n)
    return names


def _calibration(text: str) -> str:
    """``shipped``, ``defaults`` or an existing file."""
    if text not in ("shipped", "defaults"):
        existing_file(text)
    return text


def parser(description: str = "") -> Parser:
    ap = Parser(prog="echo-bench acceptance", description=description)
    add = ap.add_argument
    add("--model", type=model_dir, required=True, help="the target: a Hugging Face checkpoint folder")
    add("--drafter", choices=DRAFTERS, required=True)
    add(
        "--draft",
        type=model_dir,
        default=None,
        help="the drafter's head folder (eagle3, dart, dflash; default: the head of that kind that ships)",
    )
    add(
        "--ngram",
        type=existing_file,
        default=None,
        help="DART n-gram trie (echo-build-ngram; default: DRAFT/ngram-trie.safetensors if present)",
    )
    add("--no-ngram", action="store_true", help="DART without n-gram pruning (the ablation)")
    add(
        "--hybrid",
        action="store_true",
        help="draft each tree with the head and the n-gram drafter together (drafters/hybrid.py)",
    )
    add("--policies", type=policy_names, default="chain6,static-tree,echo", help="comma-separated policies")
    add(
        "--prompts",
        type=prompt_sets,
        default="humaneval,chat",
        help="comma-separated prompt sets (models/prompts.py) or .jsonl paths",
    )
    add_prompt_counts(ap, per_set=20)
    add("--max-new-tokens", type=positive_int, default=128, help="generated tokens per request")
    add("--batch", type=positive_int, default=8, help="requests decoded together")
    add(
        "--k-max", type=positive_int, default=None, help="batch verification cap of budgeted policies (default 8*batch)"
    )
    add("--max-depth", type=positive_int, default=8, help="draft depth of echo & co. and of the static tree")
    add("--topk", type=positive_int, default=10, help="static tree")
    add("--total-tokens", type=at_least(2), default=60, help="static tree, root included")
    add("--w-def", type=positive_int, default=None, help="ECHO's default width (default: half of --w-max, as served)")
    add("--w-max", type=positive_int, default=4, help="ECHO's widest expansion")
    add(
        "--calibration",
        type=_calibration,
        default="shipped",
        help="ECHO's gates: an echo-calibrate file, 'shipped' (the calibration shipped for this target and drafter, "
        "as the server picks it; paper defaults where none matches) or 'defaults' (the paper's)",
    )
    add("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    add("--max-prompt-len", type=positive_int, default=None, help="keep only the last N prompt tokens")
    add("--device", type=device, default=None, help="default: cuda if available, else cpu")
    add("--dtype", default="float32", choices=DTYPES, help="the target's dtype")
    add("--threads", type=count, default=0, help="torch intra-op threads (0: torch's default)")
    add("--out", type=out_file, default=None, help="write OUT.json and OUT.md (a .json/.md suffix is dropped)")
    alias(ap, "--model", "--target")
    alias(ap, "--max-new-tokens", "--max-new", "--max-tokens")
    return ap


def parse_args(argv: list[str] | None, description: str = "") -> argparse.Namespace:
    """Parsed and checked options; ``draft`` is the shipped head where none was given, ``gating``
    is ``(calibration or None, where it came from)`` and ``built`` each policy by name."""
    ap = parser(description)
    args = ap.parse_args(argv)
    check_device(ap, args.device)
    if "dart-tree" in args.policies and args.drafter != "dart":
        ap.error("--policies dart-tree is DART's own tree: it needs --drafter dart")
    if args.drafter == "ngram" and args.draft is not None:
        ap.error("--draft is a head folder of the drafters with weights; ngram has none")
    try:
        if args.draft is None and args.drafter != "ngram":
            args.draft = shipped_draft(args.model, args.drafter)
        elif args.draft is not None:  # drafts in the target's vocabulary, its weights are there
            from ..models.drafts import check_head_for

            try:
                check_head_for(args.model, args.draft)
            except ValueError as e:
                raise ValueError(f"--draft {args.draft}: {e}") from None
        args.gating = gating_calibration(args.calibration, args.model, args.drafter, args.draft)
        cfg = PolicyConfig(
            k_max=args.k_max or 8 * args.batch,
            max_depth=args.max_depth,
            w_def=args.w_def or max(1, args.w_max // 2),
            w_max=args.w_max,
            topk=args.topk,
            total_tokens=args.total_tokens,
        )
        args.built = {n: build_policy(n, cfg, args.gating[0]) for n in args.policies}
    except ValueError as e:  # DraftMismatch, CalibrationError, a policy's own checks: one line
        ap.error(str(e))
    return args


def build_policy(name: str, cfg: PolicyConfig, calibration=None) -> TreePolicy:
    """The policy ``name`` (see :data:`policy_names`); ValueError for a name or shape it refuses."""
    m = re.fullmatch(r"chain-?(\d+)", name)
    if m:
        return Chain(int(m.group(1)))
    if name == "dart-tree":  # DART's static Algorithm 1; bound to the DART drafter before it runs
        from ..drafters.dart import DartTreePolicy

        return DartTreePolicy(max_depth=cfg.max_depth)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: use chainN or one of {', '.join(POLICIES)}")
    return make_policy(name, cfg, calibration=calibration)


def shipped_draft(target: Path, kind: str) -> Path:
    """The ``kind`` head that ships with sglang-echo, staged for ``target`` (as ``make serve`` and
    ``echo-bench serve`` default to it); ValueError where none ships or it does not fit."""
    from ..models.drafts import DraftMismatch, shipped_head

    try:
        return shipped_head(target, kind)
    except DraftMismatch as e:
        raise ValueError(f"--drafter {kind}: {e}") from None


def gating_calibration(spec: str, target: Path, drafter: str, draft: Optional[Path]):
    """(calibration or None for the paper's defaults, where it came from) for ``--calibration``.
    ``shipped`` picks what the server picks for this target and drafter, so ECHO's rows measure
    the gates ``make serve`` runs."""
    from ..calibration.shipped import shipped_calibration
    from ..core.calibration_file import fingerprint, load_calibration
    from ..integration.served_calibration import drafter_fingerprint

    if spec == "defaults":
        return None, "the paper's default gates"
    path = shipped_calibration(target, drafter, draft) if spec == "shipped" else Path(spec)
    if path is None:
        return None, "the paper's default gates (no shipped calibration for this target and drafter)"
    calibration = load_calibration(
        path,
        model_fingerprint=fingerprint(target),
        drafter_kind=drafter,
        drafter_fingerprint=drafter_fingerprint(drafter, draft),
    )
    return calibration, str(path)
