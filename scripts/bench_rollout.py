"""Benchmark the path OpenRLHF runs: n concurrent single-sample calls per prompt on vLLM's async engine, stock
generation against speculative rollouts (`AsyncSpeculativeGenerator`), on the same engine, weights and prompts, side
by side in one run.

Each visit loads freshly perturbed weights (a stand-in for an RL update) and drops the prefix cache, then times both
(alternating which goes first) as the wall clock of the whole visit: its makespan, decided by the slowest sample.
Visit 0 only writes the first drafts. In the same run it measures this machine's rates (scoring prefill tokens/s,
and decode tokens/s at the baseline's concurrency) and from them the time ratio the token counts allow:

    limit_ratio = baseline time / (scored tokens / scoring rate + decoded tokens / decode rate)

A rule verified in the engine (`lossless`, or vLLM's own: `suffix`, `ngram`) runs on an engine of its own with its
speculative config, started beside the baseline's with the same arguments and loaded with the same weights (the
baseline's engine has no speculative decoding, as stock OpenRLHF's has none). Every engine step is recorded
(`integration.vllm.step_log`) and projected onto a GPU's step curve (`--cost-curve`, default
docs/gpu_step_h200.json), which `lossless`'s budget then prices its draft slots on too.

Regimes: `overhead` (a tiny model: decoding is bound by per-step overhead, as it is by memory on GPUs) and
`compute` (a 100M model, compute bound on 2 CPU cores). The last line carries the figures:

    python scripts/bench_rollout.py --regime overhead
    python scripts/bench_rollout.py --regime compute
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import AsyncLLMEngine, SamplingParams

    from specrl_openrlhf.integration.rollout.generator import AsyncSpeculativeGenerator
    from specrl_openrlhf.policies import ReusePolicy
    from specrl_openrlhf.pricing.curves import StepCurve
    from specrl_openrlhf.pricing.steps import EngineSteps

CURVE = str(Path(__file__).resolve().parents[1] / "docs" / "gpu_step_h200.json")
REGIMES = {
    "overhead": dict(model=dict(hidden_size=128, num_layers=2, intermediate_size=256, eos_logit=0.0), noise=0.3),
    "compute": dict(model=dict(hidden_size=1024, num_layers=8, intermediate_size=2816, eos_logit=0.5), noise=0.03),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regime", choices=REGIMES, default="overhead")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--visits", type=int, default=3, help="visits after the first (which only writes drafts)")
    parser.add_argument("--policy", default="spec")
    parser.add_argument("--scoring", choices=["chunked", "full"], default="chunked", help="see --reuse.scoring")
    parser.add_argument("--lenience", type=float, default=None)
    parser.add_argument("--params", default="{}", help="the rule's parameters, as JSON (see --reuse.params)")
    parser.add_argument(
        "--round-trip-tokens",
        type=float,
        default=None,
        help="chunk schedule: what a scoring round trip costs, in tokens",
    )
    parser.add_argument("--noise", type=float, default=None, help="relative weight noise per visit (regime default)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature; below 1 the random model samples like a sharper policy (rules that score drafts "
        "need 1, `lossless` in the engine takes any)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=None, help="engine concurrency (default: all samples)")
    parser.add_argument(
        "--priority", action="store_true", help="priority scheduling: scoring first, then the longest continuations"
    )
    from specrl_openrlhf.miniature.engine import add_dtype_argument

    add_dtype_argument(parser, default="float32")
    parser.add_argument("--model-dir", default=None, help="where the random model is built (default: a temp folder)")
    parser.add_argument(
        "--cost-curve",
        default=None,
        help="a GPU's step curve: lossless's budget prices draft slots on it, and both runs' engine steps are "
        "projected on it (projection only, default: docs/gpu_step_h200.json)",
    )
    args = parser.parse_args(argv)
    if args.cost_curve is not None:  # one clear error before any engine starts
        from specrl_openrlhf.pricing.curves import StepCurve

        try:
            StepCurve.load(args.cost_curve)
        except ValueError as error:
            parser.error(f"--cost-curve {error}")
    return args


async def stock_visit(generate, prompts, n, params):
    """OpenRLHF's stock path: n concurrent single-sample requests per prompt."""
    outputs = await asyncio.gather(*[generate(list(p), params) for p in prompts for _ in range(n)])
    return sum(len(o.outputs[0].token_ids) for o in outputs)


