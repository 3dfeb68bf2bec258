"""GPU time, projected: the engine steps a run recorded on CPU, priced on a GPU's measured step curve.

Terminology:
- *engine steps* (`EngineSteps`): per engine step, the rows it served (requests in prefill and decoding) and the
  tokens it carried (a decoding row carries 1 + its drafts; a prefill row its prompt chunk), the draft tokens it
  verified and accepted, and when it ended (vLLM's stats, recorded by `integration.vllm.step_log`).
- *step curve* (`step_curve.StepCurve`): a GPU's measured time of one step by rows and tokens per row
  (`scripts/bench_gpu_step.py`; docs/gpu_step_h200.json holds an H200's, for a Qwen3-1.7B shape).
- *projected time*: the sum over the recorded steps of the curve at (rows x scale, tokens per row), prefill priced as
  prefill, and every cost a step pays besides its forward (`RuleCost`: the host's time and the proposer's where async
  scheduling is off). Scale 1 prices
  the steps as they ran; an RL scale (rows x 8, at most 512 rows) prices each step as if it served 8 times the
  requests, as a GPU engine at RL batch sizes does. A projection: it keeps the CPU run's schedule (which steps ran,
  with which rows and drafts) and swaps its step times for the GPU's, so it says what that schedule would cost there;
  the budget's choices follow the CPU's costs unless it priced slots on the same curve (`LosslessParams.cost_curve`).
- *makespan split* (`EngineSteps.split`): a rollout's time at a full batch (steps with at least `FULL_SHARE` of the
  rollout's peak rows) against its tail (the steps after the last full one, rows falling as samples finish).

Standard library and numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..step_curve import HostCurve, StepCurve

RL_SCALE, RL_MAX_ROWS = 8, 512  # the RL scale the benchmarks print beside scale 1
FULL_SHARE = 0.9  # a step at a full batch serves at least this share of the rollout's peak rows
FIELDS = ("time", "prefill_rows", "prefill_tokens", "decode_rows", "decode_tokens", "drafted", "accepted")


@dataclass(frozen=True)
class EngineSteps:
    """One engine's steps, [S] each, oldest first."""

    time: np.ndarray  # float64, when the step's stats reached the front end (perf_counter seconds)
    prefill_rows: np.ndarray  # int64
    prefill_tokens: np.ndarray  # int64
    decode_rows: np.ndarray  # int64
    decode_tokens: np.ndarray  # int64, 1 + drafts per decoding row
    drafted: np.ndarray  # int64, draft tokens verified
    accepted: np.ndarray  # int64, draft tokens accepted

    @classmethod
    def of(cls, rows) -> EngineSteps:
        """From records (time, prefill rows, prefill tokens, decode rows, decode tokens, drafted, accepted)."""
        columns = np.array(rows, np.float64).reshape(-1, len(FIELDS)).T
        return cls(columns[0], *(c.astype(np.int64) for c in columns[1:]))

    def as_dict(self) -> dict[str, list]:
        return {name: getattr(self, name).tolist() for name in FIELDS}

    @classmethod
    def from_dict(cls, data: dict) -> EngineSteps:
        return cls.of(list(zip(*(data[name] for name in FIELDS))))

    def __len__(self) -> int:
        return len(self.time)

    def __add__(self, other: EngineSteps) -> EngineSteps:
        return EngineSteps(*(np.concatenate([getattr(self, n), getattr(other, n)]) for n in FIELDS))

    @property
    def rows(self) -> np.ndarray:
        return self.prefill_rows + self.decode_rows

    @property
    def tokens(self) -> np.ndarray:
        return self.prefill_tokens + self.decode_tokens

    def durations(self, start: float | None = None) -> np.ndarray:
        """[S] seconds each step took: the time since the step before (the first: since `start`, else the median)."""
        if not len(self):
            return np.zeros(0)
        gaps = np.diff(self.time, prepend=self.time[0] if start is None else start)
        if start is None:
            gaps[0] = float(np.median(gaps[1:])) if len(self) > 1 else 0.0
        return np.maximum(gaps, 0.0)

    def split(self, start: float | None = None) -> dict[str, float]:
        """The makespan split of one rollout's steps: seconds and steps at a full batch and in the tail, the peak
        rows, mean rows per step, and drafted tokens per decoding row at a full batch and in the tail."""
        rows, durations = self.rows, self.durations(start)
        if not len(self):
            return {"full_s": 0.0, "tail_s": 0.0, "full_steps": 0, "tail_steps": 0, "peak_rows": 0, "mean_rows": 0.0}
        full = rows >= FULL_SHARE * rows.max()
        tail = np.zeros(len(self), bool)
        tail[int(np.flatnonzero(full)[-1]) + 1 :] = True

        def per_row(mask):
            decode = self.decode_rows[mask].sum()
            return float(self.drafted[mask].sum() / decode) if decode else 0.0

        return {
            "full_s": float(durations[~tail].sum()),
            "tail_s": float(durations[tail].sum()),
            "full_steps": int((~tail).sum()),
            "tail_steps": int(tail.sum()),
            "peak_rows": int(rows.max()),
            "mean_rows": float(rows.mean()),
            "full_drafted_per_row": per_row(~tail),
            "tail_drafted_per_row": per_row(tail),
        }


