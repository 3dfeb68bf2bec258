"""What the quickstart prints and writes: a table per epoch, the report's tables, a summary per rule with its paired
accuracy difference over seeds, `metrics.json`/`metrics.csv`, and the last line, `RESULT ...`."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from ..analysis import plots, report, report_rows, run_readers
from ..analysis.run_series import RunSeries, baseline_of
from ..pricing.curves import describe
from ..pricing.projection import RL_SCALE, missing_field
from ..pricing.rl_scale import project_at_rl_scales, scale_fields
from ..pricing.steps import EngineSteps
from .draft_price import reproduces
from .plan import Group

EPOCH_COLUMNS = [
    ("epoch", "epoch", "{:>5}"),
    ("run", "run", "{:>24}"),
    ("decoded", "decoded_tokens", "{:>8.0f}"),
    ("reused", "reused_tokens", "{:>7.0f}"),
    ("full", "full_reuse_ratio", "{:>5.2f}"),
    ("prefix", "mean_verified_prefix_len", "{:>6.1f}"),
    ("KL", "kl_prev_curr", "{:>6.3f}"),
    ("excess", "excess_acceptance", "{:>6.3f}"),
    ("drift", "drift_since_decode", "{:>6.2f}"),
    ("age", "reused_token_age", "{:>5.2f}"),
    ("rollout_s", "rollout_s", "{:>9.1f}"),
    ("train_s", "train_s", "{:>7.1f}"),
    ("reward", "reward", "{:>6.3f}"),
    ("held-out", "held_out_accuracy", "{:>8.3f}"),
]


def format_table(rows: list[dict]) -> str:
    """The per-epoch table: tokens, reuse, the staleness meter (KL, excess acceptance, drift since decoding, age of
    reused tokens), times, reward and held-out accuracy ('-' where the epoch was not evaluated)."""
    widths = [len(fmt.format(0 if "f" in fmt else "")) for _, _, fmt in EPOCH_COLUMNS]
    lines = [" ".join(f"{title:>{w}}" for (title, _, _), w in zip(EPOCH_COLUMNS, widths))]
    for row in rows:
        cells = []
        for (_, key, fmt), width in zip(EPOCH_COLUMNS, widths):
            value = row.get(key)
            cells.append(f"{'-':>{width}}" if value is None else fmt.format(value))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def write_outputs(out: Path, groups: list[Group], summary: dict, settings: dict) -> Path:
    """metrics.json (every row, the runs and the summary: what `python -m specrl_openrlhf.report` reads) and
    metrics.csv."""
    runs = [run for group in groups for run in group.runs]
    rows = [row for run in runs for row in run.rows]
    path = out / "metrics.json"
    described = [run.describe() for run in runs]
    path.write_text(json.dumps({"settings": settings, "summary": summary, "runs": described, "rows": rows}, indent=1))
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def finish(args, out: Path, groups: list[Group], accuracy_before: dict, wall_s: float, settings: dict) -> int:
    """Write the outputs and the report, print the tables, the summary and the RESULT line."""
    runs = [run for group in groups for run in group.runs]
    known = [v for v in accuracy_before.values() if v is not None]
    before = sum(known) / len(known) if known else None
    metrics = write_outputs(out, groups, {"acc_before": before, "wall_s": wall_s}, settings)
    series = run_readers.load_cpu_metrics(metrics)
    files = report.write_report(series, out)
    tail = plots.plot_rows_per_step(out / "steps", out / "rows_per_step.png")
    if tail is not None:
        files["rows_per_step"] = tail
    print("\n" + format_table([row for run in runs for row in run.rows if row["kind"] == "epoch"]))
    print("\nwhole runs, against each group's baseline (the paper's Table 3 shape, with the staleness meter):")
    print(report.markdown(report_rows.table_rows(series)))
    paired = report_rows.paired_rows(series)
    curve, host = getattr(args, "projection_curve", None), getattr(args, "host_curve", None)
    if curve is not None:
        paired = host_figures(paired, series, groups, out / "steps", curve, host)
        print(f"\nprojected on {describe(curve)}; host: {host.describe() if host else 'none (missing=host)'}")
    if paired:
        print("\nsummary, paired against each seed's baseline:")
        note = reproduces(getattr(args, "draft_price", "model"), getattr(args, "cost_curve", None), runs)
        print("\n".join(summary_lines(paired, series, before, note)))
    print(f"outputs: {out}/ metrics.csv, metrics.json, " + ", ".join(str(p.relative_to(out)) for p in files.values()))
    print(f"wall time {wall_s:.0f}s")
    if paired and not args.grid and not args.only:
        print(result_line(paired, args.main_method.name, before, out))
    else:
        print(f"RESULT grid={args.grid or 'cell'} runs={len(runs)} seeds={len(args.seeds)} out={out}")
    return 0


def later_token_ratio(series: list[RunSeries], method: str) -> float:
    """Decoded tokens of the baselines over the method's from the second epoch on, when drafts exist."""

    def later(run):
        return sum(r.get("decoded_tokens") or 0.0 for r in run.steps if r.get("epoch", 1) > 0)

    pairs = [(r, baseline_of(r, series)) for r in series if r.method == method]
    return report_rows.ratio(sum(later(b) for _, b in pairs if b), sum(later(r) for r, _ in pairs))


