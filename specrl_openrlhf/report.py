"""`python -m specrl_openrlhf.report RUNS_DIR`: the paper's tables from the metrics of every run under a folder.

It reads two kinds of runs:
- our CPU runs (`metrics.json`, written by the quickstart and by `python -m specrl_openrlhf.grid` cells);
- OpenRLHF runs' TensorBoard logs (`--logger.tensorboard_dir`), with TensorBoard's own event reader. Their cell
  (policy, lenience, seed) comes from the `cell.json` the grid runner writes beside the log, or from `args.json`.

It prints the Table-3 shape (decoded tokens, rollout speed-up over the matching baseline, accuracy) and the time
breakdown by stage, in Markdown and CSV, and draws rollout time, full-reuse ratio, verified prefix length and
reward against step, per run and per grid. A method's baseline is the `off` run of the same group: the same
quickstart group, or the same grid, preset and seed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .policies import short_name

logger = logging.getLogger(__name__)

CURVES = (  # (key, title) of the per-step plots
    ("rollout_s", "rollout time per step (s)"),
    ("decoded_tokens", "decoded tokens per step"),
    ("full_reuse_ratio", "full-reuse ratio"),
    ("mean_verified_prefix_len", "mean verified prefix length"),
    ("kept_share", "share of draft tokens kept"),
    ("reward", "train reward"),
    ("lenience", "lenience applied"),
)
TB_STAGES = {  # OpenRLHF's timing tags -> our stage names
    "train/timing/generation": "rollout_s",
    "train/timing/make_experience": "make_experience_s",
    "train/timing/ppo_train": "train_s",
    "train/timing/broadcast": "sync_s",  # the weight sync, as CPU runs name it
}


@dataclass
class RunSeries:
    """One training run, normalised: per-step rows and evaluations, whatever wrote them."""

    name: str
    policy: str
    lenience: float | None
    group: str  # runs of one group share a baseline (the group's `off` run)
    source: str
    steps: list[dict] = field(default_factory=list)  # step, rollout_s, decoded_tokens, reward, ... (totals per step)
    evals: list[dict] = field(default_factory=list)  # step or epoch, and one accuracy per dataset
    accuracy_before: float | None = None

    @property
    def is_baseline(self) -> bool:
        return self.policy == "off"

    def total(self, key: str) -> float:
        return sum(float(row.get(key) or 0.0) for row in self.steps)

    def final_accuracy(self) -> dict[str, float]:
        return {k: v for k, v in self.evals[-1].items() if k not in ("step", "epoch")} if self.evals else {}


# ---- readers ---------------------------------------------------------------------------------------------------


def load_cpu_metrics(path: Path) -> list[RunSeries]:
    """The runs of one `metrics.json` (quickstart or grid cell)."""
    data = json.loads(path.read_text())
    cell_file = path.parent / "cell.json"  # a grid cell: one run, named by its cell
    cell = json.loads(cell_file.read_text()) if cell_file.is_file() and len(data.get("runs", [])) == 1 else {}
    runs = []
    for info in data.get("runs", []):
        rows = [r for r in data["rows"] if r.get("run") == info["name"]]
        runs.append(
            RunSeries(
                name=cell.get("name") or info["name"],
                policy=info["policy"],
                lenience=info.get("lenience"),
                group=f"{info.get('group_key') or path.parent}#{info.get('group', 0)}",
                source=str(path),
                steps=[r for r in rows if r.get("kind") == "step"],
                evals=[
                    {"step": r["step"], "epoch": r["epoch"], "held_out": r["held_out_accuracy"]}
                    for r in rows
                    if r.get("kind") == "epoch"
                ],
                accuracy_before=data.get("summary", {}).get("acc_before"),
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

    def series(tag) -> dict[int, float]:
        latest: dict[int, tuple[float, float]] = {}
        for event in accumulator.Scalars(tag) if tag in tags else []:
            if event.step not in latest or event.wall_time >= latest[event.step][0]:
                latest[event.step] = (event.wall_time, event.value)
        return {step: value for step, (_, value) in sorted(latest.items())}

    samples = series("train/rollout/num_samples")
    per_sample = {  # OpenRLHF logs sample-level info as means over samples: times num_samples gives the totals
        # a stock run decodes every response token (OpenRLHF's rollout stats, before any dynamic batching)
        "decoded_tokens": series("train/reuse/decoded_tokens")
        or series("train/rollout/response_length_mean")
        or series("train/response_length"),
        "reused_tokens": series("train/reuse/reused_tokens"),
        "draft_tokens": series("train/reuse/draft_tokens"),
    }
    plain = {
        "full_reuse_ratio": series("train/reuse/full_reuse_ratio"),
        "reward": series("train/rollout/reward_mean") or series("train/reward"),
    }
    # per-draft values (0 for a sample without a draft), so their mean over samples is divided by the hit rate
    hit_rate = series("train/reuse/drafts_found")
    per_draft = {
        "mean_verified_prefix_len": series("train/reuse/mean_verified_prefix_len"),
        "lenience": series("train/reuse/lenience"),
    }
    stages = {ours: series(tag) for tag, ours in TB_STAGES.items()}
    steps = []
    for step in sorted(set(samples) | set(stages["rollout_s"])):
        n = samples.get(step, 0.0)
        row = {"step": step, "samples": n}
        row.update({k: v[step] * n for k, v in per_sample.items() if step in v})
        row.update({k: v[step] for k, v in plain.items() if step in v})
        if hit_rate.get(step):
            row.update({k: v[step] / hit_rate[step] for k, v in per_draft.items() if step in v})
        row.update({k: v[step] for k, v in stages.items() if step in v})
        if row.get("draft_tokens"):
            row["kept_share"] = row.get("reused_tokens", 0.0) / row["draft_tokens"]
        steps.append(row)
    evals: dict[int, dict] = {}
    for tag in sorted(t for t in tags if t.startswith("eval/") and t.endswith("_pass1")):
        dataset = tag.removeprefix("eval/").removeprefix("eval_").removesuffix("_pass1")
        for step, value in series(tag).items():
            evals.setdefault(step, {"step": step})[dataset] = value
    cell = read_cell(directory)
    lenience = cell.get("lenience")
    applied = [row["lenience"] for row in steps if row.get("lenience")]
    if lenience is None and applied:  # the preset's lenience: the run logged what it applied
        lenience = sum(applied) / len(applied)
    return RunSeries(
        name=cell.get("name") or directory.name,
        policy=cell.get("policy", "off"),
        lenience=lenience,
        group=cell.get("group") or str(directory.parent),
        source=str(directory),
        steps=steps,
        evals=[evals[s] for s in sorted(evals)],
    )


def read_cell(directory: Path) -> dict:
    """The grid cell a TensorBoard run belongs to: `cell.json` in its folder or a parent (written by the grid
    runner), else the reuse flags of an `args.json` there."""
    for folder in [directory, *directory.parents][:4]:
        if (folder / "cell.json").is_file():
            return json.loads((folder / "cell.json").read_text())
        if (folder / "args.json").is_file():
            args = json.loads((folder / "args.json").read_text())
            return {"policy": args.get("rollout_reuse", "off"), "lenience": args.get("lenience")}
    return {}


def discover(root: Path) -> list[RunSeries]:
    """Every run under `root`: metrics.json files and folders holding TensorBoard event files."""
    runs: list[RunSeries] = []
    for path in sorted(root.rglob("metrics.json")):
        try:
            runs.extend(load_cpu_metrics(path))
        except (OSError, ValueError, KeyError) as error:
            logger.warning("skipping %s: %s", path, error)
    for folder in sorted({p.parent for p in root.rglob("events.out.tfevents.*")}):
        run = load_tensorboard_run(folder)
        if run is not None:
            runs.append(run)
    return runs


# ---- tables ----------------------------------------------------------------------------------------------------


def baseline_of(run: RunSeries, runs: list[RunSeries]) -> RunSeries | None:
    return next((r for r in runs if r.group == run.group and r.is_baseline), None)


def table_rows(runs: list[RunSeries]) -> list[dict]:
    """One row per run: the paper's Table 3 columns and the time breakdown."""
    rows = []
    for run in runs:
        base = baseline_of(run, runs)
        rollout = run.total("rollout_s")
        accuracy = run.final_accuracy()
        row = {
            "run": run.name,
            "policy": short_name(run.policy),
            "lenience": lenience_label(run),
            "tokens_decoded_M": run.total("decoded_tokens") / 1e6,
            "speedup": base.total("rollout_s") / rollout if base is not None and rollout else math.nan,
            "token_ratio": base.total("decoded_tokens") / run.total("decoded_tokens")
            if base is not None and run.total("decoded_tokens")
            else math.nan,
            **{f"acc_{k}": v for k, v in accuracy.items()},
        }
        if base is not None and accuracy:
            base_accuracy = base.final_accuracy()
            row.update({f"dacc_{k}": v - base_accuracy[k] for k, v in accuracy.items() if k in base_accuracy})
        for stage in sorted({k for r in run.steps for k in r if k.endswith("_s")}):
            row[f"time_{stage}"] = run.total(stage)
        rows.append(row)
    return rows


