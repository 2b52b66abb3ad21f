"""Simulated acceptance: an ECHO server that accepts exactly what a recorded target + drafter pair
accepted, whatever its own weights (``SGLANG_ECHO_SIMULATE=TRACE_STEM``).

sglang's ``SGLANG_SIMULATE_ACC_LEN`` forces a fixed accept length on EAGLE's first chain, so a
server with random weights (``--load-format dummy``) can be timed at a realistic acceptance. This
module extends that convention to ECHO, driven by an ``echo-replay`` trace (a real target's
greedy continuation of each prompt and, at every position, the real drafter's deep draft tree
with its log-probabilities; :mod:`sglang_echo.replay.trace`):

* **Streams.** A request whose prompt ids are a trace prompt follows that trace stream
  (:class:`TraceStreams`, looked up once per request and cached on it); any other request is
  decoded by the server's own weights, untouched.
* **Drafts** (:class:`SimulatedFrontierDrafter`, built by the worker's ``_frontier``). The EAGLE-3
  frontier drafter still runs the draft model's forward at every depth, over the frontier the
  policy chose (the draft cost is real), but the candidates it returns are the trace's tokens,
  log-probabilities and validity for those frontier nodes (:class:`~sglang_echo.replay.drafter.
  RecordedDrafter`, on the device), so the gates and Algorithm 1 see the recorded drafter's real
  confidences.
* **Target** (:func:`force_tokens`, AROUND hooks registered by :func:`register`). After the
  target's verify forward, each verified node's logits get a large value at the trace's next true
  token, a scatter of ``B x W`` values into ``next_token_logits`` (after ragged verify's scatter:
  the hook is on sglang's ``eagle_sample``), so the target's greedy choice at a node at position
  ``q`` is the token the trace holds at ``q + 1``. The prefill's first token is forced the same
  way (the sampled ids of the target's extend). The committed sequence is then exactly the
  trace's greedy continuation, and a node is accepted exactly when the recorded target would
  have accepted it (replay's rule: ``sglang_echo/replay/README.md``, Replay).

What stays real: every forward (target verify over the real tree sizes, draft model, draft
extend), the control plane, the KV cache and the scheduling. What is simulated: which tokens the
drafter proposes and which the target picks. Rows the trace cannot serve (an unknown prompt, a
position past the recorded trees, a root that is not the trace's token) draft nothing and keep
their own logits. Greedy requests only: the forced logit makes a sampled request greedy too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from sglang_echo import env

log = logging.getLogger(__name__)

ENV = "SGLANG_ECHO_SIMULATE"
STREAM_ATTR = "_echo_sim_stream"  # cached on each sglang Req: its trace stream, -1 if none
# Added at the forced token: far above any real logit (fp16 holds it), finite under softmax.
FORCED_LOGIT = 1e4
VERIFY_SAMPLE = "sglang.srt.speculative.eagle_utils.eagle_sample"  # hooked (AROUND)
TARGET_FORWARD = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"  # hooked (AROUND)


class SimulationError(ValueError):
    """``SGLANG_ECHO_SIMULATE`` cannot run on this server; the message names the setting."""


def force_tokens(logits: Tensor, tokens: Tensor) -> None:
    """Make ``tokens[n]`` the argmax of row ``n`` of ``logits`` ``[N, V]`` in place, where
    ``tokens[n] >= 0`` (other rows keep their values). One gather and one scatter of ``N``
    values: no row is rewritten across the vocabulary, and no host sync."""
    col = tokens.clamp(min=0).to(torch.int64)[:, None]
    keep = logits.gather(1, col)
    forced = torch.full_like(keep, FORCED_LOGIT)
    logits.scatter_(1, col, torch.where(tokens[:, None] >= 0, forced, keep))


@dataclass
class TraceStreams:
    """The trace's streams as a server meets them: prompt ids -> stream, and each stream's token at
    every absolute position (its prompt, then its greedy continuation), on the device."""

    index: dict[tuple[int, ...], int]
    start: Tensor  # [P] offset of the stream's position 0 in ``tokens``
    end: Tensor  # [P] one past its last recorded position
    prompt_len: Tensor  # [P]
    tokens: Tensor  # [sum] prompt + continuation, stream after stream
    tree_start: Tensor  # [P] global index of the tree rooted at o_0
    num_trees: Tensor  # [P] trees recorded (roots o_0 .. o_{n-1})
    strangers: int = 0  # requests met whose prompt is not a trace prompt

    @classmethod
    def from_trace(cls, trace, device: torch.device | str = "cpu") -> "TraceStreams":
        P = trace.num_prompts
        index: dict[tuple[int, ...], int] = {}
        for p in range(P):  # once per trace; the first of duplicate prompts wins
            index.setdefault(tuple(trace.prompt(p).tolist()), p)
        prompt_len = trace.prompt_indptr[1:] - trace.prompt_indptr[:-1]
        seq_len = prompt_len + trace.output_indptr[1:] - trace.output_indptr[:-1]
        seqs = [torch.cat([trace.prompt(p), trace.output(p)]) for p in range(P)]
        start = torch.cumsum(seq_len, 0) - seq_len
        dev = torch.device(device)
        return cls(
            index=index,
            start=start.to(dev),
            end=(start + seq_len).to(dev),
            prompt_len=prompt_len.to(dev),
            tokens=(torch.cat(seqs) if seqs else torch.zeros(0, dtype=torch.int64)).to(dev),
            tree_start=trace.tree_indptr[:-1].to(dev),
            num_trees=(trace.tree_indptr[1:] - trace.tree_indptr[:-1]).to(dev),
        )

    def stream_of(self, req: Any) -> int:
        """``req``'s trace stream (-1: its prompt is not a trace prompt); looked up once, then cached."""
        p = getattr(req, STREAM_ATTR, None)
        if p is None:
            p = self.index.get(tuple(req.origin_input_ids), -1)
            setattr(req, STREAM_ATTR, p)
            if p < 0:  # the first one warns; later ones (sglang's health checks among them) log at debug
                self.strangers += 1
                log.log(
                    logging.WARNING if self.strangers == 1 else logging.DEBUG,
                    "ECHO simulate: request %s (%d prompt tokens) is not a trace prompt: the server's own "
                    "weights decode it",
                    getattr(req, "rid", "?"),
                    len(req.origin_input_ids),
                )
        return p

    def streams(self, reqs: Sequence[Any]) -> Tensor:
        """``[B]`` stream of every request of a batch, -1 for those outside the trace; on a GPU
        copied from pinned memory without waiting for the device's queue (a pageable copy syncs)."""
        ids = torch.tensor([self.stream_of(r) for r in reqs], dtype=torch.int64)
        dev = self.tokens.device
        return ids if dev.type == "cpu" else ids.pin_memory().to(dev, non_blocking=True)

    def next_tokens(self, streams: Tensor, positions: Tensor) -> Tensor:
        """The token each stream holds right after ``positions`` (``[B, ...]``, absolute): what the
        recorded target generated there; -1 for unknown streams, positions inside the prompt and
        past the recorded continuation."""
        shape = (-1,) + (1,) * (positions.dim() - 1)
        p = streams.clamp(min=0).view(shape)
        nxt = positions.to(torch.int64) + 1
        idx = self.start[p] + nxt
        ok = (streams.view(shape) >= 0) & (nxt >= self.prompt_len[p]) & (idx < self.end[p])
        return torch.where(ok, self.tokens[idx.clamp(0, max(self.tokens.numel() - 1, 0))], -1)

    def trees(self, streams: Tensor, seq_lens: Tensor, roots: Tensor) -> Tensor:
        """``[B]`` the recorded tree of each request's step: root ``o_s`` sits at position
        ``seq_len = prompt_len + s``; -1 where the stream is unknown, ``s`` is past the recorded
        trees, or the root is not the trace's token there (a stream that left the trace)."""
        p = streams.clamp(min=0)
        pos = seq_lens.to(torch.int64)
        s = pos - self.prompt_len[p]
        idx = (self.start[p] + pos).clamp(0, max(self.tokens.numel() - 1, 0))
        ok = (streams >= 0) & (s >= 0) & (s < self.num_trees[p]) & (self.tokens[idx] == roots.to(torch.int64))
        return torch.where(ok, self.tree_start[p] + s, -1)


