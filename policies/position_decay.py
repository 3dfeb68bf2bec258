"""Worked example: lenience that decays towards 1 (exact acceptance) along the draft.

Early tokens of a draft are reused leniently; later ones, which depend on more of the old policy's choices,
must match the current policy more closely: lenience_i = 1 + (lenience - 1) * decay**i.
"""

from dataclasses import dataclass, field

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class PositionDecayParams:
    """The parameters of `PositionDecay`."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The lenience at the draft's first token."""

    decay: float = field(default=0.99, metadata=sr.limits(above=0.0, at_most=1.0))
    """The factor on lenience - 1 per position along the draft."""

    def __post_init__(self):
        sr.policies.check_lenience("position_decay", self.lenience)
        sr.check_fields(self, owner="position_decay")


@sr.register("position_decay")
class PositionDecay(sr.ReusePolicy):
    """Lenience decaying towards 1 with the token position."""

    Params = PositionDecayParams

    def cut(self, batch: sr.DraftBatch) -> torch.Tensor:
        positions = torch.arange(batch.draft_logprobs.shape[1], dtype=torch.float64)  # [T]
        lenience = 1.0 + (self.params.lenience - 1.0) * self.params.decay**positions  # [T]
        log_ratio = batch.scored_logprobs.double() - batch.draft_logprobs.double()  # [B, T]
        accepted = torch.log(batch.uniforms) <= torch.clamp(torch.log(lenience)[None, :] + log_ratio, max=0.0)
        return sr.policies.first_rejection(accepted, batch.lengths)
