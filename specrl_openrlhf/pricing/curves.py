"""A GPU's step curve: the measured time of one engine step by the rows it serves and the tokens each carries.

Terminology:
- *decode grid* (`StepCurve.seconds`): one forward of `rows` rows carrying `tokens` tokens each, a decoding step (1
  token a row) or a verification step (1 + drafts a row), timed on a GPU (`scripts/bench_gpu_step.py`;
  docs/gpu_step_h200.json holds an H200's, for a Qwen3-1.7B shape);
- *prefill column* (`StepCurve.prefill`, optional): one forward that prefills `tokens` prompt tokens, timed the same
  way (`bench_gpu_step.py --prefill`). Where a curve has none, a prefill token is priced as a carried token at the
  decode grid's slope (per token carried, at the first measured row or more), a model (`prefill_measured` says which).
- *context*: the tokens each row holds in its KV cache before the step. A curve is measured at one context
  (`StepCurve.context`, the file's `"context"`, None where it does not say) and prices every step at it: its `time` and
  `prefill_cost` take a `context` and ignore it. A step price that models the context (any object with `time`,
  `prefill_cost`, `device` and `source`, as `StepPrice` says) prices by it.
- *host column* (`StepCurve.host`, optional, a `HostCurve`): the engine's host time per step by rows, which a step
  pays on top of its forward where async scheduling is off (every model-free proposer's): a budget priced on the
  curve counts it in a step's fixed cost.

`fit_linear` fits one line, t = base + per_row x rows + per_token x tokens carried, to a curve's points (the file
`bench_gpu_step.py` writes keeps it beside them, as `fit`); pricing reads the curve, not the fit.

A curve travels as data (`as_data`, `from_data`): a run reads its file once, where it starts, and hands the data to
every engine with the rule's parameters, so no engine reads a file. Bad data is one `ValueError` naming its source.

Core module: numpy only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

import numpy as np

from . import linear
from .interpolation import interval, line


class StepPrice(Protocol):
    """What pricing reads of a GPU's step price: a `StepCurve`, or a model that prices by context too."""

    device: str
    source: str

    def time(self, rows, tokens_per_row, context=None): ...

    def prefill_cost(self, tokens, rows=0.0, context=None, sequences=1.0, carried=None): ...

    def logits_cost(self, tokens): ...


def describe(curve) -> str:
    """A step price as a label names it: its device, its source and, where it says, the context it was measured at
    and that its engine runs without CUDA graphs."""
    context = getattr(curve, "context", None)
    where = f" at context {context:g}" if isinstance(context, (int, float)) else ""
    eager = getattr(curve, "eager", None)  # an engine without CUDA graphs (`kernels.KernelStepModel.with_eager`)
    mode = f"; {eager.describe()}" if eager is not None else ""
    return f"{curve.device or 'a GPU'} ({curve.source}){where}{mode}"


def prefill_modelled(curve) -> bool:
    """Whether the price models prefill on its decode grid (a `StepCurve` without a prefill column)."""
    return getattr(curve, "prefill_measured", True) is False


