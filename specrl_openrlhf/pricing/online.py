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


def record_step(xtx, xty, rows, tokens, context, seconds, decay):
    """Adds a step, x = (1, rows, tokens, context) and its `seconds`, to the decayed normal equations: `xtx` ([4, 4])
    and `xty` ([4]) decay, then gain x x^T and x seconds. Plain Python over arrays, which the proposer compiles
    (`integration.vllm.v1.follow`), as `fit_step_cost`."""
    x = np.array([1.0, float(rows), float(tokens), float(context)])
    for i in range(len(x)):
        xty[i] = decay * xty[i] + x[i] * seconds
        for j in range(len(x)):
            xtx[i, j] = decay * xtx[i, j] + x[i] * x[j]


def fit_step_cost(xtx, xty, share, prior_weight, ridge, params):
    """Fills `params` ([4]) with the least-squares fit of the normal equations (`record_step`) under the prior
    per_token = share x (per_row + per_token), a soft linear constraint worth `prior_weight` x xtx[0, 0] (steps
    that carry drafts of varying size soon outweigh it), and a `ridge` relative to each term's own scale (a fit of
    steps that never varied stays solvable); terms that come out negative are left out and the rest refitted (their
    cost is 0). Plain Python over arrays, which the proposer compiles."""
    n = len(xty)
    a = np.array([0.0, -share, 1.0 - share, 0.0])
    penalty, scaled = prior_weight * xtx[0, 0], 0.0
    for i in range(n):
        scaled += xtx[i, i] / max(xtx[i, i], 1e-30)
    system = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            system[i, j] = xtx[i, j] + penalty * (a[i] * a[j])
        system[i, i] += ridge * scaled * max(xtx[i, i], 1e-30)
    keep = np.ones(n, np.bool_)
    for attempt in range(2):  # every term, then without those that came out negative
        index = np.flatnonzero(keep)
        m = len(index)
        lu, b = np.empty((m, m)), np.empty(m)  # the kept rows and columns, solved by Gaussian elimination
        for i in range(m):
            b[i] = xty[index[i]]
            for j in range(m):
                lu[i, j] = system[index[i], index[j]]
        for col in range(m):
            pivot = col  # partial pivoting
            for r in range(col + 1, m):
                if abs(lu[r, col]) > abs(lu[pivot, col]):
                    pivot = r
            for j in range(m):
                lu[col, j], lu[pivot, j] = lu[pivot, j], lu[col, j]
            b[col], b[pivot] = b[pivot], b[col]
            for r in range(col + 1, m):
                f = lu[r, col] / lu[col, col]
                for j in range(col, m):
                    lu[r, j] -= f * lu[col, j]
                b[r] -= f * b[col]
        params[:] = 0.0
        for i in range(m - 1, -1, -1):
            total = b[i]
            for j in range(i + 1, m):
                total -= lu[i, j] * params[index[j]]
            params[index[i]] = total / lu[i, i]
        if attempt == 0 and not (params < 0).any():
            return
        for i in range(n):
            keep[i] = params[i] >= 0
    for i in range(n):
        params[i] = max(params[i], 0.0)


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
        self,
        half_life: float = COST_HALF_LIFE_STEPS,
        prior_token_share: float = 0.5,
        prior_weight: float = 4.0,
        record=record_step,
        fit=fit_step_cost,
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
        self.record, self.fit = record, fit  # `record_step` and `fit_step_cost`, or the proposer's compiled copies

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
        self.record(self.xtx, self.xty, rows, tokens, context, seconds, self.decay)
        self.steps += 1
        self._params = None

    @property
    def params(self) -> np.ndarray:
        """[4] float64 (base, per_row, per_token, per_kv) in seconds, each >= 0."""
        if self._params is None:
            self._params = self._fit()
        return self._params

    def _fit(self) -> np.ndarray:
        params = np.zeros(self.TERMS)
        if self.steps:
            self.fit(self.xtx, self.xty, self.share, self.prior_weight, self.RIDGE, params)
        return params

    def predict(self, rows: int, tokens: int, context: float = 0.0) -> float:
        base, per_row, per_token, per_kv = self.params
        return base + per_row * rows + per_token * tokens + per_kv * context

    def at(self, context: float) -> np.ndarray:
        """[3] (base, per_row, per_token) of a step whose rows hold `context` KV tokens in all: the context's cost is
        fixed for the step, whatever it drafts (`DraftBudget.allocate`'s linear model)."""
        base, per_row, per_token, per_kv = self.params
        return np.array([base + per_kv * context, per_row, per_token])
