"""Worked example: lenience that decays towards 1 (exact acceptance) along the draft.

Early tokens of a draft are reused leniently; later ones, which depend on more of the old policy's choices,
must match the current policy more closely: lenience_i = 1 + (lenience - 1) * decay**i.
"""

from dataclasses import dataclass

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class PositionDecayParams:
    lenience: float = sr.DEFAULT_LENIENCE
    decay: float = 0.99

    def __post_init__(self):
        sr.policies.check_lenience("position_decay", self.lenience)
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"position_decay: decay must be in (0, 1], got {self.decay!r}")


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
