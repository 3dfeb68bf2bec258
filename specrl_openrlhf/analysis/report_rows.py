"""The report's rows as data (`analysis.report` prints them): one row a run, the paper's Table-3 columns against
its baseline, and one row a rule and regime, paired against each seed's baseline with a 95% interval over seeds.
A run's baseline is the `off` run of its group: the same quickstart group, or the same grid, preset and seed.
"""

from __future__ import annotations

import math

from ..metrics import STALENESS_METRICS
from ..references import short_name
from .run_series import RunSeries, baseline_of

# t quantiles for two-sided 95% intervals, by degrees of freedom (1-30); beyond, the normal's
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T_975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
STEP_TIMES = ("full_s", "tail_s", "gpu_s", "gpu8_s")  # from the engine's steps: not stages of a training step


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


# Verified in the engine: (row key, header, the run's value), shown for runs that report them
ENGINE_COLUMNS = (
    ("accepted_per_step", "accepted/step", lambda run: run.step_mean("accepted_per_step")),
    ("reentries_per_sample", "re-entries/sample", lambda run: ratio(run.total("reentries"), run.total("samples"))),
    ("drafted_slots", "drafted/step", lambda run: run.step_mean("drafted_slots")),
    ("predicted_acceptance", "predicted acc.", lambda run: run.step_mean("predicted_acceptance")),
    ("observed_acceptance", "observed acc.", lambda run: run.step_mean("observed_acceptance")),
    ("step_base_ms", "step ms", lambda run: run.step_mean("step_base_ms")),
    ("step_row_ms", "+ms/row", lambda run: run.step_mean("step_row_ms")),
    ("step_token_ms", "+ms/token", lambda run: run.step_mean("step_token_ms")),
)


