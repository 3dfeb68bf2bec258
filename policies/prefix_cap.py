"""Worked example: the spec rule, but never keep more than `max_fraction` of a draft.

Forcing a fresh tail on every sample keeps some exploration even when the policy barely moves.
"""

from dataclasses import dataclass, field

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class PrefixCapParams:
    """The parameters of `PrefixCap`."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The spec rule's lenience."""

    max_fraction: float = field(default=0.9, metadata=sr.limits(at_least=0.0, at_most=1.0))
    """The largest share of a draft kept."""

    def __post_init__(self):
        sr.policies.check_lenience("prefix_cap", self.lenience)
        sr.check_fields(self, owner="prefix_cap")


@sr.register("prefix_cap")
class PrefixCap(sr.ReusePolicy):
    """Spec rule with the verified prefix capped at max_fraction of the draft."""

    Params = PrefixCapParams

    def cut(self, batch: sr.DraftBatch) -> torch.Tensor:
        cap = torch.floor(batch.lengths.double() * self.params.max_fraction).long()  # [B]
        return torch.minimum(sr.policies.lenient_cut(batch, self.params.lenience), cap)