def time_ratio_spread(series: list[RunSeries], method: str, regime: str) -> float:
    """How far this machine's noise moves a rule's rollout-time ratio against its baseline from run to run, as the
    runs measure it themselves (`time_ratio_error`); over seeds, the error of their mean. NaN where no run can tell."""
    errors = [
        time_ratio_error(run, base)
        for run in series
        if run.method == method
        and run.regime == regime
        and not run.is_baseline
        and (base := baseline_of(run, series)) is not None
    ]
    errors = [e for e in errors if not math.isnan(e)]
    return math.sqrt(sum(e * e for e in errors)) / len(errors) if errors else math.nan


def time_ratio_error(run: RunSeries, base: RunSeries) -> float:
    """The standard error of the baseline's summed rollout time over the rule's, from their training steps' own
    scatter: the delta method on the two sums, their variances and covariance taken within each epoch (its steps do
    the same work; the runs take turns step by step, so the machine's noise hits both alike). NaN where no epoch has
    two steps."""
    stock = {row["step"]: float(row.get("rollout_s") or 0.0) for row in base.steps}
    epochs: dict[int, list[tuple[float, float]]] = {}
    for row in run.steps:
        if row["step"] in stock:
            epochs.setdefault(row.get("epoch", 0), []).append((stock[row["step"]], float(row.get("rollout_s") or 0.0)))
    times = np.array([pair for pairs in epochs.values() for pair in pairs]).reshape(-1, 2)  # [steps, 2]
    sums = times.sum(axis=0)  # [2]: stock's, the rule's
    scattered = [np.array(pairs) for pairs in epochs.values() if len(pairs) > 1]
    if not (sums > 0).all() or not scattered:
        return math.nan
    covariance = sum(len(pairs) * np.cov(pairs.T) for pairs in scattered)  # [2, 2], of the two sums
    gradient = np.array([1.0 / sums[1], -sums[0] / sums[1] ** 2])  # of stock's sum over the rule's
    return float(math.sqrt(max(gradient @ covariance @ gradient, 0.0)))


