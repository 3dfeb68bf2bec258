"""Worked example (issue: rules that stay on-policy): a budget on excess acceptance, steered across batches.

Excess acceptance is the share of scored draft tokens kept only because of lenience, mean(min(1, ℓ r) - min(1, r))
with r = p_curr / p_prev (the staleness meter logs it as `reuse/excess_acceptance`). This rule steers log ℓ so that
it stays near a budget: when the policy moves fast and lenience starts keeping many tokens the current policy would
not, ℓ shrinks towards exact acceptance; when it barely moves, ℓ grows. Every engine reports the sums of its batches;
one coordinator updates the rule once per `--reuse.update_every` samples (see policies/adaptive_lenience.py).

    python -m specrl_openrlhf replay TRACES --rollout_reuse spec policies/excess_budget.py:ExcessBudget
"""

import math
from dataclasses import dataclass, field

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class ExcessBudgetParams:
    """The parameters of `ExcessBudget`."""

    budget: float = field(default=0.01, metadata=sr.limits(above=0.0, below=1.0))
    """The excess acceptance to hold, per scored token."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The starting lenience."""

    gain: float = 20.0
    """The change of log ℓ per unit of error, per update."""

    max_lenience: float = math.exp(2.0)
    """The most lenience the steering may reach."""

    def __post_init__(self):
        sr.check_fields(self, owner="excess_budget")
        sr.policies.check_steering("excess_budget", self)


class ExcessBudget(sr.SteeredLenience):
    """Spec rule whose lenience is steered to hold the excess acceptance at a budget."""

    Params = ExcessBudgetParams

    def feedback(self, batch: sr.DraftBatch, cuts: torch.Tensor) -> dict[str, float]:
        scored = batch.mask & ~torch.isnan(batch.scored_logprobs)  # p_curr is NaN where the rule did not need it
        log_ratio = (batch.scored_logprobs.double() - batch.draft_logprobs.double())[scored]
        exact = torch.clamp(log_ratio, max=0.0).exp()
        lenient = torch.clamp(self.log_lenience + log_ratio, max=0.0).exp()
        return {"excess": float((lenient - exact).sum()), "scored": float(scored.sum())}

    def error(self, feedback: dict[str, float]) -> float | None:
        if feedback.get("scored", 0.0) <= 0:
            return None
        return self.params.budget - feedback["excess"] / feedback["scored"]