class StepCurve:
    """A GPU's step time by rows and tokens per row, measured on a grid (`points`: rows, tokens per row, seconds),
    and optionally a prefill column (`prefill`: tokens, seconds).

    Between grid points, linear in rows and in tokens per row. Past the grid: fewer rows than the smallest measured
    cost what it does (a small batch is bound by reading the weights, not by its rows), more rows or tokens than the
    largest extend the last measured slope. Measured at one context (`context`: tokens in each row's KV cache, None
    where the file does not say), which every step is priced at.

    >>> grid = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r * q} for r in (32, 64) for q in (1, 2)]
    >>> curve = StepCurve(grid)
    >>> round(curve.time(48, 1.5) * 1e3, 3), round(curve.time(8, 1) * 1e3, 3), round(curve.time(64, 4) * 1e3, 3)
    (4.72, 4.32, 6.56)
    """

    def __init__(
        self,
        points: list[dict],
        device: str = "",
        prefill: list[dict] | None = None,
        source: str = "",
        host: HostCurve | None = None,
        context: float | None = None,
    ):
        self.device, self.source, self.host = device, source or "the step curve", host
        self.context = None if context is None else float(context)
        self._budget_costs: dict[tuple[int, int], np.ndarray] = {}
        try:
            table = {(int(p["rows"]), float(p["tokens"])): float(p["seconds"]) for p in points}
            prefill_table = {float(p["tokens"]): float(p["seconds"]) for p in prefill or []}
        except (TypeError, KeyError, ValueError) as error:
            raise ValueError(
                f"{self.source}: not a step curve ({type(error).__name__}: {error}); each point needs rows, tokens "
                "and seconds (scripts/bench_gpu_step.py writes one)"
            ) from None
        values = [*table.values(), *prefill_table.values()]
        if not all(math.isfinite(s) and s > 0 for s in values) or any(r < 1 or q < 1 for r, q in table):
            raise ValueError(f"{self.source}: a step curve's rows, tokens and seconds must be positive")
        self.rows = np.array(sorted({r for r, _ in table}), np.float64)  # [R]
        self.tokens = np.array(sorted({q for _, q in table}), np.float64)  # [Q]
        missing = [(int(r), q) for r in self.rows for q in self.tokens if (int(r), q) not in table]
        if missing or len(self.rows) < 2 or len(self.tokens) < 2:
            raise ValueError(
                f"{self.source}: a step curve needs a full grid of at least 2 x 2 points; missing {missing[:4]}"
            )
        self.seconds = np.array([[table[(int(r), q)] for q in self.tokens] for r in self.rows])  # [R, Q]
        if prefill is not None and len(prefill_table) < 2:
            raise ValueError(f"{self.source}: a prefill column needs at least 2 points, got {len(prefill_table)}")
        self.prefill_tokens = np.array(sorted(prefill_table), np.float64)  # [P], empty without a column
        self.prefill_seconds = np.array([prefill_table[t] for t in self.prefill_tokens])  # [P]

    @classmethod
    def from_data(cls, data, source: str = "") -> StepCurve:
        """From a curve's JSON object (`as_data`, or the file `bench_gpu_step.py` writes)."""
        if not isinstance(data, dict) or not isinstance(data.get("curve"), list):
            raise ValueError(
                f"{source or 'the step curve'}: not a step curve (a JSON object with a 'curve' list of points; "
                "scripts/bench_gpu_step.py writes one)"
            )
        prefill, host = data.get("prefill"), data.get("host")
        if prefill is not None and not isinstance(prefill, list):
            raise ValueError(f"{source or 'the step curve'}: 'prefill' must be a list of points (tokens, seconds)")
        if host is not None:
            if not isinstance(host, dict) or not isinstance(host.get("points"), list):
                raise ValueError(f"{source or 'the step curve'}: 'host' must be a host step curve's data")
            host = HostCurve.from_data(host, source)
        context = data.get("context")
        if context is not None and (not isinstance(context, (int, float)) or not context >= 0):
            raise ValueError(f"{source or 'the step curve'}: 'context' must be a number of tokens, got {context!r}")
        return cls(data["curve"], str(data.get("device", "")), prefill, source, host, context)

    @classmethod
    def load(cls, path: str | Path) -> StepCurve:
        """The curve of a file; a missing, unreadable or malformed file is one ValueError naming it."""
        return cls.from_data(read_json(path, "step curve", "scripts/bench_gpu_step.py writes one"), str(path))

    def as_data(self) -> dict:
        """The curve as a JSON object `from_data` reads back (what travels to the engines)."""
        points = [
            {"rows": int(r), "tokens": float(q), "seconds": float(self.seconds[i, j])}
            for i, r in enumerate(self.rows)
            for j, q in enumerate(self.tokens)
        ]
        data = {"device": self.device, "curve": points}
        if self.context is not None:
            data["context"] = self.context
        if self.prefill_measured:
            data["prefill"] = [{"tokens": float(t), "seconds": float(s)} for t, s in self.prefill_points()]
        if self.host is not None:
            data["host"] = self.host.as_data()
        return data

    def with_host(self, host: HostCurve | None) -> StepCurve:
        """This curve with the host's time per step beside it (`host`)."""
        return StepCurve.from_data({**self.as_data(), **({"host": host.as_data()} if host else {})}, self.source)

    def prefill_points(self) -> list[tuple[float, float]]:
        return list(zip(self.prefill_tokens.tolist(), self.prefill_seconds.tolist()))

    @property
    def prefill_measured(self) -> bool:
        """Whether prefills are priced on a measured column (else on the decode grid's token slope: a model)."""
        return len(self.prefill_tokens) >= 2

    def time(self, rows, tokens_per_row, context=None):
        """Seconds of steps with `rows` rows and `tokens_per_row` tokens each (scalars or arrays alike): bilinear on
        the grid, extended past it by its edge slopes. `context` is ignored: the curve was measured at one."""
        r, q = np.broadcast_arrays(np.asarray(rows, np.float64), np.asarray(tokens_per_row, np.float64))
        shape, r, q = r.shape, np.maximum(r.ravel(), self.rows[0]), q.ravel()
        i, wr = interval(self.rows, r)
        j, wq = interval(self.tokens, q)
        s = self.seconds
        out = (1 - wr) * ((1 - wq) * s[i, j] + wq * s[i, j + 1]) + wr * ((1 - wq) * s[i + 1, j] + wq * s[i + 1, j + 1])
        return float(out[0]) if not shape else out.reshape(shape)

    def prefill_cost(self, tokens, rows=0.0, context=None, sequences=1.0, carried=None):
        """Seconds that `tokens` prefill tokens add to a step that also serves `rows` decoding rows (scalars or
        arrays): the measured column's time less its intercept at zero tokens (the fixed cost the step pays anyway);
        without a column, each token at the decode grid's cost of a carried token at those rows (`token_slope`: at
        the first measured row where fewer rows decode, so never more a token for fewer rows; a model). `context`,
        `sequences` and `carried` (the decoding rows' tokens) are ignored (the curve was measured at one context, on
        one sequence, and its token slope is by rows)."""
        tokens = np.asarray(tokens, np.float64)
        if self.prefill_measured:
            t, s = self.prefill_tokens, self.prefill_seconds
            intercept = s[0] - (s[1] - s[0]) / (t[1] - t[0]) * t[0]
            j, w = interval(t, tokens)
            extra = (1 - w) * s[j] + w * s[j + 1] - intercept
        else:
            extra = tokens * self.token_slope(rows)
        out = np.where(tokens > 0, np.maximum(extra, 0.0), 0.0)
        return float(out) if out.ndim == 0 else out

    def logits_cost(self, tokens):
        """0: the curve's steps computed every position's logits, so a carried or modelled prefill token's cost
        holds them already (an upper bound for prefills that need only their last position's)."""
        out = np.zeros_like(np.asarray(tokens, np.float64))
        return float(out) if out.ndim == 0 else out

    def token_slope(self, rows):
        """Seconds per carried token more, at `rows` rows: the least-squares slope over every measured tokens-per-row,
        per row (scalars or arrays; `linear.token_slope`). Below the first measured row, the first row's: `time`
        prices fewer rows as that many, so its slope is per that many rows' tokens."""
        return linear.token_slope(self, rows, self.tokens, least_rows=self.rows[0])

    def budget_cost(self, rows: int, scale: int = 1, context=None) -> np.ndarray:
        """[3] (base, per_row, per_token) that price a step of `rows` rows as the curve does at rows x `scale`, each
        row and draft slot standing for `scale` of the GPU's (`linear.budget_cost`, over every measured
        tokens-per-row); the host column's time, where there is one, is part of the base. `context` (a row's) is
        ignored, as by `time`."""
        key = (int(rows), int(scale))
        cost = self._budget_costs.get(key)
        if cost is None:  # the proposer asks at every step, for a few hundred distinct rows at most
            cost = self._budget_costs[key] = linear.budget_cost(self, rows, scale, None, self.tokens, self.rows[0])
        return cost

    def linear_at(self, rows: float, context=None) -> tuple[float, float]:
        """(seconds of a step of `rows` rows carrying 1 token each, seconds per token more) at `rows`: the curve as
        a budget prices a step near it, the token cost a least-squares slope over every measured tokens-per-row."""
        return self.time(rows, 1.0), self.token_slope(float(rows))


