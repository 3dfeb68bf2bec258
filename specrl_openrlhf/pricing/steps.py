"""Engine steps as a run recorded them, and a rollout's makespan split.

Terminology:
- *engine steps* (`EngineSteps`): per engine step, the rows it served (requests in prefill and decoding) and the
  tokens it carried (a decoding row carries 1 + its drafts; a prefill row its prompt chunk), the draft tokens it
  verified and accepted, when it ended (vLLM's stats, recorded by `integration.vllm.step_log`), and, where the
  recorder knows it, the context its decoding rows read (`decode_context`: the sum over them of the tokens each held
  in its KV cache before the step; NaN where it was not recorded).
- *makespan split* (`EngineSteps.split`): a rollout's time at a full batch (steps with at least `FULL_SHARE` of the
  rollout's peak rows) against its tail (the steps after the last full one, rows falling as samples finish).

Core module: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

FULL_SHARE = 0.9  # a step at a full batch serves at least this share of the rollout's peak rows
FIELDS = ("time", "prefill_rows", "prefill_tokens", "decode_rows", "decode_tokens", "drafted", "accepted")
CONTEXT = "decode_context"  # the optional column


@dataclass(frozen=True)
class EngineSteps:
    """One engine's steps, [S] each, oldest first.

    >>> steps = EngineSteps.of([(0.1, 1, 40, 3, 3, 0, 0), (0.2, 0, 0, 4, 12, 8, 5, 180)])
    >>> steps.rows.tolist(), steps.decode_context.tolist()
    ([4, 4], [nan, 180.0])
    """

    time: np.ndarray  # float64, when the step's stats reached the front end (perf_counter seconds)
    prefill_rows: np.ndarray  # int64
    prefill_tokens: np.ndarray  # int64
    decode_rows: np.ndarray  # int64
    decode_tokens: np.ndarray  # int64, 1 + drafts per decoding row
    drafted: np.ndarray  # int64, draft tokens verified
    accepted: np.ndarray  # int64, draft tokens accepted
    decode_context: np.ndarray = field(default=None)  # float64, KV tokens its decoding rows read; NaN: not recorded

    def __post_init__(self):
        if self.decode_context is None:
            object.__setattr__(self, "decode_context", np.full(len(self.time), math.nan))
        else:
            object.__setattr__(self, "decode_context", np.asarray(self.decode_context, np.float64))

    @classmethod
    def of(cls, rows) -> EngineSteps:
        """From records (time, prefill rows, prefill tokens, decode rows, decode tokens, drafted, accepted), each
        with its decode context after them where the recorder knows it."""
        rows = [tuple(r) for r in rows]
        width = len(FIELDS) + 1 if any(len(r) > len(FIELDS) for r in rows) else len(FIELDS)
        filled = [r + (math.nan,) * (width - len(r)) for r in rows]
        columns = np.array(filled, np.float64).reshape(-1, width).T
        context = columns[len(FIELDS)] if width > len(FIELDS) else None
        return cls(columns[0], *(c.astype(np.int64) for c in columns[1 : len(FIELDS)]), decode_context=context)

    def as_dict(self) -> dict[str, list]:
        """Its columns as lists; the decode context only where some step recorded it (None where a step did not)."""
        data = {name: getattr(self, name).tolist() for name in FIELDS}
        if self.context_recorded.any():
            data[CONTEXT] = [None if math.isnan(c) else c for c in self.decode_context.tolist()]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> EngineSteps:
        steps = cls.of(list(zip(*(data[name] for name in FIELDS))))
        context = data.get(CONTEXT)
        if context is None:
            return steps
        values = np.array([math.nan if c is None else c for c in context], np.float64)
        return cls(*(getattr(steps, n) for n in FIELDS), decode_context=values)

    def __len__(self) -> int:
        return len(self.time)

    def __add__(self, other: EngineSteps) -> EngineSteps:
        return EngineSteps(*(np.concatenate([getattr(self, n), getattr(other, n)]) for n in (*FIELDS, CONTEXT)))

    @property
    def context_recorded(self) -> np.ndarray:
        """[S] whether the step's decode context was recorded."""
        return ~np.isnan(self.decode_context)

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
