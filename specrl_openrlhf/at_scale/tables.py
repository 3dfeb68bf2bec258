"""The report's tables: each rule's figures and projection against stock at the regime's spacing
(`at_scale_table`), and each drafted epoch's (`epoch_table`)."""

from __future__ import annotations

from ..markdown import numbers, table
from ..pricing.projection import Projection
from .run import RuleRun
from .spacing import run_caption


def at_scale_table(runs: dict[str, RuleRun], result: dict[str, Projection], kept=None, regime=None) -> str:
    """Each rule's figures and its projection against stock (`result`: the run's, with its kept share `kept` where
    given; the rest over the corpus replayed), a markdown table, and what its columns mean."""
    head = ["rule", "path", "projected", "projected_async", "projected_no_host", "breakeven host ms", "kept", "steps"]
    head += ["forward s", "prefill s", "host s", "proposer s", "proposer µs/row-step", "tail", "memory MB"]
    head += ["previous epoch held"]
    rows = []
    for rule, r in runs.items():
        f, p = r.figures, result[rule]
        path = r.rule.runs_on
        breakeven = "-" if rule == "off" else f"{p.breakeven_host_ms:.2f}"  # stock against itself: no tie to find
        rows.append(
            [rule, path, f"{p.projected:.2f}", f"{p.projected_async:.2f}", f"{p.projected_no_host:.2f}", breakeven]
            + [f"{(kept or {}).get(rule, f['kept']):.1%}", f["steps"], f"{f['gpu_s']:.2f}", f"{r.prefill_s:.2f}"]
            + [f"{f['host_s']:.2f}"]
            + [f"{f['proposer_s']:.2f}", f"{f['proposer_us']:.2f}", f"{f['tail']:.1%}", f"{f['memory_mb']:.0f}"]
            + [f"{f['found_previous']:.0%}"]
        )
    caption = "" if regime is None else run_caption(regime)
    notes = [f"{rule}: {r.figures['note']}" for rule, r in runs.items() if r.figures.get("note")]
    notes += [
        f"{rule}: proposer s {r.figures['proposer_priced']}"
        for rule, r in runs.items()
        if r.figures.get("proposer_priced", "measured here") != "measured here"
    ]
    return (
        table(head, rows, numbers(2, len(head)))
        + f"\n{caption}host measured: {result['off'].host_ms:.2f} ms a full-batch step; breakeven: the host time at "
        "which the rule would tie stock (inf: wins at any; nan: loses at any)" + "".join(f"\n{note}" for note in notes)
    )


def epoch_table(runs: dict[str, RuleRun], by_epoch: dict[int, dict[str, Projection]]) -> str:
    """Each drafted epoch's kept share and projection against stock's same epoch, a rule a row."""
    head = ["rule"] + [f"epoch {e}: {what}" for e in by_epoch for what in ("kept", "projected", "host hidden")]
    rows = [
        [rule]
        + [
            cell
            for e, projected in by_epoch.items()
            for cell in (
                f"{runs[rule].kept_by_epoch.get(e, 0.0):.1%}",
                f"{projected[rule].projected:.2f}",
                f"{projected[rule].projected_async:.2f}",
            )
        ]
        for rule in runs
        if rule != "off"
    ]
    return "each drafted epoch against stock's same epoch:\n" + table(head, rows, numbers(1, len(head)))
