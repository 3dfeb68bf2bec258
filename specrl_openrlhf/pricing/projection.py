"""GPU time, projected: engine steps recorded on CPU (a real engine's, or the simulator's), priced on a GPU's step
price, with every cost a step pays, and the host's part shown.

Terminology:
- *step price* (`curves.StepPrice`): a GPU's time of one step by rows and tokens per row (a `StepCurve` measured by
  `scripts/bench_gpu_step.py`, or a model that prices by each row's context too), and of prefill tokens.
- *step costs* (`StepCosts`): per step, the GPU's forward, the engine's host part (`HostCurve`, this machine's,
  measured on the tiny model) and the proposer's own time.
- *projected time*: the sum over the steps of what each pays, at rows x `scale` (an RL scale: rows x 8, at most 512,
  prices each step as if it served 8 times the requests, as a GPU engine at RL batch sizes does). With async scheduling
  (stock, the request-path rules) the host's part overlaps the forward; without it (vLLM turns it off for every
  model-free proposer) a step pays the forward, the host's part and the proposer one after another. A projection: it
  keeps the CPU run's schedule and swaps its step times for the GPU's.
- *the host's part* (`Projection`, `project`): a rule against stock four ways: `projected` (the host paid serially
  where the rule turns async scheduling off), `projected_async` (the host hidden, as a drafter that kept async
  scheduling would get: the proposer still runs serially, it needs the step's sampled tokens), `projected_no_host`
  (no host time at all, for stock and the rule: the forward and the proposer alone) and `breakeven_host_ms` (the host
  time of a full-batch step at which the rule ties stock). A missing input is named (`missing`), never priced as a
  silent 0.

Core module: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .curves import HostCurve, StepPrice, prefill_modelled
from .steps import EngineSteps

RL_SCALE, RL_MAX_ROWS = 8, 512  # the RL scale the benchmarks print beside scale 1


@dataclass(frozen=True)
class Pricing:
    """How steps are priced: the GPU's step price at rows x `scale` (at most `max_rows`), and the engine's host time
    per step (`host`; None: not measured, named `missing=host` wherever a figure is shown)."""

    curve: StepPrice
    scale: int = 1
    max_rows: int | None = None
    host: HostCurve | None = None

    def scaled(self, rows) -> np.ndarray:
        """Rows x scale, at most `max_rows`."""
        scaled = np.asarray(rows, np.float64) * self.scale
        return scaled if self.max_rows is None else np.minimum(scaled, self.max_rows)

    @property
    def prefill(self) -> str:
        """'modelled' where the price models prefill on its decode grid (no prefill column), else 'measured'."""
        return "modelled" if prefill_modelled(self.curve) else "measured"


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step [S]: the GPU's forward, the host's part, the proposer's; and the rows each was priced at."""

    gpu: np.ndarray
    host: np.ndarray
    proposer: np.ndarray
    rows: np.ndarray | None = None

    def total(self, async_scheduling: bool, host_factor: float = 1.0) -> float:
        """A rollout's projected seconds, the host's part x `host_factor`: with async scheduling it overlaps the
        forward; without it a step pays the forward, the host's part and the proposer one after another. The
        proposer runs serially either way (it drafts from the step's sampled tokens)."""
        return float(_totals(self, async_scheduling, np.array([host_factor], np.float64))[0])

    def with_proposer(self, extra) -> StepCosts:
        """These costs with `extra` seconds of the proposer's per step (its history updates, say)."""
        return StepCosts(self.gpu, self.host, self.proposer + np.asarray(extra, np.float64), self.rows)

    def take(self, steps: np.ndarray) -> StepCosts:
        """These costs at `steps` only ([S] bool, or indices): an epoch's, say."""
        rows = None if self.rows is None else self.rows[steps]
        return StepCosts(self.gpu[steps], self.host[steps], self.proposer[steps], rows)

    def without_host(self) -> StepCosts:
        """These costs with no host time at all."""
        return StepCosts(self.gpu, np.zeros_like(self.gpu), self.proposer, self.rows)


