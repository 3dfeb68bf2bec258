"""What a proposer's budget measured (`BudgetReport`): decayed sums over recent steps and verdicts, sent with every
history update, and the details the benchmarks print.

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np

from ..pricing.online import OnlineStepCost

REPORT_HALF_LIFE_STEPS = 2048.0  # the sums reported to the rollout fade over about this many steps


def decayed_sums(decay, predicted, hits):
    """Over verdicts i of n, the sums of decay^(n - 1 - i) (the newest weighs 1) times 1, `predicted[i]` and
    `hits[i]`. Plain Python over arrays, which the proposer compiles (`integration.vllm.v1.follow`)."""
    verdicts, weighted_predicted, weighted_hits = 0.0, 0.0, 0.0
    for i in range(len(predicted)):
        verdicts = verdicts * decay + 1.0
        weighted_predicted = weighted_predicted * decay + predicted[i]
        weighted_hits = weighted_hits * decay + (1.0 if hits[i] else 0.0)
    return verdicts, weighted_predicted, weighted_hits


class BudgetReport:
    """What one proposer's budget measured: decayed sums over recent steps and verdicts (about the last `half_life`
    of each) and the step cost's parameters (`as_dict`, sent with every history update); the cost fit's error and
    acceptance predicted against observed per predicted decile, and the proposer's own time (`details`, for
    benchmarks). Sums, so that a process's proposers and an engine's workers add up."""

    def __init__(self, half_life: float = REPORT_HALF_LIFE_STEPS, sums=decayed_sums):
        self.decay = 0.5 ** (1.0 / half_life)
        self.decayed_sums = sums  # `decayed_sums`, or the proposer's compiled copy of it
        self.sums = dict.fromkeys(("steps", "slots", "verdicts", "predicted", "accepted"), 0.0)
        self.cost = np.zeros(OnlineStepCost.TERMS)
        self.cost_error = 0.0
        self.margin, self.plain_scale = 0.0, 1.0  # the drafting check's (`DraftingCheck`)
        self.deciles = np.zeros((10, 3))  # the acceptance model's calibration (`AcceptanceModel.calibration`)
        self.timed = {"propose_s": 0.0, "rows_followed": 0.0}  # the proposer's own time and rows, over its life

    def time(self, seconds: float, rows: int) -> None:
        """A step's `propose` took `seconds` over `rows` rows."""
        self.timed["propose_s"] += seconds
        self.timed["rows_followed"] += rows

    def step(self, slots: int) -> None:
        self.sums["steps"] = self.sums["steps"] * self.decay + 1.0
        self.sums["slots"] = self.sums["slots"] * self.decay + slots

    def verdicts(self, predicted: np.ndarray, accepted: np.ndarray) -> None:
        """Verdicts on slots, oldest first ([n] each)."""
        n = len(predicted)
        if not n:
            return
        factor = self.decay**n
        parts = self.decayed_sums(self.decay, np.asarray(predicted, np.float64), np.asarray(accepted))
        for name, part in zip(("verdicts", "predicted", "accepted"), parts):
            self.sums[name] = self.sums[name] * factor + part

    def as_dict(self) -> dict[str, float]:
        base, per_row, per_token, per_kv = (float(x) for x in self.cost)
        costs = {"cost_base_s": base, "cost_row_s": per_row, "cost_token_s": per_token, "cost_kv_s": per_kv}
        return {**self.sums, "reports": 1.0, **costs}

    def details(self) -> dict[str, float]:
        """`as_dict`, the cost fit's mean relative error, and per predicted decile the verdicts, the predictions'
        sum and the acceptances' sum."""
        out = self.as_dict()
        out.update(cost_error=self.cost_error, margin=self.margin, plain_scale=self.plain_scale, **self.timed)
        for decile, (verdicts, predicted, accepted) in enumerate(self.deciles):
            out.update({f"decile{decile}_verdicts": verdicts, f"decile{decile}_predicted": predicted})
            out[f"decile{decile}_accepted"] = accepted
        return out
