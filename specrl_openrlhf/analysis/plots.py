"""The report's figures: per-step curves per run, tokens and accuracy against lenience, the accuracy gap against
staleness, and the frontier of tokens saved against accuracy kept. matplotlib loads when a figure is drawn.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

from .run_series import RunSeries, baseline_of

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
    return _save(figure, path, title)


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
    return _save(figure, path)


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
    return _save(figure, path, "accuracy gap against staleness (marker: regime, colour: rule)")


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
    return _save(figure, path, "the frontier: tokens saved against accuracy kept")


def plot_rows_per_step(steps_dir: Path, path: Path) -> Path | None:
    """Rows per engine step over a rollout, each run's last rollout of its first seed (`<run>.jsonl` in `steps_dir`,
    written by the quickstart): the batch stays full, then the tail, as samples finish at different steps."""
    import json

    from ..pricing.steps import EngineSteps

    files = sorted(Path(steps_dir).glob("*.jsonl")) if Path(steps_dir).is_dir() else []
    if not files:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for file in files:
        lines = file.read_text().splitlines()
        if not lines:
            continue
        record = json.loads(lines[-1])
        steps = EngineSteps.from_dict(record)
        if not len(steps):
            continue
        elapsed = steps.time - record["start"]
        name = file.stem
        axis.step(elapsed, steps.rows, where="pre", label=name, color=rule_colour(name.rpartition("-")[2]), alpha=0.8)
    axis.set_xlabel("seconds into the rollout")
    axis.set_ylabel("rows per engine step")
    axis.set_title("the rollout's tail: rows per engine step over the last rollout")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    return _save(figure, path)


def _save(figure, path: Path, title: str = "") -> Path:
    """Write `figure` to `path` (its folder made if need be), titled `title` if given, and close it."""
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    _pyplot().close(figure)
    return path