def _mean(values) -> float:
    values = [v for v in values if v == v]
    return sum(values) / len(values) if values else 0.0


async def rate(engine_generate_fn, requests, params) -> float:
    """Tokens per second over `requests` (token lists), all in flight at once; the tokens counted are the prompts'
    for a scoring request and the generated ones otherwise."""
    start = time.perf_counter()
    outputs = await asyncio.gather(*[engine_generate_fn(r, params) for r in requests])
    seconds = time.perf_counter() - start
    if params.prompt_logprobs is not None:
        return sum(len(r) for r in requests) / seconds
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds


@dataclass
class Tally:
    """What the timed visits of one method added up to: the engine steps recorded, wall time (makespans), engine
    steps, this process's CPU, and each visit's makespan split."""

    recorded: EngineSteps
    wall_s: float = 0.0
    steps: float = 0.0
    cpu_s: float = 0.0
    splits: list[dict] = field(default_factory=list)


@dataclass
class Bench:
    """The run's engines, its rule and what it sends: the baseline's engine (`engine`, its `generate`), the engine
    the rule runs on (`engines[-1]`, the baseline's unless the rule verifies in the engine), the generator over it, the
    prompts and the sampling settings."""

    model_dir: Path
    noise: float
    policy: ReusePolicy
    curve: StepCurve | None
    engine: AsyncLLMEngine
    engines: list[AsyncLLMEngine]
    generate: Callable
    generator: AsyncSpeculativeGenerator
    prompts: list[list[int]]
    params: SamplingParams  # n samples a prompt, for the generator
    single: SamplingParams  # one sample a request, for stock's calls


def rule_and_curve(args):
    """The rule (with `--params`, and `lossless`'s budget on `--cost-curve`) and the GPU step curve the engine steps
    are projected on (`--cost-curve`, else docs/gpu_step_h200.json where it is there, else none)."""
    from specrl_openrlhf.config import ReuseConfig
    from specrl_openrlhf.pricing.curves import StepCurve

    params = json.loads(args.params)
    if args.cost_curve and args.policy == "lossless":
        params["cost_curve"] = str(Path(args.cost_curve).resolve())
    policy = ReuseConfig(policy=args.policy, lenience=args.lenience, params=params).build_policy()
    curve_file = args.cost_curve or (CURVE if Path(CURVE).is_file() else None)
    return policy, StepCurve.load(curve_file) if curve_file else None


def start_engine(args, model_dir: Path, samples: int, **extra):
    """An async CPU engine on the random model, every sample in flight at once unless `--max-num-seqs`; `extra`
    engine arguments on top (a rule's speculative config)."""
    import vllm

    from specrl_openrlhf.miniature.engine import cpu_dtype, cpu_engine_kwargs
    from specrl_openrlhf.miniature.weights import EXTENSION

    arguments = cpu_engine_kwargs(
        dtype=cpu_dtype(args.dtype),
        kv_cache_bytes=1 << 30,
        max_model_len=args.prompt_len + args.max_tokens + 8,
        max_num_seqs=args.max_num_seqs or samples,
        max_num_batched_tokens=16384,
        scheduling_policy="priority" if args.priority else "fcfs",
    )
    arguments.update(extra)
    return vllm.AsyncLLMEngine.from_engine_args(
        vllm.AsyncEngineArgs(
            model=str(model_dir), logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION, **arguments
        )
    )


def start_engines(args, model_dir: Path, policy) -> list:
    """The baseline's engine, and beside it, for a rule verified in the engine, the rule's own with its speculative
    config (the baseline's has none, as stock OpenRLHF's has none)."""
    from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs

    samples = args.prompts * args.n
    engines = [start_engine(args, model_dir, samples)]
    if policy.verifies_in_engine:
        base = {"max_model_len": args.prompt_len + args.max_tokens + 8}
        engines.append(start_engine(args, model_dir, samples, **engine_kwargs(policy, base)))
    return engines


