"""The rules of `bench_at_scale.py` run and priced (the package's docstring says what is simulated and how it is
priced): a shipped corpus loaded, each rule simulated once in a cell's regime, priced on its GPU's step price,
projected against stock, in total and for each drafted epoch, and the fastest rule picked. The command line (`cli`),
the map (`map`), the lenience curve (`lenience`) and the check against the engine (`validate`) build on it; it
imports none of them.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from ..miniature.corpus import PRESETS, named
from ..params import check_fields, check_value
from ..pricing import rule_figures
from ..pricing.curves import HostCurve, StepCurve, StepPrice
from ..pricing.kernels import GPUS, MODELS, KernelStepModel
from ..pricing.projection import Pricing, Projection, RuleCost, StepCosts, project
from ..simulator.corpus import Corpus
from ..simulator.engine import EngineSimulator, Schedule, Simulation
from ..simulator.regime import DEFAULT_REGIME, REGIMES, Regime
from ..simulator.request_workload import NoDrafts, request_workload
from ..simulator.visits import Gaps, Stored, StoreHeld, gap_visits, passes, subset
from .proposers import REMEMBERING, SUFFIX_CACHED, build
from .rules import BenchRule, bench_rule
from .store import draft_store

RULES = (  # by default; `engine=auto` is the installed vLLM's runner: `engine=v2` vLLM >= 0.34's GPU speculators
    "off",
    "lossless",
    "lossless,engine=v2",
    "lossless,verify=requests",
    "spec@1.65",
    "exact",
    "suffix",
    "suffix,engine=v2,adaptive=off",
    "suffix,engine=v2",
    "ngram",
)
GOAL = {"corpus": "long", "model": "qwen3-8b", "gpu": "h100", "regime": DEFAULT_REGIME}  # the paper's hardware


@dataclass(frozen=True, kw_only=True)
class Cell:
    """Where a verdict is read: a model on a GPU, in a regime (its engine and RL step), a verification step's
    attention read once or per token, and what every rule's run shares besides."""

    model: str = GOAL["model"]
    """The model shape priced (`pricing.kernels.MODELS`)."""
    gpu: str = GOAL["gpu"]
    """The GPU priced (`pricing.kernels.GPUS`)."""
    regime: Regime = REGIMES[DEFAULT_REGIME]
    """The engine and the RL step (`simulator.regime`)."""
    attention: Literal["once", "per_token"] = "once"
    """A verification step's attention: each row's cache read once (the lower bound) or per token (the upper)."""
    curve: StepCurve | KernelStepModel | None = None
    """A step price read from a file (`--curve`: a measured step curve), priced in place of the kernels; the KV
    capacity is still the kernels'."""
    suffix_cache: int | None = None
    """Suffix decoding's cached responses an engine (vLLM's `suffix_decoding_max_cached_requests`; None: its default,
    `proposers.SUFFIX_CACHED`), each simulated one standing for the regime's scale of them."""

    def __post_init__(self):
        check_fields(self)
        for name, value, choices in (("model", self.model, MODELS), ("gpu", self.gpu, GPUS)):
            if value not in choices:
                raise ValueError(f"--{name} {value!r}: choose one of {', '.join(choices)}")
        if self.suffix_cache is not None:
            check_value("--suffix-cache", self.suffix_cache, int, at_least=1)

    def kernels(self, attention: str | None = None) -> KernelStepModel:
        """The kernel step model of the cell's GPU and model, an engine without CUDA graphs' where the regime is one
        (`Regime.enforce_eager`: `KernelStepModel.with_eager`)."""
        try:
            model = KernelStepModel.build(self.gpu, self.model, attention or self.attention)
        except ModuleNotFoundError as error:
            raise SystemExit(f"bench_at_scale.py: error: {error}") from None
        return model.with_eager(True) if self.regime.enforce_eager else model

    def price(self, attention: str | None = None) -> tuple[StepPrice, int]:
        """The GPU's step price (the curve's where given, else the kernels' with a verification step's attention
        read `attention` times, default `self.attention`) and the KV tokens the regime's engine holds."""
        kernel = self.kernels(attention)
        return self.curve or kernel, kernel.kv_capacity_at(self.regime.gpu_memory_utilization)

    def schedule(self, corpus: Corpus) -> tuple[Schedule, int]:
        """The simulator's schedule for `corpus`'s returning prompts (`visits.passes`: half of them; the fewest where
        passes differ) in this cell's regime, and the scale it runs at."""
        _, capacity = self.price()
        prompts = min(len(returning) for returning, _ in passes(len(corpus.prompts)))
        scale = self.regime.scale(corpus.samples, prompts)
        return self.regime.schedule(corpus.samples, prompts, capacity), scale

    def suffix_cached(self, scale: int) -> int:
        """Suffix decoding's cached responses in simulated ones."""
        return max(1, math.ceil((self.suffix_cache or SUFFIX_CACHED) / scale))

    def at(self, **changed) -> Cell:
        return replace(self, **changed)


