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
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .metrics import PER_DRAFT_METRICS, STALENESS_METRICS
from .references import short_name

logger = logging.getLogger(__name__)

CURVES = (  # (key, title) of the per-step plots
    ("rollout_s", "rollout time per step (s)"),
    ("decoded_tokens", "decoded tokens per step"),
    ("full_reuse_ratio", "full-reuse ratio"),
    ("mean_verified_prefix_len", "mean verified prefix length"),
    ("kept_share", "share of draft tokens kept"),
    ("reward", "train reward"),
    ("lenience", "lenience applied"),
    ("kl_prev_curr", "staleness: KL(p_prev || p_curr) per token"),
    ("excess_acceptance", "staleness: excess acceptance"),
    ("drift_since_decode", "staleness: log p_curr / p_gen"),
    ("reused_token_age", "staleness: age of reused tokens (visits)"),
)
STAGES = {  # OpenRLHF's timing keys -> our stage names
    "timing/generation": "rollout_s",
    "timing/make_experience": "make_experience_s",
    "timing/ppo_train": "train_s",
    "timing/broadcast": "sync_s",  # the weight sync
}
SUMMED = (
    "decoded_tokens",
    "reused_tokens",
    "draft_tokens",
    "scored_tokens",
    "drafts_found",
    "fallbacks",
    "resampled_tokens",
    "scoring_requests",
    "resample_requests",
    "branch_switches",
    "reentries",
)
# t quantiles for two-sided 95% intervals, by degrees of freedom (1-30); beyond, the normal's
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T_975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def step_row(step: int, logs: dict[str, float]) -> dict:
    """One step's row from OpenRLHF-shaped logs (`rollout/num_samples`, `rollout/reward_mean`, `timing/*`, and the
    per-sample `reuse/*` metrics averaged over samples): totals per step, and per-draft values as means over the
    samples that had a draft."""
    n = float(logs.get("rollout/num_samples", 0.0))
    row: dict = {"step": step, "samples": n}
    decoded = logs.get("reuse/decoded_tokens")
    if decoded is None:  # a stock run decodes every response token
        decoded = logs.get("rollout/response_length_mean", logs.get("response_length"))
    if decoded is not None:
        row["decoded_tokens"] = decoded * n
    row.update({k: logs[f"reuse/{k}"] * n for k in SUMMED if k != "decoded_tokens" and f"reuse/{k}" in logs})
    for mean in ("full_reuse_ratio", "accepted_per_step"):  # means over the step's samples
        if f"reuse/{mean}" in logs:
            row[mean] = logs[f"reuse/{mean}"]
    reward = logs.get("rollout/reward_mean", logs.get("reward"))
    if reward is not None:
        row["reward"] = reward
    hit_rate = logs.get("reuse/drafts_found", 0.0)
    if hit_rate:
        row.update({k: logs[f"reuse/{k}"] / hit_rate for k in PER_DRAFT_METRICS if f"reuse/{k}" in logs})
    row.update({ours: logs[tag] for tag, ours in STAGES.items() if tag in logs})
    phases = [logs.get(f"reuse/time_{p}_s", 0.0) for p in ("scoring", "generation", "assembly")]
    if sum(phases) and "rollout_s" in row:  # the rollout's share spent scoring, from the samples' latency
        row["scoring_s"] = row["rollout_s"] * phases[0] / sum(phases)
    if row.get("draft_tokens"):
        row["kept_share"] = row.get("reused_tokens", 0.0) / row["draft_tokens"]
    if row.get("reused_tokens"):  # the price of what was kept: draft tokens scored per token kept
        row["scored_per_kept"] = row.get("scored_tokens", 0.0) / row["reused_tokens"]
    return row


