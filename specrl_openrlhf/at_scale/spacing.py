"""The rules at each spacing (`--spacing`: RL steps between a prompt's visits), a first visit apart from later ones,
and a run's figure as the mix its regime's visits make (`visit_projections`, `visit_kept`): the first visit once and
a later visit `visits - 1` times, weighed by time (stock's total seconds over the rule's). The corpus's first epoch is
every prompt's first visit (nothing of an earlier one exists: only its siblings in flight, its own text and what the
caches hold of other prompts), its later epochs are later visits.
"""

from __future__ import annotations

import math

import numpy as np

from ..markdown import numbers, table
from ..pricing.projection import Pricing, Projection, StepCosts, project
from ..simulator.regime import Regime
from ..simulator.visits import gap_visits
from .proposers import SUFFIX_CACHED
from .run import RuleRun, run_rules
from .store import draft_store

PARTS = ("first", "later", "run")  # a first visit, a later one, the run's mix
SPACINGS = "1,8,regime"  # --spacing's default


def parse_spacings(text: str, regime: Regime) -> list[int]:
    """`--spacing`'s list (RL steps, or `regime`: the regime's own), each once, the regime's last; a ValueError names
    the flag and what it takes."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        value = regime.steps_between_visits if item == "regime" else int(item) if item.isdigit() else 0
        if value < 1:
            raise ValueError(f"--spacing {text}: give RL steps between a prompt's visits (>= 1) or regime: {item!r}")
        if value not in out:
            out.append(value)
    own = regime.steps_between_visits
    return [s for s in out if s != own] + [own]


def _drafted(run: RuleRun) -> int:
    return len(set(run.epochs.tolist()) - {0})


def visit_costs(run: RuleRun, visits: int) -> dict[str, StepCosts]:
    """A rule's step costs on its first visit, its later ones (every drafted epoch), and the run's: the first once
    and the later visits' mean `visits - 1` times (a step's costs scale with its weight)."""
    first, later = run.costs.take(run.epochs == 0), run.costs.take(run.epochs > 0)
    weight = (visits - 1) / _drafted(run) if _drafted(run) else 0.0
    if weight == 0:
        return {"first": first, "later": later, "run": first}
    parts = [first, _times(later, weight)]
    rows = None if first.rows is None else np.concatenate([p.rows for p in parts])
    whole = StepCosts(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("gpu", "host", "proposer")), rows)
    return {"first": first, "later": later, "run": whole}


def _times(costs: StepCosts, weight: float) -> StepCosts:
    return StepCosts(costs.gpu * weight, costs.host * weight, costs.proposer * weight, costs.rows)


def visit_projections(
    runs: dict[str, RuleRun], host, price, full_rows: int, visits: int
) -> dict[str, dict[str, Projection]]:
    """Each rule against stock on its first visit, its later visits and the run (`PARTS`; `later` absent where the
    corpus has one epoch)."""
    pricing = Pricing(price, host=host)
    stock = visit_costs(runs["off"], visits)
    costs = {rule: visit_costs(r, visits) for rule, r in runs.items()}
    parts = PARTS if _drafted(runs["off"]) else ("first", "run")
    return {
        part: {rule: project(stock[part], costs[rule][part], r.cost, pricing, full_rows) for rule, r in runs.items()}
        for part in parts
    }


def visit_kept(run: RuleRun, visits: int) -> dict[str, float]:
    """A rule's kept share of its first visit's response tokens, its later visits', and the run's (the same mix)."""
    first = run.kept_tokens.get(0, (0, 0))
    later = np.sum([v for e, v in run.kept_tokens.items() if e > 0] or [(0, 0)], axis=0)
    weight = (visits - 1) / _drafted(run) if _drafted(run) else 0.0
    whole = (first[0] + weight * later[0], first[1] + weight * later[1])
    return {part: kept / tokens if tokens else math.nan for part, (kept, tokens) in zip(PARTS, (first, later, whole))}


def spacing_table(by_spacing: dict[int, dict], kept: dict[int, dict], regime: Regime) -> str:
    """Each rule at each spacing: kept and projected (host measured; hidden) on its first visit, its later visits,
    and the run, against stock at the same spacing; a markdown table, a rule and spacing a row."""
    head = ["rule", "spacing"] + [f"{part}: {what}" for part in PARTS for what in ("kept", "projected", "host hidden")]
    rows = []
    rules = [r for r in next(iter(by_spacing.values()))["first"] if r != "off"]
    for rule in rules:
        for spacing, projected in by_spacing.items():
            own = " (regime)" if spacing == regime.steps_between_visits else ""
            row = [rule, f"{spacing}{own}"]
            for part in PARTS:
                p = projected.get(part, {}).get(rule)
                share = kept[spacing][rule][part]
                row += [f"{share:.1%}", f"{p.projected:.2f}", f"{p.projected_async:.2f}"] if p else ["-"] * 3
            rows.append(row)
    return (
        f"each rule by spacing (RL steps from a prompt's visit to its next), against stock at the same spacing: its "
        f"first visit, its later visits, and the run ({regime.visits} visit{'s' if regime.visits > 1 else ''}: the "
        f"first once, a later one {regime.visits - 1} times, by time):\n" + table(head, rows, numbers(2, len(head)))
    )


def run_caption(regime: Regime) -> str:
    """What the verdict table's figures are: its projections and kept share the run's, the rest the corpus's."""
    return (
        f"projected and kept: the run ({regime.describe_visits()}: the first visit once, a later one "
        f"{regime.visits - 1} times, by time); the other columns: the corpus replayed (a first visit, then later "
        "ones); "
    )