def step_costs(
    decode_rows,
    decode_tokens,
    prefill_tokens,
    pricing: Pricing,
    proposer_s=0.0,
    decode_context=None,
    prefill_rows=None,
    logit_tokens=None,
    prefill_context=None,
) -> StepCosts:
    """Per step [S]: decoding rows x scale at their mean tokens per row on the step price, at the mean context of a
    decoding row (`decode_context`, the sum over its decoding rows of the tokens each held in its KV cache before the
    step; NaN or None: not recorded, priced without one, which a price that needs one refuses); prefill tokens x scale
    priced as prefill beside the decoding rows' tokens (`prefill_rows` x scale sequences of them where recorded, each
    after the mean of `prefill_context`, the sum over them of the tokens each had cached before the step: a chunk of
    a long prompt, a continuation after a cached prefix; None: fresh prompts; a step of prefill alone pays the
    price's smallest step too, a row at no context), and the logits of `logit_tokens` x scale of them (prompt
    log-probs), each served step's whole forward with its launches where the price is of an engine without CUDA graphs
    (`curve.eager`, `eager.EagerLaunches.step`); the host's part at those rows; and `proposer_s` (per step, or one
    value for all)."""
    curve = pricing.curve
    rows = np.atleast_1d(np.asarray(decode_rows, np.float64))
    tokens = np.atleast_1d(np.asarray(decode_tokens, np.float64))
    prefill = np.broadcast_to(np.asarray(prefill_tokens, np.float64) * pricing.scale, rows.shape)
    scaled = np.maximum(pricing.scaled(rows), 1.0)
    decoding = rows > 0
    gpu = np.zeros(rows.shape)
    if decoding.any():
        context = _mean_context(decode_context, rows)
        per_row = tokens[decoding] / rows[decoding]
        known = context[decoding] if context is not None else None
        gpu[decoding] = _at_known_context(curve.time, known, scaled[decoding], per_row)
    alone = ~decoding & (prefill > 0)
    if alone.any():
        gpu[alone] += curve.time(1.0, 1.0, context=0.0)
    prefilling = prefill > 0
    if prefilling.any():
        recorded = prefill_rows is not None
        prompts = np.broadcast_to(np.asarray(prefill_rows if recorded else 1.0, np.float64), rows.shape)
        sequences = prompts * pricing.scale if recorded else prompts
        context = None
        if prefill_context is not None:  # each sequence's cached tokens: the mean over the step's prefills
            cached = np.broadcast_to(np.asarray(prefill_context, np.float64), rows.shape)
            context = (cached / np.maximum(prompts, 1.0))[prefilling]
        carried = np.where(decoding, scaled * tokens / np.maximum(rows, 1.0), scaled)  # the alone step's one token
        cost = curve.prefill_cost(
            prefill[prefilling],
            scaled[prefilling],
            context=context,
            sequences=sequences[prefilling],
            carried=carried[prefilling],
        )
        gpu[prefilling] += np.asarray(cost, np.float64)
    if logit_tokens is not None:
        logits = np.broadcast_to(np.asarray(logit_tokens, np.float64) * pricing.scale, rows.shape)
        gpu += np.asarray(curve.logits_cost(logits), np.float64)
    served = decoding | prefilling
    eager = getattr(curve, "eager", None)  # an engine without CUDA graphs: each served step pays its launches
    if eager is not None and served.any():
        gpu[served] = eager.step(gpu[served])
    host = pricing.host.time(scaled) if pricing.host is not None else np.zeros_like(gpu)
    host = np.where(served, host, 0.0)
    proposer = np.broadcast_to(np.asarray(proposer_s, np.float64), gpu.shape) * served
    return StepCosts(gpu, host, proposer, np.where(served, scaled, 0.0))


def _mean_context(decode_context, rows: np.ndarray) -> np.ndarray | None:
    """[S] tokens a decoding row read, NaN where not recorded (or no row decoded); None where no step recorded it."""
    if decode_context is None:
        return None
    total = np.broadcast_to(np.asarray(decode_context, np.float64), rows.shape)
    mean = np.where(rows > 0, total / np.maximum(rows, 1.0), math.nan)
    return None if np.isnan(mean).all() else mean


def _at_known_context(price, context: np.ndarray | None, *args: np.ndarray) -> np.ndarray:
    """`price(*args)` per step, with `context=` each step's context where it was recorded, without it elsewhere."""
    if context is None:
        return np.asarray(price(*args), np.float64)
    known = ~np.isnan(context)
    out = np.zeros(known.shape)
    if known.any():
        out[known] = price(*(a[known] for a in args), context=context[known])
    if not known.all():
        out[~known] = price(*(a[~known] for a in args))
    return out


@dataclass(frozen=True)
class RuleCost:
    """What a rule's steps pay besides the forward: vLLM keeps async scheduling for stock and the request-path rules
    (no proposer in the engine) and turns it off for every model-free proposer, whose own time then runs serially:
    `proposer_base_us` a step + `proposer_us` a row (None: never measured here; priced 0 and named
    `missing=proposer_cost` wherever a figure is shown)."""

    async_scheduling: bool = True
    proposer_us: float | None = 0.0
    proposer_base_us: float = 0.0

    def proposer_s(self, rows) -> np.ndarray:
        """[S] the proposer's seconds at each step's `rows` (served ones only)."""
        rows = np.asarray(rows, np.float64)
        return np.where(rows > 0, self.proposer_base_us + (self.proposer_us or 0.0) * rows, 0.0) * 1e-6

    @property
    def missing(self) -> tuple[str, ...]:
        return ("proposer_cost",) if self.proposer_us is None else ()


