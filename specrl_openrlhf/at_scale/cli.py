"""`python scripts/bench_at_scale.py`: every rule at RL scale in the simulator, on a recorded corpus, in a named
regime, priced where RL runs: a named GPU and model, every row's context, every cost.

Rules (`--rules`): any rule `--rollout_reuse` takes, in its spelling (`rules`: a registered name, `NAME@LENIENCE`,
`path/rule.py:Class`, each with `,key=value` parameters), on the path its policy says:
- the engine path: stock (`off`), `lossless` verified in the engine (our proposer, `HistoryProposer`), vLLM's suffix
  decoding (`suffix`, arctic-inference's cache) and n-gram proposer (`ngram`), each driven as vLLM drives it, with
  a stand-in of the `VllmConfig` fields it reads and of the persistent batch (`proposers`);
- the request path (`simulator.request_workload`): `lossless,verify=requests` (its tree; `draft=own`,
  `draft=majority` too), `spec@1.65`, `exact` and every other rule, plugins included: scoring requests with prompt
  log-probs, then continuations that read the prefix cache, async scheduling kept. A rule other than `lossless` cuts
  the corpus's drafts with its own `cut`, on the corpus's scoring pass and a run's uniforms; the length of a
  continuation after its rejection is borrowed from the recorded response (an approximation).

The regime (`--regime`, and a flag for each of its fields): the engine (rows, token budget, memory share and so its
KV cache, prefix caching), the RL step (requests an engine) and the host. `openrlhf` by default: the engine an
OpenRLHF user's command builds, read from vLLM where it is importable.

Pricing (`pricing`), per engine step:
- modelled from measured kernels: the GPU's forward (`--gpu`, `--model`: `pricing.kernels.KernelStepModel`, from
  aiconfigurator's vLLM kernels) at the step's rows, tokens a row and each row's context, prefill and prompt
  log-probs' logits included; the KV cache's capacity bounds the rows a step runs. `--curve FILE` prices on a measured
  step curve instead (docs/gpu_step_h200.json: our plain-PyTorch H200 curve, at context 512 only);
- measured here: each proposer's own time as it runs (history updates included); the engine's host time per step is
  the regime's (`--host`: the shipped curve by default), which stock and the request path overlap with the forward
  (async scheduling) and every model-free proposer pays on top.
Each rule is shown four ways against stock: `projected` (the regime's host time), `projected_async` (the host hidden),
`projected_no_host` (no host time at all) and `breakeven_host_ms` (the host time of a full-batch step at which the rule
ties stock); in total and for each drafted epoch. A projection: the figures say what these schedules would cost on
that GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..policies import load_plugin
from ..pricing import measured
from ..pricing.curves import HostCurve, describe
from ..pricing.kernels import GPUS, MODELS
from ..pricing.prices import load_price
from ..pricing.projection import missing_field
from ..references import split_rules
from ..simulator.regime import DEFAULT_REGIME, HOSTS, REGIMES
from .eager_modes import mode_comparison, mode_fields, mode_table
from .heatmap import DEFAULT_IMAGE
from .lenience import corpus_figures, curve_rules, lenience_curve
from .map import run_map
from .proposers import SUFFIX_CACHED
from .rules import bench_rules, engine_fields, history_budget_error
from .run import (
    GOAL,
    RULES,
    Cell,
    RuleRun,
    epoch_projections,
    fastest,
    load_corpus,
    projections,
    run_rules,
)
from .spacing import SPACINGS, one_visit_line, parse_spacings, run_spacings, spacing_table, visits_lines
from .spacing import result_fields as spacing_fields
from .tables import at_scale_table, epoch_table
from .validate import validate, validated

__all__ = ["GOAL", "READINGS", "RULES", "main", "parse_args"]

VALIDATED_VISITS = 4  # --validate's visits of the prompts unless --visits names them
READINGS = {"projected": "host measured", "projected_async": "host hidden", "projected_no_host": "no host"}
REGIME_FLAGS = {  # flag: (the Regime field, its type, help)
    "--max-num-seqs": ("max_num_seqs", int, "rows the engine decodes at once (vLLM's max_num_seqs)"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int, "tokens a step carries, drafts included"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float, "the engine's share of the GPU's memory"),
    "--requests-per-engine": ("requests_per_engine", int, "an RL step's requests one engine serves"),
    "--max-response-tokens": ("max_response_tokens", int, "responses are cut at this length"),
    "--steps-between-visits": ("steps_between_visits", int, "RL steps from a prompt's visit to its next"),
    "--visits": ("visits", int, "visits a run makes to each prompt (with --validate: the real engine's, default 4)"),
    "--dataset-prompts": ("dataset_prompts", int, "the dataset's prompts (the draft store holds each one's)"),
}


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for path in args.plugin:
            load_plugin(path)
        args.rules = ["off", *curve_rules().values()] if args.lenience_curve else split_rules(args.rules)
        args.cell = cell_of(args)
        args.visits = args.visits or VALIDATED_VISITS  # --validate's
        args.spacings = parse_spacings(args.spacing, args.cell.regime)
        args.host = host_of(args.cell.regime.host, load_only=True)
        if args.validate:
            validated(args.rules)  # a rule it can't name: one error now, before the engines start
        else:
            args.loaded = load_corpus(args.corpus, args.cell.regime.max_response_tokens)
            args.parsed = bench_rules(args.rules, args.loaded)  # an unknown rule, or what the corpus lacks: now
    except ValueError as error:
        parser.error(str(error))
    return args


def build_parser() -> argparse.ArgumentParser:
    from ..miniature.corpus import PRESETS

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
    parser.add_argument(
        "--rules",
        default=",".join(RULES),
        help="off and any rules --rollout_reuse takes, comma-separated: NAME, NAME@LENIENCE or path/rule.py:Class, "
        "each with ,key=value parameters (e.g. off,lossless,history_mb=2048,lossless,verify=requests,spec@1.65,"
        f"policies/prefix_cap.py:PrefixCap; default: {','.join(RULES)})",
    )
    parser.add_argument(
        "--reuse.plugin",
        dest="plugin",
        action="append",
        default=[],
        metavar="FILE.py",
        help="load the rules a file registers, by name (repeatable)",
    )
    regime = parser.add_argument_group("the regime: the engine and the RL step (each flag overrides --regime's)")
    regime.add_argument(
        "--regime", default=DEFAULT_REGIME, choices=tuple(REGIMES), help=f"(default: {DEFAULT_REGIME})"
    )
    for flag, (_, kind, text) in REGIME_FLAGS.items():
        regime.add_argument(flag, type=kind, default=None, help=text)
    regime.add_argument("--prefix-caching", default=None, choices=("on", "off"), help="vLLM's prefix cache")
    regime.add_argument(
        "--enforce-eager",
        default=None,
        choices=("on", "off"),
        help="vLLM's enforce_eager: the engine runs without CUDA graphs, each step paying its kernel launches "
        "(openrlhf: on, as OpenRLHF's examples set it)",
    )
    regime.add_argument(
        "--host",
        default=None,
        metavar="|".join(HOSTS) + "|FILE",
        help="the engine's host time a step: the curve the package ships (default), measured on this machine, none, "
        "or a host step curve file",
    )
    regime.add_argument(
        "--spacing",
        default=SPACINGS,
        help="the spacings (RL steps between a prompt's visits) each rule is shown at, comma-separated; regime: the "
        f"regime's own, which the verdict reads (default: {SPACINGS})",
    )
    parser.add_argument(
        "--suffix-cache",
        type=int,
        default=None,
        help=f"suffix decoding's cached responses an engine (vLLM's suffix_decoding_max_cached_requests; default "
        f"{SUFFIX_CACHED:,}, vLLM's)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--map", action="store_true", help="every corpus x model x GPU x regime: the fastest rule")
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
    return parser


def cell_of(args) -> Cell:
    """The cell the flags name: the regime `--regime` names with each regime flag given, and what the rules share."""
    given = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in REGIME_FLAGS.items()}
    if args.prefix_caching is not None:
        given["prefix_caching"] = args.prefix_caching == "on"
    if args.enforce_eager is not None:
        given["enforce_eager"] = args.enforce_eager == "on"
    given["host"] = args.host
    regime = engine_regime(REGIMES[args.regime]).with_fields(**given)
    curve = load_price(args.curve) if args.curve else None
    return Cell(
        model=args.model,
        gpu=args.gpu,
        regime=regime,
        attention=args.attention,
        curve=curve,
        suffix_cache=args.suffix_cache,
    )


def engine_regime(regime):
    """`regime` with vLLM's own engine-context defaults where it names them and vLLM is importable (a vLLM that
    changed them is followed, and says so in the regime's source)."""
    if regime.name != "openrlhf":
        return regime
    try:
        from ..integration.vllm.engine_defaults import engine_context_defaults
    except ImportError:
        return regime
    try:
        rows, tokens = engine_context_defaults()
    except ImportError:
        return regime
    if (rows, tokens) == (regime.max_num_seqs, regime.max_num_batched_tokens):
        return regime
    from dataclasses import replace

    source = f"{regime.source}; vLLM here defaults to {rows} rows and {tokens} tokens under ENGINE_CONTEXT"
    return replace(regime, max_num_seqs=rows, max_num_batched_tokens=tokens, source=source)