class SimulatedFrontierDrafter:
    """The core's drafter protocol with the real EAGLE-3 frontier drafter's forwards and the trace's
    candidates (module docstring: Drafts)."""

    def __init__(self, real, recorded, trees: Tensor):
        self.real, self.recorded = real, recorded
        recorded.seek(trees)

    def propose(self, frontier, k: int):
        k = min(k, getattr(self.real, "topk", k))  # the real drafter's children per slot
        self.real.propose(frontier, k)  # the draft forward, and its own lane bookkeeping for the next depth
        return self.recorded.propose(frontier, k)

    def __getattr__(self, name):  # forwards, ...
        return getattr(self.real, name)


class Simulation:
    """One server's simulated acceptance: the trace, its streams and the recorded drafter, on the device."""

    def __init__(self, trace, stem: str, device: torch.device | str):
        from sglang_echo.replay.drafter import RecordedDrafter

        self.trace, self.stem = trace, stem
        self.streams = TraceStreams.from_trace(trace, device)
        self.recorded = RecordedDrafter(trace, device, track=False)

    def describe(self) -> str:
        m = self.trace.meta
        return (
            f"simulated acceptance from trace {self.stem} ({m.drafter} drafter on {Path(m.target).name}, "
            f"{self.trace.num_prompts} streams, {m.max_new} tokens each)"
        )

    def frontier(self, real, batch, roots: Tensor) -> SimulatedFrontierDrafter:
        streams = self.streams.streams(batch.reqs)
        return SimulatedFrontierDrafter(real, self.recorded, self.streams.trees(streams, batch.seq_lens, roots))

    def force_verify(self, verify_input, batch, logits_output) -> None:
        """The target's greedy choice at every verified node: the trace's next token there."""
        bs, width = len(batch.reqs), verify_input.draft_token_num
        positions = verify_input.positions.view(bs, width)
        want = self.streams.next_tokens(self.streams.streams(batch.reqs), positions).view(-1)
        force_tokens(logits_output.next_token_logits[: bs * width], want)

    def force_prefill(self, batch, result) -> None:
        """The prefill's token (``o_0`` for a finished prompt): the trace's."""
        ids = result.next_token_ids
        want = self.streams.next_tokens(self.streams.streams(batch.reqs), batch.seq_lens - 1)
        result.next_token_ids = torch.where(want >= 0, want.to(ids.dtype), ids)


