"""`python scripts/bench_at_scale.py --lenience-curve`: how much of the drafted epochs SPEC-RL's ratio rule keeps as
its lenience ℓ grows, on a corpus, beside the paper's own ablation, and what each ℓ projects against stock.

Kept of drafted: of the response tokens the rule gives the epochs that have drafts (every epoch after the first), the
share it kept from drafts rather than generated. At ℓ = ∞ (`full`) the rule keeps every draft whole, by definition.
"""

from __future__ import annotations

import math
import time

from ..markdown import numbers, table
from ..simulator.corpus import PAPER_LENIENCES, Corpus, quality
from ..simulator.request_workload import request_workload
from .paper_times import PAPER_LABEL, gap_lines, paper_table
from .rules import bench_rule
from .run import Cell, projections, run_rules

# The SPEC-RL paper's ablation on lenience (its table "Ablation on lenience": Qwen3-1.7B, GRPO, DeepMath-6K, 15
# epochs): the rollout tokens generated at stock and at each ℓ.
PAPER_LENIENCE = {
    "source": "SPEC-RL paper, table 'Ablation on lenience' (Qwen3-1.7B, GRPO, DeepMath-6K)",
    "epochs": 15,
    "stock_tokens_m": 554.8,
    "tokens_m": {"1": 419.1, "e^0.2": 246.7, "e^0.5": 182.7, "e^0.8": 144.8, "e^2": 114.4},
}
# ℓ by its label: the paper's five, and ∞ (the `full` policy: every draft kept whole)
LENIENCES = {"1": 1.0, "e^0.2": math.exp(0.2), "e^0.5": math.exp(0.5), "e^0.8": math.exp(0.8), "e^2": math.exp(2)}


def curve_rules() -> dict[str, str]:
    """The request-path rule of each ℓ label, ∞ (`full`) last."""
    rules = {label: f"spec@{round(value, 4):g}" for label, value in LENIENCES.items()}
    return rules | {"∞": "spec@inf"}


def paper_kept(label: str) -> float:
    """The share of the paper's drafted epochs' tokens its rule kept at ℓ `label`: the tokens it saved against stock
    over the tokens of every epoch but the first (an epoch's tokens: stock's over its epochs); 1 at ∞.

    >>> [round(paper_kept(label), 2) for label in (*LENIENCES, "∞")]
    [0.26, 0.6, 0.72, 0.79, 0.85, 1.0]
    """
    if label == "∞":
        return 1.0
    stock, epochs = PAPER_LENIENCE["stock_tokens_m"], PAPER_LENIENCE["epochs"]
    return (stock - PAPER_LENIENCE["tokens_m"][label]) / (stock * (epochs - 1) / epochs)


def corpus_figures(corpus: Corpus) -> str:
    """What the corpus under a verdict is, beside what an RL run is: its length (and its largest step between
    epochs), cut, repeats, token surprisal and ratio-rule lenience curve (`simulator.corpus.quality`), each ℓ's kept
    share beside the paper's."""
    figures = quality(corpus)
    words = [f"{k}={figures[k]:.3f}" for k in ("mean_tokens", "epoch_length_step", "cut_share", "repeated_share")]
    words += [f"{k}={v:.3f}" for k, v in figures.items() if k.startswith("surprisal")]
    for label, lenience in zip(LENIENCES, PAPER_LENIENCES):
        if f"kept_spec@{lenience:g}" in figures:
            words.append(f"kept[ℓ={label}]={figures[f'kept_spec@{lenience:g}']:.3f} (paper {paper_kept(label):.2f})")
    return " ".join(words) or "no figures"


def paper_token_ratio(label: str) -> float:
    """The paper's rollout tokens at ℓ `label` over stock's (NaN at ∞: not in its table)."""
    if label == "∞":
        return math.nan
    return PAPER_LENIENCE["tokens_m"][label] / PAPER_LENIENCE["stock_tokens_m"]


def kept_of_drafted(rule: str, corpus: Corpus) -> tuple[int, int]:
    """(tokens kept, tokens generated) by request-path `rule` over the epochs that have drafts: a sample with a draft
    keeps its cut and generates its continuation, one without generates its response (`RequestReplay.plan`)."""
    workload, kept, generated = request_workload(bench_rule(rule).policy, corpus), 0, 0
    for epoch in range(1, corpus.epochs):
        for prompt, responses in enumerate(corpus.responses[epoch]):
            for decision, response in zip(workload.plan(epoch, prompt, corpus).decisions, responses):
                kept += decision.kept if decision else 0
                generated += len(decision.rest) if decision else len(response)
    return kept, generated


def lenience_curve(corpus_name: str, corpus: Corpus, cell: Cell, host, started: float) -> int:
    """Prints the curve in `cell` (off and `curve_rules`), the drafted epochs beside the paper's rollout times
    (`paper_times`), then its RESULT line."""
    rules = curve_rules()
    runs = run_rules(["off", *rules.values()], corpus, cell, host, {})
    price, _ = cell.price()
    _, scale = cell.schedule(corpus)
    result = projections(runs, host, price, cell.regime.full_batch)
    rows, fields = [], []
    for label, rule in rules.items():
        kept_tokens, generated = kept_of_drafted(rule, corpus)
        kept, p = kept_tokens / max(kept_tokens + generated, 1), result[rule]
        ratio = paper_token_ratio(label)
        rows.append(
            [
                f"{label} (full)" if rule == "spec@inf" else label,
                rule,
                f"{kept:.1%}",
                f"{paper_kept(label):.0%}",
                "-" if math.isnan(ratio) else f"{ratio:.3f}",
            ]
            + [f"{p.projected:.2f}", f"{p.projected_async:.2f}"]
        )
        fields.append(
            f"kept_of_drafted[{rule}]={kept:.3f} paper_kept[{rule}]={paper_kept(label):.3f} {p.fields(rule)}"
        )
    head = ["ℓ", "rule", "kept of drafted", "paper's kept", "paper's tokens / stock", "projected", "projected_async"]
    print(
        f"[at-scale] the lenience curve on {corpus_name}, {cell.model} on {cell.gpu}, regime "
        f"{cell.regime.describe()}; the paper: {PAPER_LENIENCE['source']}"
    )
    print(table(head, rows, numbers(2, len(head))))
    beside, paper_fields = paper_table(rules, runs, host, price, cell.regime.full_batch, cell.model)
    gaps, gap_fields = gap_lines(runs, rules[PAPER_LABEL], scale, cell.model)
    print(beside)
    print(gaps)
    print(
        "RESULT "
        + " ".join(fields + paper_fields + [gap_fields])
        + f" host_ms={result['off'].host_ms:.3f} corpus={corpus_name} model={cell.model} gpu={cell.gpu} "
        f"{cell.regime.fields()} wall_s={time.perf_counter() - started:.0f}"
    )
    return 0
