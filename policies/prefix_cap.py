"""Worked example: the spec rule, but never keep more than `max_fraction` of a draft.

Forcing a fresh tail on every sample keeps some exploration even when the policy barely moves.
"""

from dataclasses import dataclass

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class PrefixCapParams:
    lenience: float = sr.DEFAULT_LENIENCE
    max_fraction: float = 0.9

    def __post_init__(self):
        sr.policies.check_lenience("prefix_cap", self.lenience)
        if not 0.0 <= self.max_fraction <= 1.0:
            raise ValueError(f"prefix_cap: max_fraction must be in [0, 1], got {self.max_fraction!r}")


@sr.register("prefix_cap")
class PrefixCap(sr.ReusePolicy):
    """Spec rule with the verified prefix capped at max_fraction of the draft."""

    Params = PrefixCapParams

    def cut(self, batch: sr.DraftBatch) -> torch.Tensor:
        cap = torch.floor(batch.lengths.double() * self.params.max_fraction).long()  # [B]
        return torch.minimum(sr.policies.lenient_cut(batch, self.params.lenience), cap)
