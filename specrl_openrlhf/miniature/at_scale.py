"""`python scripts/bench_at_scale.py`: `lossless` at RL scale, in the simulator (`analysis.simulator`), against stock,
vLLM's suffix decoding and n-gram proposer, every cost counted.

The real proposers run here as vLLM drives them, on a recorded corpus (`corpus`): our engine proposer
(`HistoryProposer`, its histories registered as the rollout registers them: the prompt's previous epoch when its visit
starts, each finished sample after), vLLM's `SuffixDecodingProposer` (arctic-inference's cache) and `NgramProposer`,
each built from a stand-in of the `VllmConfig` fields it reads and called with a stand-in of the persistent batch.
Per engine step the simulator records the rows, the tokens they carried, the prefill, the drafts verified and accepted
and the proposer's wall time here. Pricing (`pricing.rules`, on `pricing.projection.step_costs`):
- measured on a GPU: the forward, on the step curve (`--curve`, an H200's by default) at the step's rows and mean
  tokens per row; prefill on the curve's prefill column where it has one (else modelled at its per-token slope);
- measured here: the proposer's own time, history updates included (it runs serially in vLLM);
- measured here, on the tiny model: the engine's host time per step (`--host-steps`), which stock overlaps with the
  forward (async scheduling) and every model-free proposer pays on top (vLLM turns async scheduling off for them).
A projection: the figures say what these schedules would cost on that GPU. Each rule is shown three ways against
stock (`pricing.projection.project`): `projected` (the host measured here, paid serially where the rule turns async
scheduling off), `projected_async` (the host hidden, as a drafter that kept async scheduling would get) and
`breakeven_host_ms` (the host time of a full-batch step at which the rule would tie stock).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..analysis.corpus import Corpus
from ..analysis.simulator import EngineSimulator, Schedule, Simulation
from ..config import json_object
from ..pricing import measured, rules
from ..pricing.curves import HostCurve, StepCurve, describe
from ..pricing.projection import Pricing, RuleCost, StepCosts, missing_field, project
from .corpus import CorpusSettings, cached_or_recorded
from .host_steps import host_curve
from .sim_proposers import build

DEFAULT_CURVE = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"
RULES = ("off", "lossless", "suffix", "ngram")


def sim_columns(sim: Simulation) -> dict[str, np.ndarray]:
    """The simulator's records as the columns `pricing.rules` reads (the decode context where they carry it)."""
    columns = {name: sim.column(name) for name in rules.COLUMNS}
    for name in rules.OPTIONAL:
        if sim.records and hasattr(sim.records[0], name):
            columns[name] = sim.column(name)
    return columns


