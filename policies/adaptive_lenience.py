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
from dataclasses import dataclass

import torch

import specrl_openrlhf as sr


@dataclass(frozen=True, kw_only=True)
class AdaptiveLenienceParams:
    target_kept: float = 0.6  # share of draft tokens to keep (cut / draft length, over a batch)
    lenience: float = sr.DEFAULT_LENIENCE  # the starting lenience
    gain: float = 2.0  # change of log(lenience) per unit of error, per update
    max_lenience: float = math.exp(3.0)

    def __post_init__(self):
        if not 0.0 < self.target_kept < 1.0:
            raise ValueError(f"adaptive_lenience: target_kept must be in (0, 1), got {self.target_kept!r}")
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