def make_generator(args, policy, engine, rule_engine):
    """The rollout loop OpenRLHF's actors call, over the rule's engine: its planner sized by the baseline's engine,
    scoring as `--scoring` says (its chunks' round trip as `--round-trip-tokens` says), a local draft store."""
    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.rollout.generator import AsyncSpeculativeGenerator, LocalDraftStore
    from specrl_openrlhf.integration.vllm.edge import engine_generate, engine_limits
    from specrl_openrlhf.request_path.chunking import ChunkSchedule

    max_token_id, max_model_len = engine_limits(engine.model_config, engine.get_tokenizer())
    planner = sr.SpeculativePlanner(
        policy,
        max_token_id=max_token_id,
        max_model_len=max_model_len,
        scoring=args.scoring,
        processed_logprobs=True,  # the engine's logprobs_mode, as OpenRLHF sets it
    )
    if args.round_trip_tokens is not None and planner.scorer.chunks is not None:
        planner.scorer.chunks = ChunkSchedule(round_trip_tokens=args.round_trip_tokens)
    return AsyncSpeculativeGenerator(
        engine_generate(rule_engine),
        policy,
        LocalDraftStore(keep_visits=policy.visits_kept),
        samples_per_visit=args.n,
        prioritize=args.priority or policy.verifies_in_engine,
        planner=planner,
        rpc=rule_engine.collective_rpc,
    )


def set_up(args) -> Bench:
    """The random model of `--regime` built, the rule and the curve, the engines and the generator, the prompts and
    the sampling settings."""
    from vllm import SamplingParams

    from specrl_openrlhf.integration.vllm.edge import engine_generate
    from specrl_openrlhf.miniature.tiny_model import build_tiny_model

    regime = REGIMES[args.regime]
    noise = regime["noise"] if args.noise is None else args.noise
    model_dir = Path(args.model_dir or Path(tempfile.gettempdir()) / f"specrl_bench_{args.regime}")
    build_tiny_model(model_dir, **regime["model"])
    policy, curve = rule_and_curve(args)
    engines = start_engines(args, model_dir, policy)
    engine = engines[0]
    generator = make_generator(args, policy, engine, engines[-1])
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 100) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, logprobs=0, temperature=args.temperature)
    single = params.clone()
    single.n = 1
    generate = engine_generate(engine)
    return Bench(model_dir, noise, policy, curve, engine, engines, generate, generator, prompts, params, single)


async def load_weights(bench: Bench, seed: int, scratch: str) -> None:
    """Freshly perturbed weights (`seed`), a stand-in for an RL update, into every engine."""
    from specrl_openrlhf.miniature.weights import perturbed_state_dict, reload_async_engine, write_weights

    path = write_weights(
        perturbed_state_dict(bench.model_dir, bench.noise, seed=seed), Path(scratch) / "w.safetensors"
    )
    for each in bench.engines:
        await reload_async_engine(each, path)


def print_header(args, bench: Bench) -> None:
    """The run's settings and the visit table's header."""
    from specrl_openrlhf.miniature.engine import dtype_line

    print(
        f"{args.regime} regime: {bench.policy.describe()} ({args.scoring} scoring), {args.prompts} prompts x {args.n} "
        f"samples, prompt "
        f"{args.prompt_len} tokens, up to {args.max_tokens} new, weight noise {bench.noise} per visit, temperature "
        f"{args.temperature}; {dtype_line(args.dtype)}"
    )
    print(
        " visit  method   wall_s  steps  cpu_s  decoded   reused   scored  prefill  full  score_s  gen_s  "
        "(cpu_s: this process, where vLLM's front end and our driver run; score_s, gen_s: per-sample sums)"
    )