STOCK = RuleCost()  # stock generation's steps: async scheduling, no proposer


def priced(steps: EngineSteps, pricing: Pricing, rule: RuleCost = STOCK) -> StepCosts:
    """The recorded steps' costs: the proposer's at `rule`'s cost a step and a row x scale."""
    proposer_s = rule.proposer_s(pricing.scaled(steps.rows))
    return step_costs(
        steps.decode_rows,
        steps.decode_tokens,
        steps.prefill_tokens,
        pricing,
        proposer_s,
        steps.decode_context,
        steps.prefill_rows,  # a step's prompts are separate sequences: no attention across them
    )


def projected_time(
    steps: EngineSteps,
    curve: StepPrice,
    scale: int = 1,
    max_rows: int | None = None,
    *,
    host: HostCurve | None = None,
    rule: RuleCost = STOCK,
) -> float:
    """Seconds the recorded steps would take on the curve's GPU, each step's rows x `scale` (at most `max_rows`),
    with every cost a step pays (`step_costs`, `StepCosts.total`): the proposer's at `rule`'s cost a step and a row."""
    return priced(steps, Pricing(curve, scale, max_rows, host), rule).total(rule.async_scheduling)


def projected_ratio(
    stock: EngineSteps, rule: EngineSteps, curve: StepPrice, scale: int = 1, *, host=None, cost=STOCK
) -> float:
    """Stock's projected time over the rule's (above 1: the rule is faster on the curve's GPU)."""
    return project_steps(stock, rule, rl_pricing(curve, scale, host), cost).projected


def rl_pricing(curve: StepPrice, scale: int = 1, host: HostCurve | None = None) -> Pricing:
    """Pricing at rows x `scale`: as the steps ran at 1, at most `RL_MAX_ROWS` rows above it."""
    return Pricing(curve, scale, RL_MAX_ROWS if scale > 1 else None, host)


@dataclass(frozen=True)
class Projection:
    """A rule's steps against stock's on one step price, the host's part shown (see the module's terminology).

    `breakeven_host_ms` is the host time of a full-batch step (the host curve x a factor) at which the rule ties
    stock, the first tie from no host time up; `wins_below` says which side of it the rule wins on. `inf`: they never
    tie and the rule wins at every host time; NaN: they never tie and the rule loses at every host time, or there is
    no host curve (`missing` names it)."""

    projected: float
    projected_async: float
    breakeven_host_ms: float
    wins_below: bool
    stock_s: float
    rule_s: float
    rule_async_s: float
    host_ms: float  # the measured host time of a full-batch step (NaN: no host curve)
    missing: tuple[str, ...] = ()
    prefill: str = "measured"
    projected_no_host: float = math.nan  # stock's seconds over the rule's with no host time for either

    def fields(self, rule: str, digits: int = 3) -> str:
        """`projected[RULE]=.. projected_async[RULE]=.. projected_no_host[RULE]=.. breakeven_host_ms[RULE]=..`, for a
        RESULT line."""
        return (
            f"projected[{rule}]={self.projected:.{digits}f} projected_async[{rule}]={self.projected_async:.{digits}f} "
            f"projected_no_host[{rule}]={self.projected_no_host:.{digits}f} "
            f"breakeven_host_ms[{rule}]={self.breakeven_host_ms:.2f}"
        )

    def describe(self) -> str:
        """The three figures in words, with what is missing."""
        if math.isnan(self.breakeven_host_ms):
            tie = "no host curve" if "host" in self.missing else "never ties stock: loses at every host time"
        elif math.isinf(self.breakeven_host_ms):
            tie = "never ties stock: wins at every host time"
        else:
            side = "below" if self.wins_below else "above"
            tie = f"ties stock at {self.breakeven_host_ms:.2f} ms of host a full-batch step, wins {side} it"
        host = "no host time" if "host" in self.missing else f"host {self.host_ms:.2f} ms a full-batch step"
        text = (
            f"{self.projected:.2f} ({host}, paid serially where the rule turns async scheduling off), "
            f"{self.projected_async:.2f} with the host hidden, {self.projected_no_host:.2f} with no host; {tie}"
        )
        notes = ([f"missing={','.join(self.missing)}"] if self.missing else []) + [f"prefill={self.prefill}"]
        return text + " (" + ", ".join(notes) + ")"


