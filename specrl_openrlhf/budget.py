"""Draft budgets: which draft slots a verification step carries, from what a step costs and what a slot is worth.

Terminology:
- *slot*: one draft token of one batch row at one step, at *position* j of the row's draft (0-based).
- *acceptance*: the chance that the engine keeps a slot's token given it kept the row's earlier slots (one-hot
  verification keeps y with probability p_curr(y)); *survival*: the chance that it keeps the slot at all, the product
  of the acceptances up to it: the expected tokens the slot adds to the step.
- *step cost*: a step's time as a function of the rows it serves and the tokens it carries (`StepCost`).
- *goodput*: the tokens a step is expected to produce per second: (rows + sum of admitted survivals) / step time.
- *gain*: a step's goodput over the goodput of the same step without drafts, minus 1: *predicted* by the budget when
  it admits slots, *realized* once the step has run (`DraftingCheck`).

`DraftBudget.allocate` admits slots by survival, best first, while the next one raises goodput (SmartSpec's rule with a
linear cost model): a slot pays when its survival exceeds c x goodput, c being a carried token's cost. Zero slots is a
valid answer; when few rows are left, a step's fixed cost dominates and drafts run long. A step drafts only where its
predicted gain clears `DraftingCheck.margin`, what predictions have been exceeding measured gains by: drafting backs
off wherever it does not pay as predicted, and where nothing pays the engine decodes as stock. After `EXPLORE_EVERY`
steps without a slot the likeliest one is drafted anyway, so that acceptance is still learned; the `static` mode (the
ablation without a budget) drafts every candidate slot. `BudgetReport` sums what a proposer's budget measured.
`AcceptanceModel` learns acceptance from the engine's own verdicts, by what predicts it (how the draft was found, where
in it the slot is, how many of the history's responses take its token). Which slots are drafted depends on the history,
the rows' tokens so far and past steps, never on a row's randomness to come: verification stays exact.

Core module: numpy only.
"""

from __future__ import annotations

import math

import numpy as np

# Half-lives of what the budget learns, each in the unit it counts: the policy moves at every training step, so old
# observations fade. A step here is one engine step (one `propose` call); a verdict is one slot's accepted-or-not.
COST_HALF_LIFE_STEPS = 512.0  # the step-cost fit
ACCEPTANCE_HALF_LIFE_VERDICTS = 20_000.0  # the acceptance counts
CHECK_HALF_LIFE_STEPS = 512.0  # the drafting check's evidence (`DraftingCheck`)
REPORT_HALF_LIFE_STEPS = 2048.0  # the sums reported to the rollout (`BudgetReport`)

# ---- step cost ------------------------------------------------------------------------------------------------------


class StepCost:
    """A step's time, t = base + per_row x rows + per_token x tokens + per_kv x context (seconds; `context`: the
    tokens the step's rows hold in the KV cache, summed, which attention reads), fitted online by least squares over
    recent steps (weights decaying with `half_life` steps), with a weak prior that holds until the steps tell the
    terms apart (rows and tokens move together until drafts vary): per_token = s x (per_row + per_token), s being
    `prior_token_share`, so a carried token costs s / (1 - s) of a row (as much as a row at the default 0.5). For a
    step's drafts the context term is a fixed cost (`at`): where it is large, as at long contexts on a GPU, a carried
    token is a small share of the step and drafts pay sooner.

    >>> cost = StepCost()
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


# ---- acceptance -----------------------------------------------------------------------------------------------------

ANCHORED, REENTERED, SHARED, OWN = 0, 1, 2, 3  # how a draft was found (integration.vllm.rows)
POSITION_EDGES = (1, 2, 3, 4, 8)  # positions 0, 1, 2, 3, 4-7, 8+
SUPPORT_EDGES = (0.25, 0.5, 0.75, 0.999)  # share of the paths at the cursor that take the token
MATCH_EDGES = (8, 16)  # a re-entry's match length: < 8, 8-15, 16+
KINDS = 4
SHAPE = (KINDS, len(POSITION_EDGES) + 1, len(SUPPORT_EDGES) + 1, len(MATCH_EDGES) + 1)  # the buckets' axes


def bucket(kind, position, support, match_length):
    """A slot's bucket (a flat index into `SHAPE`): how its draft was found (ANCHORED: the row's whole response is a
    path of the history; REENTERED: a suffix match in it; SHARED: in another prompt's responses; OWN: in the prompt's
    own text), its position in the draft, its support and the match length (anchored: the longest). Plain Python
    over scalars, which the proposer's kernels compile (`integration.vllm.rows`)."""
    p = 0
    while p < len(POSITION_EDGES) and position >= POSITION_EDGES[p]:
        p += 1
    s = 0
    while s < len(SUPPORT_EDGES) and support >= SUPPORT_EDGES[s]:
        s += 1
    m = len(MATCH_EDGES)
    if kind != ANCHORED:
        m = 0
        while m < len(MATCH_EDGES) and match_length >= MATCH_EDGES[m]:
            m += 1
    return ((kind * SHAPE[1] + p) * SHAPE[2] + s) * SHAPE[3] + m


