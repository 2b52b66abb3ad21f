"""The drafter interface: what the ECHO step loop asks of any drafter.

A drafter serves one batch of requests (row ``b`` = request ``b``) through this lifecycle::

    drafter.start(prompts)                      # a new batch; prompts[b]: its token ids
    drafter.catch_up(tokens, features)          # after prefill and after every verification
    while building the step's trees:            # sglang_echo.core.policy.build_trees
        drafter.propose(frontier, k)            # depth by depth, active requests only

Contract:

* ``captured_layers`` names the target layers whose *input* residual stream the drafter reads
  (sglang's ``layers_to_capture``, HF ``hidden_states[i]``); the features handed to
  :meth:`catch_up` are those layers concatenated in that order, ``[n, len(captured_layers) * H]``.
  A parameter-free drafter captures nothing and receives ``None``.
* :meth:`catch_up` commits each request's newly accepted tokens: after prefill,
  ``prompt[1:] + [first token]``; after a verification, the accepted draft tokens plus the bonus
  token. ``features[b][i]`` is the target's feature at the position *before* ``tokens[b][i]``
  (EAGLE pairs ``h_t`` with ``x_{t+1}``), i.e. of the prompt positions after prefill and of the
  root plus accepted nodes after a verification. This is WhiFlash's lazy catch-up: the drafter
  only extends its own state (KV) with committed tokens; anything it drafted past them is dropped.
  An empty tensor means "nothing new" (e.g. a finished request). Drafters that keep the token
  history themselves (n-gram) already have the prompt from :meth:`start`, so the first catch-up
  repeats ``prompt[1:]``: they check and skip it.
* The root of request ``b``'s next tree is its last committed token. :meth:`propose` follows
  :class:`sglang_echo.core.policy.TreeDrafter`: up to ``k`` children for every valid frontier
  slot of an active request, with log-probabilities under the drafter (the path score of Eq. 5
  and the confidence gates read them, so they must be calibrated probabilities, not raw scores).
  ``frontier.source`` names a frontier node by its column in the Candidates of the *previous*
  ``propose`` call of the same step (``-1`` for the roots), so a drafter can keep per-candidate
  state (hidden states, drafted paths) between depths.
* Drafters whose natural output is per-position marginals (DFlash, DART) implement
  :meth:`propose` by reading the marginal of depth ``frontier.depth + 1``; the tree policy is
  the same.

Inside sglang the EAGLE-3 and DART catch-up is sglang's own draft extend and ``propose`` is
:class:`sglang_echo.integration.drafter.EagleFrontierDrafter` (EAGLE-3) or
:class:`sglang_echo.integration.dart.DartFrontierDrafter` (DART, over :class:`.dart_search.DartSearch`,
shared with the offline drafter); the classes in this package are
the engine-agnostic drafters the offline step loop, the calibrator and the trainer's evaluation
use, and the parameter-free ones plug into the worker unchanged.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates


class Drafter(ABC):
    name: str = "drafter"
    captured_layers: tuple[int, ...] = ()

    @abstractmethod
    def start(self, prompts: Sequence[Tensor]) -> None:
        """Forget every previous request and serve a new batch."""

    @abstractmethod
    def catch_up(self, tokens: Sequence[Tensor], features: Sequence[Tensor] | None) -> None:
        """Commit accepted tokens per request (see the module contract)."""

    @abstractmethod
    def propose(self, frontier: Frontier, k: int) -> Candidates:
        """Up to ``k`` children per valid frontier slot of the active requests."""

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """Co-drafting (:class:`.hybrid.HybridDrafter`): ``[B, E]`` candidates another drafter
        proposed for the frontier of this drafter's last :meth:`propose` (children of frontier slot
        ``parent``, token ``tokens``) join that call's candidates, after its own columns or
        ``before`` them, so that the next frontier's ``source`` may name any column of the merged
        proposal and this drafter expands those nodes as if it had proposed them."""
        raise NotImplementedError(f"the {self.name} drafter cannot expand another drafter's candidates")


def adopt_columns(own: Tensor, theirs: Tensor, before: bool) -> Tensor:
    """Per-candidate state ``own [B, C, ...]`` with another drafter's columns ``theirs [B, E, ...]``
    joined where :meth:`Drafter.adopt` puts them: ``before`` its own, or after."""
    return torch.cat([theirs, own] if before else [own, theirs], 1)


def check_catch_up(
    tokens: Sequence[Tensor], features: Sequence[Tensor] | None, batch_size: int, width: int, name: str
) -> tuple[Tensor, list[Tensor]] | None:
    """Validate a feature-reading drafter's ``catch_up`` arguments.

    Returns ``(n, feats)``: each request's new-token count ([B] int64, host) and its features as
    ``[n_i, width]``; ``None`` when no request has anything to catch up.
    """
    if len(tokens) != batch_size:
        raise ValueError(f"catch_up got {len(tokens)} requests, the batch has {batch_size}")
    n = torch.tensor([int(t.numel()) for t in tokens], dtype=torch.int64)
    if batch_size == 0 or int(n.max()) == 0:
        return None
    if features is None or len(features) != batch_size:
        raise ValueError(f"{name} needs the target features of every committed token")
    feats = [f.reshape(-1, width) for f in features]
    if any(f.shape[0] != int(m) for f, m in zip(feats, n)):
        raise ValueError(f"features/tokens length mismatch: {[f.shape[0] for f in feats]} vs {n.tolist()}")
    return n, feats


# The drafter kind of each head architecture this repo reads (config.json ``architectures``).
HEAD_ARCHITECTURES = {"LlamaForCausalLMEagle3": "eagle3", "LlamaForCausalLMDart": "dart", "DFlashDraftModel": "dflash"}


def head_kind(path) -> Optional[str]:
    """The drafter a head directory is for, from its ``config.json``: ``dart`` or ``dflash`` when it
    names their architecture, else ``eagle3``; ``None`` without a readable config."""
    cfg = Path(path or "") / "config.json"
    if not path or not cfg.is_file():
        return None
    try:
        archs = json.loads(cfg.read_text()).get("architectures", [])
    except (OSError, ValueError):
        return None
    return next(
        (HEAD_ARCHITECTURES[a] for a in archs if a in HEAD_ARCHITECTURES and a != "LlamaForCausalLMEagle3"), "eagle3"
    )
