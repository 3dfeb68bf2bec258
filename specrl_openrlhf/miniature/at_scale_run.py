"""The rules of `bench_at_scale.py` run and priced (`miniature.at_scale`'s docstring says what is simulated and how it
is priced): a shipped corpus loaded, each rule simulated once on a schedule, priced on a GPU step price, projected
against stock, and the fastest rule picked. The command line (`at_scale`), the map (`at_scale_map`), the lenience
curve (`at_scale_lenience`) and the check against the engine (`at_scale_validate`) build on it; it imports none of
them.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from ..analysis.corpus import Corpus
from ..analysis.request_replay import NoDrafts, request_workload
from ..analysis.simulator import EngineSimulator, Schedule, Simulation
from ..pricing import rules
from ..pricing.curves import HostCurve
from ..pricing.kernels import KernelStepModel
from ..pricing.projection import Pricing, Projection, RuleCost, StepCosts, project
from .corpus import PRESETS, named
from .sim_proposers import build

ENGINE_RULES = ("off", "lossless", "suffix", "ngram")
RULES = ("off", "lossless", "lossless:requests", "spec@1.65", "exact", "suffix", "ngram")
GOAL = {"corpus": "long", "model": "qwen3-8b", "gpu": "h100"}  # the paper's hardware, its middle model


@dataclass
class RuleRun:
    """One rule's simulation, priced: its figures, its steps' costs, what it pays besides the forward."""

    figures: dict
    costs: StepCosts
    cost: RuleCost
    prefill_s: float


def load_corpus(name: str) -> Corpus:
    """A shipped corpus by name, or a corpus file; a missing one says how to record it."""
    if name in PRESETS:
        path = named(name)
        if not path.is_file():
            raise ValueError(f"--corpus {name}: {path} is missing: python -m specrl_openrlhf.miniature.corpus {name}")
    else:
        path = name
    corpus = Corpus.load(path)
    return replace(corpus, meta={**corpus.meta, "path": str(path)})


def step_price(args, model: str, gpu: str, attention: str | None = None):
    """The GPU step price of `model` on `gpu` (or `--curve`'s), with the KV capacity of that model on that GPU; a
    verification step's attention read `attention` times (default: `--attention`)."""
    try:
        kernel = KernelStepModel.build(gpu, model, attention or args.attention)
    except ModuleNotFoundError as error:
        raise SystemExit(f"bench_at_scale.py: error: {error}") from None
    return args.measured_curve or kernel, kernel.kv_capacity_tokens


def simulate(rule: str, corpus: Corpus, schedule: Schedule, price, suffix_cache: int, params: dict) -> tuple:
    """One rule's simulation on `schedule` (a proposer in the engine, or the request path's workload)."""
    if rule in ENGINE_RULES:
        proposer = build(rule, corpus, schedule, price, suffix_cache, params)
        workload = None
    else:
        proposer, workload = NoDrafts(), request_workload(rule, corpus)
    steps = sum(len(schedule.steps_of(e, len(corpus.prompts))) for e in range(corpus.epochs))
    sim = EngineSimulator(corpus, schedule, proposer, workload=workload).run(progress=_bar(rule, steps))
    print()
    return sim, proposer


def priced(sim: Simulation, proposer, pricing: Pricing) -> RuleRun:
    """A simulated rule on `pricing`: its figures (`pricing.rules`), costs, and the prefill's share of its forward."""
    columns = {name: sim.column(name) for name in (*rules.COLUMNS, *rules.OPTIONAL)}
    costs = rules.simulated_costs(columns, pricing)
    found = float(np.mean(sim.found_previous)) if sim.found_previous else math.nan
    figures = rules.figures(columns, costs, proposer.async_scheduling) | {"kept": sim.kept, "found_previous": found}
    figures["memory_mb"] = proposer.memory_bytes() / 2**20
    fit = figures["proposer_fit"]  # measured here: never missing
    cost = RuleCost(proposer.async_scheduling, fit["row_us"], fit["base_us"])
    return RuleRun(figures, costs, cost, rules.prefill_seconds(columns, pricing, costs))


def run_rules(
    args, corpus: Corpus, model: str, gpu: str, host: HostCurve, cache: dict, attention: str | None = None
) -> dict[str, RuleRun]:
    """Every rule of `args.rules` priced for `model` on `gpu`, a verification step's cache read as `attention`
    (default `--attention`; lossless's budget drafts on `--attention`'s price either way, so another `attention`
    prices the same simulations). A simulation is reused across prices where it does not depend on them (every rule
    but lossless, whose budget prices its drafts on the step price) and the KV capacity did not bind
    (`Simulation.peak_kv`)."""
    price, capacity = step_price(args, model, gpu, attention)
    budget = step_price(args, model, gpu)[0] if attention else price
    scale = rows_scale(args, corpus)
    schedule = args.schedule.scaled(scale, capacity)  # a row's KV and tokens: the GPU's over `scale`
    suffix_cache = args.suffix_cache or math.ceil(1.2 * schedule.prompts_per_step * corpus.samples)
    pricing = Pricing(price, scale=scale, host=host)
    params = {**args.params, "cost_scale": scale}  # lossless's budget prices a row as the GPU's `scale` rows
    runs = {}
    for rule in args.rules:
        key = (rule, (model, gpu) if rule == "lossless" else None)
        sim, proposer = cache.get(key, (None, None))
        if sim is None or sim.peak_kv > schedule.kv_capacity_tokens:
            budget_price = budget.with_host(host)  # lossless's budget prices a step's host time too
            sim, proposer = simulate(rule, corpus, schedule, budget_price, suffix_cache, params)
            cache[key] = (sim, proposer)
        runs[rule] = priced(sim, proposer, pricing)
    return runs


def rows_scale(args, corpus: Corpus) -> int:
    """GPU rows a simulated row stands for: `--scale`, else an RL step's requests scaled up to `--max-num-seqs`."""
    requests = min(args.schedule.prompts_per_step, len(corpus.prompts)) * corpus.samples
    return args.scale or max(1, args.schedule.max_num_seqs // requests)


def projections(runs: dict[str, RuleRun], pricing_host: HostCurve, price, full_rows: int) -> dict[str, Projection]:
    """Each rule against stock (`runs["off"]`) on `price`, with the host measured and with it hidden."""
    pricing = Pricing(price, host=pricing_host)
    return {rule: project(runs["off"].costs, r.costs, r.cost, pricing, full_rows) for rule, r in runs.items()}


def fastest(result: dict[str, Projection], reading: str, candidates=None) -> tuple[str, float]:
    """The fastest of `candidates` (default: every rule of `result`, stock included) by `reading` (`projected`: the
    host measured; `projected_async`: hidden), and its margin: its speedup over the runner-up's (NaN: no runner-up).

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


def step_history_bytes(corpus: Corpus, schedule: Schedule) -> int:
    """The arena bytes the largest RL step's previous-epoch histories take (`Arena.BYTES_PER_NODE` a token)."""
    from ..integration.vllm.arena import Arena

    largest = 0
    for epoch in range(1, corpus.epochs):
        for prompts in schedule.steps_of(epoch, len(corpus.prompts)):
            tokens = sum(len(r) for p in prompts for r in corpus.responses[epoch - 1][p])
            largest = max(largest, tokens)
    return largest * Arena.BYTES_PER_NODE


def _bar(rule: str, total: int):
    def progress(done: int) -> None:
        filled = int(30 * done / max(total, 1))
        print(f"\r[at-scale] {rule:<17} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} RL steps", end="")
        sys.stdout.flush()

    return progress