def rule_figures(sim: Simulation, pricing: Pricing, async_scheduling: bool) -> tuple[dict, StepCosts]:
    """A rule's figures (`pricing.rules.figures`, with the share it kept and its previous epochs found) and its
    steps' costs."""
    columns = sim_columns(sim)
    costs = rules.simulated_costs(columns, pricing)
    found = float(np.mean(sim.found_previous)) if sim.found_previous else math.nan
    return rules.figures(columns, costs, async_scheduling) | {"kept": sim.kept, "found_previous": found}, costs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python scripts/bench_at_scale.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rules", default=",".join(RULES), help=f"off and any of {RULES[1:]}")
    parser.add_argument("--max-num-seqs", type=int, default=512, help="the engine's rows (default: 512)")
    parser.add_argument("--prompts-per-step", type=int, default=32, help="prompts per RL step (default: 32)")
    parser.add_argument("--curve", default=str(DEFAULT_CURVE), help="a GPU's step curve (default: the H200's)")
    parser.add_argument(
        "--prefill",
        choices=("auto", "measured"),
        default="auto",
        help="auto: the curve's prefill column where it has one, else prefill modelled at its token slope; "
        "measured: refuse a curve without one",
    )
    parser.add_argument("--host-steps", default=None, help="a host step curve (default: measured here, once)")
    parser.add_argument("--corpus", default=None, help="a corpus file (default: recorded once into the cache)")
    parser.add_argument("--prompts", type=int, default=CorpusSettings.prompts, help="the corpus's prompts")
    parser.add_argument("--samples", type=int, default=CorpusSettings.samples, help="its samples per prompt")
    parser.add_argument("--epochs", type=int, default=CorpusSettings.epochs, help="its epochs")
    parser.add_argument(
        "--suffix-cache",
        type=int,
        default=None,
        help="suffix decoding's cached responses (default: 1.2 RL steps' requests, as vLLM's 10,000 at 512 prompts "
        "x 16 samples a step)",
    )
    parser.add_argument(
        "--params",
        type=json_object,
        default={},
        metavar="JSON",
        help="lossless's parameters (as --reuse.params), e.g. '{\"min_match\": 3}': an ablation is a switch",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="the simulator against the real engine at bench_real_model's size (3 prompts x 8 samples), for off, "
        "lossless and suffix, on the same prompts and weights",
    )
    parser.add_argument("--visits", type=int, default=4, help="with --validate: visits of the prompts (default: 4)")
    args = parser.parse_args(argv)
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    if "off" not in args.rules or set(args.rules) - set(RULES):
        parser.error(f"--rules takes off and any of {', '.join(RULES[1:])}, got {','.join(args.rules)}")
    try:
        args.gpu_curve = StepCurve.load(args.curve)
        args.schedule = Schedule(max_num_seqs=args.max_num_seqs, prompts_per_step=args.prompts_per_step)
        args.corpus_settings = CorpusSettings(prompts=args.prompts, samples=args.samples, epochs=args.epochs)
        args.host = HostCurve.load(args.host_steps) if args.host_steps else None
        if args.corpus:
            args.loaded = Corpus.load(args.corpus)
    except ValueError as error:
        parser.error(str(error))
    if args.prefill == "measured" and not args.gpu_curve.prefill_measured:
        parser.error(
            f"--curve {args.curve} has no prefill column: measure one (scripts/bench_gpu_step.py --prefill) or drop "
            "--prefill measured (prefill is then modelled at the curve's token slope)"
        )
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


def step_history_bytes(corpus: Corpus, schedule: Schedule) -> int:
    """The arena bytes the largest RL step's previous-epoch histories take (`Arena.BYTES_PER_NODE` a token)."""
    from ..integration.vllm.arena import Arena

    largest = 0
    for epoch in range(1, corpus.epochs):
        for prompts in schedule.steps_of(epoch, len(corpus.prompts)):
            tokens = sum(len(r) for p in prompts for r in corpus.responses[epoch - 1][p])
            largest = max(largest, tokens)
    return largest * Arena.BYTES_PER_NODE


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.validate:
        return validate(args)
    from .engine import machine

    started = time.perf_counter()
    corpus = getattr(args, "loaded", None) or cached_or_recorded(args.corpus_settings, progress=print)
    host = args.host or host_curve(None, progress=print)
    schedule = args.schedule
    needed = step_history_bytes(corpus, schedule)
    if "lossless" in args.rules and needed > args.lossless.history_mb << 20:
        print(
            f"bench_at_scale.py: error: --params history_mb={args.lossless.history_mb} is too small for one RL step's "
            f"histories ({needed / 2**20:.1f} MiB); raise it",
            file=sys.stderr,
        )
        return 2
    requests = schedule.prompts_per_step * corpus.samples
    suffix_cache = args.suffix_cache or math.ceil(1.2 * requests)
    pricing = Pricing(args.gpu_curve, host=host)
    args.gpu_curve = args.gpu_curve.with_host(host)  # lossless's budget prices a step's host time too
    print(
        f"[at-scale] corpus: {len(corpus.prompts)} prompts x {corpus.samples} samples x {corpus.epochs} epochs "
        f"({corpus.meta.get('model', '?')}); RL steps of {schedule.prompts_per_step} prompts ({requests} requests) "
        f"on {schedule.max_num_seqs} rows; suffix cache {suffix_cache} responses\n"
        f"[at-scale] projected on {describe(pricing.curve)}, prefill "
        f"{'measured' if pricing.prefill == 'measured' else 'modelled at the curve token slope'}; host steps "
        f"{host.describe()}; proposers timed on {machine()}"
    )
    results, costs = {}, {}
    for rule in args.rules:
        proposer = build(rule, corpus, schedule, args.gpu_curve, suffix_cache, args.params)
        steps_total = sum(len(schedule.steps_of(e, len(corpus.prompts))) for e in range(corpus.epochs))
        bar = _bar(rule, steps_total)
        sim = EngineSimulator(corpus, schedule, proposer).run(progress=bar)
        print()
        results[rule], costs[rule] = rule_figures(sim, pricing, proposer.async_scheduling)
        results[rule]["memory_mb"] = proposer.memory_bytes() / 2**20
        fit = results[rule]["proposer_fit"]  # measured here: never missing
        results[rule]["cost"] = RuleCost(proposer.async_scheduling, fit["row_us"], fit["base_us"])
    projections = {
        rule: project(costs["off"], costs[rule], f["cost"], pricing, schedule.max_num_seqs)
        for rule, f in results.items()
    }
    print(at_scale_table(results, projections))
    saved = measured.save_proposer_costs(
        {rule: f["proposer_fit"] for rule, f in results.items() if rule != "off"}, machine()
    )
    print(f"[at-scale] proposer costs saved to {saved}")
    missing = {rule: p.missing for rule, p in projections.items()}
    print(
        "RESULT "
        + "".join(
            f"{projections[rule].fields(rule) if rule != 'off' else 'projected[off]=1.000'} "
            f"proposer_us[{rule}]={f['proposer_us']:.2f} "
            f"kept[{rule}]={f['kept']:.3f} "
            for rule, f in results.items()
        )
        + f"host_ms={projections['off'].host_ms:.3f} {missing_field(missing)} prefill={pricing.prefill} "
        f"wall_s={time.perf_counter() - started:.0f}"
    )
    return 0


