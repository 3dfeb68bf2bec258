"""The SPEC-RL paper's rollout times beside the simulator's (`bench_at_scale.py --lenience-curve`, read in the `paper`
regime): each ℓ's speedup over stock on the drafted epochs alone (the paper's 15 epochs are nearly all drafted; a
corpus's first of four is not), two ways: decode alone (the rule's steps less what its scoring requests cost, as the
paper's "rollout" column leaves its verification pass out) and all-in (scoring included, as its step total does), and
the figures that explain a gap: decoded tokens a second a GPU, the scoring pass's share of stock's rollout, and the
share of stock's time in the tail of its RL steps.

Terminology:
- *drafted epochs*: every epoch of the corpus after the first, whose prompts come back with drafts;
- *decode alone*, *all-in*: stock's seconds over the rule's, the rule's scoring cost left out or in;
- *tokens a second a GPU*: stock's response tokens of the drafted epochs over its seconds, an engine a GPU.
"""

from __future__ import annotations

import math

import numpy as np

from ..markdown import numbers, table
from ..pricing.projection import Pricing, StepCosts, project
from ..pricing.rule_figures import batch_phases
from .run import RuleRun

# The paper's lenience ablation (Qwen3-1.7B, GRPO): rollout time against stock's at each ℓ, its verification pass
# left out; ∞ is its `full` reuse (the text: "reaches 14.86x when ℓ -> ∞").
PAPER_ROLLOUT_SPEEDUP = {"1": 1.22, "e^0.2": 1.86, "e^0.5": 2.29, "e^0.8": 2.64, "e^2": 3.05, "∞": 14.86}
# The paper's time table (GRPO, ℓ = e^0.5, average seconds a step on 8 H100s): stock's rollout; SPEC-RL's
# verification, rollout and assembly; and the tokens stock generated (M over its 90 steps).
PAPER_TIME_TABLE = {
    "qwen3-1.7b": {"stock": 309.9, "verification": 22.1, "rollout": 135.2, "assembly": 1.5, "tokens_m": 554.8},
    "qwen3-8b": {"stock": 768.2, "verification": 74.7, "rollout": 305.8, "assembly": 1.3, "tokens_m": 1033.1},
}
PAPER_STEPS, PAPER_GPUS, PAPER_LABEL = 90, 8, "e^0.5"


def paper_all_in(model: str) -> float:
    """The paper's speedup with its verification and assembly counted (NaN for a model it did not time).

    >>> round(paper_all_in("qwen3-1.7b"), 3), round(paper_all_in("qwen3-8b"), 3)
    (1.951, 2.012)
    """
    row = PAPER_TIME_TABLE.get(model)
    return row["stock"] / (row["verification"] + row["rollout"] + row["assembly"]) if row else math.nan


def paper_tokens_per_gpu_s(model: str) -> float:
    """The paper's stock decode: tokens a second a GPU (NaN for a model it did not time).

    >>> round(paper_tokens_per_gpu_s("qwen3-8b"))
    1868
    """
    row = PAPER_TIME_TABLE.get(model)
    return row["tokens_m"] * 1e6 / PAPER_STEPS / row["stock"] / PAPER_GPUS if row else math.nan


def drafted_speedups(runs: dict[str, RuleRun], rule: str, host, price, full_rows: int) -> tuple[float, float]:
    """(decode alone, all-in): stock's seconds over `rule`'s on the drafted epochs, the host as the regime has it."""
    stock, run = runs["off"], runs[rule]
    base = stock.costs.take(stock.epochs > 0)
    drafted = run.epochs > 0
    costs = run.costs.take(drafted)
    decode = StepCosts(costs.gpu - run.scoring_s[drafted], costs.host, costs.proposer, costs.rows)
    pricing = Pricing(price, host=host)
    return (
        project(base, decode, run.cost, pricing, full_rows).projected,
        project(base, costs, run.cost, pricing, full_rows).projected,
    )


def gap_figures(runs: dict[str, RuleRun], rule: str, scale: int) -> dict[str, float]:
    """What explains a gap to the paper, on the drafted epochs: stock's tokens a second a GPU, `rule`'s scoring
    seconds over stock's (the paper's verification over its rollout), and the share of stock's time in its tail."""
    stock, run = runs["off"], runs[rule]
    drafted = stock.epochs > 0
    seconds = float(stock.costs.take(drafted).total(True))
    rows = stock.costs.rows[drafted] if stock.costs.rows is not None else np.zeros(int(drafted.sum()))
    _, tail = batch_phases(rows, np.asarray(stock.rl_steps[drafted]))
    gpu = stock.costs.gpu[drafted]
    return {
        "tokens_per_gpu_s": stock.drafted_tokens * scale / seconds if seconds else math.nan,
        "scoring_share": float(run.scoring_s[run.epochs > 0].sum()) / seconds if seconds else math.nan,
        "tail_share": float(gpu[tail].sum() / max(gpu.sum(), 1e-12)),
    }


def paper_table(labels: dict[str, str], runs, host, price, full_rows: int, model: str) -> tuple[str, list[str]]:
    """The ℓ rows beside the paper's (a markdown table) and their RESULT fields."""
    rows, fields = [], []
    for label, rule in labels.items():
        decode, all_in = drafted_speedups(runs, rule, host, price, full_rows)
        paper_all = paper_all_in(model) if label == PAPER_LABEL else math.nan
        rows.append(
            [label, rule, f"{decode:.2f}", f"{PAPER_ROLLOUT_SPEEDUP[label]:.2f}", f"{all_in:.2f}"]
            + ["-" if math.isnan(paper_all) else f"{paper_all:.2f}"]
        )
        fields.append(f"decode_alone[{rule}]={decode:.3f} all_in[{rule}]={all_in:.3f}")
    head = ["ℓ", "rule", "decode alone × stock", "paper's rollout ×", "all-in × stock", "paper's all-in ×"]
    intro = (
        "the drafted epochs (every epoch but the first) against stock's, beside the paper's lenience ablation (its "
        f"rollout column, Qwen3-1.7B) and its time table (all-in at ℓ = {PAPER_LABEL}, {model}):\n"
    )
    return intro + table(head, rows, numbers(2, len(head))), fields


def gap_lines(runs, rule: str, scale: int, model: str) -> tuple[str, str]:
    """The figures behind a gap (ours against the paper's), as a line to print and RESULT fields."""
    ours = gap_figures(runs, rule, scale)
    row = PAPER_TIME_TABLE.get(model)
    paper_share = row["verification"] / row["stock"] if row else math.nan
    line = (
        f"[at-scale] behind the gaps ({rule}, drafted epochs): stock decodes {ours['tokens_per_gpu_s']:,.0f} tokens a "
        f"second a GPU here, the paper's {paper_tokens_per_gpu_s(model):,.0f} ({model}); scoring costs "
        f"{ours['scoring_share']:.1%} of stock's rollout here, the paper's verification {paper_share:.1%}; stock's "
        f"tail (the steps after its last full batch) is {ours['tail_share']:.1%} of its forward"
    )
    fields = (
        f"tokens_per_gpu_s[off]={ours['tokens_per_gpu_s']:.0f} "
        f"paper_tokens_per_gpu_s={paper_tokens_per_gpu_s(model):.0f} "
        f"scoring_share[{rule}]={ours['scoring_share']:.3f} paper_verification_share={paper_share:.3f} "
        f"tail_share[off]={ours['tail_share']:.3f}"
    )
    return line, fields