def summary_lines(
    paired: list[dict], series: list[RunSeries], accuracy_before: float | None, reproduced: str = ""
) -> list[str]:
    """One block per rule (and regime): token ratio, rollout-time ratio with how far it moves from run to run
    (`time_ratio_spread`), accuracy, and the paired accuracy difference against the baseline with its 95% interval
    over seeds; then `reproduced`, what is the seed's and what is this machine's (`draft_price.reproduces`)."""
    lines = []
    for row in paired:
        regime = f" ({row['regime']})" if row["regime"] and len({r["regime"] for r in paired}) > 1 else ""
        interval = (
            "no interval from one seed: add --seeds 0,1,2"
            if math.isnan(row["acc_diff_lo"])
            else f"95% CI [{100 * row['acc_diff_lo']:+.1f}, {100 * row['acc_diff_hi']:+.1f}]"
        )
        lines += [
            f"  {row['method']}{regime}, {plots.seeds_label(row['seeds'])}, against off:",
            f"    decoded tokens  {row['token_ratio']:.2f}x fewer "
            f"({later_token_ratio(series, row['method']):.2f}x from the 2nd epoch on, when drafts exist)",
            f"    rollout time    ratio {row['time_ratio']:.2f}"
            + spread_text(time_ratio_spread(series, row["method"], row["regime"]))
            + projected_text(row),
            f"    held-out acc.   {100 * row['acc']:.1f} vs {100 * row['acc_off']:.1f}: "
            f"{100 * row['acc_diff']:+.1f} points, {interval}",
        ]
        if "rows_per_step" in row:
            lines.append(
                f"    engine steps    {row['rows_per_step']:.1f} rows a step from the 2nd epoch on (off "
                f"{row['rows_per_step_off']:.1f}); tail {100 * row['tail_share']:.0f}% of rollout time (off "
                f"{100 * row['tail_share_off']:.0f}%)"
            )
        if math.isnan(row.get("kl_prev_curr", math.nan)):  # verified in the engine: no draft was scored
            lines.append("    staleness       none measured: verified in the engine, which never compares with p_prev")
        else:
            lines.append(
                f"    staleness       KL {row['kl_prev_curr']:.3f}/token, "
                f"excess acceptance {row['excess_acceptance']:.3f}, "
                f"drift since decoding {row['drift_since_decode']:.2f}, "
                f"reused-token age {row['reused_token_age']:.2f}"
            )
    if accuracy_before is not None:
        lines.append(f"  warm start: held-out accuracy {100 * accuracy_before:.1f}")
    if reproduced:
        lines.append(f"  {reproduced}")
    if len(paired) > 1:
        lines.append(advice(paired))
    return lines


def spread_text(spread: float) -> str:
    """` ± x run to run` where the run measured how far its time ratio moves (`time_ratio_spread`)."""
    return "" if math.isnan(spread) else f" ± {spread:.2f} run to run (its steps' scatter on this machine)"


def projected_text(row: dict) -> str:
    """`; projected on a GPU ...` where the runs were projected on a step curve, the host's part shown."""
    if "projected" not in row:
        return ""
    text = (
        f"; projected on the GPU's step curve {row['projected']:.2f} at scale 1, {row['projected8']:.2f} at rows x 8"
    )
    if "projected_async" in row:
        text += (
            f", with the host hidden {row['projected_async']:.2f} / {row['projected_async8']:.2f}, breakeven host "
            f"{row['breakeven_host_ms']:.2f} / {row['breakeven_host_ms8']:.2f} ms a full-batch step"
            f" (missing={','.join(row['missing']) or 'none'}, prefill={row['prefill']})"
        )
    return text + " (a projection of this run's engine steps, not a GPU run)"


PROJECTED = ("projected_async", "projected_async8", "breakeven_host_ms", "breakeven_host_ms8")