_ACTIVE: Optional[Simulation] = None


def active() -> Optional[Simulation]:
    """This process's simulation (set by :func:`start`), or None."""
    return _ACTIVE


def start(drafter: str, vocab_size: int, device: torch.device | str) -> Optional[Simulation]:
    """Called once by the ECHO worker: the simulation ``SGLANG_ECHO_SIMULATE`` names, checked
    (the trace exists and loads, the drafter is EAGLE-3's, the target's vocabulary holds every
    trace id), or None when the variable is unset. Raises :class:`SimulationError`."""
    global _ACTIVE
    stem = env.get(ENV)
    if stem is None:
        _ACTIVE = None
        return None
    _ACTIVE = load(stem, drafter, vocab_size, device)
    log.warning(
        "ECHO: %s: the drafts and the target's tokens come from the trace, every forward is real", _ACTIVE.describe()
    )
    return _ACTIVE


def load(stem: str, drafter: str, vocab_size: int, device: torch.device | str) -> Simulation:
    from sglang_echo.replay.trace import Trace, trace_files

    if drafter != "eagle3":
        raise SimulationError(
            f"{ENV}: simulated acceptance drives the EAGLE-3 frontier drafter; this server's "
            f"drafter is {drafter!r} (SGLANG_ECHO_DRAFTER=eagle3)"
        )
    missing = [str(p) for p in trace_files(stem) if not p.is_file()]
    if missing:
        raise SimulationError(
            f"{ENV}={stem}: no trace there ({', '.join(missing)} missing; echo-replay record "
            "writes STEM.json and STEM.safetensors)"
        )
    try:
        trace = Trace.load(stem)
    except (ValueError, OSError, TypeError, KeyError) as e:
        raise SimulationError(f"{ENV}={stem}: not a readable trace ({type(e).__name__}: {e})") from None
    need = trace.vocab_needed()
    if need > vocab_size:
        raise SimulationError(
            f"{ENV}={stem}: the trace's vocabulary ({need} ids) is larger than this target's "
            f"({vocab_size}); serve a target whose vocabulary holds it"
        )
    return Simulation(trace, str(stem), device)


