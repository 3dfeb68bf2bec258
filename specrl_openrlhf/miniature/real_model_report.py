"""What `bench_real_model.py` prints: a line per rule and visit as it runs, and the paper's Table 3 shape over seeds
(`summary`), each rule against its seed's `off`, with 95% t intervals over seeds; each rule's engine steps projected
on the GPU's step curve against stock's, the host's part shown (`pricing.rl_scale.project_at_rl_scales`)."""

from __future__ import annotations

import math

from ..markdown import numbers, table
from ..pricing.curves import describe
from ..pricing.projection import RL_SCALE, STOCK, rl_pricing
from ..pricing.rl_scale import RL_SCALES, project_at_rl_scales, scale_fields, scaled_name
from ..pricing.steps import EngineSteps
from .real_model_settings import Record, Settings

HEADER = (
    f"{'seed':>4} {'visit':>5} {'rule':<26} {'seconds':>8} {'decoded':>8} {'reused':>7} {'kept':>6} {'reentry':>8} "
    f"{'reward':>7} {'drafted':>8}"
)
SUMMARY_HEAD = (
    "rule",
    "decoded tokens",
    "tokens vs off (visits 2+)",
    "speedup (all)",
    "speedup (visits 2+)",
    "projected GPU speedup, rows x1 / x8",
    "with the host hidden, x1 / x8",
    "breakeven host ms, x1 / x8",
    "kept share (visits 2+)",
    "re-entries / sample",
    "reward",
    "held-out acc. diff",
)


def format_record(r: Record) -> str:
    return (
        f"{r.seed:>4} {r.visit:>5} {r.rule:<26} {r.seconds:>8.1f} {r.decoded:>8} {r.reused:>7} {r.kept:>6.1%} "
        f"{r.reentries / max(r.samples, 1):>8.1f} {r.reward:>7.3f} {r.drafted:>8}"
    )


def summary(result: dict, settings: Settings) -> tuple[str, dict]:
    """The paper's Table 3 shape, per rule against each seed's `off`, over seeds (95% t intervals)."""
    from ..analysis.report_rows import mean_interval

    records, accuracy = result["records"], result["accuracy"]
    by = {(r.seed, r.rule, r.visit): r for r in records}
    cells_of_rows = []
    figures = {}
    for rule in settings.rules:
        per_seed = []
        for seed in settings.seeds:
            mine = [by[(seed, rule, v)] for v in range(settings.visits)]
            off = [by[(seed, "off", v)] for v in range(settings.visits)]
            later, later_off = mine[1:] or mine, off[1:] or off
            per_seed.append(
                {
                    "decoded": sum(r.decoded for r in mine),
                    "token_ratio": sum(r.decoded for r in later_off) / max(sum(r.decoded for r in later), 1),
                    "speedup": sum(r.seconds for r in off) / sum(r.seconds for r in mine),
                    "later_speedup": sum(r.seconds for r in later_off) / sum(r.seconds for r in later),
                    **projected(result, rule, mine, off),
                    "kept": sum(r.reused for r in later) / max(sum(r.reused + r.decoded for r in later), 1),
                    "reentries": sum(r.reentries for r in mine) / max(sum(r.samples for r in mine), 1),
                    "reward": sum(r.reward for r in mine) / len(mine),
                    "acc_diff": accuracy.get((seed, rule), math.nan) - accuracy.get((seed, "off"), math.nan),
                }
            )
        cells = {key: mean_interval([s[key] for s in per_seed]) for key in per_seed[0] if key != "missing"}
        figures[rule] = {key: value[0] for key, value in cells.items()} | {"acc_diff_ci": cells["acc_diff"][1:]}
        figures[rule]["missing"] = per_seed[0]["missing"]

        def show(key, fmt, cells=cells):
            mean, lo, hi = cells[key]
            return fmt.format(mean) + ("" if math.isnan(lo) else f" [{fmt.format(lo)}, {fmt.format(hi)}]")

        cells_of_rows.append(
            [
                rule,
                f"{cells['decoded'][0]:,.0f}",
                show("token_ratio", "{:.2f}x"),
                show("speedup", "{:.2f}"),
                show("later_speedup", "{:.2f}"),
                f"{show('projected', '{:.2f}')} / {show('projected8', '{:.2f}')}",
                f"{show('projected_async', '{:.2f}')} / {show('projected_async8', '{:.2f}')}",
                f"{cells['breakeven_host_ms'][0]:.2f} / {cells['breakeven_host_ms8'][0]:.2f}",
                show("kept", "{:.1%}"),
                f"{cells['reentries'][0]:.1f}",
                f"{cells['reward'][0]:.3f}",
                show("acc_diff", "{:+.3f}"),
            ]
        )
    lines = [table(SUMMARY_HEAD, cells_of_rows, numbers(1, len(SUMMARY_HEAD)))]
    host = result.get("host")
    if host is not None:
        lines.append(
            f"\nhost: {host.describe()}; breakeven: the host time of a full-batch step at which the rule would tie "
            "stock (inf: wins at any; nan: loses at any)"
        )
    return "\n".join(lines), figures


def projected(result: dict, rule: str, mine: list[Record], off: list[Record]) -> dict:
    """A seed's rule against its `off` on the GPU's curve, every visit's steps together, at rows x 1 and x 8: the
    projection (`project_at_rl_scales`), with the host hidden, the breakeven host time, and what is missing."""
    curve = result.get("curve")
    names = ("projected", "projected_async", "breakeven_host_ms")
    if curve is None:
        return {scaled_name(name, scale): math.nan for scale in RL_SCALES for name in names} | {"missing": ("curve",)}
    stock = sum((EngineSteps.from_dict(r.steps) for r in off if r.steps), EngineSteps.of([]))
    steps = sum((EngineSteps.from_dict(r.steps) for r in mine if r.steps), EngineSteps.of([]))
    cost = result.get("costs", {}).get(rule, STOCK)
    projections = project_at_rl_scales(stock, steps, curve, result.get("host"), cost)
    return scale_fields(projections, names) | {"missing": projections[RL_SCALE].missing}


def projection_fields(rule: str, f: dict) -> str:
    """The RESULT line's projection of a rule: at rows x 1 and x 8, with the host hidden, and its breakeven."""
    return (
        f"projected[{rule}]={f['projected']:.2f} projected8[{rule}]={f['projected8']:.2f} "
        f"projected_async[{rule}]={f['projected_async']:.2f} projected_async8[{rule}]={f['projected_async8']:.2f} "
        f"breakeven_host_ms[{rule}]={f['breakeven_host_ms']:.2f} "
        f"breakeven_host_ms8[{rule}]={f['breakeven_host_ms8']:.2f}"
    )


def prefill_note(result: dict) -> str:
    curve = result.get("curve")
    return "none" if curve is None else rl_pricing(curve).prefill


def curve_line(settings: Settings) -> str:
    """Which step curve the projection uses, named where it is the default."""
    if settings.curve_file is None:
        return "[real-model] no step curve: no GPU projection"
    from ..pricing.curves import StepCurve

    curve = StepCurve.load(settings.curve_file)
    named = "" if settings.cost_curve else ", the default: no --cost-curve named"
    return f"[real-model] projected on {describe(curve)} (curve={settings.curve_label}{named})"
