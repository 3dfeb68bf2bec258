"""GPU time, projected: the engine steps a run recorded on CPU, priced on a GPU's measured step curve.

Terminology:
- *engine steps* (`EngineSteps`): per engine step, the rows it served (requests in prefill and decoding) and the
  tokens it carried (a decoding row carries 1 + its drafts; a prefill row its prompt chunk), the draft tokens it
  verified and accepted, and when it ended (vLLM's stats, recorded by `integration.vllm.step_log`).
- *step curve* (`StepCurve`): a GPU's measured time of one step by rows and tokens per row
  (`scripts/bench_gpu_step.py`; docs/gpu_step_h200.json holds an H200's, for a Qwen3-1.7B shape).
- *projected time*: the sum over the recorded steps of the curve at (rows x scale, tokens per row). Scale 1 prices
  the steps as they ran; an RL scale (rows x 8, at most 512 rows) prices each step as if it served 8 times the
  requests, as a GPU engine at RL batch sizes does. A projection: it keeps the CPU run's schedule (which steps ran,
  with which rows and drafts) and swaps its step times for the GPU's, so it says what that schedule would cost there;
  the budget's choices follow the CPU's costs unless it priced slots on the same curve (`LosslessParams.cost_curve`).
- *makespan split* (`EngineSteps.split`): a rollout's time at a full batch (steps with at least `FULL_SHARE` of the
  rollout's peak rows) against its tail (the steps after the last full one, rows falling as samples finish).

Standard library and numpy.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


class StepCurve:
    """A GPU's step time by rows and tokens per row, measured on a grid (`points`: rows, tokens per row, seconds).

    Between grid points, linear in rows and in tokens per row. Past the grid: fewer rows than the smallest measured
    cost what it does (a small batch is bound by reading the weights, not by its rows), more rows or tokens than the
    largest extend the last measured slope.

    >>> grid = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r * q} for r in (32, 64) for q in (1, 2)]
    >>> curve = StepCurve(grid)
    >>> round(curve.time(48, 1.5) * 1e3, 3), round(curve.time(8, 1) * 1e3, 3), round(curve.time(64, 4) * 1e3, 3)
    (4.72, 4.32, 6.56)
    """

    def __init__(self, points: list[dict], device: str = ""):
        self.device = device
        self.rows = np.array(sorted({int(p["rows"]) for p in points}), np.float64)  # [R]
        self.tokens = np.array(sorted({float(p["tokens"]) for p in points}), np.float64)  # [Q]
        table = {(int(p["rows"]), float(p["tokens"])): float(p["seconds"]) for p in points}
        missing = [(r, q) for r in self.rows for q in self.tokens if (int(r), q) not in table]
        if missing or len(self.rows) < 2 or len(self.tokens) < 2:
            raise ValueError(f"a step curve needs a full grid of at least 2 x 2 points; missing {missing[:4]}")
        self.seconds = np.array([[table[(int(r), q)] for q in self.tokens] for r in self.rows])  # [R, Q]

    @classmethod
    def load(cls, path: str | Path) -> StepCurve:
        data = json.loads(Path(path).read_text())
        return cls(data["curve"], data.get("device", ""))

    def time(self, rows, tokens_per_row):
        """Seconds of steps with `rows` rows and `tokens_per_row` tokens each (scalars or arrays alike): bilinear on
        the grid, extended past it by its edge slopes."""
        r, q = np.broadcast_arrays(np.asarray(rows, np.float64), np.asarray(tokens_per_row, np.float64))
        shape, r, q = r.shape, np.maximum(r.ravel(), self.rows[0]), q.ravel()
        i, wr = _cell(self.rows, r)
        j, wq = _cell(self.tokens, q)
        s = self.seconds
        out = (1 - wr) * ((1 - wq) * s[i, j] + wq * s[i, j + 1]) + wr * ((1 - wq) * s[i + 1, j] + wq * s[i + 1, j + 1])
        return float(out[0]) if not shape else out.reshape(shape)

    @staticmethod
    @functools.lru_cache(maxsize=4)
    def cached(path: str) -> StepCurve:
        """The curve of a file, loaded once per process (the engine's proposer prices every step on it)."""
        return StepCurve.load(path)

    def budget_cost(self, rows: int, scale: int = 1) -> np.ndarray:
        """[3] (base, per_row, per_token) that price a step of `rows` rows as the curve does at rows x `scale`, each
        row and draft slot standing for `scale` of the GPU's (`budget.DraftBudget.allocate`'s linear model)."""
        one, per_token = self.linear_at(rows * scale)
        per_token *= scale
        return np.array([one - per_token * rows, 0.0, per_token])

    def linear_at(self, rows: float) -> tuple[float, float]:
        """(seconds of a step of `rows` rows carrying 1 token each, seconds per token more) at `rows`: the curve as
        a budget prices a step near it, the token cost a least-squares slope over every measured tokens-per-row."""
        times = self.time(np.full(len(self.tokens), float(rows)), self.tokens)  # [Q]
        slope = np.polyfit(self.tokens, times, 1)[0]  # seconds per token per row
        return self.time(rows, 1.0), max(float(slope), 0.0) / max(rows, 1.0)


def _cell(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The grid interval of each x (the first or last one past the ends) and x's weight towards its upper end."""
    index = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
    return index, (x - grid[index]) / (grid[index + 1] - grid[index])


def projected_time(steps: EngineSteps, curve: StepCurve, scale: int = 1, max_rows: int | None = None) -> float:
    """Seconds the recorded steps would take on the curve's GPU, each step's rows x `scale` (at most `max_rows`)."""
    rows = steps.rows.astype(np.float64)
    served = rows > 0
    if not served.any():
        return 0.0
    per_row = steps.tokens[served] / rows[served]
    scaled = rows[served] * scale
    if max_rows is not None:
        scaled = np.minimum(scaled, max_rows)
    return float(np.sum(curve.time(scaled, per_row)))


def projected_ratio(stock: EngineSteps, rule: EngineSteps, curve: StepCurve, scale: int = 1) -> float:
    """Stock's projected time over the rule's (above 1: the rule is faster on the curve's GPU)."""
    max_rows = RL_MAX_ROWS if scale > 1 else None
    mine = projected_time(rule, curve, scale, max_rows)
    return projected_time(stock, curve, scale, max_rows) / mine if mine else math.nan