def table_rows(runs: list[RunSeries]) -> list[dict]:
    """One row per run: the paper's Table 3 columns, the staleness meter over the run, what the engine verified (for
    `lossless` in the engine), and the time breakdown."""
    rows = []
    for run in runs:
        base = baseline_of(run, runs)
        accuracy = run.final_accuracy()
        row = {
            "run": run.name,
            "policy": short_name(run.policy),
            "lenience": lenience_label(run),
            "tokens_decoded_M": run.total("decoded_tokens") / 1e6,
            "speedup": ratio(base.total("rollout_s"), run.total("rollout_s")) if base is not None else math.nan,
            "token_ratio": ratio(base.total("decoded_tokens"), run.total("decoded_tokens")) if base else math.nan,
            **{f"acc_{k}": v for k, v in accuracy.items()},
        }
        if base is not None and accuracy:
            base_accuracy = base.final_accuracy()
            row.update({f"dacc_{k}": v - base_accuracy[k] for k, v in accuracy.items() if k in base_accuracy})
        for key in STALENESS_METRICS:
            value = run.per_draft_mean(key)
            if value is not None:
                row[key] = value
        if run.step_mean("accepted_per_step") is not None:
            row.update({key: value(run) for key, _, value in ENGINE_COLUMNS})
        for stage in sorted({k for r in run.steps for k in r if k.endswith("_s")} - set(STEP_TIMES)):
            row[f"time_{stage}"] = run.total(stage)
        if run.total("engine_steps"):  # the engine's steps: rows per step, the tail, GPU time projected
            steps = run.total("engine_steps")
            row["rows_per_step"] = sum(s.get("mean_rows", 0.0) * s.get("engine_steps", 0) for s in run.steps) / steps
            full, tail = run.total("full_s"), run.total("tail_s")
            row["tail_share"] = tail / (full + tail) if full + tail else math.nan
            for key in ("gpu_s", "gpu8_s"):
                if run.total(key):
                    row[key] = run.total(key)
                    row[key.replace("gpu", "projected").removesuffix("_s")] = (
                        ratio(base.total(key), run.total(key)) if base is not None and base.total(key) else math.nan
                    )
        rows.append(row)
    return rows


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95% t interval; the interval is NaN for fewer than two values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = (T_975[n - 2] if n - 1 <= len(T_975) else 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_rows(runs: list[RunSeries]) -> list[dict]:
    """One row per rule and regime: ratios against the baseline of each seed's group, averaged over seeds, and the
    paired difference in final accuracy (first dataset) with a 95% interval over seeds."""
    keyed: dict[tuple[str, str], list[RunSeries]] = {}
    for run in runs:
        if not run.is_baseline and baseline_of(run, runs) is not None:
            keyed.setdefault((run.regime, run.method), []).append(run)
    rows = []
    for (regime, method), members in keyed.items():
        pairs = [(run, baseline_of(run, runs)) for run in members]
        dataset = next(iter(pairs[0][0].final_accuracy()), None)
        diffs = [
            run.final_accuracy()[dataset] - base.final_accuracy()[dataset]
            for run, base in pairs
            if dataset in run.final_accuracy() and dataset in base.final_accuracy()
        ]
        mean, lo, hi = mean_interval(diffs)
        row = {
            "regime": regime,
            "method": method,
            "policy": members[0].policy,
            "seeds": len(pairs),
            "token_ratio": _mean([ratio(b.total("decoded_tokens"), r.total("decoded_tokens")) for r, b in pairs]),
            "time_ratio": _mean([ratio(b.total("rollout_s"), r.total("rollout_s")) for r, b in pairs]),
            "acc": _mean([r.final_accuracy().get(dataset, math.nan) for r, _ in pairs]),
            "acc_off": _mean([b.final_accuracy().get(dataset, math.nan) for _, b in pairs]),
            "acc_diff": mean,
            "acc_diff_lo": lo,
            "acc_diff_hi": hi,
        }
        for key in STALENESS_METRICS:
            values = [v for r, _ in pairs if (v := r.per_draft_mean(key)) is not None]
            row[key] = _mean(values) if values else math.nan
        row.update(engine_step_columns(pairs))
        rows.append(row)
    return rows


def engine_step_columns(pairs: list[tuple[RunSeries, RunSeries]]) -> dict[str, float]:
    """Where the runs recorded their engine steps (our CPU runs): the time projected on a GPU's step curve, stock's
    over the rule's at scale 1 (`projected`) and at the RL scale (`projected8`); rows per engine step in the later
    epochs (when drafts exist), the rule's and stock's; and the share of rollout time spent in the tail."""
    if not all(run.total("engine_steps") and base.total("engine_steps") for run, base in pairs):
        return {}
    out = {}
    for key, name in (("gpu_s", "projected"), ("gpu8_s", "projected8")):
        if all(run.total(key) and base.total(key) for run, base in pairs):
            out[name] = _mean([ratio(base.total(key), run.total(key)) for run, base in pairs])

    def later_rows(run):  # mean rows per engine step, from the second epoch on
        later = [s for s in run.steps if s.get("epoch", 1) > 0 and s.get("engine_steps")]
        steps = sum(s["engine_steps"] for s in later)
        return sum(s["mean_rows"] * s["engine_steps"] for s in later) / steps if steps else math.nan

    def tail_share(run):
        tail, full = run.total("tail_s"), run.total("full_s")
        return tail / (tail + full) if tail + full else math.nan

    out["rows_per_step"] = _mean([later_rows(run) for run, _ in pairs])
    out["rows_per_step_off"] = _mean([later_rows(base) for _, base in pairs])
    out["tail_share"] = _mean([tail_share(run) for run, _ in pairs])
    out["tail_share_off"] = _mean([tail_share(base) for _, base in pairs])
    return out


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def lenience_label(run: RunSeries) -> str:
    """The lenience a run applied: its setting, or first→last for a rule that adapts it."""
    applied = [r["lenience"] for r in run.steps if r.get("lenience")]
    if applied and max(applied) - min(applied) > 1e-6:
        return f"{applied[0]:.3g}→{applied[-1]:.3g}"
    return "" if run.lenience is None else f"{run.lenience:.3g}"