@dataclass
class RunSeries:
    """One training run, normalised: per-step rows and evaluations, whatever wrote them."""

    name: str
    policy: str
    lenience: float | None
    group: str  # runs of one group share a baseline (the group's `off` run)
    source: str
    method: str = ""  # the rule as compared across seeds (name and lenience)
    regime: str = ""
    seed: int | None = None
    steps: list[dict] = field(default_factory=list)  # step, rollout_s, decoded_tokens, reward, ... (totals per step)
    evals: list[dict] = field(default_factory=list)  # step or epoch, and one accuracy per dataset
    accuracy_before: float | None = None

    def __post_init__(self):
        self.method = self.method or short_name(self.policy)

    @property
    def is_baseline(self) -> bool:
        return self.policy == "off"

    def total(self, key: str) -> float:
        return sum(float(row.get(key) or 0.0) for row in self.steps)

    def per_draft_mean(self, key: str) -> float | None:
        """A per-draft value over the whole run: the mean over every draft of every step."""
        weights = [(row[key], row.get("drafts_found", 0.0)) for row in self.steps if row.get(key) is not None]
        drafts = sum(w for _, w in weights)
        return sum(v * w for v, w in weights) / drafts if drafts else None

    def final_accuracy(self) -> dict[str, float]:
        return {k: v for k, v in self.evals[-1].items() if k not in ("step", "epoch")} if self.evals else {}


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


def baseline_of(run: RunSeries, runs: list[RunSeries]) -> RunSeries | None:
    return next((r for r in runs if r.group == run.group and r.is_baseline), None)


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def table_rows(runs: list[RunSeries]) -> list[dict]:
    """One row per run: the paper's Table 3 columns, the staleness meter over the run, and the time breakdown."""
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
        for stage in sorted({k for r in run.steps for k in r if k.endswith("_s")}):
            row[f"time_{stage}"] = run.total(stage)
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
        rows.append(row)
    return rows


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def lenience_label(run: RunSeries) -> str:
    """The lenience a run applied: its setting, or first→last for a rule that adapts it."""
    applied = [r["lenience"] for r in run.steps if r.get("lenience")]
    if applied and max(applied) - min(applied) > 1e-6:
        return f"{applied[0]:.3g}→{applied[-1]:.3g}"
    return "" if run.lenience is None else f"{run.lenience:.3g}"


def markdown(rows: list[dict]) -> str:
    """The Table-3 shape with the staleness meter, then the time breakdown by stage."""
    accuracy_keys = sorted({k for r in rows for k in r if k.startswith("acc_")})
    meter = [k for k in STALENESS_METRICS if any(k in r for r in rows)]
    head = ["run", "policy", "ℓ", "Tokens (M)", "Speedup", *[k.removeprefix("acc_") for k in accuracy_keys], *meter]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for r in rows:
        cells = [r["run"], r["policy"], r["lenience"], f"{r['tokens_decoded_M']:.3f}", _times(r["speedup"])]
        cells += [_percent(r.get(k)) for k in accuracy_keys]
        cells += [_number(r.get(k)) for k in meter]
        lines.append("| " + " | ".join(cells) + " |")
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