@dataclass
class RuleRun:
    """One rule's simulation, priced: its figures, its steps' costs (and each step's epoch), what it pays besides the
    forward, its kept share of each epoch, and the rule (its path)."""

    figures: dict
    costs: StepCosts
    cost: RuleCost
    prefill_s: float
    epochs: np.ndarray  # [S] the corpus's epoch of each step
    rl_steps: np.ndarray  # [S] the RL step of each step
    kept_by_epoch: dict[int, float]
    scoring_s: np.ndarray  # [S] the part of each step's forward its scoring requests cost (the request path)
    drafted_tokens: int  # its response tokens in the drafted epochs (every epoch but the first), kept or generated
    rule: BenchRule
    kept_tokens: dict[int, tuple[int, int]] = field(default_factory=dict)  # epoch: (kept, all its response tokens)


def load_corpus(name: str, max_response_tokens: int | None = None) -> Corpus:
    """A shipped corpus by name, or a corpus file, its responses cut at `max_response_tokens` (None: as recorded); a
    missing one says how to record it."""
    if name in PRESETS:
        path = named(name)
        if not path.is_file():
            raise ValueError(f"--corpus {name}: {path} is missing: python -m specrl_openrlhf.miniature.corpus {name}")
    else:
        path = name
    corpus = Corpus.load(path)
    if max_response_tokens is not None:
        corpus = corpus.truncated(max_response_tokens)
    return replace(corpus, meta={**corpus.meta, "path": str(path)})


def simulate(
    rule: BenchRule,
    corpus: Corpus,
    schedule: Schedule,
    price,
    suffix_cache: int,
    cost_scale: int,
    gaps: Gaps | None = None,
    store: StoreHeld | None = None,
    progress=None,
) -> tuple:
    """One rule's simulation on `schedule`: its proposer in the engine (`proposers.build`, its budget priced on
    `price` at `cost_scale`), stock, or the request path's workload (a stateful rule updated once an RL step), the
    other requests of `gaps` before each epoch and the draft store's answers (`store`) where given."""
    store = store or StoreHeld()
    if rule.path == "requests":
        step_samples = schedule.prompts_per_step * corpus.samples
        proposer = NoDrafts()
        workload = Stored(request_workload(rule.policy, corpus, update_every=step_samples), store)
    else:
        proposer, workload = build(rule.policy, corpus, schedule, price, suffix_cache, cost_scale, store), None
    if progress is None:
        steps = sum(len(schedule.steps_of(e, len(corpus.prompts))) for e in range(corpus.epochs))
        progress = _bar(rule.label, steps)
    sim = EngineSimulator(corpus, schedule, proposer, workload=workload, gaps=gaps).run(progress=progress)
    return sim, proposer


def simulate_visits(
    rule: BenchRule, corpus: Corpus, schedule: Schedule, price, suffix_cache: int, scale: int, spacing: int, store
) -> tuple[Simulation, Proposers]:
    """`simulate` with a prompt back `spacing` RL steps after its visit: in each pass (`visits.passes`) its returning
    prompts return while the others' requests fill the gaps (`visits.Gaps`), the passes merged."""
    parts, proposers, done = [], [], 0
    epoch_steps = [len(schedule.steps_of(0, len(returning))) for returning, _ in passes(len(corpus.prompts))]
    bar = _bar(rule.label, sum(epoch_steps) * corpus.epochs)
    for (returning, others), steps in zip(passes(len(corpus.prompts)), epoch_steps):
        gaps = Gaps(corpus, others, gap_visits(spacing, steps, schedule.prompts_per_step), schedule.seed)
        sim, proposer = simulate(
            rule,
            subset(corpus, returning),
            schedule,
            price,
            suffix_cache,
            scale,
            gaps,
            store,
            progress=lambda step, before=done: bar(before + step),
        )
        done += steps * corpus.epochs
        parts.append(sim)
        proposers.append(proposer)
    print()
    return Simulation.merged(parts), Proposers.of(proposers)