def at_scale_table(results: dict[str, dict], projections: dict) -> str:
    """Each rule's figures and its projection against stock (`pricing.projection.Projection`), a markdown table."""
    lines = [
        "| rule | projected speedup | with the host hidden | breakeven host ms (full batch) | forward s | host s | "
        "proposer s | proposer µs/row-step (full batch; all) | kept | steps | tail | memory MB "
        "| previous epoch held |",
        "| --- |" + " ---: |" * 12,
    ]
    for rule, f in results.items():
        p = projections[rule]
        breakeven = "-" if rule == "off" else f"{p.breakeven_host_ms:.2f}"  # stock against itself: no tie to find
        lines.append(
            f"| {rule} | {p.projected:.2f} | {p.projected_async:.2f} | {breakeven} | {f['gpu_s']:.2f} | "
            f"{f['host_s']:.2f} | {f['proposer_s']:.2f} | {f['proposer_us']:.2f}; {f['proposer_us_all']:.2f} | "
            f"{f['kept']:.1%} | {f['steps']} | {f['tail']:.1%} | {f['memory_mb']:.0f} | {f['found_previous']:.0%} |"
        )
    host_ms = next(iter(projections.values())).host_ms
    lines.append(
        f"host measured: {host_ms:.2f} ms a full-batch step; breakeven: the host time at which the rule would tie "
        "stock (inf: wins at any; nan: loses at any)"
    )
    return "\n".join(lines)


def _bar(rule: str, total: int):
    def progress(done: int) -> None:
        filled = int(30 * done / max(total, 1))
        print(f"\r[at-scale] {rule:<9} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} RL steps", end="")
        sys.stdout.flush()

    return progress


VALIDATED = ("off", "lossless", "suffix")


