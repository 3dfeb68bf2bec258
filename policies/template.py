"""Template for a new acceptance rule. Copy this file, rename the policy, edit `cut`, then run with

    python -m specrl_openrlhf.cli.train_ppo_ray --reuse.plugin policies/my_rule.py --rollout_reuse my_rule ...

The file is loaded by path in every Ray process, so keep it self-contained (imports: torch, specrl_openrlhf).
"""

from dataclasses import dataclass

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class MyRuleParams:
    """Parameters are a frozen keyword-only dataclass, a docstring under each field; validate them here so bad
    values fail at start-up. `sr.check_fields` checks each field against its annotation (`Literal[...]` choices,
    int, float, bool) and a range in its metadata, `field(default=0.9, metadata=sr.limits(at_least=0, at_most=1))`,
    naming the field, the value and what it takes."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The factor on p_curr / p_prev: 1 is exact speculative acceptance."""

    def __post_init__(self):
        sr.policies.check_lenience("my_rule", self.lenience)
        sr.check_fields(self, owner="my_rule")


@sr.register("my_rule")
class MyRule(sr.ReusePolicy):
    """Template: the spec rule, written out (edit me)."""

    Params = MyRuleParams
    needs_scores = True  # False skips the scoring pass; batch.scored_logprobs is then None
    draft_age = 1  # 1 = drafts from the previous visit, 2 = two visits back

    def cut(self, batch: sr.DraftBatch) -> torch.Tensor:
        # batch.draft_logprobs, batch.scored_logprobs, batch.uniforms: [B, T]; batch.lengths: [B]
        accept_logprob = torch.clamp(
            torch.log(torch.tensor(self.params.lenience)) + batch.scored_logprobs - batch.draft_logprobs, max=0.0
        )
        accepted = torch.log(batch.uniforms) <= accept_logprob
        return sr.policies.first_rejection(accepted, batch.lengths)  # [B] int64 in [0, lengths]