async def timed_visit(args, bench: Bench, visit: int, method: str, tally: Tally):
    """One visit of one method (`off`: stock's n single-sample calls a prompt; `spec`: the generator), the prefix
    cache dropped first, timed as its makespan, its line printed and added to `tally`. Returns stock's decoded tokens
    (`off`) or the batch's stats (`spec`)."""
    from specrl_openrlhf.integration.rollout.generator import gather_samples
    from specrl_openrlhf.integration.vllm.step_log import take_steps

    for each in bench.engines:
        await each.reset_prefix_cache()
    runs_on = bench.engine if method == "off" else bench.engines[-1]
    take_steps(runs_on)  # what ran before is not this visit's
    cpu_before, start = time.process_time(), time.perf_counter()
    if method == "off":
        decoded = await stock_visit(bench.generate, bench.prompts, args.n, bench.single)
    else:
        batch = await gather_samples(bench.generator, bench.prompts, bench.params)
    wall, visit_cpu = time.perf_counter() - start, time.process_time() - cpu_before
    visit_record = take_steps(runs_on)
    tally.recorded = tally.recorded + visit_record
    tally.splits.append(visit_record.split(start))
    visit_steps = len(visit_record)
    head = f"{visit:>6}  {method:<6} {wall:>7.2f} {visit_steps:>6.0f} {visit_cpu:>6.2f}"
    if method == "off":
        print(f"{head} {decoded:>8}")
    else:
        s = batch.stats
        print(
            f"{head} {s.decoded_tokens:>8} {s.reused_tokens:>8} {s.scored_tokens:>8} "
            f"{s.scoring_prefill_tokens:>8} {s.fully_reused / s.samples:>5.2f} "
            f"{s.time_scoring_s:>8.1f} {s.time_generation_s:>6.1f}"
        )
    tally.wall_s += wall
    tally.steps += visit_steps
    tally.cpu_s += visit_cpu
    return decoded if method == "off" else s


async def timed_visits(args, bench: Bench, scratch: str):
    """Visit 0 writes the first drafts; visits 1..`--visits` time both methods on fresh weights, alternating which
    goes first. Returns each method's `Tally`, stock's decoded tokens and the rule's summed stats."""
    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.rollout.generator import gather_samples
    from specrl_openrlhf.pricing.steps import EngineSteps

    tallies = {method: Tally(EngineSteps.of([])) for method in ("off", "spec")}
    decoded_off, stats = 0, sr.ReuseStats()
    await load_weights(bench, 0, scratch)
    await gather_samples(bench.generator, bench.prompts, bench.params)  # visit 0: the first drafts
    for visit in range(1, args.visits + 1):
        await load_weights(bench, visit, scratch)
        order = ["off", "spec"] if visit % 2 else ["spec", "off"]  # neither always pays for a cold start
        for method in order:
            counted = await timed_visit(args, bench, visit, method, tallies[method])
            if method == "off":
                decoded_off += counted
            else:
                stats = stats + counted
    return tallies, decoded_off, stats


async def machine_rates(args, bench: Bench) -> tuple[float, float]:
    """This machine's rates at the concurrency of a visit, with the last weights, on the baseline's engine: scoring
    prefill tokens/s over the drafts the cache holds, and decode tokens/s once the prompts are cached."""
    from vllm import SamplingParams

    from specrl_openrlhf.cache import prompt_key

    samples = args.prompts * args.n
    await bench.engine.reset_prefix_cache()
    cache = bench.generator.store.cache
    scoring = [p + d.token_ids.tolist() for p in bench.prompts for d in cache.drafts(prompt_key(p))][-samples:]
    scoring_rate = (
        await rate(bench.generate, scoring, SamplingParams(max_tokens=1, prompt_logprobs=0)) if scoring else math.inf
    )
    await bench.engine.reset_prefix_cache()
    stream = [p for p in bench.prompts for _ in range(args.n)]
    await rate(bench.generate, stream, SamplingParams(max_tokens=1))  # prompts now cached: time decoding only
    decode_rate = await rate(bench.generate, stream, SamplingParams(max_tokens=64, ignore_eos=True))
    return scoring_rate, decode_rate


def print_requests(stats) -> None:
    """The requests a sample sent (scoring, continuation, resample) and our driver's time."""
    continuations = stats.samples - stats.fully_reused
    print(
        f"REQUESTS per sample: scoring {stats.scoring_requests / stats.samples:.2f} (probes and chunks), continuation "
        f"{continuations / stats.samples:.2f}, resample {stats.resample_requests / stats.samples:.2f}; scoring "
        f"prefill {stats.scoring_prefill_tokens / stats.samples:.0f} tokens per sample; Python time per sample in "
        f"our driver: scoring {stats.time_scoring_s / stats.samples * 1e3:.1f} ms wall (incl. engine waits)"
    )