async def engine_visits(settings, progress=print) -> dict[str, tuple[Corpus, list[tuple[int, int, int]]]]:
    """The real engine at bench_real_model's size (`settings`: a `real_model.Settings`), no training between visits,
    per rule: its responses as a corpus, and per visit the engine steps it ran, the response tokens it kept from
    drafts and all its response tokens. Verification is one-hot, so an output token equal to the draft's is exactly
    a kept one: replaying a rule's own responses, the simulator should find the engine's own verdicts."""
    import random

    import vllm
    from transformers import AutoTokenizer

    from ..integration.rollout.generator import gather_samples
    from ..integration.vllm.step_log import take_steps
    from .real_model import Lane, engine_args, new_generator
    from .smollm2 import converted
    from .word_problems import chat_prompt, splits

    model_dir = converted(temperature=settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    train, _ = splits(settings.prompts * 16, settings.held_out, seed=1234)
    problems = random.Random(settings.seeds[0]).sample(train, settings.prompts)
    prompts = [chat_prompt(tokenizer, p) for p in problems]
    params = vllm.SamplingParams(n=settings.samples, max_tokens=settings.max_tokens, temperature=1.0, logprobs=0)
    lanes, measured, responses = [], {}, {}
    try:
        for method in settings.methods():
            args = engine_args(model_dir, settings, method.config.build_policy(), max(len(p) for p in prompts))
            lane = Lane(method, vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args)))
            lane.generator = new_generator(lane, settings, settings.seeds[0])
            lanes.append(lane)
        for visit in range(settings.visits):
            for lane in lanes:
                take_steps(lane.engine)
                batch = await gather_samples(lane.generator, prompts, params)
                steps, s, rule = take_steps(lane.engine), batch.stats, lane.method.config.policy
                measured.setdefault(rule, []).append((len(steps), s.reused_tokens, s.reused_tokens + s.decoded_tokens))
                responses.setdefault(rule, []).append([[list(o.token_ids) for o in row] for row in batch.outputs])
                progress(f"[validate] visit {visit} {lane.method.name}: {len(steps)} steps")
    finally:
        for lane in lanes:
            lane.engine.shutdown()
            lane.engine = lane.generator = None  # gone before the interpreter's exit, where vLLM's __del__ would fail
    meta = {"model": "SmolLM2-135M-Instruct", "validation": True}
    return {rule: (Corpus(prompts, responses[rule], meta), measured[rule]) for rule in measured}


def validate(args) -> int:
    """`--validate`: the simulator against the engine at bench_real_model's size, for off, lossless and suffix."""
    import asyncio

    from .engine import use_cpu_engine_env
    from .real_model import Settings

    use_cpu_engine_env()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # as bench_real_model: the model's own OpenMP threads
    settings = Settings(
        prompts=3, samples=8, visits=args.visits, seeds=(0,), rules=VALIDATED, cost_curve=args.curve, lr=0.0
    )
    engine = asyncio.run(engine_visits(settings, progress=print))
    schedule = Schedule(max_num_seqs=settings.prompts * settings.samples, prompts_per_step=settings.prompts)
    errors = {}
    print("| rule | engine steps | simulated steps | engine kept | simulated kept |\n| --- |" + " ---: |" * 4)
    for rule in VALIDATED:
        corpus, visits = engine[rule]  # the rule's own responses: the engine's verdicts are in them
        proposer = build(rule, corpus, schedule, args.gpu_curve, 10_000)  # vLLM's cache: every visit here
        sim = EngineSimulator(corpus, schedule, proposer).run()
        later = [r for r in sim.records if r.rl_step >= 1]  # from the second visit on: the first has no previous one
        tokens = sum(total for *_, total in visits[1:])
        sim_steps, sim_kept = len(later), sum(r.accepted for r in later) / tokens
        real_steps, real_kept = sum(steps for steps, *_ in visits[1:]), sum(kept for _, kept, _ in visits[1:]) / tokens
        errors[rule] = (sim_steps / real_steps - 1, (sim_kept - real_kept) / real_kept if real_kept else 0.0)
        print(f"| {rule} | {real_steps} | {sim_steps} | {real_kept:.1%} | {sim_kept:.1%} |")
    print(
        "RESULT "
        + "".join(f"steps_err[{r}]={e[0]:+.3f} kept_err[{r}]={e[1]:+.3f} " for r, e in errors.items())
        + f"visits={settings.visits}"
    )
    return 0