@dataclass(frozen=True)
class Proposers:
    """What `rule_run` reads of a rule's proposers over the passes of `simulate_visits` (kept without them: a
    proposer's caches are let go): its scheduling, the most memory one held, and a GPU speculator's kernels launched
    a step (`gpu_kernels`, the passes' in order; None for the others), their price model and its note."""

    async_scheduling: bool
    memory: int
    gpu_kernels: list | None = None
    kernels: object = None
    note: str = ""

    @staticmethod
    def of(proposers: list) -> Proposers:
        launched = [getattr(p, "gpu_kernels", None) for p in proposers]
        return Proposers(
            proposers[0].async_scheduling,
            max(p.memory_bytes() for p in proposers),
            None if launched[0] is None else [step for steps in launched for step in steps],
            getattr(proposers[0], "kernels", None),
            getattr(proposers[0], "note", ""),
        )

    def memory_bytes(self) -> int:
        return self.memory


def rule_run(rule: BenchRule, sim: Simulation, proposer, pricing: Pricing) -> RuleRun:
    """A simulated rule on `pricing`: its figures (`pricing.rule_figures`), costs, and its prefill seconds."""
    columns = {name: sim.column(name) for name in (*rule_figures.COLUMNS, *rule_figures.OPTIONAL)}
    launched = getattr(proposer, "gpu_kernels", None)
    if launched is not None:  # a GPU speculator: its kernels' GPU time, estimated, not this machine's time
        seconds = proposer.kernels.seconds(launched)
        columns |= {"proposer_s": seconds, "register_s": np.zeros_like(seconds)}
    costs = rule_figures.simulated_costs(columns, pricing)
    found = float(np.mean(sim.found_previous)) if sim.found_previous else math.nan
    figures = rule_figures.figures(columns, costs, proposer.async_scheduling) | {
        "kept": sim.kept,
        "found_previous": found,
    }
    figures["memory_mb"] = proposer.memory_bytes() * pricing.scale / 2**20  # an engine's: the simulated one's x scale
    figures["proposer_priced"] = proposer.kernels.source if launched is not None else "measured here"
    figures["note"] = getattr(proposer, "note", "")  # what the simulation changed of the rule
    fit = figures["proposer_fit"]  # measured here: never missing
    cost = RuleCost(proposer.async_scheduling, fit["row_us"], fit["base_us"])
    kept = {epoch: sim.kept_in(epoch) for epoch in sorted(sim.epoch_tokens)}
    drafted = sum(tokens + outside for epoch, (tokens, outside) in sim.epoch_tokens.items() if epoch > 0)
    return RuleRun(
        figures,
        costs,
        cost,
        rule_figures.prefill_seconds(columns, pricing, costs),
        sim.column("epoch"),
        sim.column("rl_step"),
        kept,
        rule_figures.scoring_seconds(columns, pricing, costs),
        drafted,
        rule,
        {epoch: sim.kept_tokens(epoch) for epoch in sorted(sim.epoch_tokens)},
    )