def host_of(host: str, load_only: bool = False) -> HostCurve | None:
    """The host step curve a regime's `host` names: the shipped one, this machine's (measured and cached unless
    `load_only`, where it is resolved later), none, or a file's."""
    if host == "shipped":
        return measured.shipped_host_curve()
    if host == "none":
        return None
    if host == "here":
        if load_only:
            return None
        from .host_steps import host_curve

        return host_curve(None, progress=print)
    return HostCurve.load(host)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.validate:
        return validate(args)
    from ..miniature.engine import machine

    started = time.perf_counter()
    corpus, cell = args.loaded, args.cell
    host = host_of(cell.regime.host) if cell.regime.host == "here" else args.host
    schedule, scale = cell.schedule(corpus)
    too_small = history_budget_error(args.parsed, corpus, schedule)
    if too_small:
        print(f"bench_at_scale.py: error: {too_small}", file=sys.stderr)
        return 2
    if args.map:
        return run_map(args.rules, args.corpus, corpus, cell, host, args.map_image, started)
    if args.lenience_curve:
        return lenience_curve(args.corpus, corpus, cell, host, started)
    price, capacity = cell.price()
    print(
        f"[at-scale] corpus {corpus.meta['path']}: {len(corpus.prompts)} prompts x {corpus.samples} samples x "
        f"{corpus.epochs} epochs ({corpus.meta.get('model', '?')}); {cell.model} on {cell.gpu}\n"
        f"[at-scale] regime {cell.regime.describe()}\n"
        f"[at-scale] regime's source: {cell.regime.source}\n"
        f"[at-scale] simulated: RL steps of {schedule.prompts_per_step} prompts, each simulated row standing for "
        f"{scale} of the GPU's ({schedule.max_num_seqs} simulated rows, {schedule.max_num_batched_tokens:,} tokens a "
        f"step); KV capacity {capacity:,} tokens\n"
        f"[at-scale] projected on {describe(price)}; host steps "
        f"{host.describe() if host else 'none'}; proposers timed on {machine()}\n"
        f"[at-scale] the corpus, against an RL run: {corpus_figures(corpus)}"
    )
    print(visits_lines(corpus, cell, schedule, scale))
    cache = {}  # simulations, shared with the other engine mode's
    try:
        by_spacing, by_visit, kept = run_spacings(args.rules, corpus, cell, host, args.spacings, cache)
    except ValueError as error:  # a rule that failed on the corpus's drafts
        print(f"\nbench_at_scale.py: error: {error}", file=sys.stderr)
        return 2
    own = cell.regime.steps_between_visits
    runs, result = by_spacing[own], by_visit[own]["run"]  # the verdict: the run at the regime's spacing
    by_epoch = epoch_projections(runs, host, price, cell.regime.full_batch)
    print(at_scale_table(runs, result, {rule: k["run"] for rule, k in kept[own].items()}, cell.regime))
    print(epoch_table(runs, by_epoch))
    print(spacing_table(by_visit, kept, cell.regime))
    if cell.regime.visits == 1:
        print(one_visit_line(cell.regime, runs, result, kept[own]))
    modes = mode_comparison(
        args.rules, corpus, cell, host, cache, runs, "later" if "later" in by_visit[own] else "run"
    )
    print(mode_table(modes))
    gain = stock_gain(corpus, cell, host, runs["off"])
    if gain is not None:
        print(
            f"[at-scale] stock in regime {cell.regime.name} against stock in regime {DEFAULT_REGIME} (the same RL "
            "step): "
            + ", ".join(f"{gain[r]:.2f}x {READINGS[r]}" for r in READINGS)
            + "; each rule's figures above are on top of it"
        )
    leaders = {reading: fastest(result, reading) for reading in READINGS}
    for reading, (rule, margin) in leaders.items():
        print(
            f"[at-scale] fastest in regime {cell.regime.name} ({cell.regime.describe_visits()}), "
            f"{READINGS[reading]}: {rule} ({getattr(result[rule], reading):.2f} x stock), {margin:.2f}x the runner-up"
        )
    fits = {r.rule.proposer_key: r.figures["proposer_fit"] for r in runs.values() if r.rule.proposer_key}
    saved = measured.save_proposer_costs(fits, machine())
    print(f"[at-scale] proposer costs saved to {saved}")
    fields = spacing_fields(by_visit, kept, cell.regime) + [
        f"spacing={own} spacings={','.join(map(str, args.spacings))}",
        mode_fields(modes),
    ]
    print(result_line(args.corpus, runs, result, by_epoch, leaders, cell, scale, started, fields, kept[own]))
    return 0


