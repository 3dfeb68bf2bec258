"""Does drafting pay, as measured (`DraftingCheck`): the realized gain of drafted steps against a counterfactual
without drafts, and the margin a step's predicted gain must clear before it drafts.

Core module: the standard library.
"""

from __future__ import annotations

import math

CHECK_HALF_LIFE_STEPS = 512.0  # the evidence fades: the policy moves at every training step
PROBE_EVERY = 64  # steps: a step without drafts at least this often, so the counterfactual stays measured
FIRST_PROBE = 2  # steps before the first probe; the interval then doubles up to PROBE_EVERY


class DraftingCheck:
    """Whether drafting pays as predicted, measured against a counterfactual without drafts, and the margin a step's
    predicted gain must clear before it drafts.

    The counterfactual is the step cost's prediction for the same rows without drafts, scaled by how steps without
    drafts measured against that prediction (`plain_scale`; at least one step in `probe_every` drafts nothing, a
    *probe*, sooner at first: after `FIRST_PROBE` steps, then at doubling intervals). A drafted step's realized gain is
    its tokens per second over the counterfactual's, minus 1. `margin` is the mean of predicted minus realized gain
    over recent drafted steps, shrunk towards 0 by `prior_steps`: costs that the linear model can't see (a fixed cost
    of any drafting, stalls, a noisy fit) raise it until the steps that still draft gain what they predict, and where
    nothing gains, nothing drafts. Evidence fades with `half_life` steps, so a budget that backed off tries again.

    >>> check = DraftingCheck()
    >>> for _ in range(200):  # predicted +30%, realized -9%: drafting backs off
    ...     check.observe(rows=32, drafted=0, produced=32, seconds=0.010, plain_s=0.010)
    ...     check.observe(rows=32, drafted=40, produced=38, seconds=0.013, plain_s=0.010, predicted_gain=0.3)
    >>> round(check.plain_scale, 2), round(check.margin, 2)
    (1.0, 0.37)
    """

    def __init__(self, probe_every: int = PROBE_EVERY, half_life: float = CHECK_HALF_LIFE_STEPS, prior_steps=8.0):
        if not probe_every >= 2 or not half_life > 0 or not prior_steps > 0:
            raise ValueError(f"bad drafting check settings: {probe_every=}, {half_life=}, {prior_steps=}")
        self.probe_every, self.prior_steps = int(probe_every), float(prior_steps)
        self.decay = 0.5 ** (1.0 / half_life)
        self.plain = [0.0, 0.0]  # decayed sums over steps without drafts: measured seconds, predicted seconds
        self.excess = [0.0, 0.0]  # decayed sums over drafted steps: predicted - realized gain, steps
        self.realized = 0.0  # decayed sum of realized gains (with excess[1], their mean: `BudgetReport`)
        self.since_plain = 0  # steps since one without drafts
        self.interval = FIRST_PROBE  # steps between probes, doubling up to probe_every

    @property
    def plain_scale(self) -> float:
        """Measured over predicted time of steps without drafts (1 before any)."""
        return self.plain[0] / self.plain[1] if self.plain[1] else 1.0

    @property
    def margin(self) -> float:
        return max(0.0, self.excess[0] / (self.excess[1] + self.prior_steps))

    @property
    def mean_realized_gain(self) -> float:
        return self.realized / self.excess[1] if self.excess[1] else math.nan

    def probe(self) -> bool:
        """Whether the next step should draft nothing, to measure the counterfactual (always, until it is measured)."""
        return not self.plain[1] or self.since_plain >= self.interval

    def observe(
        self,
        rows: int,
        drafted: int,
        produced: int,
        seconds: float,
        plain_s: float,
        predicted_gain: float | None = 0.0,
    ) -> None:
        """A step that ran: its rows, the draft tokens it carried, the tokens it produced, its time, the step cost's
        prediction for its rows without drafts, and the gain the budget predicted (None: an exploring slot, which
        no budget chose)."""
        if not (rows > 0 and seconds > 0 and plain_s > 0 and math.isfinite(seconds)):
            return
        d = self.decay
        self.plain = [self.plain[0] * d, self.plain[1] * d]
        self.excess = [self.excess[0] * d, self.excess[1] * d]
        self.realized *= d
        if drafted == 0:
            self.plain = [self.plain[0] + seconds, self.plain[1] + plain_s]
            self.since_plain, self.interval = 0, min(2 * self.interval, self.probe_every)
            return
        self.since_plain += 1
        if predicted_gain is None or not self.plain[1]:
            return
        realized = (produced / seconds) / (rows / (plain_s * self.plain_scale)) - 1.0
        self.excess = [self.excess[0] + predicted_gain - realized, self.excess[1] + 1.0]
        self.realized += realized