def print_engine(stats) -> None:
    """What the engine drafted and accepted, for a rule verified in the engine."""
    print(
        f"ENGINE drafted {stats.draft_tokens} tokens, accepted {stats.reused_tokens} "
        f"({stats.reused_tokens / max(stats.draft_tokens, 1):.2f}), "
        f"{stats.reused_tokens / max(stats.drafted_steps, 1):.2f} per verification step, "
        f"{stats.reentries / stats.samples:.1f} re-entries per sample"
    )


def print_budget(report: dict) -> None:
    """Our proposer's budget (`budget_details`): its step cost fit, slots a step, acceptance predicted against
    observed, overall and per predicted decile."""
    verdicts = max(report["verdicts"], 1e-9)
    print(
        f"BUDGET step cost {1e3 * report['cost_base_s']:.2f} ms + {1e3 * report['cost_row_s']:.4f} ms/row + "
        f"{1e3 * report['cost_token_s']:.4f} ms/token (mean relative error {report['cost_error']:.1%}); "
        f"{report['slots'] / report['steps']:.1f} slots drafted per step; acceptance predicted "
        f"{report['predicted'] / verdicts:.3f}, observed {report['accepted'] / verdicts:.3f} (recent steps)"
    )
    deciles = [(d, report.get(f"decile{d}_verdicts", 0.0)) for d in range(10)]
    print(
        "CALIBRATION predicted -> observed (verdicts): "
        + ", ".join(
            f"{report[f'decile{d}_predicted'] / n:.2f} -> {report[f'decile{d}_accepted'] / n:.2f} ({n:.0f})"
            for d, n in deciles
            if n
        )
    )


def print_projection(args, bench: Bench, tallies: dict[str, Tally]) -> str:
    """Both methods' engine steps projected on the GPU's curve at rows x 1 and at the RL scale, every cost paid;
    returns the RESULT line's projection fields (NaN, `missing=curve`, without a curve)."""
    from specrl_openrlhf.miniature.engine import machine
    from specrl_openrlhf.pricing.curves import describe
    from specrl_openrlhf.pricing.measured import rule_cost, shipped_host_curve
    from specrl_openrlhf.pricing.projection import RL_MAX_ROWS, RL_SCALE, missing_field
    from specrl_openrlhf.pricing.rl_scale import project_at_rl_scales

    if bench.curve is None:
        return "projected=nan projected8=nan missing=curve prefill=none"
    host = shipped_host_curve()  # the verdicts' host (measuring it here, after the engines, would fail in-process)
    cost = rule_cost(bench.policy, machine())
    projected = project_at_rl_scales(tallies["off"].recorded, tallies["spec"].recorded, bench.curve, host, cost)
    one, rl = projected[1], projected[RL_SCALE]
    proposer_us = f"{cost.proposer_us:.2f}" if cost.proposer_us is not None else "never measured (missing)"
    print(
        f"PROJECTION on {describe(bench.curve)} (a projection of the recorded engine steps, not a GPU run; every "
        f"cost: the host's time, {host.describe()}, paid serially where async scheduling is off; the proposer's as "
        f"bench_at_scale measured it: {cost.proposer_base_us:.0f} us a step + {proposer_us} us a row): "
        f"stock / {args.policy} at rows x 1: {one.describe()}; at rows x {RL_SCALE} (at most {RL_MAX_ROWS}): "
        f"{rl.describe()}"
    )
    return (
        f"projected={one.projected:.2f} projected8={rl.projected:.2f} projected_async={one.projected_async:.2f} "
        f"projected_async8={rl.projected_async:.2f} breakeven_host_ms={one.breakeven_host_ms:.2f} "
        f"breakeven_host_ms8={rl.breakeven_host_ms:.2f} {missing_field({args.policy: one.missing})} "
        f"prefill={one.prefill}"
    )