features = np.vectorize(bucket, otypes=[np.int64])  # `bucket` of each slot of arrays (or scalars) of one shape


class AcceptanceModel:
    """The chance that a slot is accepted given its row's earlier slots were, learned from verdicts: decayed counts
    per bucket (`features`), each shrunk towards a coarser bucket (kind and support), that one towards all slots,
    and that one towards `prior`. Predicted against observed acceptance is kept per predicted decile (`calibration`).
    Array in, array out: a step's slots are predicted and observed at once.

    >>> model = AcceptanceModel()
    >>> likely, unlikely = features(ANCHORED, 0, 1.0, 0), features(REENTERED, 3, 0.2, 5)
    >>> for _ in range(200):
    ...     model.observe(np.array([likely, unlikely]), np.array([True, False]))
    >>> np.round(model.predict(np.array([likely, unlikely])), 2).tolist()
    [1.0, 0.0]
    """

    RESCALE_AT = 1e6  # counts are kept undecayed, the current verdict's weight growing; rescaled before it overflows

    def __init__(self, prior: float = 0.5, strength: float = 4.0, half_life: float = ACCEPTANCE_HALF_LIFE_VERDICTS):
        if not 0 < prior < 1 or not strength > 0 or not half_life > 0:
            raise ValueError(f"bad acceptance model settings: {prior=}, {strength=}, {half_life=}")
        self.prior, self.strength = float(prior), float(strength)
        self.decay = 0.5 ** (1.0 / half_life)
        self.weight = 1.0  # the current verdict's weight: counts are kept undecayed and rescaled (cheap decay)
        self.fine = np.zeros((int(np.prod(SHAPE)), 2))  # per bucket: [accepted, seen], weighted
        self.coarse = np.zeros((SHAPE[0] * SHAPE[2], 2))  # per (kind, support)
        self.total = np.zeros(2)
        self.deciles = np.zeros((10, 3))  # per predicted decile: verdicts, sum of predictions, acceptances
        self._table: np.ndarray | None = None  # every bucket's prediction, since the last verdicts

    @property
    def calibration(self) -> np.ndarray:
        """[10, 3] per decile of the predicted acceptance: verdicts, sum of predictions, sum of acceptances."""
        return self.deciles.copy()

    def predict(self, buckets: np.ndarray) -> np.ndarray:
        """Each slot's predicted acceptance (float64, the shape of `buckets`)."""
        return self.table[buckets]

    @property
    def table(self) -> np.ndarray:
        """[buckets] every bucket's predicted acceptance."""
        if self._table is None:
            k = self.strength * self.weight
            overall = (self.total[0] + k * self.prior) / (self.total[1] + k)
            middle = (self.coarse[:, 0] + k * overall) / (self.coarse[:, 1] + k)  # [kinds x supports]
            kind, _, support, _ = np.unravel_index(np.arange(len(self.fine)), SHAPE)
            self._table = (self.fine[:, 0] + k * middle[kind * SHAPE[2] + support]) / (self.fine[:, 1] + k)
        return self._table

    def observe(self, buckets: np.ndarray, accepted: np.ndarray, predicted: np.ndarray | None = None) -> None:
        """Verdicts on slots ([n] each); `predicted`: what `predict` said when they were drafted (the calibration)."""
        n = len(buckets)
        if not n:
            return
        weights = self.weight / self.decay ** np.arange(1, n + 1)  # each verdict weighs 1/decay more than the last
        self.weight = float(weights[-1])
        hits = np.asarray(accepted, np.float64)
        kind, _, support, _ = np.unravel_index(buckets, SHAPE)
        for table, index in ((self.fine, buckets), (self.coarse, kind * SHAPE[2] + support)):
            table[:, 0] += np.bincount(index, weights * hits, minlength=len(table))
            table[:, 1] += np.bincount(index, weights, minlength=len(table))
        self.total += (float(weights @ hits), float(weights.sum()))
        if predicted is not None:
            decile = np.minimum((np.asarray(predicted) * 10).astype(np.int64), 9)
            for column, values in enumerate((np.ones(n), predicted, hits)):
                self.deciles[:, column] += np.bincount(decile, values, minlength=10)
        if self.weight > self.RESCALE_AT:
            factor = 1.0 / self.weight
            self.fine *= factor
            self.coarse *= factor
            self.total *= factor
            self.weight = 1.0
        self._table = None