def host_figures(
    paired: list[dict], series: list[RunSeries], groups: list[Group], steps_dir: Path, curve, host
) -> list[dict]:
    """Each paired row whose runs were projected, with the host's part shown (`pricing.projection.project_steps`):
    every rollout's engine steps of the rule (`steps_dir/<run>.jsonl`) against its baseline's, at rows x 1 and x 8,
    averaged over seeds: with the host hidden, the breakeven host time, and what is missing."""
    from ..pricing.measured import rule_cost
    from .engine import machine

    policies = {run.label: run.method.config.build_policy() for group in groups for run in group.runs}
    out = []
    for row in paired:
        members = [r for r in series if r.method == row["method"] and r.regime == row["regime"] and not r.is_baseline]
        pairs = [(r, b) for r in members if (b := baseline_of(r, series)) is not None]
        if "projected" not in row or not pairs or not all(r.name in policies for r, _ in pairs):
            out.append(row)
            continue
        cost = rule_cost(policies[pairs[0][0].name], machine())
        figures = {key: [] for key in PROJECTED}
        for run, base in pairs:
            stock, steps = recorded_steps(steps_dir, base.name), recorded_steps(steps_dir, run.name)
            projections = project_at_rl_scales(stock, steps, curve, host, cost)
            for key, value in scale_fields(projections, ("projected_async", "breakeven_host_ms")).items():
                figures[key].append(value)
        p = projections[RL_SCALE]
        means = {key: sum(values) / len(values) for key, values in figures.items()}
        out.append({**row, **means, "missing": p.missing, "prefill": p.prefill})
    return out


def recorded_steps(steps_dir: Path, run: str) -> EngineSteps:
    """Every rollout's engine steps of a run (`<run>.jsonl`, a rollout a line), together."""
    path = Path(steps_dir) / f"{run}.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return sum((EngineSteps.from_dict(json.loads(line)) for line in lines if line.strip()), EngineSteps.of([]))


PARITY_POINTS = 0.02  # the frontier's goal (docs/benchmarks.md, 'Frontier'): |mean paired difference| <= 2 points
SEEDS_TO_RESOLVE = "--seeds 0,1,2,3,4"  # one seed's held-out difference spreads by about +-5 points here


def exact_in_rl(policy: str) -> bool:
    """Whether the rule returns samples of the current policy whatever produced its drafts, also when the policy was
    trained on them (a property of the rule, tested in tests/policies/test_lossless.py); False for a rule that can't
    be loaded here."""
    from ..policies import policy_class

    try:
        return bool(policy_class(policy).exact_in_rl)
    except Exception:
        return False


def resolved(row: dict) -> bool:
    """The seeds give an interval for the accuracy difference (one seed does not)."""
    return not math.isnan(row["acc_diff_lo"])


def kept_accuracy(row: dict) -> bool:
    """Kept the baseline's accuracy, as the seeds resolve it: a mean difference within 2 points and a 95% interval
    that holds 0 (a wide interval alone is not parity: 3 seeds can hold 0 around a 3-point loss)."""
    return resolved(row) and abs(row["acc_diff"]) <= PARITY_POINTS and row["acc_diff_lo"] <= 0.0 <= row["acc_diff_hi"]


def measured_loss(row: dict) -> bool:
    """The seeds resolve an accuracy loss: a 95% interval below 0. One seed never does."""
    return resolved(row) and row["acc_diff_hi"] < 0.0