def project(
    stock: StepCosts, rule: StepCosts, cost: RuleCost, pricing: Pricing, full_rows: float | None = None
) -> Projection:
    """`rule`'s steps (priced at `cost`: its scheduling, its proposer) against `stock`'s, on `pricing`: `projected`,
    `projected_async` and `breakeven_host_ms`, the host of a full batch at `full_rows` rows (default: stock's most).
    Every step's total is piecewise linear in the host factor, so the tie is solved in closed form between the
    factors where a step's host part overtakes its forward."""
    stock_s, rule_s, rule_async_s = stock.total(True), rule.total(cost.async_scheduling), rule.total(True)
    missing = (("host",) if pricing.host is None else ()) + cost.missing
    if full_rows is None:
        full_rows = float(stock.rows.max()) if stock.rows is not None and len(stock.rows) else 1.0
    host_s = pricing.host.time(max(full_rows, 1.0)) if pricing.host is not None else math.nan
    factor, wins_below = (math.nan, True) if pricing.host is None else _tie(stock, rule, cost.async_scheduling)
    return Projection(
        projected=_ratio(stock_s, rule_s),
        projected_async=_ratio(stock_s, rule_async_s),
        breakeven_host_ms=factor * host_s * 1e3 if not math.isnan(factor) else math.nan,
        wins_below=wins_below,
        stock_s=stock_s,
        rule_s=rule_s,
        rule_async_s=rule_async_s,
        host_ms=host_s * 1e3,
        missing=missing,
        prefill=pricing.prefill,
        projected_no_host=_ratio(stock.without_host().total(True), rule.without_host().total(cost.async_scheduling)),
    )


def project_steps(stock: EngineSteps, rule: EngineSteps, pricing: Pricing, cost: RuleCost = STOCK) -> Projection:
    """`project` on recorded engine steps: stock's priced as stock, the rule's at `cost`."""
    return project(priced(stock, pricing), priced(rule, pricing, cost), cost, pricing)


def missing_field(missing: dict[str, tuple[str, ...]]) -> str:
    """`missing=` for a RESULT line: each missing input once, a rule's own under its name (`proposer_cost[suffix]`);
    `none` where nothing is."""
    shared = sorted({m for names in missing.values() for m in names if m == "host"})
    own = [f"{m}[{rule}]" for rule, names in missing.items() for m in names if m != "host"]
    return "missing=" + (",".join(shared + own) or "none")


def _ratio(stock_s: float, rule_s: float) -> float:
    return stock_s / rule_s if rule_s else math.nan


def _totals(costs: StepCosts, async_scheduling: bool, factors: np.ndarray) -> np.ndarray:
    """[F] the steps' total seconds at each host factor: sum of max(gpu, f x host) + proposer with async scheduling,
    else sum of gpu + f x host + proposer."""
    gpu, host = np.asarray(costs.gpu, np.float64), np.asarray(costs.host, np.float64)
    fixed = float(np.asarray(costs.proposer, np.float64).sum())
    if not async_scheduling:
        return fixed + gpu.sum() + factors * host.sum()
    hosted = host > 0
    order = np.argsort(gpu[hosted] / host[hosted])
    turns = (gpu[hosted] / host[hosted])[order]  # the factor past which a step's host part overtakes its forward
    g = np.concatenate([[0.0], np.cumsum(gpu[hosted][order])])
    h = np.concatenate([[0.0], np.cumsum(host[hosted][order])])
    overtaken = np.searchsorted(turns, factors, side="left")  # steps whose host part is the longer at that factor
    return fixed + gpu[~hosted].sum() + (g[-1] - g[overtaken]) + factors * h[overtaken]


def _turns(costs: StepCosts, async_scheduling: bool) -> np.ndarray:
    if not async_scheduling:
        return np.zeros(0)
    hosted = np.asarray(costs.host) > 0
    return np.asarray(costs.gpu)[hosted] / np.asarray(costs.host)[hosted]


def _tie(stock: StepCosts, rule: StepCosts, rule_async: bool) -> tuple[float, bool]:
    """(host factor at which the rule's total meets stock's, the first from 0 up; whether the rule wins below it).
    Both totals are linear between the factors where a step's host part overtakes its forward, and past the last."""
    factors = np.unique(np.concatenate([[0.0], _turns(stock, True), _turns(rule, rule_async)]))
    gap = _totals(rule, rule_async, factors) - _totals(stock, True, factors)  # [F] the rule's seconds more
    wins_below = bool(gap[0] < 0)
    if gap[0] == 0:
        return 0.0, False
    crossed = np.flatnonzero((gap < 0) != wins_below)
    if len(crossed):
        k = int(crossed[0])
        x0, x1, y0, y1 = factors[k - 1], factors[k], gap[k - 1], gap[k]
        return float(x0 - y0 * (x1 - x0) / (y1 - y0)), wins_below
    slope = float(np.sum(rule.host) - np.sum(stock.host))  # past the last turn every host part is the longer
    if (slope > 0) == wins_below and slope != 0:
        return float(factors[-1] - gap[-1] / slope), wins_below
    return (math.inf if wins_below else math.nan), wins_below
