"""Draft budgets: which draft slots a verification step carries, from what a step costs and what a slot is worth.

Terminology:
- *slot*: one draft token of one batch row at one step, at *position* j of the row's draft (0-based).
- *acceptance*: the chance that the engine keeps a slot's token given it kept the row's earlier slots (one-hot
  verification keeps y with probability p_curr(y)); *survival*: the chance that it keeps the slot at all, the product
  of the acceptances up to it: the expected tokens the slot adds to the step.
- *step cost*: a step's time as a function of the rows it serves and the tokens it carries, linear: base + per_row x
  rows + per_token x tokens. It comes from `pricing/`: the engine's own steps fitted online
  (`pricing.online.OnlineStepCost`), or a GPU's price (`budget_cost`).
- *goodput*: the tokens a step is expected to produce per second: (rows + sum of admitted survivals) / step time.
- *gain*: a step's goodput over the goodput of the same step without drafts, minus 1: *predicted* by the budget when
  it admits slots, *realized* once the step has run (`DraftingCheck`).

One module a job:
- `acceptance`: what a slot is worth (`AcceptanceModel`), learned from the engine's own verdicts by what predicts it
  (`bucket`, `features`: how the draft was found, where in it the slot is, how many of the history's responses take
  its token);
- `allocation`: which slots a step drafts (`DraftBudget.allocate`): by survival, best first, while the next one raises
  goodput (SmartSpec's rule with a linear cost model): a slot pays when its survival exceeds c x goodput, c being a
  carried token's cost. Zero slots is a valid answer; when few rows are left, a step's fixed cost dominates and drafts
  run long. After `EXPLORE_EVERY` steps without a slot the likeliest one is drafted anyway, so that acceptance is
  still learned; the `static` mode (the ablation without a budget) drafts every candidate slot;
- `drafting_check`: does drafting pay, as measured (`DraftingCheck`): a step drafts only where its predicted gain
  clears `DraftingCheck.margin`, what predictions have been exceeding measured gains by: drafting backs off wherever it
  does not pay as predicted, and where nothing pays the engine decodes as stock;
- `proposer_report`: what a proposer's budget measured, summed (`BudgetReport`).

Which slots are drafted depends on the history, the rows' tokens so far and past steps, never on a row's randomness to
come: verification stays exact.

Core package: numpy only.
"""

from .acceptance import (
    ACCEPTANCE_HALF_LIFE_VERDICTS,
    ANCHORED,
    KINDS,
    MATCH_EDGES,
    OWN,
    POSITION_EDGES,
    REENTERED,
    SHAPE,
    SHARED,
    SUPPORT_EDGES,
    AcceptanceModel,
    bucket,
    features,
    record_verdicts,
)
from .allocation import (
    BUDGET_MODES,
    EXPLORE_EVERY,
    EXPLORE_MARGIN,
    DraftBudget,
    goodput_allocate,
    survival_floor,
    within_room,
)
from .drafting_check import CHECK_HALF_LIFE_STEPS, FIRST_PROBE, PROBE_EVERY, DraftingCheck
from .proposer_report import REPORT_HALF_LIFE_STEPS, BudgetReport, decayed_sums

__all__ = [
    "ACCEPTANCE_HALF_LIFE_VERDICTS",
    "ANCHORED",
    "BUDGET_MODES",
    "CHECK_HALF_LIFE_STEPS",
    "EXPLORE_EVERY",
    "EXPLORE_MARGIN",
    "FIRST_PROBE",
    "KINDS",
    "MATCH_EDGES",
    "OWN",
    "POSITION_EDGES",
    "PROBE_EVERY",
    "REENTERED",
    "REPORT_HALF_LIFE_STEPS",
    "SHAPE",
    "SHARED",
    "SUPPORT_EDGES",
    "AcceptanceModel",
    "BudgetReport",
    "DraftBudget",
    "DraftingCheck",
    "bucket",
    "decayed_sums",
    "features",
    "goodput_allocate",
    "record_verdicts",
    "survival_floor",
    "within_room",
]
