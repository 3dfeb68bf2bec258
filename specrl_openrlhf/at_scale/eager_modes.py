"""Each rule with CUDA graphs and without (`enforce_eager`), in one cell: what stock loses without them, and what each
rule gains over stock in either engine (`mode_comparison`, printed by `mode_table`, `mode_fields` for RESULT).

The cell's own mode is its regime's; the other is the same regime with `enforce_eager` flipped, every rule's
simulation reused where it does not depend on the price (`run.run_rules`'s cache) and run again where it does (our
proposer's budget, vLLM's adaptive verification, which an engine without CUDA graphs does not have). A projection,
as every figure of `bench_at_scale.py`: an eager step is priced by `pricing.eager`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..markdown import numbers, table
from ..pricing.projection import Projection
from ..simulator.corpus import Corpus
from .run import Cell, RuleRun, run_rules
from .spacing import visit_kept, visit_projections

MODES = {False: "graphs", True: "eager"}
VISITS = {"first": "a prompt's first visit", "later": "a prompt's later visits", "run": "the run's mix of visits"}


@dataclass
class Modes:
    """Each rule's projection against stock in each mode (`projected[eager]`, by rule) and its kept share, and
    stock's seconds in each."""

    projected: dict[bool, dict[str, Projection]]
    kept: dict[bool, dict[str, float]]  # each rule's kept share of its response tokens, in each mode
    part: str = "run"  # the visits compared (`spacing.PARTS`)

    def stock_s(self, eager: bool) -> float:
        """Stock's projected seconds (it keeps async scheduling: the host hidden either way)."""
        return self.projected[eager]["off"].stock_s

    @property
    def stock_loss(self) -> float:
        """Stock's time without CUDA graphs over its time with them."""
        return self.stock_s(True) / self.stock_s(False)

    def rule_loss(self, rule: str, reading: str = "projected") -> float:
        """The rule's own time without CUDA graphs over its time with them (`reading`: the host measured or hidden)."""
        seconds = {
            eager: p[rule].rule_s if reading == "projected" else p[rule].rule_async_s
            for eager, p in self.projected.items()
        }
        return seconds[True] / seconds[False]


def mode_comparison(
    rules: list[str], corpus: Corpus, cell: Cell, host, cache: dict, runs: dict[str, RuleRun], part: str
) -> Modes:
    """`rules` in `cell`'s mode (`runs`: at the regime's spacing) and in the other, on the same corpus, each on the
    visits `part` names (`spacing.PARTS`: the first visit, the later ones, or the run's mix)."""
    other = cell.at(regime=replace(cell.regime, enforce_eager=not cell.regime.enforce_eager))
    other_runs = run_rules(rules, corpus, other, host, cache)
    projected, kept = {}, {}
    for c, r in ((cell, runs), (other, other_runs)):
        price, _ = c.price()
        eager = c.regime.enforce_eager
        projected[eager] = visit_projections(r, host, price, c.regime.full_batch, c.regime.visits)[part]
        kept[eager] = {rule: visit_kept(run, c.regime.visits)[part] for rule, run in r.items()}
    return Modes(projected, kept, part)


def mode_table(modes: Modes) -> str:
    """Each rule against stock in each mode and its own time eager over with graphs, a markdown table, stock's too."""
    head = ["rule", "kept, graphs", "x stock, graphs", "host hidden", "kept, eager", "x stock, eager", "host hidden"]
    head += ["eager / graphs", "hidden"]
    rows = []
    for rule in modes.projected[False]:
        graphs, eager = modes.projected[False][rule], modes.projected[True][rule]
        rows.append(
            [rule, f"{modes.kept[False][rule]:.1%}", f"{graphs.projected:.2f}", f"{graphs.projected_async:.2f}"]
            + [f"{modes.kept[True][rule]:.1%}", f"{eager.projected:.2f}", f"{eager.projected_async:.2f}"]
            + [f"{modes.rule_loss(rule):.3f}", f"{modes.rule_loss(rule, 'async'):.3f}"]
        )
    return (
        f"each rule with CUDA graphs and without (enforce_eager), on {VISITS[modes.part]}, each against stock in the "
        "same engine; eager / graphs: the rule's own time without CUDA graphs over its time with them\n"
        + table(head, rows, numbers(1, len(head)))
        + f"\nstock without CUDA graphs takes {modes.stock_loss:.3f}x its time with them "
        f"({modes.stock_s(True):.2f} s against {modes.stock_s(False):.2f} s)"
    )


def mode_fields(modes: Modes) -> str:
    """`stock_eager_over_graphs=.. projected_graphs[RULE]=.. projected_async_graphs[RULE]=.. kept_graphs[RULE]=..`
    and the same `_eager` for a RESULT line."""
    fields = [f"stock_eager_over_graphs={modes.stock_loss:.4f} modes_visits={modes.part}"]
    for eager, projected in sorted(modes.projected.items()):
        mode = MODES[eager]
        fields += [
            f"projected_{mode}[{rule}]={p.projected:.3f} projected_async_{mode}[{rule}]={p.projected_async:.3f} "
            f"kept_{mode}[{rule}]={modes.kept[eager][rule]:.3f}"
            for rule, p in projected.items()
            if rule != "off"
        ]
    return " ".join(fields)