# ---- the budget -----------------------------------------------------------------------------------------------------


EXPLORE_EVERY = 16  # steps without a drafted slot, after which the likeliest one is drafted anyway: verdicts go on
EXPLORE_MARGIN = 0.02  # no exploring slot while drafting gains less than predicted by more than this
BUDGET_MODES = ("goodput", "static")


def survival_floor(rows, base, per_row, per_token):
    """The survival at or below which a slot never pays: a slot pays when its survival exceeds per_token x the goodput
    so far, which admitting paying slots only raises, so slots below per_token x the goodput without drafts never do
    (most of them, in a busy step)."""
    return per_token * rows / max(base + (per_row + per_token) * rows, 1e-12)


def goodput_allocate(acceptance, lengths, rows, base, per_row, per_token, floor, admit_all, counts):
    """Adds to `counts` ([n]) each row's count in the goodput-maximising set of slots (`admit_all`: every slot) and
    returns the set's predicted gain: slots by survival (the product of a row's acceptances up to the slot), best
    first, while the next one raises (rows + expected tokens) / step time; slots at or below `floor` never pay
    (`survival_floor`; -1 with `admit_all`). Plain Python over arrays, which the proposer compiles
    (`integration.vllm.rows`)."""
    n, total = len(lengths), 0
    for i in range(n):
        alive = 1.0
        for j in range(lengths[i]):
            alive *= acceptance[i, j]
            if alive <= floor:
                break
            total += 1
    survival, owner = np.empty(total), np.empty(total, np.int64)
    t = 0
    for i in range(n):
        alive = 1.0
        for j in range(lengths[i]):
            alive *= acceptance[i, j]
            if alive <= floor:
                break
            survival[t], owner[t] = alive, i
            t += 1
    if total == 0:
        return 0.0
    order = np.argsort(-survival, kind="mergesort")  # stable: a row's slots stay in order (survival never rises)
    plain = rows / max(base + (per_row + per_token) * rows, 1e-12)
    best, best_goodput, gained = 0, plain, 0.0
    for j in range(total):
        gained += survival[order[j]]
        goodput = (rows + gained) / max(base + per_row * rows + per_token * (rows + j + 1), 1e-12)
        if admit_all or goodput > best_goodput:  # the first maximum: no slot that adds nothing
            best, best_goodput = j + 1, goodput
    for j in range(best):
        counts[owner[order[j]]] += 1
    return best_goodput / plain - 1.0