def stock_gain(corpus, cell: Cell, host, stock: RuleRun) -> dict[str, float] | None:
    """What stock gains in `cell`'s regime over stock in the default regime's engine, on the same RL step (None where
    the regime is the default or serves another step): the default's seconds over the regime's, by each reading."""
    default = REGIMES[DEFAULT_REGIME]
    if cell.regime.name == DEFAULT_REGIME or cell.regime.requests_per_engine != default.requests_per_engine:
        return None
    base = cell.at(regime=default.with_fields(host=cell.regime.host))
    price, _ = base.price()
    runs = run_rules(["off"], corpus, base, host, {})
    runs["here"] = stock
    result = projections(runs, host, price, cell.regime.full_batch)["here"]
    return {reading: getattr(result, reading) for reading in READINGS}


def result_line(corpus, runs, result, by_epoch, leaders, cell: Cell, scale, started, visits=(), kept=None) -> str:
    """The RESULT line: each rule's verdict (`result`: the run at the regime's spacing, its kept share from `kept`'s
    `run` where given), each drafted epoch's, the visits' (`visits`: fields), what the cell is, the fastest."""
    off = runs["off"]
    fields = [
        f"{result[rule].fields(rule)} kept[{rule}]={kept[rule]['run'] if kept else r.figures['kept']:.3f} "
        f"steps[{rule}]={r.figures['steps']}"
        for rule, r in runs.items()
    ]
    fields += list(visits)
    for epoch, projected in by_epoch.items():
        fields += [
            f"projected_e{epoch}[{rule}]={p.projected:.3f} projected_async_e{epoch}[{rule}]={p.projected_async:.3f} "
            f"kept_e{epoch}[{rule}]={runs[rule].kept_by_epoch.get(epoch, 0.0):.3f}"
            for rule, p in projected.items()
            if rule != "off"
        ]
    fields += [
        f"forward_s[off]={off.figures['gpu_s']:.3f} prefill_s[off]={off.prefill_s:.3f}",
        f"host_ms={result['off'].host_ms:.3f} {missing_field({k: p.missing for k, p in result.items()})}",
        f"corpus={corpus} model={cell.model} gpu={cell.gpu} price={'curve' if cell.curve else 'kernels'}",
        f"scale={scale} {cell.regime.fields()}",
    ]
    for reading, (rule, margin) in leaders.items():
        suffix = {"projected": "", "projected_async": "_async", "projected_no_host": "_no_host"}[reading]
        fields.append(f"fastest{suffix}={rule} fastest{suffix}_margin={margin:.3f}")
    fields.append(engine_fields([r.rule for r in runs.values()]))
    return "RESULT " + " ".join(f for f in fields if f) + f" wall_s={time.perf_counter() - started:.0f}"