# ---- plots -----------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# The rules our grids train, each with its colour in every figure; any other rule gets one from its name's hash.
KNOWN_RULES = (
    "off",
    "spec@1.65",
    "lossless",
    "residual",
    "lossless(draft=majority)",
    "exact",
    "spec@e^0.5",
    "anchored@e^0.5",
    "delayed@e^0.5",
    "full",
    "random",
    "spec@1",
    "spec@e^0.2",
    "spec@e^0.8",
    "spec@e^2",
)
PALETTE = [f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink", "gray", "olive", "cyan")]
PALETTE += ["navy", "gold", "teal", "magenta", "lime", "maroon", "slateblue", "darkorange", "turquoise", "crimson"]


def rule_colour(method: str) -> str:
    """The colour of a rule (a run's `method`) in every figure."""
    if method in KNOWN_RULES:
        return PALETTE[KNOWN_RULES.index(method) % len(PALETTE)]
    return PALETTE[zlib.crc32(method.encode()) % len(PALETTE)]


def seeds_label(count: int) -> str:
    return f"{count} seed" if count == 1 else f"{count} seeds"


def plot(runs: list[RunSeries], path: Path, title: str = "") -> Path:
    """Every run on each panel: the per-step curves and held-out accuracy."""
    plt = _pyplot()
    curves = [(k, t) for k, t in CURVES if any(k in r for run in runs for r in run.steps)]
    colors = {run.name: rule_colour(run.method) for run in runs}  # a rule's colour, whatever the figure
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
    spec = sorted((r for r in runs if r.policy == "spec" and r.lenience), key=lambda r: r.lenience)
    if len(spec) < 2:
        return None
    plt = _pyplot()
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


def _gap_point(axis, x: float, row: dict, marker: str, label: str) -> None:
    """One paired row's accuracy difference (points) at x, with its 95% interval when there is one."""
    low = 0.0 if math.isnan(row["acc_diff_lo"]) else 100 * (row["acc_diff"] - row["acc_diff_lo"])
    high = 0.0 if math.isnan(row["acc_diff_hi"]) else 100 * (row["acc_diff_hi"] - row["acc_diff"])
    axis.errorbar(
        x,
        100 * row["acc_diff"],
        yerr=[[low], [high]],
        fmt=marker,
        color=rule_colour(row["method"]),
        capsize=3,
        label=label,
    )


def plot_staleness_gap(paired: list[dict], path: Path) -> Path | None:
    """The paired accuracy gap against the measured staleness, one point per rule and regime, with its 95% interval
    over seeds: against the KL per visit, the excess acceptance and the drift since decoding."""
    points = [r for r in paired if not math.isnan(r["acc_diff"]) and not math.isnan(r["kl_prev_curr"])]
    if len(points) < 2:
        return None
    plt = _pyplot()
    panels = (
        ("kl_prev_curr", "KL(p_prev || p_curr) per scored token"),
        ("excess_acceptance", "excess acceptance (kept only by lenience)"),
        ("drift_since_decode", "mean log p_curr / p_gen since decoding"),
    )
    regimes = sorted({r["regime"] for r in points})
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), sharey=True)
    for axis, (key, title) in zip(axes, panels):
        for r in points:
            marker = "os^dvP"[regimes.index(r["regime"]) % 6]
            _gap_point(axis, r[key], r, marker, f"{r['method']}, {r['regime']}")
        axis.axhline(0.0, color="black", alpha=0.4)
        axis.set_xlabel(title)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("held-out acc. − off (points, 95% CI)")
    axes[-1].legend(fontsize=7)
    figure.suptitle("accuracy gap against staleness (marker: regime, colour: rule)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def plot_frontier(paired: list[dict], path: Path) -> Path | None:
    """Decoded tokens against held-out accuracy, one panel per regime: each rule's token ratio against its baseline
    and its paired accuracy difference, with the 95% interval over seeds. The baseline sits at (1, 0)."""
    points = [r for r in paired if not math.isnan(r["acc_diff"]) and not math.isnan(r["token_ratio"])]
    if not points:
        return None
    plt = _pyplot()
    regimes = sorted({r["regime"] for r in points})
    figure, axes = plt.subplots(1, len(regimes), figsize=(6 * len(regimes), 4.5), sharey=True, squeeze=False)
    for axis, regime in zip(axes[0], regimes):
        axis.plot([1.0], [0.0], "ks", label="off")
        for r in (r for r in points if r["regime"] == regime):
            _gap_point(axis, r["token_ratio"], r, "o", f"{r['method']} ({seeds_label(r['seeds'])})")
        axis.axhline(0.0, color="black", alpha=0.4)
        axis.axvline(2.0, color="grey", alpha=0.3, linestyle="--")
        axis.set_xlabel("decoded tokens: baseline / rule (higher decodes less)")
        axis.set_title(regime or "runs")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0][0].set_ylabel("held-out acc. − off (points, 95% CI)")
    figure.suptitle("the frontier: tokens saved against accuracy kept")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


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


if __name__ == "__main__":
    sys.exit(main())
