"""What every policy reports per step, and the running totals benchmarks print.

Definitions (ECHO Sec. 2 and 5.1):

* verified tokens: ``K_total = sum_i K_i``, roots included (what the target pass costs);
* accepted tokens ``L_i``: drafted tokens of request i the target accepted (bonus excluded);
* MAT, mean accepted tokens per request per step, counts the bonus token as the paper and EAGLE
  do: ``mean(L_i + 1)``;
* yield (Eq. 3), "the fraction of verified tokens that contribute to the accepted prefix":
  ``sum L_i / sum (K_i - 1)`` over drafted tokens (the extracted Eq. 3 is garbled; this is its
  stated meaning);
* draft utilisation ``u_i = L_i / depth_i`` for requests that drafted (Sec. 5.1, Fig. 4);
* budget use ``K_total / K_max`` and the gate pass rate at every gated depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor


@dataclass
class StepMetrics:
    tree_size: Tensor  # [B] K_i, roots included
    tree_depth: Tensor  # [B]
    accept_len: Tensor  # [B] L_i
    gate_evaluated: Tensor  # [D+1]
    gate_passed: Tensor  # [D+1]
    k_max: Optional[int] = None

    @property
    def verified_tokens(self) -> int:
        return int(self.tree_size.sum())

    @property
    def draft_tokens(self) -> int:
        return int((self.tree_size - 1).sum())

    @property
    def accepted_tokens(self) -> int:
        return int(self.accept_len.sum())

    @property
    def mat(self) -> float:
        return float((self.accept_len + 1).float().mean())

    @property
    def yield_(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def utilisation(self) -> Tensor:
        drafted = self.tree_depth > 0
        return self.accept_len[drafted].float() / self.tree_depth[drafted].float()

    @property
    def budget_used(self) -> Optional[float]:
        return self.verified_tokens / self.k_max if self.k_max else None


@dataclass
class MetricsTotals:
    """Sums over many steps; :meth:`summary` gives the figures benchmarks print."""

    steps: int = 0
    requests: int = 0
    verified: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    max_verified: int = 0
    utilisation: list[float] = field(default_factory=list)
    gate_evaluated: Optional[Tensor] = None
    gate_passed: Optional[Tensor] = None

    def add(self, m: StepMetrics) -> None:
        self.steps += 1
        self.requests += m.tree_size.numel()
        self.verified += m.verified_tokens
        self.drafted += m.draft_tokens
        self.accepted += m.accepted_tokens
        self.committed += int((m.accept_len + 1).sum())
        self.max_verified = max(self.max_verified, m.verified_tokens)
        self.utilisation.extend(m.utilisation.tolist())
        if self.gate_evaluated is None or self.gate_evaluated.numel() < m.gate_evaluated.numel():
            self.gate_evaluated = _grow(self.gate_evaluated, m.gate_evaluated.numel())
            self.gate_passed = _grow(self.gate_passed, m.gate_passed.numel())
        self.gate_evaluated[: m.gate_evaluated.numel()] += m.gate_evaluated
        self.gate_passed[: m.gate_passed.numel()] += m.gate_passed

    def summary(self) -> dict:
        rates = {}
        if self.gate_evaluated is not None:
            for d, (e, p) in enumerate(zip(self.gate_evaluated.tolist(), self.gate_passed.tolist())):
                if e:
                    rates[d] = p / e
        return {
            "steps": self.steps,
            "mat": self.committed / self.requests if self.requests else 0.0,
            "yield": self.accepted / self.drafted if self.drafted else 0.0,
            "utilisation": sum(self.utilisation) / len(self.utilisation) if self.utilisation else 0.0,
            "verified_per_step": self.verified / self.steps if self.steps else 0.0,
            "max_verified_per_step": self.max_verified,
            "gate_pass_rate": rates,
        }


def _grow(t: Optional[Tensor], n: int) -> Tensor:
    out = torch.zeros(n, dtype=torch.int64)
    if t is not None:
        out[: t.numel()] = t
    return out
