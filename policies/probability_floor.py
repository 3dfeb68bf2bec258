"""Worked example (docs/prototyping.md): the spec rule, plus a floor on the current policy's probability.

Lenience keeps a draft token that the current policy now finds half as likely as the old one did (ℓ = e^0.5 accepts
it 82% of the time). When such tokens are the ones training is pushing down, a wrong step, say, reusing them slows
learning. This rule also rejects every token whose probability under the current policy is below `floor`.

    python -m specrl_openrlhf replay TRACES --rollout_reuse spec policies/probability_floor.py:ProbabilityFloor
    python -m openrlhf.cli.train_ppo_ray --rollout_reuse policies/probability_floor.py:ProbabilityFloor ...
"""

from dataclasses import dataclass, field

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class ProbabilityFloorParams:
    """The parameters of `ProbabilityFloor`."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The spec rule's lenience."""

    floor: float = field(default=0.2, metadata=sr.limits(at_least=0.0, below=1.0))
    """Reject a draft token whose current probability is below this."""

    def __post_init__(self):
        sr.policies.check_lenience("probability_floor", self.lenience)
        sr.check_fields(self, owner="probability_floor")


class ProbabilityFloor(sr.ReusePolicy):
    """Spec rule that also rejects draft tokens the current policy gives less than `floor`."""

    Params = ProbabilityFloorParams
    prefix_decidable = True  # each token is judged on its own: the first rejection decides the cut

    def cut(self, batch: sr.DraftBatch) -> torch.Tensor:
        # batch.scored_logprobs, batch.draft_logprobs, batch.uniforms: [B, T]; batch.lengths: [B]
        lenient = sr.policies.lenient_acceptance_logprob(
            batch.scored_logprobs.double(), batch.draft_logprobs.double(), self.params.lenience
        )
        accepted = (torch.log(batch.uniforms) <= lenient) & (batch.scored_logprobs.exp() >= self.params.floor)
        return sr.policies.first_rejection(accepted, batch.lengths)  # [B]