def trace_identity(stem: str) -> dict[str, str]:
    """The recorded target's and head's fingerprints (``{"model", "drafter"}``): under a simulation
    the gates see the trace's confidences, so a calibration is checked against the pair that made
    them, not against this server's weights. Raises :class:`SimulationError` for a trace without."""
    from sglang_echo.replay.trace import TraceMeta

    try:
        found = TraceMeta.read(stem).fingerprints
    except (OSError, ValueError, TypeError) as e:
        raise SimulationError(f"{ENV}={stem}: not a readable trace ({type(e).__name__}: {e})") from None
    if "model" not in found or "drafter" not in found:
        raise SimulationError(
            f"{ENV}={stem}: the trace records no fingerprints of its target and head, so no calibration "
            "can be checked against it; record it again (FORCE=1 bash benchmarks/gpu/make_trace.sh) or unset "
            "SGLANG_ECHO_CALIBRATION"
        )
    return found


def simulated(drafter, batch, roots: Tensor):
    """``drafter`` itself, or, under a simulation, the same drafter serving the trace's candidates."""
    return drafter if _ACTIVE is None else _ACTIVE.frontier(drafter, batch, roots)


def _require_active() -> Simulation:
    if _ACTIVE is None:
        raise SimulationError(
            f"{ENV} is set, but this server's speculative worker is not ECHO's EAGLE-3 worker: "
            "only --speculative-algorithm ECHO with SGLANG_ECHO_DRAFTER=eagle3 simulates a trace "
            "(sglang's own EAGLE3 uses SGLANG_SIMULATE_ACC_LEN)"
        )
    return _ACTIVE


def verify_sample_hook(original, verify_input, batch, logits_output, *args, **kwargs):
    """AROUND ``eagle_sample``: the trace's tokens win the verified nodes' logits, then sglang samples."""
    if not batch.forward_mode.is_idle() and len(batch.reqs):
        _require_active().force_verify(verify_input, batch, logits_output)
    return original(verify_input, batch, logits_output, *args, **kwargs)


def target_forward_hook(original, worker, *args, **kwargs):
    """AROUND ``TpModelWorker.forward_batch_generation``: a target extend's sampled tokens, the trace's."""
    result = original(worker, *args, **kwargs)
    batch = args[0] if args else kwargs.get("batch")
    if (
        _ACTIVE is not None
        and batch is not None
        and not kwargs.get("is_verify", False)
        and not getattr(worker, "is_draft_worker", False)
        and batch.forward_mode.is_extend()
        and getattr(result, "next_token_ids", None) is not None
        and len(batch.reqs)
    ):
        _ACTIVE.force_prefill(batch, result)
    return result


def register(hooks: Any, around: Any) -> None:
    """The simulation's hooks (``hooks``: sglang's HookRegistry), only when ``SGLANG_ECHO_SIMULATE``
    is set: every other server runs sglang's functions unwrapped."""
    if env.get(ENV) is None:
        return
    hooks.register(VERIFY_SAMPLE, verify_sample_hook, around)
    hooks.register(TARGET_FORWARD, target_forward_hook, around)
