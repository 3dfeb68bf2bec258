"""A rule's figures from simulated engine steps (`simulator.engine`'s records, given here as columns): its steps'
costs, its proposer's time per row at a full batch and over every step, the tail's share, and the proposer's fitted
cost a step (what the engine benchmarks price it at, `measured.proposer_costs`).

Columns are [S] arrays by name, as `Simulation.column` gives them: `decode_rows`, `decode_tokens`, `prefill_rows`,
`prefill_tokens`, `drafted`, `accepted`, `proposer_s`, `register_s`, `rl_step`, and `decode_context`,
`prefill_context` (the tokens a step's prefills had cached before it) and `logit_tokens` (prefill tokens whose prompt
log-probs a step computes) where the simulator recorded them.

Core module: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .projection import Pricing, StepCosts, step_costs
from .steps import FULL_SHARE

COLUMNS = (
    "decode_rows",
    "decode_tokens",
    "prefill_rows",
    "prefill_tokens",
    "drafted",
    "accepted",
    "proposer_s",
    "register_s",
    "rl_step",
)
OPTIONAL = ("decode_context", "logit_tokens", "prefill_context")


def simulated_costs(columns: Mapping[str, np.ndarray], pricing: Pricing) -> StepCosts:
    """The simulated steps' costs: the proposer's measured time with its history updates (`register_s`), the decode
    and prefill contexts where the simulator recorded them. At a scale above 1 each row stands for `scale` of the
    GPU's: the proposer's time a step grows with the rows it follows but not its fixed cost a call (the GPU's step is
    one call: `proposer_fit`'s base is paid once), and its history updates grow with the responses."""
    proposer_s = scaled_proposer(columns, pricing.scale)
    costs = step_costs(
        columns["decode_rows"],
        columns["decode_tokens"],
        columns["prefill_tokens"],
        pricing,
        proposer_s,
        columns.get("decode_context"),
        columns["prefill_rows"],
        columns.get("logit_tokens"),
        columns.get("prefill_context"),
    )
    return costs.with_proposer(np.asarray(columns["register_s"], np.float64) * pricing.scale)


def scaled_proposer(columns: Mapping[str, np.ndarray], scale: int) -> np.ndarray:
    """[S] the proposer's seconds a step at rows x `scale`: its measured time x `scale`, less the fixed cost a call
    (`proposer_fit`'s base) `scale` - 1 times over, where a step served rows.

    >>> columns = {"proposer_s": np.array([1.5e-4, 2.5e-4]), "decode_rows": np.array([10, 20]),
    ...            "prefill_rows": np.array([0, 0])}
    >>> scaled_proposer(columns, 4).round(6).tolist()  # 50 µs a call + 10 µs a row: 50 + 10 x 40 and 50 + 10 x 80
    [0.00045, 0.00085]
    """
    measured = np.asarray(columns["proposer_s"], np.float64)
    if scale == 1:
        return measured
    rows = np.asarray(columns["decode_rows"]) + np.asarray(columns["prefill_rows"])
    served = rows > 0
    base = proposer_fit(rows, measured)["base_us"] * 1e-6 if served.sum() >= 2 else 0.0
    return np.where(served, np.maximum(measured * scale - (scale - 1) * base, 0.0), measured * scale)


def prefill_seconds(columns: Mapping[str, np.ndarray], pricing: Pricing, costs: StepCosts) -> float:
    """The part of the steps' forward (`costs`, `simulated_costs`'s) that their prefills cost."""
    unprefilled = {**columns, "prefill_tokens": np.zeros_like(np.asarray(columns["prefill_tokens"]))}
    return float(costs.gpu.sum() - simulated_costs(unprefilled, pricing).gpu.sum())


def scoring_seconds(columns: Mapping[str, np.ndarray], pricing: Pricing, costs: StepCosts) -> np.ndarray:
    """[S] the part of each step's forward (`costs`, `simulated_costs`'s) that its scoring requests' prefills cost (the
    tokens whose prompt log-probs it computes, `logit_tokens`, and their logits): 0 where none ran."""
    logits = columns.get("logit_tokens")
    if logits is None:
        return np.zeros_like(costs.gpu)
    logits = np.asarray(logits)
    unscored = {
        **columns,
        "prefill_tokens": np.asarray(columns["prefill_tokens"]) - logits,
        "logit_tokens": 0 * logits,
    }
    return np.maximum(costs.gpu - simulated_costs(unscored, pricing).gpu, 0.0)


def batch_phases(rows: np.ndarray, rl_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([S] steps at a full batch, [S] steps in a tail), per RL step: at a full batch, at least `FULL_SHARE` of the
    RL step's most rows; its tail, the steps after its last full one.

    >>> full, tail = batch_phases(np.array([8, 8, 2, 4, 4, 1]), np.array([0, 0, 0, 1, 1, 1]))
    >>> full.astype(int).tolist(), tail.astype(int).tolist()
    ([1, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 1])
    """
    full, tail = np.zeros(len(rows), bool), np.zeros(len(rows), bool)
    for step in np.unique(rl_step):
        index = np.flatnonzero(rl_step == step)
        at_full = index[rows[index] >= FULL_SHARE * rows[index].max()]
        full[at_full] = True
        tail[index[index > at_full[-1]]] = True
    return full, tail


def figures(columns: Mapping[str, np.ndarray], costs: StepCosts, async_scheduling: bool) -> dict:
    """A rule's projected seconds (and their parts), its proposer's time per row and step at a full batch (every RL
    step's) and over every step, its fitted cost a step, steps, the tail's share of the projected time, and accepted
    tokens per drafted one."""
    rows = np.asarray(columns["decode_rows"]) + np.asarray(columns["prefill_rows"])
    proposer_s = np.asarray(columns["proposer_s"], np.float64)
    register_s = np.asarray(columns["register_s"], np.float64)
    serial = costs.gpu + costs.host + costs.proposer
    per_step = np.maximum(costs.gpu, costs.host) + costs.proposer if async_scheduling else serial  # [S]
    full, tail = batch_phases(rows, np.asarray(columns["rl_step"]))
    return {
        "projected_s": float(per_step.sum()),
        "gpu_s": float(costs.gpu.sum()),
        "host_s": float(costs.host.sum()),
        "proposer_s": float(costs.proposer.sum()),
        "proposer_us": float(proposer_s[full].sum() / max(rows[full].sum(), 1) * 1e6),
        "proposer_us_all": float(proposer_s.sum() / max(rows.sum(), 1) * 1e6),
        "proposer_fit": proposer_fit(rows, proposer_s + register_s),
        "register_ms_max": float(register_s.max() * 1e3) if len(rows) else 0.0,
        "steps": len(rows),
        "tail": float(per_step[tail].sum() / max(per_step.sum(), 1e-12)),
        "accepted_per_drafted": float(np.sum(columns["accepted"]) / max(np.sum(columns["drafted"]), 1)),
    }


def proposer_fit(rows: np.ndarray, seconds: np.ndarray) -> dict[str, float]:
    """A proposer's time a step as `base_us` + `row_us` x rows, least squares over the steps that served rows.

    >>> proposer_fit(np.array([0, 10, 20, 40]), np.array([0.0, 2e-4, 3e-4, 5e-4]))
    {'base_us': 100.0, 'row_us': 10.0}
    """
    served = rows > 0
    x = np.stack([np.ones(served.sum()), rows[served]], axis=1)
    (base, per_row), *_ = np.linalg.lstsq(x, seconds[served] * 1e6, rcond=None)
    return {"base_us": round(max(float(base), 0.0), 9), "row_us": round(max(float(per_row), 0.0), 9)}
