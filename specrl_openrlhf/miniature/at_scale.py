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

This module is the command line; it dispatches to the modules below it, which never import it: `at_scale_run` (the
rules run, priced and projected), `at_scale_map` (`--map`) and its picture (`at_scale_heatmap`), `at_scale_lenience`
(`--lenience-curve`) and `at_scale_validate` (`--validate`).
"""

from __future__ import annotations

import argparse
import sys
import time

from ..analysis.request_replay import request_workload
from ..analysis.simulator import Schedule
from ..config import json_object
from ..markdown import numbers, table
from ..pricing import measured
from ..pricing.curves import HostCurve, describe
from ..pricing.kernels import GPUS, MODELS
from ..pricing.prices import load_price
from ..pricing.projection import Projection, missing_field
from .at_scale_heatmap import DEFAULT_IMAGE
from .at_scale_lenience import corpus_figures, curve_rules, lenience_curve
from .at_scale_map import run_map
from .at_scale_run import (
    ENGINE_RULES,
    GOAL,
    RULES,
    RuleRun,
    fastest,
    load_corpus,
    projections,
    rows_scale,
    run_rules,
    step_history_bytes,
    step_price,
)
from .at_scale_validate import validate, validated
from .corpus import PRESETS
from .host_steps import host_curve

__all__ = ["ENGINE_RULES", "GOAL", "RULES", "main", "parse_args"]


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
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--map", action="store_true", help="every corpus x model x GPU: the fastest rule and path")
    mode.add_argument(
        "--lenience-curve",
        action="store_true",
        help="spec@ℓ at ℓ = 1, e^0.2, e^0.5, e^0.8, e^2 and ∞ (full): kept of the drafted epochs and projected, "
        "beside the SPEC-RL paper's (replaces --rules)",
    )
    mode.add_argument("--validate", action="store_true", help="the simulator against the real engine")
    parser.add_argument(
        "--map-image",
        default=str(DEFAULT_IMAGE),
        metavar="PNG",
        help=f"with --map: where the map's picture is written (default: {DEFAULT_IMAGE})",
    )
    parser.add_argument("--visits", type=int, default=4, help="with --validate: visits of the prompts (default: 4)")
    args = parser.parse_args(argv)
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    if args.lenience_curve:
        args.rules = ["off", *curve_rules().values()]
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


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.validate:
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
        return run_map(args, corpus, host, started)
    if args.lenience_curve:
        return lenience_curve(args, corpus, host, started)
    price, capacity = step_price(args, args.model, args.gpu)
    scale = rows_scale(args, corpus)
    print(
        f"[at-scale] corpus {corpus.meta['path']}: {len(corpus.prompts)} prompts x {corpus.samples} samples x "
        f"{corpus.epochs} epochs ({corpus.meta.get('model', '?')}); RL steps of {args.schedule.prompts_per_step} "
        f"prompts, each simulated row standing for {scale} of the GPU's (at most {args.schedule.max_num_seqs}); KV "
        f"capacity {capacity:,} tokens ({args.model} on {args.gpu}); prefix caching {args.prefix_caching}\n"
        f"[at-scale] projected on {describe(price)}; host steps {host.describe()}; proposers timed on {machine()}\n"
        f"[at-scale] the corpus, against an RL run: {corpus_figures(corpus)}"
    )
    runs = run_rules(args, corpus, args.model, args.gpu, host, {})
    result = projections(runs, host, price, args.schedule.max_num_seqs)
    print(at_scale_table(runs, result))
    leaders = {reading: fastest(result, reading) for reading in ("projected", "projected_async")}
    for reading, (rule, margin) in leaders.items():
        host_reading = "host measured here" if reading == "projected" else "host hidden"
        print(
            f"[at-scale] fastest, {host_reading}: {rule} ({getattr(result[rule], reading):.2f} x stock), "
            f"{margin:.2f}x the runner-up"
        )
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
        f"fastest={leaders['projected'][0]} fastest_margin={leaders['projected'][1]:.3f} "
        f"fastest_async={leaders['projected_async'][0]} fastest_async_margin={leaders['projected_async'][1]:.3f} "
        f"wall_s={time.perf_counter() - started:.0f}"
    )
    return 0


def at_scale_table(runs: dict[str, RuleRun], result: dict[str, Projection]) -> str:
    """Each rule's figures and its projection against stock, a markdown table, and what its columns mean."""
    head = ["rule", "path", "projected", "projected_async", "breakeven host ms", "kept", "steps", "forward s"]
    head += ["prefill s", "host s", "proposer s", "proposer µs/row-step", "tail", "memory MB", "previous epoch held"]
    rows = []
    for rule, r in runs.items():
        f, p = r.figures, result[rule]
        path = "stock" if rule == "off" else "engine" if rule in ENGINE_RULES else "requests"
        breakeven = "-" if rule == "off" else f"{p.breakeven_host_ms:.2f}"  # stock against itself: no tie to find
        rows.append(
            [rule, path, f"{p.projected:.2f}", f"{p.projected_async:.2f}", breakeven, f"{f['kept']:.1%}", f["steps"]]
            + [f"{f['gpu_s']:.2f}", f"{r.prefill_s:.2f}", f"{f['host_s']:.2f}", f"{f['proposer_s']:.2f}"]
            + [f"{f['proposer_us']:.2f}", f"{f['tail']:.1%}", f"{f['memory_mb']:.0f}", f"{f['found_previous']:.0%}"]
        )
    return (
        table(head, rows, numbers(2, len(head)))
        + f"\nhost measured: {result['off'].host_ms:.2f} ms a full-batch step; breakeven: the host time at which the "
        "rule would tie stock (inf: wins at any; nan: loses at any)"
    )
