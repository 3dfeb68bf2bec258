"""`python -m specrl_openrlhf.report RUNS_DIR`: the paper's tables from the metrics of every run under a folder.

It reads three kinds of runs:
- our CPU runs (`metrics.json`, written by the quickstart and by `python -m specrl_openrlhf.grid` cells);
- OpenRLHF runs' TensorBoard logs (`--logger.tensorboard_dir`), with TensorBoard's own event reader. Their cell
  (policy, lenience, seed, group) comes from the `cell.json` the grid runner writes beside the log, or from
  `args.json`;
- wandb run folders (`wandb/offline-run-*`, `wandb/run-*`), read from disk (`wandb_logs`): the run's name, group
  and config say its cell.
A run found twice (a quickstart's metrics.json and its own TensorBoard or wandb logs) is reported once, from
metrics.json.

Both become the same rows: `step_row` turns one step of OpenRLHF-shaped logs (means over samples, as OpenRLHF's
trainer logs them) into totals and per-draft means, for our runs and OpenRLHF's alike. The report prints the
Table-3 shape (decoded tokens, rollout speed-up over the matching baseline, accuracy, the staleness meter), the
time breakdown by stage, and, where a rule ran over several seeds, its paired difference against the baseline
with a 95% interval. It draws the per-step curves per run and per folder, tokens and accuracy against lenience,
and the accuracy gap against the measured staleness. A run's baseline is the `off` run of its group: the same
quickstart group, or the same grid, preset and seed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
from pathlib import Path

from ..metrics import STALENESS_METRICS
from ..references import short_name
from .plots import plot, plot_frontier, plot_lenience, plot_staleness_gap
from .run_series import RunSeries, baseline_of, step_row

logger = logging.getLogger(__name__)

# t quantiles for two-sided 95% intervals, by degrees of freedom (1-30); beyond, the normal's
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T_975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# ---- readers ---------------------------------------------------------------------------------------------------


def load_cpu_metrics(path: Path) -> list[RunSeries]:
    """The runs of one `metrics.json` (quickstart or grid cell). A grid cell's `cell.json` beside it names the cell
    and its group: how the grid runner tells the report which cells share a baseline."""
    data = json.loads(Path(path).read_text())
    cell_file = path.parent / "cell.json"  # a grid cell: one run, named by its cell
    cell = json.loads(cell_file.read_text()) if cell_file.is_file() and len(data.get("runs", [])) == 1 else {}
    runs = []
    for info in data.get("runs", []):
        rows = [r for r in data["rows"] if r.get("run") == info["name"]]
        if not rows:  # planned but not trained yet: a grid still running, or stopped
            continue
        group = info.get("group", 0)
        runs.append(
            RunSeries(
                name=cell.get("name") or info["name"],
                policy=info["policy"],
                lenience=info.get("lenience"),
                group=cell.get("group") or (group if isinstance(group, str) else f"{path.parent}#{group}"),
                source=str(path),
                method=cell.get("method") or info.get("method", ""),
                regime=cell.get("regime") or info.get("regime", ""),
                seed=cell.get("seed", info.get("seed", data.get("settings", {}).get("seed"))),
                steps=[r for r in rows if r.get("kind") == "step"],
                evals=[
                    {"step": r["step"], "epoch": r["epoch"], "held_out": r["held_out_accuracy"]}
                    for r in rows
                    if r.get("kind") == "epoch" and r.get("held_out_accuracy") is not None
                ],
                accuracy_before=info.get("acc_before", data.get("summary", {}).get("acc_before")),
            )
        )
    return runs


def load_tensorboard_run(directory: Path) -> RunSeries | None:
    """An OpenRLHF run from its event files, with TensorBoard's reader. Resumed runs log some steps twice: the
    latest value of each step wins."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as error:
        raise SystemExit("reading TensorBoard logs needs the tensorboard package: pip install tensorboard") from error
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags().get("scalars", []))
    if not tags:
        return None
    scalars = {}
    for tag in tags:
        latest: dict[int, tuple[float, float]] = {}
        for event in accumulator.Scalars(tag):
            if event.step not in latest or event.wall_time >= latest[event.step][0]:
                latest[event.step] = (event.wall_time, event.value)
        scalars[tag] = {step: value for step, (_, value) in latest.items()}
    return series_from_scalars(scalars, directory)