def advice(paired: list[dict]) -> str:
    """The summary's one line on which rule to use, from what this run can tell: whether a rule is exact in RL (a
    property of the rule), decoded tokens and rollout time (stable from one seed), and held-out accuracy only where
    the seeds resolve it. A rule that is biased in RL is never preferred to an exact one on accuracy the seeds don't
    resolve; it is recommended only where no exact rule rolled out faster than stock and the seeds showed it kept the
    baseline's accuracy. Where no rule qualifies, stock generation (off) is."""

    def cost(row: dict) -> str:
        kind = "exact" if exact_in_rl(row["policy"]) else "biased"
        return (
            f"{row['method']} ({kind} in RL; {row['token_ratio']:.2f}x fewer decoded tokens, "
            f"rollout time ratio {row['time_ratio']:.2f})"
        )

    exact = [r for r in paired if exact_in_rl(r["policy"]) and not measured_loss(r)]
    faster = [r for r in exact if r["time_ratio"] >= 1.0]
    proven = [r for r in paired if not exact_in_rl(r["policy"]) and kept_accuracy(r) and r["time_ratio"] >= 1.0]
    if faster:
        best = max(faster, key=lambda r: r["time_ratio"])
        line = f"which rule: {cost(best)}: exact, and faster than stock here"
    elif proven:
        best = max(proven, key=lambda r: r["time_ratio"])
        line = f"which rule: {cost(best)}: kept the baseline's accuracy over {best['seeds']} seeds"
    elif exact:
        best = max(exact, key=lambda r: r["time_ratio"])
        line = f"which rule: off (stock) on this machine: {cost(best)} rolled out slower than stock"
    else:
        best = None
        line = "which rule: off (stock): no rule here is exact in RL and kept the baseline's accuracy"
    notes = []
    for row in paired:
        if row is best:
            continue
        if measured_loss(row):
            notes.append(
                f"{cost(row)} lost {100 * -row['acc_diff']:.1f} points over {row['seeds']} seeds "
                f"[{100 * row['acc_diff_lo']:+.1f}, {100 * row['acc_diff_hi']:+.1f}]"
            )
        elif not exact_in_rl(row["policy"]) and not kept_accuracy(row):
            notes.append(f"{cost(row)}: what its bias costs in accuracy is not resolved by this run")
    if any(not resolved(r) for r in paired):
        notes.append(
            f"one seed can't tell held-out accuracy apart (a seed's difference spreads by about 5 points): "
            f"{SEEDS_TO_RESOLVE} gives each rule's difference with a 95% interval"
        )
    return "; ".join([line, *notes])


def result_line(paired: list[dict], main_method: str, accuracy_before: float | None, out: Path) -> str:
    """`RESULT token_ratio=... acc_diff=... acc_diff_lo=... acc_diff_hi=... seeds=N out=...` for the main rule against
    off (the first regime's), then the other rules' token ratios and differences."""
    main = next(r for r in paired if r["method"] == main_method)
    fields = {
        "token_ratio": f"{main['token_ratio']:.2f}",
        "time_ratio": f"{main['time_ratio']:.2f}",
        "acc_before": "nan" if accuracy_before is None else f"{accuracy_before:.3f}",
        "acc_off": f"{main['acc_off']:.3f}",
        "acc_rule": f"{main['acc']:.3f}",
        "policy": main_method,
        "acc_diff": f"{main['acc_diff']:.3f}",
        "acc_diff_lo": f"{main['acc_diff_lo']:.3f}",
        "acc_diff_hi": f"{main['acc_diff_hi']:.3f}",
        "seeds": str(main["seeds"]),
    }
    for row in paired:
        if row is not main and row["regime"] == main["regime"]:
            fields[f"token_ratio[{row['method']}]"] = f"{row['token_ratio']:.2f}"
            fields[f"time_ratio[{row['method']}]"] = f"{row['time_ratio']:.2f}"
            fields[f"acc_diff[{row['method']}]"] = f"{row['acc_diff']:.3f}"
    projected = [row for row in paired if row["regime"] == main["regime"] and "projected" in row]
    for row in projected:
        fields[f"projected[{row['method']}]"] = f"{row['projected']:.2f}"
        fields[f"projected8[{row['method']}]"] = f"{row['projected8']:.2f}"
        for key in PROJECTED:
            if key in row:
                fields[f"{key}[{row['method']}]"] = f"{row[key]:.2f}"
        fields[f"rows_per_step[{row['method']}]"] = f"{row['rows_per_step']:.1f}"
    shown = [row for row in projected if "missing" in row]
    if shown:
        fields["missing"] = missing_field({row["method"]: row["missing"] for row in shown}).split("=", 1)[1]
        fields["prefill"] = shown[0]["prefill"]
    fields["out"] = str(out)
    return "RESULT " + " ".join(f"{k}={v}" for k, v in fields.items())