@dataclass(frozen=True)
class Pricing:
    """How steps are priced: the GPU's step curve at rows x `scale` (at most `max_rows`), and every cost a step pays
    besides its forward: the proposer's own time (it runs serially), and, for a rule that turns vLLM's async
    scheduling off, the engine's host time (`HostCurve`), which stock overlaps with the GPU's forward."""

    curve: StepCurve
    scale: int = 1
    max_rows: int | None = None
    host: HostCurve | None = None

    @property
    def optimistic(self) -> bool:
        """Whether the figure leaves costs out: the host's (no host curve) or a prefill's measured cost (no column);
        ragged drafted steps are priced at their mean tokens per row, as the curve's uniform steps were timed."""
        return self.host is None or not self.curve.prefill_measured


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step [S]: the GPU's forward, the host's part, the proposer's."""

    gpu: np.ndarray
    host: np.ndarray
    proposer: np.ndarray

    def total(self, async_scheduling: bool) -> float:
        """A rollout's projected seconds: with async scheduling (stock) the host's part overlaps the forward; without
        it (every model-free proposer) a step pays the forward, the host's part and the proposer one after another."""
        if async_scheduling:
            return float(np.maximum(self.gpu, self.host).sum())
        return float((self.gpu + self.host + self.proposer).sum())


def step_costs(decode_rows, decode_tokens, prefill_tokens, pricing: Pricing, proposer_s=0.0) -> StepCosts:
    """Per step: decoding rows x scale at their mean tokens per row on the curve, prefill tokens x scale priced as
    prefill (`StepCurve.prefill_cost`; a step of prefill alone pays the curve's smallest step too), the host's part at
    those rows, and `proposer_s` (per step, or one value for all)."""
    rows = np.asarray(decode_rows, np.float64)
    tokens = np.asarray(decode_tokens, np.float64)
    prefill = np.asarray(prefill_tokens, np.float64) * pricing.scale
    scaled = rows * pricing.scale
    if pricing.max_rows is not None:
        scaled = np.minimum(scaled, pricing.max_rows)
    decoding = rows > 0
    per_row = np.where(decoding, tokens / np.maximum(rows, 1.0), 1.0)
    gpu = np.where(decoding, pricing.curve.time(np.maximum(scaled, 1.0), per_row), 0.0)
    gpu = gpu + np.where(~decoding & (prefill > 0), pricing.curve.time(1.0, 1.0), 0.0)
    gpu = gpu + np.asarray(pricing.curve.prefill_cost(prefill, np.maximum(scaled, 1.0)), np.float64)
    served = decoding | (prefill > 0)
    host = pricing.host.time(np.maximum(scaled, 1.0)) if pricing.host is not None else np.zeros_like(gpu)
    host = np.where(served, host, 0.0)
    proposer = np.broadcast_to(np.asarray(proposer_s, np.float64), gpu.shape) * served
    return StepCosts(gpu, host, proposer)


@dataclass(frozen=True)
class RuleCost:
    """What a rule's steps pay besides the forward: vLLM keeps async scheduling for stock and the request-path rules
    (no proposer in the engine) and turns it off for every model-free proposer, whose own time then runs serially:
    `proposer_base_us` a step + `proposer_us` a row (None: not known, priced 0, and the figure is optimistic)."""

    async_scheduling: bool = True
    proposer_us: float | None = 0.0
    proposer_base_us: float = 0.0


STOCK = RuleCost()  # stock generation's steps: async scheduling, no proposer


def projected_time(
    steps: EngineSteps,
    curve: StepCurve,
    scale: int = 1,
    max_rows: int | None = None,
    *,
    host: HostCurve | None = None,
    rule: RuleCost = STOCK,
) -> float:
    """Seconds the recorded steps would take on the curve's GPU, each step's rows x `scale` (at most `max_rows`),
    with every cost a step pays (`step_costs`, `StepCosts.total`): the proposer's at `rule`'s cost a step and a row."""
    pricing = Pricing(curve, scale, max_rows, host)
    rows = steps.rows * scale if max_rows is None else np.minimum(steps.rows * scale, max_rows)
    proposer_s = np.where(rows > 0, rule.proposer_base_us + (rule.proposer_us or 0.0) * rows, 0.0) * 1e-6
    costs = step_costs(steps.decode_rows, steps.decode_tokens, steps.prefill_tokens, pricing, proposer_s)
    return costs.total(rule.async_scheduling)


def projected_ratio(
    stock: EngineSteps, rule: EngineSteps, curve: StepCurve, scale: int = 1, *, host=None, cost=STOCK
) -> float:
    """Stock's projected time over the rule's (above 1: the rule is faster on the curve's GPU)."""
    max_rows = RL_MAX_ROWS if scale > 1 else None
    mine = projected_time(rule, curve, scale, max_rows, host=host, rule=cost)
    theirs = projected_time(stock, curve, scale, max_rows, host=host)
    return theirs / mine if mine else math.nan
