"""The running engine's own step time, fitted online (`OnlineStepCost`): a measurement model of the engine the proposer
runs in, fitted by least squares to the time between its calls, not a GPU's price. It is the draft budget's cost
where no GPU price is given (`budget.DraftBudget.allocate` takes its linear model at a step's context, `at`); with a
price (`cost_curve`), `curves.StepCurve.budget_cost` or `kernels.KernelStepModel.budget_cost` gives the same three
terms. The same line that `curves.fit_linear` fits offline to a measured curve, fitted here as the steps run.

Core module: numpy only.
"""

from __future__ import annotations

import math

import numpy as np

# The policy moves at every training step, so old steps fade; a step here is one engine step (one `propose` call).
COST_HALF_LIFE_STEPS = 512.0


class OnlineStepCost:
    """A step's time, t = base + per_row x rows + per_token x tokens + per_kv x context (seconds; `context`: the
    tokens the step's rows hold in the KV cache, summed, which attention reads), fitted online by least squares over
    recent steps (weights decaying with `half_life` steps), with a weak prior that holds until the steps tell the
    terms apart (rows and tokens move together until drafts vary): per_token = s x (per_row + per_token), s being
    `prior_token_share`, so a carried token costs s / (1 - s) of a row (as much as a row at the default 0.5). For a
    step's drafts the context term is a fixed cost (`at`): where it is large, as at long contexts on a GPU, a carried
    token is a small share of the step and drafts pay sooner.

    >>> cost = OnlineStepCost()
    >>> steps = [(32, 32, 3e3), (32, 96, 9e3), (8, 8, 4e3), (8, 40, 1e3), (64, 64, 6e4), (64, 200, 2e4)]
    >>> for rows, tokens, kv in steps * 20:
    ...     cost.observe(rows, tokens, 0.004 + 0.0001 * rows + 0.00005 * tokens + 1e-7 * kv, kv)
    >>> [round(float(x) * 1e3, 2) for x in cost.params[:3]], round(float(cost.params[3]) * 1e7, 2)  # ms; 1e-7 s
    ([4.01, 0.1, 0.05], 1.01)
    """

    WARMUP_STEPS = 16  # steps fitted before the fit predicts (its error, the stall filter)
    STALL_FACTOR = 5.0  # a step this many times slower than predicted is a stall (GC, a weight load), not a step
    RIDGE = 1e-9  # relative ridge on the normal equations: a fit of steps that never varied stays solvable
    TERMS = 4  # base, per row, per token, per context token

    def __init__(
        self, half_life: float = COST_HALF_LIFE_STEPS, prior_token_share: float = 0.5, prior_weight: float = 4.0
    ):
        if not half_life > 0 or not 0 <= prior_token_share <= 1 or not prior_weight > 0:
            raise ValueError(f"bad step cost settings: {half_life=}, {prior_token_share=}, {prior_weight=}")
        self.decay = 0.5 ** (1.0 / half_life)
        self.share, self.prior_weight = float(prior_token_share), float(prior_weight)
        self.xtx = np.zeros((self.TERMS, self.TERMS))  # decayed sums of x x^T, x = (1, rows, tokens, context)
        self.xty = np.zeros(self.TERMS)
        self.steps = 0
        self.error = [0.0, 0.0]  # decayed sums of |predicted - measured| / measured over fitted steps, and weights
        self._params: np.ndarray | None = None

    @property
    def relative_error(self) -> float:
        """The fit's mean relative error on the steps it was asked to predict before it saw them (NaN before)."""
        return self.error[0] / self.error[1] if self.error[1] else math.nan

    def observe(self, rows: int, tokens: int, seconds: float, context: float = 0.0) -> None:
        if not (rows > 0 and tokens >= rows and context >= 0 and math.isfinite(seconds) and seconds > 0):
            return
        if self.steps >= self.WARMUP_STEPS:
            predicted = self.predict(rows, tokens, context)
            if seconds > self.STALL_FACTOR * predicted:
                return
            self.error = [
                self.error[0] * self.decay + abs(predicted - seconds) / seconds,
                self.error[1] * self.decay + 1,
            ]
        x = np.array([1.0, rows, tokens, context])
        self.xtx = self.decay * self.xtx + np.outer(x, x)
        self.xty = self.decay * self.xty + x * seconds
        self.steps += 1
        self._params = None

    @property
    def params(self) -> np.ndarray:
        """[4] float64 (base, per_row, per_token, per_kv) in seconds, each >= 0."""
        if self._params is None:
            self._params = self._fit()
        return self._params

    def _fit(self) -> np.ndarray:
        if self.steps == 0:
            return np.zeros(self.TERMS)
        # the prior: per_token = share x (per_row + per_token), a soft linear constraint worth `prior_weight` squared
        # drafted tokens per step; steps that carry drafts of varying size soon outweigh it
        a = np.array([0.0, -self.share, 1.0 - self.share, 0.0])
        penalty = self.prior_weight * self.xtx[0, 0] * np.outer(a, a)
        scale = np.sqrt(np.maximum(np.diag(self.xtx), 1e-30))  # the ridge per term, in each term's own units
        ridge = self.RIDGE * np.trace(self.xtx / np.outer(scale, scale)) * np.diag(scale**2)
        system = self.xtx + penalty + ridge
        params = np.linalg.solve(system, self.xty)
        if (params < 0).any():  # refit without the negative terms (their cost is 0)
            keep = params >= 0
            params = np.zeros(self.TERMS)
            sub = np.ix_(keep, keep)
            params[keep] = np.linalg.solve(system[sub], self.xty[keep])
            params = np.maximum(params, 0.0)
        return params

    def predict(self, rows: int, tokens: int, context: float = 0.0) -> float:
        base, per_row, per_token, per_kv = self.params
        return base + per_row * rows + per_token * tokens + per_kv * context

    def at(self, context: float) -> np.ndarray:
        """[3] (base, per_row, per_token) of a step whose rows hold `context` KV tokens in all: the context's cost is
        fixed for the step, whatever it drafts (`DraftBudget.allocate`'s linear model)."""
        base, per_row, per_token, per_kv = self.params
        return np.array([base + per_kv * context, per_row, per_token])
