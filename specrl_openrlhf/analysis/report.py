"""`python -m specrl_openrlhf.report RUNS_DIR`: the paper's tables from the metrics of every run under a folder.

It reads our CPU runs' `metrics.json`, OpenRLHF's TensorBoard logs and wandb runs (`run_readers`), makes their rows
(`report_rows`) and prints them: the Table-3 shape (decoded tokens, rollout speed-up over the matching baseline,
accuracy, the staleness meter), what the engine verified, the engine's steps, the time breakdown by stage, and, where
a rule ran over several seeds, its paired difference against the baseline with a 95% interval. It draws the per-step
curves per run and per folder, tokens and accuracy against lenience, and the accuracy gap against the measured
staleness.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from pathlib import Path

from ..markdown import numbers, table
from ..metrics import STALENESS_METRICS
from .plots import plot, plot_frontier, plot_lenience, plot_staleness_gap
from .report_rows import ENGINE_COLUMNS, paired_rows, table_rows
from .run_readers import discover
from .run_series import RunSeries

STEP_COLUMNS = (
    ("rows_per_step", "rows/step"),
    ("tail_share", "tail share"),
    ("gpu_s", "GPU s, rows x1"),
    ("projected", "projected speedup x1"),
    ("gpu8_s", "GPU s, rows x8"),
    ("projected8", "projected speedup x8"),
)
PAIRED_HEAD = (
    ("regime", "left"),
    ("rule", "left"),
    ("seeds", "right"),
    ("token ratio", "right"),
    ("rollout-time ratio", "right"),
    ("acc.", "right"),
    ("acc. off", "right"),
    ("Δ acc. (95% CI)", "left"),
    ("KL", "right"),
    ("excess", "right"),
)


def markdown(rows: list[dict]) -> str:
    """The Table-3 shape with the staleness meter, what the engine verified, then the time breakdown by stage."""
    accuracy_keys = sorted({k for r in rows for k in r if k.startswith("acc_")})
    meter = [k for k in STALENESS_METRICS if any(k in r for r in rows)]
    head = ["run", "policy", "ℓ", "Tokens (M)", "Speedup", *[k.removeprefix("acc_") for k in accuracy_keys], *meter]
    cells = [
        [r["run"], r["policy"], r["lenience"], f"{r['tokens_decoded_M']:.3f}", _times(r["speedup"])]
        + [_percent(r.get(k)) for k in accuracy_keys]
        + [_number(r.get(k)) for k in meter]
        for r in rows
    ]
    tables = [table(head, cells, numbers(2, len(head)))]
    engine = [r for r in rows if ENGINE_COLUMNS[0][0] in r]
    if engine:
        keys = [(k, h) for k, h, _ in ENGINE_COLUMNS]
        tables.append(_figures_by_run("run (verified in the engine)", keys, engine))
    stepped = [r for r in rows if "rows_per_step" in r]
    if stepped:
        tables.append(_figures_by_run("run (engine steps; GPU time projected on a step curve)", STEP_COLUMNS, stepped))
    stages = sorted({k for r in rows for k in r if k.startswith("time_")})
    if stages:
        head = ["run", *(s.removeprefix("time_") for s in stages)]
        cells = [[r["run"], *(f"{r.get(s, 0.0):.1f}" for s in stages)] for r in rows]
        tables.append(table(head, cells, numbers(1, len(head))))
    return "\n\n".join(tables)


def _figures_by_run(first: str, columns, rows: list[dict]) -> str:
    """A table of a run a row: `first` heads the run's name, then one figure a (key, header) of `columns`."""
    head = [first, *(h for _, h in columns)]
    return table(head, [[r["run"], *(_number(r.get(k)) for k, _ in columns)] for r in rows], numbers(1, len(head)))


def paired_markdown(rows: list[dict]) -> str:
    """Per rule and regime, over seeds: the ratios and the paired accuracy difference (points) with its interval."""
    cells = []
    for r in rows:
        interval = (
            "" if math.isnan(r["acc_diff_lo"]) else f" [{100 * r['acc_diff_lo']:+.1f}, {100 * r['acc_diff_hi']:+.1f}]"
        )
        cells.append(
            [r["regime"] or "-", r["method"], r["seeds"], f"{r['token_ratio']:.2f}×", f"{r['time_ratio']:.2f}×"]
            + [_percent(r["acc"]), _percent(r["acc_off"]), f"{100 * r['acc_diff']:+.1f}{interval}"]
            + [_number(r["kl_prev_curr"]), _number(r["excess_acceptance"])]
        )
    return table([h for h, _ in PAIRED_HEAD], cells, [a for _, a in PAIRED_HEAD])


def to_csv(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _times(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}×"


def _percent(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def _number(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def write_report(runs: list[RunSeries], out: Path) -> dict[str, Path]:
    """table.md, table.csv, one plot per run and one for all, and where they apply the lenience plot, the paired
    table over seeds (paired.md, paired.csv), the accuracy gap against staleness and the frontier."""
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(runs)
    files = {"markdown": out / "table.md", "csv": out / "table.csv"}
    files["markdown"].write_text(markdown(rows) + "\n")
    files["csv"].write_text(to_csv(rows))
    files["plot"] = plot(runs, out / "runs.png", "all runs")
    for run in runs:
        plot([run], out / "per_run" / f"{_safe(run.name)}.png", run.name)
    lenience = plot_lenience(runs, out / "lenience.png")
    if lenience is not None:
        files["lenience"] = lenience
    paired = paired_rows(runs)
    if paired:
        files["paired"] = out / "paired.md"
        files["paired"].write_text(paired_markdown(paired) + "\n")
        files["paired_csv"] = out / "paired.csv"
        files["paired_csv"].write_text(to_csv(paired))
        gap = plot_staleness_gap(paired, out / "staleness_gap.png")
        if gap is not None:
            files["staleness_gap"] = gap
        frontier = plot_frontier(paired, out / "frontier.png")
        if frontier is not None:
            files["frontier"] = frontier
    return files


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[-80:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrl_openrlhf.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir", help="folder holding runs (metrics.json files or TensorBoard logs)")
    parser.add_argument("--out", default=None, help="where to write table.md/csv and plots (default: RUNS_DIR/report)")
    args = parser.parse_args(argv)
    root = Path(args.runs_dir)
    if not root.is_dir():
        parser.error(f"RUNS_DIR {root}: no such folder")
    runs = discover(root)
    if not runs:
        parser.error(f"RUNS_DIR {root}: no metrics.json, TensorBoard event files or wandb runs under it")
    files = write_report(runs, Path(args.out) if args.out else root / "report")
    rows = table_rows(runs)
    print(markdown(rows))
    paired = paired_rows(runs)
    if paired:
        print("\npaired against each seed's baseline:\n" + paired_markdown(paired))
    print()
    print(to_csv(rows), end="")
    print(f"\nwritten: {', '.join(str(p) for p in files.values())}")