def series_from_scalars(scalars: dict[str, dict[int, float]], directory: Path, cell: dict | None = None) -> RunSeries:
    """A run from OpenRLHF's logged scalars ({'train/...' or 'eval/...': {step: value}}), whatever stored them;
    `cell` says which run it is (default: the `cell.json` or `args.json` near `directory`)."""
    train = {tag.removeprefix("train/"): values for tag, values in scalars.items() if tag.startswith("train/")}
    steps = sorted({s for key in ("rollout/num_samples", "timing/generation") for s in train.get(key, {})})
    rows = [step_row(step, {k: v[step] for k, v in train.items() if step in v}) for step in steps]
    evals: dict[int, dict] = {}
    for tag in sorted(t for t in scalars if t.startswith("eval/") and t.endswith("_pass1")):
        dataset = tag.removeprefix("eval/").removeprefix("eval_").removesuffix("_pass1")
        for step, value in scalars[tag].items():
            evals.setdefault(step, {"step": step})[dataset] = value
    cell = read_cell(directory) if cell is None else cell
    lenience = cell.get("lenience")
    applied = [row["lenience"] for row in rows if row.get("lenience")]
    if lenience is None and applied:  # the preset's lenience: the run logged what it applied
        lenience = sum(applied) / len(applied)
    policy = cell.get("policy", "off")
    return RunSeries(
        name=cell.get("name") or directory.name,
        policy=policy,
        lenience=lenience,
        group=cell.get("group") or str(directory.parent),
        source=str(directory),
        method=cell.get("method") or short_name(policy) + ("" if cell.get("lenience") is None else f"@{lenience:.3g}"),
        regime=cell.get("regime", ""),
        seed=cell.get("seed"),
        steps=rows,
        evals=[evals[s] for s in sorted(evals)],
    )


def read_cell(directory: Path) -> dict:
    """The grid cell a run belongs to: `cell.json` in its folder or a parent (written by the grid runner), else the
    reuse flags of an `args.json` there."""
    for folder in [directory, *directory.parents][:4]:
        if (folder / "cell.json").is_file():
            return json.loads((folder / "cell.json").read_text())
        if (folder / "args.json").is_file():
            args = json.loads((folder / "args.json").read_text())
            return {"policy": args.get("rollout_reuse", "off"), "lenience": args.get("lenience")}
    return {}


def load_wandb_run(folder: Path) -> RunSeries | None:
    """A run from a wandb run folder: OpenRLHF's WandbLogger logs what its TensorboardLogger does."""
    from . import wandb_logs

    scalars = wandb_logs.scalars(folder)
    if not scalars:
        return None
    info = wandb_logs.run_info(folder)
    config = info["config"]
    cell = read_cell(folder) or {
        "name": info.get("name") or config.get("name"),
        "group": info.get("group") or config.get("group"),
        **{k: config[k] for k in ("policy", "lenience", "method", "regime", "seed") if k in config},
    }
    if "policy" not in cell and "rollout_reuse" in config:  # an OpenRLHF run: its own arguments
        cell.update(policy=config["rollout_reuse"], lenience=config.get("lenience"))
    return series_from_scalars(scalars, folder, {k: v for k, v in cell.items() if v is not None})


def discover(root: Path) -> list[RunSeries]:
    """Every run under `root`: metrics.json files, folders holding TensorBoard event files, wandb run folders."""
    from . import wandb_logs

    runs: list[RunSeries] = []
    for path in sorted(root.rglob("metrics.json")):
        try:
            runs.extend(load_cpu_metrics(path))
        except (OSError, ValueError, KeyError) as error:
            logger.warning("skipping %s: %s", path, error)
    seen = {(run.name, run.group) for run in runs}
    logged = [
        (folder, load_tensorboard_run) for folder in sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    ]
    logged += [(folder, load_wandb_run) for folder in wandb_logs.run_folders(root)]
    for folder, load in logged:
        try:
            run = load(folder)
        except (OSError, ValueError) as error:
            logger.warning("skipping %s: %s", folder, error)
            continue
        if run is not None and (run.name, run.group) not in seen:
            runs.append(run)
    return runs


