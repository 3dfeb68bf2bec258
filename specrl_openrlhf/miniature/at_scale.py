"""`python scripts/bench_at_scale.py`: every rule at RL scale in the simulator (`analysis.simulator`), on a recorded
corpus, priced where RL runs: a named GPU and model, every row's context, every cost.

Rules, on two paths:
- the engine path: stock (`off`), `lossless` verified in the engine (our proposer, `HistoryProposer`), vLLM's suffix
  decoding (`suffix`, arctic-inference's cache) and n-gram proposer (`ngram`), each driven as vLLM drives it, with
  a stand-in of the `VllmConfig` fields it reads and of the persistent batch (`sim_proposers`);
- the request path (`analysis.request_replay`): `lossless:requests` (its tree; `lossless:own`, `lossless:majority`
  too), `spec@1.65` and `exact` (lenience 1): scoring requests with prompt log-probs, then continuations that read
  the prefix cache, async scheduling kept. The ratio rules replay the corpus's scoring pass with seeded uniforms; the
  length of a continuation after their rejection is borrowed from the recorded response (an approximation).

Pricing (`pricing`), per engine step:
- modelled from measured kernels: the GPU's forward (`--gpu`, `--model`: `pricing.kernels.KernelStepModel`, from
  aiconfigurator's vLLM kernels) at the step's rows, tokens a row and each row's context, prefill and prompt
  log-probs' logits included; the KV cache's capacity bounds the rows a step runs. `--curve FILE` prices on a measured
  step curve instead (docs/gpu_step_h200.json: our plain-PyTorch H200 curve, at context 512 only);
- measured here: each proposer's own time as it runs (history updates included), and the engine's host time per
  step (on the tiny model, `--host-steps`), which stock and the request path overlap with the forward (async
  scheduling) and every model-free proposer pays on top.
Each rule is shown three ways against stock: `projected` (this machine's host time), `projected_async` (the host
hidden) and `breakeven_host_ms` (the host time of a full-batch step at which the rule ties stock). A projection: the
figures say what these schedules would cost on that GPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from ..analysis.corpus import Corpus
from ..analysis.request_replay import NoDrafts, request_workload
from ..analysis.simulator import EngineSimulator, Schedule, Simulation
from ..config import json_object
from ..pricing import measured, rules
from ..pricing.curves import HostCurve, describe
from ..pricing.kernels import GPUS, MODELS, KernelStepModel
from ..pricing.prices import load_price
from ..pricing.projection import Pricing, Projection, RuleCost, StepCosts, missing_field, project
from .corpus import PRESETS, named
from .host_steps import host_curve
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python scripts/bench_at_scale.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--corpus", default=GOAL["corpus"], help=f"{', '.join(PRESETS)} (shipped), or a file")
    parser.add_argument("--model", default=GOAL["model"], help=f"the model shape priced: {', '.join(MODELS)}")
    parser.add_argument("--gpu", default=GOAL["gpu"], help=f"the GPU priced: {', '.join(GPUS)}")
    parser.add_argument("--attention", default="once", choices=("once", "per_token"), help="a verification step's")
    parser.add_argument("--curve", default=None, help="price on a measured step curve file instead of kernels")
    parser.add_argument("--rules", default=",".join(RULES), help=f"off and any of {RULES[1:]} (or lossless:own, ...)")
    parser.add_argument("--max-num-seqs", type=int, default=512, help="the engine's rows (default: 512)")
    parser.add_argument("--prompts-per-step", type=int, default=32, help="prompts per RL step (default: 32)")
    parser.add_argument(
        "--prefix-caching",
        default="on",
        choices=("on", "off"),
        help="vLLM's prefix cache, for every rule (default: on, as the request path needs; OpenRLHF turns it on with "
        "--vllm.enable_prefix_caching)",
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=None,
        help="GPU rows each simulated row stands for (default: the RL step's requests scaled up to --max-num-seqs)",
    )
    parser.add_argument("--host-steps", default=None, help="a host step curve (default: measured here, cached)")
    parser.add_argument(
        "--suffix-cache",
        type=int,
        default=None,
        help="suffix decoding's cached responses (default: 1.2 RL steps' requests, as vLLM's 10,000 at 512 prompts "
        "x 16 samples a step)",
    )
    parser.add_argument("--params", type=json_object, default={}, metavar="JSON", help="lossless's parameters")
    parser.add_argument("--map", action="store_true", help="every corpus x model x GPU: the fastest rule and path")
    parser.add_argument("--validate", action="store_true", help="the simulator against the real engine")
    parser.add_argument("--visits", type=int, default=4, help="with --validate: visits of the prompts (default: 4)")
    args = parser.parse_args(argv)
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    if "off" not in args.rules:
        parser.error(f"--rules takes off and any of {', '.join(RULES[1:])}, got {','.join(args.rules)}")
    for flag, value, choices in (("--model", args.model, MODELS), ("--gpu", args.gpu, GPUS)):
        if value not in choices:
            parser.error(f"{flag} {value!r}: choose one of {', '.join(choices)}")
    try:
        args.schedule = Schedule(
            max_num_seqs=args.max_num_seqs,
            prompts_per_step=args.prompts_per_step,
            prefix_caching=args.prefix_caching == "on",
        )
        args.host = HostCurve.load(args.host_steps) if args.host_steps else None
        args.measured_curve = load_price(args.curve) if args.curve else None
        if args.validate:
            from .at_scale_validate import validated

            validated(args.rules)  # a rule it can't name: one error now, before the engines start
        else:
            args.loaded = load_corpus(args.corpus)
            for rule in args.rules:
                if rule not in ENGINE_RULES:
                    request_workload(rule, args.loaded)  # an unknown rule, or no scoring pass: one error now
    except ValueError as error:
        parser.error(str(error))
    try:
        from ..policies.builtin import LosslessParams

        args.lossless = LosslessParams(**args.params)
    except (TypeError, ValueError) as error:
        parser.error(f"--params: {error}")
    if "suffix" in args.rules:
        from .gpu_smoke import suffix_installed

        if not suffix_installed():
            parser.error("--rules suffix needs arctic-inference's suffix tree: bash scripts/install.sh builds it")
    return args


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


def step_price(args, model: str, gpu: str):
    """The GPU step price of `model` on `gpu` (or `--curve`'s), with the KV capacity of that model on that GPU."""
    try:
        kernel = KernelStepModel.build(gpu, model, args.attention)
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


def run_rules(args, corpus: Corpus, model: str, gpu: str, host: HostCurve, cache: dict) -> dict[str, RuleRun]:
    """Every rule of `args.rules` priced for `model` on `gpu`. A simulation is reused across prices where it does not
    depend on them (every rule but lossless, whose budget prices its drafts on the step price) and the KV capacity did
    not bind (`Simulation.peak_kv`)."""
    price, capacity = step_price(args, model, gpu)
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
            budget_price = price.with_host(host)  # lossless's budget prices a step's host time too
            sim, proposer = simulate(rule, corpus, schedule, budget_price, suffix_cache, params)
            cache[key] = (sim, proposer)
        runs[rule] = priced(sim, proposer, pricing)
    return runs


def rows_scale(args, corpus: Corpus) -> int:
    """GPU rows a simulated row stands for: `--scale`, else an RL step's requests scaled up to `--max-num-seqs`."""
    requests = min(args.schedule.prompts_per_step, len(corpus.prompts)) * corpus.samples
    return args.scale or max(1, args.schedule.max_num_seqs // requests)


def projections(runs: dict[str, RuleRun], pricing_host: HostCurve, price, full_rows: int) -> dict[str, Projection]:
    pricing = Pricing(price, host=pricing_host)
    return {rule: project(runs["off"].costs, r.costs, r.cost, pricing, full_rows) for rule, r in runs.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.validate:
        from .at_scale_validate import validate

        return validate(args)
    from .engine import machine

    started = time.perf_counter()
    corpus = args.loaded
    host = args.host or host_curve(None, progress=print)
    needed = step_history_bytes(corpus, args.schedule)
    if "lossless" in args.rules and needed > args.lossless.history_mb << 20:
        print(
            f"bench_at_scale.py: error: --params history_mb={args.lossless.history_mb} is too small for one RL step's "
            f"histories ({needed / 2**20:.1f} MiB); raise it",
            file=sys.stderr,
        )
        return 2
    if args.map:
        from .at_scale_map import run_map

        return run_map(args, corpus, host, started)
    price, capacity = step_price(args, args.model, args.gpu)
    scale = rows_scale(args, corpus)
    print(
        f"[at-scale] corpus {corpus.meta['path']}: {len(corpus.prompts)} prompts x {corpus.samples} samples x "
        f"{corpus.epochs} epochs ({corpus.meta.get('model', '?')}); RL steps of {args.schedule.prompts_per_step} "
        f"prompts, each simulated row standing for {scale} of the GPU's (at most {args.schedule.max_num_seqs}); KV "
        f"capacity {capacity:,} tokens ({args.model} on {args.gpu}); prefix caching {args.prefix_caching}\n"
        f"[at-scale] projected on {describe(price)}; host steps {host.describe()}; proposers timed on {machine()}"
    )
    runs = run_rules(args, corpus, args.model, args.gpu, host, {})
    result = projections(runs, host, price, args.schedule.max_num_seqs)
    print(at_scale_table(runs, result))
    saved = measured.save_proposer_costs(
        {rule: r.figures["proposer_fit"] for rule, r in runs.items() if rule in ENGINE_RULES[1:]}, machine()
    )
    print(f"[at-scale] proposer costs saved to {saved}")
    off = runs["off"]
    print(
        "RESULT "
        + "".join(
            f"{result[rule].fields(rule)} kept[{rule}]={r.figures['kept']:.3f} steps[{rule}]={r.figures['steps']} "
            for rule, r in runs.items()
        )
        + f"forward_s[off]={off.figures['gpu_s']:.3f} prefill_s[off]={off.prefill_s:.3f} "
        f"host_ms={result['off'].host_ms:.3f} {missing_field({k: p.missing for k, p in result.items()})} "
        f"corpus={args.corpus} model={args.model} gpu={args.gpu} price={'curve' if args.curve else 'kernels'} "
        f"scale={scale} prefix_caching={args.prefix_caching} "
        f"wall_s={time.perf_counter() - started:.0f}"
    )
    return 0


def at_scale_table(runs: dict[str, RuleRun], result: dict[str, Projection]) -> str:
    """Each rule's figures and its projection against stock, a markdown table."""
    lines = [
        "| rule | path | projected | projected_async | breakeven host ms | kept | steps | forward s | prefill s | "
        "host s | proposer s | proposer µs/row-step | tail | memory MB | previous epoch held |",
        "| --- | --- |" + " ---: |" * 13,
    ]
    for rule, r in runs.items():
        f, p = r.figures, result[rule]
        path = "stock" if rule == "off" else "engine" if rule in ENGINE_RULES else "requests"
        breakeven = "-" if rule == "off" else f"{p.breakeven_host_ms:.2f}"  # stock against itself: no tie to find
        lines.append(
            f"| {rule} | {path} | {p.projected:.2f} | {p.projected_async:.2f} | {breakeven} | {f['kept']:.1%} | "
            f"{f['steps']} | {f['gpu_s']:.2f} | {r.prefill_s:.2f} | {f['host_s']:.2f} | {f['proposer_s']:.2f} | "
            f"{f['proposer_us']:.2f} | {f['tail']:.1%} | {f['memory_mb']:.0f} | {f['found_previous']:.0%} |"
        )
    lines.append(
        f"host measured: {result['off'].host_ms:.2f} ms a full-batch step; breakeven: the host time at which the rule "
        "would tie stock (inf: wins at any; nan: loses at any)"
    )
    return "\n".join(lines)


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