def fit_linear(points: list[dict]) -> dict:
    """Least squares of t = base + per_row x rows + per_token x rows x tokens over points (rows, tokens, seconds)."""
    x = np.array([[1.0, p["rows"], p["rows"] * p["tokens"]] for p in points], np.float64).reshape(-1, 3)
    y = np.array([p["seconds"] for p in points], np.float64)
    params, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = float(np.sqrt(np.mean((x @ params - y) ** 2)) / np.mean(y)) if len(y) else float("nan")
    return {
        "base_s": float(params[0]),
        "per_row_s": float(params[1]),
        "per_token_s": float(params[2]),
        "rel_rms": residual,  # the residual's RMS over the mean time
    }


def read_json(path: str | Path, what: str, fix: str):
    """A curve file's JSON (`what`); a missing or unreadable file is one ValueError naming it and `fix`."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {what} file ({fix})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable {what} ({type(error).__name__}: {error})") from None


class HostCurve:
    """The engine's host (CPU) time of one step by the rows it serves, with the model's forward, logits and sampling
    taken out (`bench_at_scale.py` measures it on the tiny model): the work async scheduling overlaps with the GPU's
    forward, and which a rule that turns it off (every model-free proposer in vLLM) pays on top. Linear between the
    measured rows, the first point's below them, the last slope past them. `taken` says when and how it was measured
    (`pricing.measured`: the time, the machine's load during it, the format), empty where its file does not say.

    >>> HostCurve([{"rows": 32, "seconds": 0.002}, {"rows": 512, "seconds": 0.01}]).time(272)
    0.006
    """

    def __init__(self, points: list[dict], machine: str = "", source: str = "", taken: dict | None = None):
        self.machine, self.source, self.taken = machine, source or "the host step curve", dict(taken or {})
        try:
            table = {int(p["rows"]): float(p["seconds"]) for p in points}
        except (TypeError, KeyError, ValueError) as error:
            raise ValueError(f"{self.source}: each point needs rows and seconds ({error})") from None
        if len(table) < 2 or not all(r >= 1 and math.isfinite(s) and s > 0 for r, s in table.items()):
            raise ValueError(f"{self.source}: a host step curve needs at least 2 points of positive rows and seconds")
        self.rows = np.array(sorted(table), np.float64)  # [H]
        self.seconds = np.array([table[int(r)] for r in self.rows])  # [H]

    @classmethod
    def from_data(cls, data, source: str = "") -> HostCurve:
        if not isinstance(data, dict) or not isinstance(data.get("points"), list):
            raise ValueError(
                f"{source or 'the host step curve'}: not a host step curve (a JSON object with a 'points' list)"
            )
        taken = data.get("taken")
        return cls(data["points"], str(data.get("machine", "")), source, taken if isinstance(taken, dict) else None)

    @classmethod
    def load(cls, path: str | Path) -> HostCurve:
        data = read_json(path, "host step curve", "bench_at_scale.py --host here measures one on this machine")
        return cls.from_data(data, str(path))

    def as_data(self) -> dict:
        data = {"machine": self.machine, "points": [{"rows": int(r), "seconds": float(s)} for r, s in self.points()]}
        return {**data, "taken": self.taken} if self.taken else data

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.rows.tolist(), self.seconds.tolist()))

    def time(self, rows):
        """Seconds of the host's part of steps of `rows` rows (scalars or arrays)."""
        out = line(self.rows, self.seconds, np.asarray(rows, np.float64))
        return float(out) if out.ndim == 0 else out

    def describe(self) -> str:
        """Which measurement this is: its file, when and where it was taken, and the machine's load during it."""
        taken = self.taken
        when = f", measured {taken['time']}" if taken.get("time") else ", when unknown"
        load = f" at load {taken['load']:.2f}" if isinstance(taken.get("load"), (int, float)) else ""
        return f"{self.source}{when} on {self.machine or 'an unnamed machine'}{load}"