def run_rules(
    rule_names: list[str], corpus: Corpus, cell: Cell, host: HostCurve | None, cache: dict, spacing: int | None = None
) -> dict[str, RuleRun]:
    """Every rule of `rule_names` (spellings, `rules.bench_rule`) priced in `cell`, by its spelling, a prompt back
    `spacing` RL steps after its visit (None: the regime's, `Regime.steps_between_visits`). Lossless's budget drafts
    on the `once` price whatever the cell's attention, so another attention prices the same simulations. A simulation
    is reused (`cache`) where it does not depend on the price (`BenchRule.drafts_on_price`: our V1 proposer's budget,
    vLLM's adaptive verification), the regime and KV capacity are the same (a capacity above `Simulation.peak_kv`
    changes nothing), and the spacing is, or does not matter (a proposer that keeps no other request's response) and
    the draft store holds as much."""
    price, _ = cell.price()
    budget, _ = cell.price("once")
    schedule, scale = cell.schedule(corpus)
    spacing = cell.regime.steps_between_visits if spacing is None else spacing
    store = StoreHeld(draft_store(corpus, cell.regime, spacing).held_share)
    pricing = Pricing(price, scale=scale, host=host)
    engine = replace(schedule, kv_capacity_tokens=None)  # the key: all but the capacity, checked against the peak
    runs = {}
    for label in rule_names:
        rule = bench_rule(label)
        eager = cell.regime.enforce_eager
        priced = (cell.model, cell.gpu, eager) if rule.drafts_on_price(eager) else None
        spaced = spacing if rule.method in REMEMBERING else None
        stored = store if rule.path == "requests" or rule.method in ("lossless", "lossless_v2") else None
        key = (label, engine, priced or (eager if rule.adaptive_verification else None), spaced, stored)
        key += (cell.suffix_cached(scale),) if rule.method == "suffix" else ()
        sim, proposer = cache.get(key, (None, None))
        if sim is None or sim.peak_kv > (schedule.kv_capacity_tokens or math.inf):
            budget_price = budget.with_host(host)  # lossless's budget prices a step's host time too
            # lossless's budget prices a row as the GPU's `scale` rows
            sim, proposer = simulate_visits(
                rule, corpus, schedule, budget_price, cell.suffix_cached(scale), scale, spacing, store
            )
            cache[key] = (sim, proposer)
        runs[label] = rule_run(rule, sim, proposer, pricing)
    return runs


def projections(runs: dict[str, RuleRun], host: HostCurve | None, price, full_rows: int) -> dict[str, Projection]:
    """Each rule against stock (`runs["off"]`) on `price`, with the host measured, hidden and absent; a full batch
    is `full_rows` of the GPU's rows."""
    pricing = Pricing(price, host=host)
    return {rule: project(runs["off"].costs, r.costs, r.cost, pricing, full_rows) for rule, r in runs.items()}


def epoch_projections(
    runs: dict[str, RuleRun], host: HostCurve | None, price, full_rows: int
) -> dict[int, dict[str, Projection]]:
    """`projections` of each drafted epoch's steps alone (every epoch but the first), so a break shows where it is
    read."""
    pricing, stock = Pricing(price, host=host), runs["off"]
    out = {}
    for epoch in sorted(set(stock.epochs.tolist()) - {0}):
        base = stock.costs.take(stock.epochs == epoch)
        out[epoch] = {
            rule: project(base, r.costs.take(r.epochs == epoch), r.cost, pricing, full_rows)
            for rule, r in runs.items()
        }
    return out


def fastest(result: dict[str, Projection], reading: str, candidates=None) -> tuple[str, float]:
    """The fastest of `candidates` (default: every rule of `result`, stock included) by `reading` (`projected`: the
    host measured; `projected_async`: hidden; `projected_no_host`: none), and its margin: its speedup over the
    runner-up's (NaN: no runner-up).

    >>> from specrl_openrlhf.pricing.projection import Projection
    >>> figures = (("off", 1.0, 1.0), ("x", 1.2, 0.9), ("y", 0.6, 1.5))
    >>> p = {rule: Projection(a, b, 0.0, True, 1, 1, 1, 1) for rule, a, b in figures}
    >>> fastest(p, "projected"), fastest(p, "projected_async")
    (('x', 1.2), ('y', 1.5))
    """
    ranked = sorted(candidates or result, key=lambda r: getattr(result[r], reading), reverse=True)
    if len(ranked) < 2:
        return ranked[0], math.nan
    return ranked[0], getattr(result[ranked[0]], reading) / getattr(result[ranked[1]], reading)


def _bar(rule: str, total: int):
    def progress(done: int) -> None:
        filled = int(30 * done / max(total, 1))
        print(f"\r[at-scale] {rule:<17} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} RL steps", end="")
        sys.stdout.flush()

    return progress