# ---- tables ----------------------------------------------------------------------------------------------------


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


STEP_TIMES = ("full_s", "tail_s", "gpu_s", "gpu8_s")  # from the engine's steps: not stages of a training step
STEP_COLUMNS = (
    ("rows_per_step", "rows/step"),
    ("tail_share", "tail share"),
    ("gpu_s", "GPU s, rows x1"),
    ("projected", "projected speedup x1"),
    ("gpu8_s", "GPU s, rows x8"),
    ("projected8", "projected speedup x8"),
)


def markdown(rows: list[dict]) -> str:
    """The Table-3 shape with the staleness meter, what the engine verified, then the time breakdown by stage."""
    accuracy_keys = sorted({k for r in rows for k in r if k.startswith("acc_")})
    meter = [k for k in STALENESS_METRICS if any(k in r for r in rows)]
    head = ["run", "policy", "ℓ", "Tokens (M)", "Speedup", *[k.removeprefix("acc_") for k in accuracy_keys], *meter]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for r in rows:
        cells = [r["run"], r["policy"], r["lenience"], f"{r['tokens_decoded_M']:.3f}", _times(r["speedup"])]
        cells += [_percent(r.get(k)) for k in accuracy_keys]
        cells += [_number(r.get(k)) for k in meter]
        lines.append("| " + " | ".join(cells) + " |")
    engine = [r for r in rows if ENGINE_COLUMNS[0][0] in r]
    if engine:
        lines += ["", "| run (verified in the engine) | " + " | ".join(h for _, h, _ in ENGINE_COLUMNS) + " |"]
        lines.append("| --- |" + " ---: |" * len(ENGINE_COLUMNS))
        lines += [
            f"| {r['run']} | " + " | ".join(_number(r.get(k)) for k, _, _ in ENGINE_COLUMNS) + " |" for r in engine
        ]
    stepped = [r for r in rows if "rows_per_step" in r]
    if stepped:
        head = [h for _, h in STEP_COLUMNS]
        lines += ["", "| run (engine steps; GPU time projected on a step curve) | " + " | ".join(head) + " |"]
        lines.append("| --- |" + " ---: |" * len(STEP_COLUMNS))
        lines += [f"| {r['run']} | " + " | ".join(_number(r.get(k)) for k, _ in STEP_COLUMNS) + " |" for r in stepped]
    stages = sorted({k for r in rows for k in r if k.startswith("time_")})
    if stages:
        lines += ["", "| run | " + " | ".join(s.removeprefix("time_") for s in stages) + " |"]
        lines.append("| --- |" + " ---: |" * len(stages))
        lines += [f"| {r['run']} | " + " | ".join(f"{r.get(s, 0.0):.1f}" for s in stages) + " |" for r in rows]
    return "\n".join(lines)


def paired_markdown(rows: list[dict]) -> str:
    """Per rule and regime, over seeds: the ratios and the paired accuracy difference (points) with its interval."""
    lines = [
        "| regime | rule | seeds | token ratio | rollout-time ratio | acc. | acc. off | Δ acc. (95% CI) | KL | "
        "excess |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        interval = (
            "" if math.isnan(r["acc_diff_lo"]) else f" [{100 * r['acc_diff_lo']:+.1f}, {100 * r['acc_diff_hi']:+.1f}]"
        )
        lines.append(
            f"| {r['regime'] or '-'} | {r['method']} | {r['seeds']} | {r['token_ratio']:.2f}× | "
            f"{r['time_ratio']:.2f}× | "
            f"{_percent(r['acc'])} | {_percent(r['acc_off'])} | {100 * r['acc_diff']:+.1f}{interval} | "
            f"{_number(r['kl_prev_curr'])} | {_number(r['excess_acceptance'])} |"
        )
    return "\n".join(lines)


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
    return 0