def lenience_label(run: RunSeries) -> str:
    """The lenience a run applied: its setting, or first→last for a rule that adapts it."""
    applied = [r["lenience"] for r in run.steps if r.get("lenience")]
    if applied and max(applied) - min(applied) > 1e-6:
        return f"{applied[0]:.3g}→{applied[-1]:.3g}"
    return "" if run.lenience is None else f"{run.lenience:.3g}"


def markdown(rows: list[dict]) -> str:
    """The Table-3 shape, then the time breakdown by stage."""
    accuracy_keys = sorted({k for r in rows for k in r if k.startswith("acc_")})
    head = ["run", "policy", "ℓ", "Tokens (M)", "Speedup", *[k.removeprefix("acc_") for k in accuracy_keys]]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- | ---: | ---: | ---: |" + " ---: |" * len(accuracy_keys)]
    for r in rows:
        cells = [r["run"], r["policy"], r["lenience"], f"{r['tokens_decoded_M']:.3f}", _times(r["speedup"])]
        cells += [_percent(r.get(k)) for k in accuracy_keys]
        lines.append("| " + " | ".join(cells) + " |")
    stages = sorted({k for r in rows for k in r if k.startswith("time_")})
    if stages:
        lines += ["", "| run | " + " | ".join(s.removeprefix("time_") for s in stages) + " |"]
        lines.append("| --- |" + " ---: |" * len(stages))
        lines += [f"| {r['run']} | " + " | ".join(f"{r.get(s, 0.0):.1f}" for s in stages) + " |" for r in rows]
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
    return "-" if value is None else f"{100 * value:.1f}"


