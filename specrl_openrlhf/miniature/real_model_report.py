"""What `bench_real_model.py` prints: a line per rule and visit as it runs, and the paper's Table 3 shape over seeds
(`summary`), each rule against its seed's `off`, with 95% t intervals over seeds."""

from __future__ import annotations

import math

from .real_model import Record, Settings

HEADER = (
    f"{'seed':>4} {'visit':>5} {'rule':<26} {'seconds':>8} {'decoded':>8} {'reused':>7} {'kept':>6} {'reentry':>8} "
    f"{'reward':>7} {'drafted':>8}"
)


def format_record(r: Record) -> str:
    return (
        f"{r.seed:>4} {r.visit:>5} {r.rule:<26} {r.seconds:>8.1f} {r.decoded:>8} {r.reused:>7} {r.kept:>6.1%} "
        f"{r.reentries / max(r.samples, 1):>8.1f} {r.reward:>7.3f} {r.drafted:>8}"
    )


def summary(result: dict, settings: Settings) -> tuple[str, dict]:
    """The paper's Table 3 shape, per rule against each seed's `off`, over seeds (95% t intervals)."""
    from ..analysis.report import mean_interval

    records, accuracy = result["records"], result["accuracy"]
    by = {(r.seed, r.rule, r.visit): r for r in records}
    lines = [
        "| rule | decoded tokens | tokens vs off (visits 2+) | speedup (all) | speedup (visits 2+) "
        "| projected GPU speedup, rows x1 / x8 | kept share (visits 2+) | re-entries / sample | reward "
        "| held-out acc. diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def gpu(records, key):
        return sum(r.engine.get(key, math.nan) for r in records)

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
                    "projected": gpu(off, "gpu_s") / gpu(mine, "gpu_s"),
                    "projected8": gpu(off, "gpu8_s") / gpu(mine, "gpu8_s"),
                    "kept": sum(r.reused for r in later) / max(sum(r.reused + r.decoded for r in later), 1),
                    "reentries": sum(r.reentries for r in mine) / max(sum(r.samples for r in mine), 1),
                    "reward": sum(r.reward for r in mine) / len(mine),
                    "acc_diff": accuracy.get((seed, rule), math.nan) - accuracy.get((seed, "off"), math.nan),
                }
            )
        cells = {key: mean_interval([s[key] for s in per_seed]) for key in per_seed[0]}
        figures[rule] = {key: value[0] for key, value in cells.items()} | {"acc_diff_ci": cells["acc_diff"][1:]}

        def show(key, fmt, cells=cells):
            mean, lo, hi = cells[key]
            return fmt.format(mean) + ("" if math.isnan(lo) else f" [{fmt.format(lo)}, {fmt.format(hi)}]")

        lines.append(
            f"| {rule} | {cells['decoded'][0]:,.0f} | {show('token_ratio', '{:.2f}x')} | {show('speedup', '{:.2f}')} "
            f"| {show('later_speedup', '{:.2f}')} | {show('projected', '{:.2f}')} / {show('projected8', '{:.2f}')} "
            f"| {show('kept', '{:.1%}')} | {cells['reentries'][0]:.1f} "
            f"| {cells['reward'][0]:.3f} | {show('acc_diff', '{:+.3f}')} |"
        )
    return "\n".join(lines), figures