class DraftBudget:
    """How many slots each row of a step drafts: in the `goodput` mode, the prefix of each row's candidates that the
    goodput-maximising set of slots holds, and after `explore_every` steps without a slot the likeliest one; in the
    `static` mode (the ablation without a budget), every candidate slot.

    >>> budget = DraftBudget()
    >>> cost = np.array([0.004, 0.0001, 0.00005])  # base, per row, per token (s)
    >>> budget.allocate(np.array([[0.9, 0.9, 0.9], [0.3, 0.3, 0.0]]), np.array([3, 2]), 2, cost).tolist()  # long
    [3, 2]
    >>> budget.allocate(np.array([[0.9, 0.9, 0.9], [0.1, 0.9, 0.0]]), np.array([3, 2]), 256, cost).tolist()  # busy
    [3, 0]
    """

    def __init__(self, explore_every: int = EXPLORE_EVERY, goodput=goodput_allocate):
        self.explore_every = explore_every
        self.goodput = goodput  # `goodput_allocate`, or the proposer's compiled copy of it
        self.idle_steps = 0  # steps since a slot was last drafted
        self.predicted_gain: float | None = 0.0  # of the last allocation (None: static, which predicts nothing)

    def allocate(
        self,
        acceptance: np.ndarray,
        lengths: np.ndarray,
        rows: int,
        cost: np.ndarray,
        mode: str = "goodput",
        margin: float = 0.0,
    ) -> np.ndarray:
        """`acceptance`: [n, k] the conditional acceptance of each candidate row's slots, the first `lengths[i]` of
        row i valid; `rows`: the rows the step serves (each produces one token whatever is drafted); `cost`:
        `StepCost.params`; `mode`: one of `BUDGET_MODES`; `margin`: the predicted gain a goodput step's drafts must
        clear (`DraftingCheck.margin`; inf: a probe, nothing drafted). Returns each candidate row's count ([n])."""
        lengths = np.asarray(lengths, np.int64)
        if mode == "static":
            self.predicted_gain = None
            return lengths.copy()
        counts, gain = self.goodput_counts(acceptance, lengths, rows, cost)
        if gain <= margin:
            counts, gain = np.zeros_like(lengths), 0.0
        if len(lengths) and not counts.any():
            self.idle_steps += 1
            if self.idle_steps >= self.explore_every and margin <= EXPLORE_MARGIN and lengths.any():
                first = np.where(lengths > 0, acceptance[:, 0], -1.0)
                best = int(np.argmax(first))  # the likeliest slot
                counts[best], self.idle_steps = 1, 0
                gain = self.goodput_counts(acceptance[best : best + 1, :1], np.ones(1, np.int64), rows, cost, True)[1]
        else:
            self.idle_steps = 0
        self.predicted_gain = gain
        return counts

    def goodput_counts(self, acceptance, lengths, rows: int, cost: np.ndarray, admit_all: bool = False):
        """Each row's count in the goodput-maximising set of slots (`admit_all`: every slot), and their gain."""
        counts = np.zeros(len(lengths), np.int64)
        if not len(lengths) or not lengths.any():
            return counts, 0.0
        base, per_row, per_token = (float(x) for x in cost)
        floor = -1.0 if admit_all else survival_floor(rows, base, per_row, per_token)
        gain = self.goodput(acceptance, lengths, rows, base, per_row, per_token, floor, admit_all, counts)
        return counts, float(gain)


# ---- the check: does drafting pay, as measured ---------------------------------------------------------------------

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


# ---- what a proposer reports ---------------------------------------------------------------------------------------


class BudgetReport:
    """What one proposer's budget measured: decayed sums over recent steps and verdicts (about the last `half_life`
    of each) and the step cost's parameters (`as_dict`, sent with every history update); the cost fit's error and
    acceptance predicted against observed per predicted decile, and the proposer's own time (`details`, for
    benchmarks). Sums, so that a
    process's proposers and an engine's workers add up."""

    def __init__(self, half_life: float = REPORT_HALF_LIFE_STEPS):
        self.decay = 0.5 ** (1.0 / half_life)
        self.sums = dict.fromkeys(("steps", "slots", "verdicts", "predicted", "accepted"), 0.0)
        self.cost = np.zeros(StepCost.TERMS)
        self.cost_error = 0.0
        self.margin, self.plain_scale = 0.0, 1.0  # the drafting check's (`DraftingCheck`)
        self.deciles = np.zeros((10, 3))  # the acceptance model's calibration (`AcceptanceModel.deciles`)
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
        weights = self.decay ** np.arange(n - 1, -1, -1)  # the newest verdict weighs 1
        for name, values in (("verdicts", np.ones(n)), ("predicted", predicted), ("accepted", accepted)):
            self.sums[name] = self.sums[name] * self.decay**n + float(weights @ np.asarray(values, np.float64))

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
