"""The training loop shared by drafter kinds: AdamW, warm-up + cosine, resumable checkpoints.

A kind supplies a model and ``loss_fn(model, batch) -> (loss, correct[steps], counted[steps])``;
the loop owns batching, progress, evaluation and checkpoints. Checkpoints hold no pickles: the
head in its serving layout (``model.safetensors`` + ``config.json``), the optimizer moments in
``optimizer.safetensors`` and the counters in ``state.json``, so a resumed run continues from the
same step with the same schedule.

Learning curve: a ``probe`` (e.g. top-1 on the dev split per kind) runs before the first step and
every ``probe_every`` steps; each point records the step and the training tokens seen so far, and
the curve lives in ``state.json`` too, so a resumed run extends it.

Device and precision: the model is moved to ``device`` and each batch follows it; ``precision
"bf16"`` runs the forward under ``torch.autocast`` (weights and AdamW moments stay fp32), about
1.7x the fp32 speed on CPUs with bf16 dot products (AVX-512 BF16, AMX) and the usual choice on
GPUs. Neither is in the resumable config: a run may resume on another device.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from sglang_echo.platform.cpu import cpu_has_bf16_gemm

from .batches import collate, make_batches
from .features import Sequence

LossFn = Callable[[torch.nn.Module, object], tuple[Tensor, Tensor, Tensor]]


@dataclass
class TrainConfig:
    epochs: float = 2.0
    lr: float = 5e-4
    warmup_steps: int = 50
    batch_tokens: int = 4096
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    save_every: int = 100
    seed: int = 0


PRECISIONS = ("fp32", "bf16")


def resolve_precision(precision: str, device: str) -> str:
    """``auto``: bf16 on GPUs and on CPUs with native bf16 GEMMs (AVX-512 BF16 / AMX), else fp32."""
    if precision != "auto":
        return precision
    if torch.device(device).type == "cpu":
        return "bf16" if cpu_has_bf16_gemm() else "fp32"
    return "bf16"


def require_geometry(head, want, source: Path):
    """``head`` (loaded from ``--init-from source``) if its config is ``want``, the head the
    flags ask for; a clear SystemExit otherwise (one check for every kind)."""
    if head.cfg != want:
        raise SystemExit(f"--init-from {source}: {head.cfg} is not the head these flags ask for ({want})")
    return head


def autocast(device: str, precision: str):
    """The forward's precision context: bf16 autocast, or nothing for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def _save_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    sd = opt.state_dict()
    tensors = {
        f"{i}.{k}": torch.as_tensor(v).detach().cpu().clone() for i, st in sd["state"].items() for k, v in st.items()
    }
    save_file(tensors, str(path))


def _load_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    sd = opt.state_dict()
    state: dict[int, dict] = {}
    for key, t in load_file(str(path)).items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = t
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


@torch.no_grad()
def evaluate(
    model, loss_fn: LossFn, seqs: list[Sequence], batch_tokens: int, device: str = "cpu", precision: str = "fp32"
) -> Tensor:
    """Top-1 accuracy per unrolled step on held-out sequences (teacher-forced tokens)."""
    correct = counted = 0
    for idx in make_batches(seqs, batch_tokens, seed=0):
        with autocast(device, precision):
            _, c, n = loss_fn(model, collate([seqs[i] for i in idx]).to(device))
        correct, counted = correct + c.cpu(), counted + n.cpu()
    return correct / counted.clamp(min=1)


def train(
    model,
    loss_fn: LossFn,
    save_fn: Callable[[Path], None],
    train_seqs: list[Sequence],
    eval_seqs: list[Sequence],
    cfg: TrainConfig,
    out: Path,
    device: str = "cpu",
    precision: str = "fp32",
    probe: Callable[[], dict] | None = None,
    probe_every: int = 0,
) -> dict:
    """Train ``model`` (resuming from ``out/checkpoint`` if present); returns the final report,
    with the ``curve`` of ``probe`` points (see the module docstring) where a probe is given."""
    out = Path(out)
    model.to(device)
    autocast(device, precision)  # validates the precision before any work
    ckpt = out / "checkpoint"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    per_epoch = len(make_batches(train_seqs, cfg.batch_tokens, cfg.seed))
    total = max(1, int(cfg.epochs * per_epoch))
    step = seen = 0  # optimizer steps, training tokens seen
    curve: list[dict] = []
    if (ckpt / "state.json").exists():
        state = json.loads((ckpt / "state.json").read_text())
        if state["config"] != asdict(cfg):
            raise ValueError(f"{ckpt}: saved with a different config {state['config']}; use a new --out")
        from safetensors.torch import load_file as _lf

        model.import_state(_lf(str(ckpt / "model.safetensors")))
        _load_optimizer(opt, ckpt / "optimizer.safetensors")
        step, seen, curve = state["step"], state.get("seen", 0), state.get("curve", [])
        print(f"[train] resuming at step {step}/{total}")

    def measure() -> None:
        if probe is None or (curve and curve[-1]["step"] == step):
            return
        model.eval()
        curve.append({"step": step, "tokens": seen, **probe()})
        model.train()
        print(f"[train] curve: {json.dumps(curve[-1])}")

    def save() -> None:
        tmp = out / "checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_fn(tmp)
        _save_optimizer(opt, tmp / "optimizer.safetensors")
        state = {"step": step, "total": total, "config": asdict(cfg), "seen": seen, "curve": curve}
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        shutil.rmtree(ckpt, ignore_errors=True)
        tmp.rename(ckpt)

    bar = tqdm(total=total, initial=step, desc="train", unit="step")
    model.train()
    measure()
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        batches = make_batches(train_seqs, cfg.batch_tokens, cfg.seed + epoch)
        for idx in batches[offset:]:
            if step >= total:
                break
            for g in opt.param_groups:
                g["lr"] = cfg.lr * _lr_factor(step, total, cfg.warmup_steps)
            with autocast(device, precision):
                loss, correct, counted = loss_fn(model, collate([train_seqs[i] for i in idx]).to(device))
            seen += sum(len(train_seqs[i].tokens) for i in idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            step += 1
            acc = (correct.cpu() / counted.cpu().clamp(min=1)).tolist()
            bar.set_postfix(loss=f"{loss.item():.3f}", acc="/".join(f"{a:.2f}" for a in acc[:4]), epoch=epoch)
            bar.update(1)
            if probe_every and step % probe_every == 0:
                measure()
            if step % cfg.save_every == 0:
                save()
    bar.close()
    measure()
    save()
    model.eval()
    acc = evaluate(model, loss_fn, eval_seqs, cfg.batch_tokens, device, precision) if eval_seqs else torch.zeros(0)
    return {
        "steps": step,
        "epochs": cfg.epochs,
        "train_sequences": len(train_seqs),
        "train_tokens": sum(len(s.tokens) for s in train_seqs),
        "eval_sequences": len(eval_seqs),
        "eval_top1_per_step": [round(a, 4) for a in acc.tolist()],
        **({"curve": curve} if probe is not None else {}),
    }
