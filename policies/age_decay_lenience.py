"""Worked example (issue: rules that stay on-policy): lenience that decays with a token's age.

A token decoded at the previous visit (age 1) gets the full lenience ℓ; one reused for longer must match the current
policy more closely: ℓ_age = 1 + (ℓ - 1) * decay^(age - 1), towards exact acceptance (ℓ = 1) as it ages.

    python -m specrl_openrlhf replay TRACES --rollout_reuse spec policies/age_decay_lenience.py:AgeDecayLenience
"""

import math
from dataclasses import dataclass, field

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class AgeDecayLenienceParams:
    """The parameters of `AgeDecayLenience`."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The lenience of tokens decoded at the previous visit."""

    decay: float = field(default=0.5, metadata=sr.limits(at_least=0.0, at_most=1.0))
    """The factor on lenience - 1 per visit of age beyond the first."""

    def __post_init__(self):
        sr.policies.check_lenience("age_decay_lenience", self.lenience)
        sr.check_fields(self, owner="age_decay_lenience")


class AgeDecayLenience(sr.ReusePolicy):
    """Spec rule whose lenience decays towards 1 with the visits since a token was decoded."""

    Params = AgeDecayLenienceParams
    prefix_decidable = True

    def cut(self, batch: sr.DraftBatch) -> torch.Tensor:
        # batch.ages: [B, T] visits since each token was decoded, 1 for the previous visit's tokens
        ages = batch.ages.double().clamp(min=1.0)
        lenience = 1.0 + (self.params.lenience - 1.0) * self.params.decay ** (ages - 1.0)  # [B, T]
        log_ratio = batch.scored_logprobs.double() - batch.draft_logprobs.double()  # [B, T]
        accept = torch.clamp(torch.log(lenience) + log_ratio, max=0.0)
        accepted = torch.log(batch.uniforms) <= accept
        return sr.policies.first_rejection(accepted, batch.lengths)

    @property
    def lenience(self) -> float:
        return self.params.lenience if not math.isinf(self.params.lenience) else math.inf