# ---- plots -----------------------------------------------------------------------------------------------------


def plot(runs: list[RunSeries], path: Path, title: str = "") -> Path:
    """Every run on each panel: the per-step curves and held-out accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [(k, t) for k, t in CURVES if any(k in r for run in runs for r in run.steps)]
    colors = {run.name: f"C{i % 10}" for i, run in enumerate(runs)}  # one colour per run on every panel
    panels = len(curves) + 1
    columns = 3
    figure, axes = plt.subplots((panels + columns - 1) // columns, columns, figsize=(15, 4 * ((panels + 2) // 3)))
    axes = list(getattr(axes, "flat", [axes]))
    for axis, (key, name) in zip(axes, curves):
        for run in runs:
            points = [(r["step"], r[key]) for r in run.steps if key in r and r[key] is not None]
            if points:
                axis.plot(*zip(*points), label=run.name, color=colors[run.name])
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    accuracy_axis = axes[len(curves)]
    for run in runs:
        datasets = sorted({k for e in run.evals for k in e if k not in ("step", "epoch")})
        for dataset, style in zip(datasets, ("o-", "s--", "^:", "d-.")):
            points = [(e["step"], e[dataset]) for e in run.evals if dataset in e]
            if run.accuracy_before is not None and len(datasets) == 1:
                points.insert(0, (0, run.accuracy_before))  # the starting policy
            label = run.name if len(datasets) == 1 else f"{run.name} {dataset}"
            accuracy_axis.plot(*zip(*points), style, label=label, color=colors[run.name])
    accuracy_axis.set_xlabel("step")
    accuracy_axis.set_title("held-out accuracy")
    accuracy_axis.grid(alpha=0.3)
    for axis in axes[len(curves) + 1 :]:
        axis.axis("off")
    axes[0].legend(fontsize=7)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def plot_lenience(runs: list[RunSeries], path: Path) -> Path | None:
    """Decoded tokens and final accuracy against lenience over the spec runs, `full` at ℓ = ∞ on the right, and the
    baselines' values as flat lines (the lenience ablation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = sorted((r for r in runs if r.policy == "spec" and r.lenience), key=lambda r: r.lenience)
    if len(spec) < 2:
        return None
    points = [(r.lenience, r) for r in spec]
    infinity = spec[-1].lenience * 2.5  # where ℓ = ∞ (the policy `full`) is drawn
    points += [(infinity, r) for r in runs if r.policy == "full"]
    x = [p for p, _ in points]
    figure, left = plt.subplots(figsize=(7, 4))
    left.semilogx(x, [r.total("decoded_tokens") for _, r in points], "o-", color="tab:blue")
    left.set_xlabel("lenience ℓ")
    left.set_ylabel("decoded tokens", color="tab:blue")
    right = left.twinx()
    first = next(iter(spec[0].final_accuracy()), None)
    if first is not None:
        right.semilogx(x, [r.final_accuracy().get(first, math.nan) for _, r in points], "s--", color="tab:red")
        right.set_ylabel(f"{first} accuracy", color="tab:red")
    left.set_xticks(x, [f"{p:.3g}" if p != infinity else "∞" for p in x])
    left.minorticks_off()
    for base in {id(b): b for _, r in points if (b := baseline_of(r, runs))}.values():
        left.axhline(base.total("decoded_tokens"), color="tab:blue", alpha=0.3)
        if first is not None:
            right.axhline(base.final_accuracy().get(first, math.nan), color="tab:red", alpha=0.3)
    left.set_title("lenience ablation (flat lines: the baselines)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def write_report(runs: list[RunSeries], out: Path) -> dict[str, Path]:
    """table.md, table.csv, one plot per run and one per group (plus the lenience plot when it applies)."""
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
        parser.error(f"RUNS_DIR {root}: no metrics.json or TensorBoard event files under it")
    files = write_report(runs, Path(args.out) if args.out else root / "report")
    rows = table_rows(runs)
    print(markdown(rows))
    print()
    print(to_csv(rows), end="")
    print(f"\nwritten: {', '.join(str(p) for p in files.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