def one_visit_line(regime: Regime, runs: dict[str, RuleRun], verdict: dict[str, Projection], kept: dict) -> str:
    """What a user whose run visits each prompt once gets: every rule on its first visit alone."""
    reusing = [rule for rule, r in runs.items() if r.rule.path == "requests"]
    engine = [rule for rule, r in runs.items() if r.rule.path == "engine"]
    figures = ", ".join(f"{rule} {kept[rule]['first']:.1%} kept, {verdict[rule].projected:.2f}x" for rule in engine)
    nothing = ", ".join(f"{rule} {verdict[rule].projected:.2f}x" for rule in reusing)
    return (
        f"[at-scale] a run that visits each prompt once ({regime.name}: {regime.describe_visits()}) is its first "
        f"visits: no prompt has a previous visit, so the rules that reuse one reuse nothing ({nothing or 'none run'}; "
        "the same with more visits on their first), and the engine's proposers draft from siblings in flight, the "
        f"prompt's text and other prompts' responses alone ({figures or 'none run'}); the later visits above are what "
        "a run of more episodes gets"
    )


def result_fields(by_spacing: dict[int, dict], kept: dict[int, dict], regime: Regime) -> list[str]:
    """RESULT fields: each rule's kept share and projections on its first and later visits at each spacing (the
    regime's unsuffixed, another's with `_s{spacing}`)."""
    fields = []
    for spacing, projected in by_spacing.items():
        tag = "" if spacing == regime.steps_between_visits else f"_s{spacing}"
        for part in ("first", "later"):
            for rule, p in projected.get(part, {}).items():
                if rule != "off":
                    fields.append(
                        f"kept_{part}{tag}[{rule}]={kept[spacing][rule][part]:.3f} "
                        f"projected_{part}{tag}[{rule}]={p.projected:.3f} "
                        f"projected_async_{part}{tag}[{rule}]={p.projected_async:.3f}"
                    )
    return fields


def run_spacings(rules: list[str], corpus, cell, host, spacings: list[int], cache=None) -> tuple[dict, dict, dict]:
    """Every rule at each spacing (`run.run_rules`, one `cache`: a rule whose proposer keeps no other request's
    response runs once), and each one's first, later and run figures: (runs, projections, kept) by spacing."""
    price, _ = cell.price()
    cache = {} if cache is None else cache
    runs = {s: run_rules(rules, corpus, cell, host, cache, spacing=s) for s in spacings}
    visits = cell.regime.visits
    projected = {s: visit_projections(r, host, price, cell.regime.full_batch, visits) for s, r in runs.items()}
    kept = {s: {rule: visit_kept(run, visits) for rule, run in r.items()} for s, r in runs.items()}
    return runs, projected, kept


def visits_lines(corpus, cell, schedule, scale: int) -> str:
    """The header's lines on visits: the regime's, the other requests a gap serves, and what each cache holds."""
    regime = cell.regime
    spacing, steps = regime.steps_between_visits, len(schedule.steps_of(0, len(corpus.prompts) // 2))
    others = gap_visits(spacing, steps, schedule.prompts_per_step) * corpus.samples
    cached = cell.suffix_cache or SUFFIX_CACHED
    held = cached / regime.requests_per_engine
    fate = "none of its last visit is left" if held < spacing - 1 else "its last visit is still there"
    return (
        f"[at-scale] visits: {regime.describe_visits()}; between two visits of a prompt an engine serves "
        f"{max(spacing - 1, 0)} RL steps of other prompts' requests ({others:,} simulated responses a gap: the "
        "responses of the odd half of the corpus's prompts, which take turns, under identities of their own; the even "
        "half returns), unpriced\n"
        f"[at-scale] caches at that spacing: vLLM's suffix decoding keeps {cached:,} responses an engine, FIFO "
        f"({cell.suffix_cached(scale):,} simulated), {held:.0f} RL steps' worth: {fate}; our proposer's arena "
        "keeps every response up to its history_mb an engine (over the scale in the simulator), rebuilt past it "
        "from the newest, and the rollout registers a returning prompt's last visit again from the draft store; "
        f"{draft_store(corpus, regime, spacing).describe()}"
    )
