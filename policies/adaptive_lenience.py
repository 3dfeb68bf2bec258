"""Worked example: adaptive lenience, a rule that keeps state across batches.

The paper fixes the lenience per algorithm (e^0.5 for GRPO) and names adaptive schedules as future work. This rule
steers log(lenience) so that a target share of draft tokens is kept: when the policy drifts faster, it loosens;
when the policy barely moves, it tightens towards exact acceptance (lenience 1). The share comes from the cuts the
rule makes anyway, so it costs nothing.

    python -m openrlhf.cli.train_ppo_ray --rollout_reuse policies/adaptive_lenience.py:AdaptiveLenience ...

Every engine reports `feedback` (kept and offered draft tokens: sums, so reports from several engines and batches
add up); one coordinator sums them, calls `update` once per `--reuse.update_every` samples (default: one training
step) and sends `state_dict()` back to every engine. Watch `reuse/lenience` and `reuse/reused_token_fraction`.
"""

import math
from dataclasses import dataclass, field

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class AdaptiveLenienceParams:
    """The parameters of `AdaptiveLenience`; `sr.check_fields` checks each against its annotation and limits."""

    target_kept: float = field(default=0.6, metadata=sr.limits(above=0.0, below=1.0))
    """The share of draft tokens to keep (cut / draft length, over a batch)."""

    lenience: float = sr.DEFAULT_LENIENCE
    """The starting lenience."""

    gain: float = 2.0
    """The change of log(lenience) per unit of error, per update."""

    max_lenience: float = math.exp(3.0)
    """The most lenience the steering may reach."""

    def __post_init__(self):
        sr.check_fields(self, owner="adaptive_lenience")
        sr.policies.check_steering("adaptive_lenience", self)


class AdaptiveLenience(sr.SteeredLenience):
    """Spec rule whose lenience is steered to keep `target_kept` of the draft tokens."""

    Params = AdaptiveLenienceParams

    def feedback(self, batch: sr.DraftBatch, cuts: torch.Tensor) -> dict[str, float]:
        return {"kept": float(cuts.sum()), "offered": float(batch.lengths.sum())}

    def error(self, feedback: dict[str, float]) -> float | None:
        if feedback.get("offered", 0.0) <= 0:
            return None
        return self.params.target_kept - feedback["kept"] / feedback["offered"]
