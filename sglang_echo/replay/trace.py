"""The replay trace: every position's recorded draft tree plus the target's greedy continuation.

At temperature 0 the committed sequence does not depend on the policy, so one recording serves
every policy. For every recorded prompt ``p`` the trace holds

* the prompt tokens and the target's greedy output ``o_0, o_1, ...`` (``o_0`` is the prefill's
  token). The output runs past ``max_new`` by the recorded depth (eos ignored) so an accepted
  path near the end of a stream can still be checked exactly as the offline loop checks it;
* one draft tree per position ``s = 0 .. max_new - 2``: root ``o_s`` (the committed prefix is the
  prompt and ``o_0 .. o_s``), drafted by the live drafter as it would be at that position.

Trees are stored flattened (CSR over trees), each a self-contained tree in BFS order whose every
node's children are contiguous and in the drafter's own order (best first), so "the first ``k``
children of ``n``" is ``first_child[n] .. first_child[n] + min(k, n_kept[n])``. Per node:

========== ======= ===============================================================
token      int32   token id
parent     int32   local index of the parent (-1 for the root)
depth      int16   0 for the root
logprob    float32 the drafter's log q(token | parent path) (0 for the root)
first_child int32  local index of the first recorded child (-1 if none)
n_kept     int16   children recorded
n_avail    int16   children the drafter returned when asked for ``width`` (-1: never asked)
========== ======= ===============================================================

``n_kept < n_avail`` only where the node cap pruned children; ``n_avail == -1`` marks nodes the
recording never expanded (the deepest depth, nodes off every recorded beam). Replay counts a
request for children that the trace cannot serve as a coverage miss instead of guessing.

Files: ``STEM.safetensors`` (the tensors) and ``STEM.json`` (:class:`TraceMeta`), never pickle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

SCHEMA = "sglang-echo/replay-trace"
VERSION = 1

# name -> storage dtype (loaded back as int64 / float32 for indexing and scores).
NODE_FIELDS = {
    "token": torch.int32,
    "parent": torch.int32,
    "depth": torch.int16,
    "logprob": torch.float32,
    "first_child": torch.int32,
    "n_kept": torch.int16,
    "n_avail": torch.int16,
}
INDEX_FIELDS = ("prompt_indptr", "prompt_tokens", "output_indptr", "output_tokens", "tree_indptr", "node_indptr")


@dataclass
class TraceMeta:
    """What was recorded and how; the JSON half of a trace."""

    drafter: str  # "eagle3" | "ngram"
    target: str  # target checkpoint path
    max_new: int  # usable generated tokens per stream (trees exist at roots o_0 .. o_{max_new-2})
    depth: int  # deepest recorded draft depth
    width: int  # children requested from the drafter per expanded node
    beams: list[int]  # beam widths whose frontiers were expanded at every depth
    max_nodes: int  # node cap per tree (by path score), root included
    eos_id: Optional[int] = None  # the replay stops a stream at its first eos (as the offline loop)
    vocab_size: Optional[int] = None  # the target's vocabulary (a simulating server's must be at least this)
    draft: Optional[str] = None  # EAGLE-3 head path
    drafter_params: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    # {"model", "drafter"}: the recorded pair's identities as a calibration file records them
    # (core/calibration_file.fingerprint), so a server simulating this trace gates with its calibration.
    fingerprints: dict[str, str] = field(default_factory=dict)
    prompts: list[str] = field(default_factory=list)  # prompt ids, in trace order
    stats: dict[str, Any] = field(default_factory=dict)  # nodes, pruned nodes, seconds, ...
    command: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA
    version: int = VERSION

    @classmethod
    def read(cls, stem: str | Path) -> "TraceMeta":
        """``STEM.json`` alone (its schema checked), without the node tensors."""
        stem = _stem(stem)
        raw = json.loads(Path(f"{stem}.json").read_text())
        if raw.get("schema") != SCHEMA or raw.get("version") != VERSION:
            raise ValueError(f"{stem}.json: not a {SCHEMA} v{VERSION} file")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass
class Trace:
    """A recorded trace (see the module docstring). Node tensors are global over all trees."""

    meta: TraceMeta
    prompt_indptr: Tensor  # [P+1]
    prompt_tokens: Tensor  # [sum prompt lengths]
    output_indptr: Tensor  # [P+1]
    output_tokens: Tensor  # [sum output lengths]: greedy continuation, max_new + depth per stream
    tree_indptr: Tensor  # [P+1] trees of prompt p: tree_indptr[p] + s is the tree rooted at o_s
    node_indptr: Tensor  # [T+1] nodes of tree t
    token: Tensor  # [N]
    parent: Tensor
    depth: Tensor
    logprob: Tensor
    first_child: Tensor
    n_kept: Tensor
    n_avail: Tensor

    # -- shapes -----------------------------------------------------------------------------------
    @property
    def num_prompts(self) -> int:
        return self.prompt_indptr.numel() - 1

    @property
    def num_trees(self) -> int:
        return self.node_indptr.numel() - 1

    @property
    def num_nodes(self) -> int:
        return self.token.numel()

    def prompt(self, p: int) -> Tensor:
        return self.prompt_tokens[self.prompt_indptr[p] : self.prompt_indptr[p + 1]]

    def output(self, p: int) -> Tensor:
        return self.output_tokens[self.output_indptr[p] : self.output_indptr[p + 1]]

    def vocab_needed(self) -> int:
        """The smallest vocabulary that holds every id of the trace: the recorded target's, else the
        largest id + 1 (traces written before ``vocab_size`` was recorded)."""
        if self.meta.vocab_size is not None:
            return int(self.meta.vocab_size)
        ids = [t.max() for t in (self.prompt_tokens, self.output_tokens, self.token) if t.numel()]
        return int(torch.stack(ids).max()) + 1 if ids else 0

    def num_positions(self, p: int) -> int:
        return int(self.tree_indptr[p + 1] - self.tree_indptr[p])

    def stream_length(self, p: int, max_new: Optional[int] = None, eos_id: Optional[int] = None) -> int:
        """Tokens the offline loop generates for prompt ``p``: ``max_new``, or up to its first eos."""
        n = min(max_new or self.meta.max_new, self.meta.max_new)
        if eos_id is not None:
            hits = (self.output(p)[:n] == eos_id).nonzero()
            if hits.numel():
                n = int(hits[0]) + 1
        return n

    # -- global views used by replay (cached) ---------------------------------------------------
    def tree_of_node(self) -> Tensor:
        """[N] tree index of every node."""
        counts = self.node_indptr[1:] - self.node_indptr[:-1]
        return torch.repeat_interleave(torch.arange(self.num_trees), counts)

    def global_first_child(self) -> Tensor:
        """[N] global index of each node's first child (-1 if none)."""
        base = self.node_indptr[:-1][self.tree_of_node()]
        return torch.where(self.first_child >= 0, self.first_child + base, self.first_child)

    def tree_roots(self) -> Tensor:
        """[T] global index of every tree's root."""
        return self.node_indptr[:-1].clone()

    def global_parent(self) -> Tensor:
        """[N] global index of each node's parent (-1 for roots)."""
        base = self.node_indptr[:-1][self.tree_of_node()]
        return torch.where(self.parent >= 0, self.parent + base, -1)

    @cached_property
    def on_true_path(self) -> Tensor:
        """[N] whether the node's root path matches the greedy continuation (so a verifier
        would accept it; roots are). Computed once per trace: every replayed policy reads it."""
        tree = self.tree_of_node()
        prompt_of_tree = torch.repeat_interleave(
            torch.arange(self.num_prompts), self.tree_indptr[1:] - self.tree_indptr[:-1]
        )
        pos = torch.arange(self.num_trees) - self.tree_indptr[:-1][prompt_of_tree]
        p = prompt_of_tree[tree]
        # The token that should sit at depth d below root o_s is o_{s+d}.
        idx = self.output_indptr[p] + pos[tree] + self.depth
        ok_idx = idx < self.output_indptr[p + 1]
        want = torch.where(ok_idx, self.output_tokens[idx.clamp(max=self.output_tokens.numel() - 1)], -1)
        match = self.token == want
        gparent = self.global_parent()
        on = self.depth == 0
        for _ in range(int(self.depth.max()) if self.num_nodes else 0):  # on the path iff parent is
            on = (self.depth == 0) | (match & on[gparent.clamp(min=0)] & (gparent >= 0))
        return on

    def true_path_length(self) -> Tensor:
        """[T] depth of the longest root path that matches the greedy continuation (the accepted
        length an oracle verifier could reach inside the recorded tree)."""
        depth = torch.where(self.on_true_path, self.depth, torch.zeros_like(self.depth)).to(torch.int64)
        return torch.zeros(self.num_trees, dtype=torch.int64).scatter_reduce(
            0, self.tree_of_node(), depth, reduce="amax"
        )

    @cached_property
    def path_scores(self) -> Tensor:
        """[N] the drafter's path score S of every node (Eq. 5: the sum of log q along its root
        path; 0 at roots). Nodes are in BFS order, so one pass per depth fills it. Computed once
        per trace."""
        gparent = self.global_parent()
        score = torch.zeros(self.num_nodes, dtype=torch.float32)
        for d in range(1, int(self.depth.max()) + 1 if self.num_nodes else 1):
            at = (self.depth == d).nonzero().flatten()
            score[at] = score[gparent[at]] + self.logprob[at].float()
        return score

    # -- files ------------------------------------------------------------------------------------
    def save(self, stem: str | Path) -> tuple[Path, Path]:
        from safetensors.torch import save_file

        stem = _stem(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        tensors = {name: getattr(self, name).to(torch.int64).contiguous() for name in INDEX_FIELDS}
        tensors.update({name: getattr(self, name).to(dt).contiguous() for name, dt in NODE_FIELDS.items()})
        st, js = Path(f"{stem}.safetensors"), Path(f"{stem}.json")
        save_file(tensors, str(st), metadata={"schema": SCHEMA, "version": str(VERSION)})
        js.write_text(json.dumps(asdict(self.meta), indent=2) + "\n")
        return st, js

    @classmethod
    def load(cls, stem: str | Path) -> "Trace":
        from safetensors.torch import load_file

        stem = _stem(stem)
        meta = TraceMeta.read(stem)
        t = load_file(f"{stem}.safetensors")
        nodes = {k: (t[k].float() if k == "logprob" else t[k].long()) for k in NODE_FIELDS}
        trace = cls(meta=meta, **{k: t[k].long() for k in INDEX_FIELDS}, **nodes)
        trace.check()
        return trace

    def check(self) -> None:
        """Cheap structural checks (a truncated or mixed-up file fails here, not mid-replay)."""
        P, T, N = self.num_prompts, self.num_trees, self.num_nodes
        if not (self.output_indptr.numel() == self.tree_indptr.numel() == P + 1):
            raise ValueError("trace: per-prompt index arrays disagree")
        if int(self.tree_indptr[-1]) != T or int(self.node_indptr[-1]) != N:
            raise ValueError("trace: index arrays do not cover the node tensors")
        if any(getattr(self, k).numel() != N for k in NODE_FIELDS):
            raise ValueError("trace: node tensors of different lengths")
        if T and not bool((self.depth[self.node_indptr[:-1]] == 0).all()):
            raise ValueError("trace: a tree does not start with its root")


def trace_files(stem: str | Path) -> tuple[Path, Path]:
    """``(STEM.safetensors, STEM.json)``: a trace's two files (a path with either suffix names its stem)."""
    base = _stem(stem)
    return Path(f"{base}.safetensors"), Path(f"{base}.json")


def _stem(path: str | Path) -> Path:
    path = Path(path)
    return path.with_suffix("") if path.suffix in (".json", ".safetensors") else path
