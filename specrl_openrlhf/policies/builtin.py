"""The built-in reuse policies of the SPEC-RL paper and its ablations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import DraftBatch, ReusePolicy, check_lenience, lenient_cut
from .registry import register

DEFAULT_LENIENCE = math.exp(0.5)  # the paper's GRPO default


@dataclass(frozen=True, kw_only=True)
class LenienceParams:
    """lenience: the factor on p_curr / p_prev; 1 is exact speculative acceptance, larger reuses more."""

    lenience: float = DEFAULT_LENIENCE

    def __post_init__(self):
        check_lenience("lenience", self.lenience)


@register("off")
class Off(ReusePolicy):
    """No reuse: every sample is generated from scratch (stock OpenRLHF)."""

    needs_scores = False
    draft_age = 0

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return torch.zeros_like(batch.lengths)


@register("spec")
class Spec(ReusePolicy):
    """Lenient speculative acceptance: keep token i while u_i <= min(1, lenience * p_curr / p_prev)."""

    Params = LenienceParams
    prefix_decidable = True

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return lenient_cut(batch, self.params.lenience)


@register("exact")
class Exact(ReusePolicy):
    """Vanilla speculative acceptance (lenience 1): keep token i while u_i <= min(1, p_curr / p_prev)."""

    prefix_decidable = True

    @property
    def lenience(self) -> float:
        return 1.0

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return lenient_cut(batch, 1.0)


@register("random")
class RandomCut(ReusePolicy):
    """Random reuse: cut uniformly at random in [0, len], without scoring (the paper's ablation)."""

    needs_scores = False

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        # floor(u * (len + 1)) is uniform on {0, ..., len}
        return torch.floor(batch.uniforms[:, 0] * (batch.lengths + 1).double()).long().clamp(max=batch.lengths)


@register("delayed")
class Delayed(Spec):
    """Delayed reuse: the spec rule on drafts from two visits back (the paper's ablation)."""

    draft_age = 2


@register("full")
class Full(ReusePolicy):
    """Full reuse (lenience = infinity): keep every draft token, without scoring."""

    needs_scores = False

    @property
    def lenience(self) -> float:
        return math.inf

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return batch.lengths.clone()