def print_tails(tallies: dict[str, Tally]) -> None:
    """Each method's makespan split: time at a full batch and in the tail, rows per step, drafts per row in each."""
    for method in ("off", "spec"):
        splits = tallies[method].splits
        full, tail = sum(s["full_s"] for s in splits), sum(s["tail_s"] for s in splits)
        rows = tallies[method].recorded.rows
        print(
            f"TAIL {method}: {full:.2f}s at a full batch, {tail:.2f}s in the tail "
            f"({tail / max(full + tail, 1e-9):.0%}); {rows.mean() if len(rows) else 0:.1f} rows per step; drafted "
            "per row "
            f"{_mean(s['full_drafted_per_row'] for s in splits):.2f} at a full batch, "
            f"{_mean(s['tail_drafted_per_row'] for s in splits):.2f} in the tail"
        )


async def run(args) -> int:
    """The benchmark: set up, the timed visits, this machine's rates, then every line of figures and RESULT."""
    from specrl_openrlhf.integration.vllm.histories import budget_details

    bench = set_up(args)
    print_header(args, bench)
    with tempfile.TemporaryDirectory() as scratch:
        tallies, decoded_off, stats = await timed_visits(args, bench, scratch)
        scoring_rate, decode_rate = await machine_rates(args, bench)
        verifies = bench.policy.verifies_in_engine
        report = (await bench.engines[-1].collective_rpc(budget_details))[0] if verifies else {}
    for each in bench.engines:
        each.shutdown()
    off, spec = tallies["off"], tallies["spec"]
    token_ratio = decoded_off / max(stats.decoded_tokens, 1)
    time_ratio = off.wall_s / spec.wall_s
    limit_s = stats.scored_tokens / scoring_rate + stats.decoded_tokens / decode_rate
    limit_ratio = off.wall_s / limit_s if limit_s else math.inf
    prefill_per_scored = stats.scoring_prefill_tokens / stats.scored_tokens if stats.scored_tokens else 0.0
    needed = stats.reused_tokens + stats.rejected_drafts  # what the rule had to see: kept tokens, first rejections
    print_requests(stats)
    if verifies:
        print_engine(stats)
    if report.get("steps"):
        print_budget(report)
    scored_per_needed = stats.scored_tokens / needed if needed else 0.0
    print(
        f"\nvisits 1..{args.visits}: off {off.wall_s:.2f}s, spec {spec.wall_s:.2f}s (makespans); engine steps "
        f"off {off.steps:.0f}, spec {spec.steps:.0f}; CPU of this process off {off.cpu_s:.2f}s, spec "
        f"{spec.cpu_s:.2f}s; spec decoded "
        f"{stats.decoded_tokens}, reused {stats.reused_tokens}, scored {stats.scored_tokens} draft tokens "
        f"({stats.scoring_prefill_tokens} prefill tokens computed by scoring requests)"
    )
    print(
        f"PHASES scoring={scoring_rate:.0f} decode={decode_rate:.0f} tokens/s at {args.prompts * args.n} concurrent "
        f"samples; a scored token costs {decode_rate / scoring_rate:.2f} decoded tokens; the limit is {limit_s:.2f}s"
    )
    fields = print_projection(args, bench, tallies)
    print_tails(tallies)
    print(
        f"RESULT regime={args.regime} policy={args.policy} token_ratio={token_ratio:.2f} time_ratio={time_ratio:.2f} "
        f"{fields} "
        f"limit_ratio={limit_ratio:.2f} efficiency={time_ratio / token_ratio:.2f} "
        f"efficiency_vs_limit={time_ratio / limit_ratio:.2f} prefill_per_scored={prefill_per_scored:.2f} "
        f"scored_per_needed={scored_per_needed:.2f} steps_ratio={off.steps / max(spec.steps, 1):.2f} "
        f"cpu_ratio={off.cpu_s / max(spec.cpu_s, 1e-9):.2f}"
    )
    return 0


if __name__ == "__main__":
    from specrl_openrlhf.miniature.engine import run_on_cpu_engines

    sys.exit(run_on_cpu_engines(lambda: run(parse_args())))
