"""The quickstart's command line: its flags, their checks (a bad one fails at once, naming the fix) and the groups
they plan (`plan`). What the command does is `DESCRIPTION`, which `--help` shows."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from .. import config as reuse_config
from ..policies import PluginError, UnknownPolicyError
from ..pricing.curves import StepCurve
from .draft_price import DRAFT_PRICES, STEP_MODEL, budgeted
from .engine import add_dtype_argument
from .plan import GRIDS, QUICKSTART, REGIMES, SUFFIX_AT_SCALE, Method, plan, with_trace_dirs

DESCRIPTION = """GRPO on CPU with stock rollouts and speculative ones, side by side (`bash scripts/quickstart.sh`).

A tiny model is warm-started on a noisy teacher (see `task`), then trained with GRPO several times from the same
weights, on the same data: once with stock OpenRLHF rollouts (`off`), and once per rule: by default `spec` at
ℓ = 1.65 and `lossless`, which is exact in RL; with `--rollout_reuse RULE`, that rule alone. Rollouts go through
OpenRLHF's own `SamplesGenerator` and `RolloutRayActor` (vLLM's async engine, one request per sample) on Ray, with
our agent executor for the speculative runs; the reward is our math-verify reward file. After each step the new
weights are loaded into each run's engine. The runs alternate step by step, so the machine's noise hits them alike.

`--seeds 0,1,2` repeats it per seed (its own data and warm start) and reports each rule's accuracy difference
against off with a 95% interval over seeds. `--grid lenience` runs the paper's lenience ablation in miniature;
`--grid drift` the staleness ablation: off, spec at e^0.5 and exact in four regimes that vary how often prompts come
back and how far the policy moves between visits, at the same number of steps.
`--grid frontier` trains spec at 1.65 and lossless with each proposal (the tree over one and two visits, the majority
path, the own draft) beside off in the default and the many-visit regimes: decoded tokens against accuracy; `--grid
tree` the two trees and spec only.
"""
DEFAULT_POLICY, DEFAULT_LENIENCE = "spec", 1.65
# Trained beside the baseline and `spec` when no rule is given: the rule that is exact in RL (docs/benchmarks.md).
RECOMMENDED = Method.of("lossless")
# Reuse flags the quickstart takes (the cache's and the checkpoint's concern only clusters).
REUSE_FLAGS = ("policy", "lenience", "params", "reused_logprobs", "scoring", "plugins", "trace_dir", "update_every")
REGIME_FLAGS = {"--epochs": "epochs", "--train-size": "train_size", "--lr": "lr", "--eval-every": "eval_every"}
DEFAULT_CURVE = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"  # an H200's, in the repository


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give seeds as integers, e.g. 0,1,2") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct seeds >= 0, e.g. 0,1,2")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bash scripts/quickstart.sh",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reuse_config.add_arguments(parser, REUSE_FLAGS)
    parser.set_defaults(rollout_reuse=None)  # None: not given (the grids refuse a rule of the user's)
    parser.add_argument("--seeds", type=seed_list, default=[0], help="seeds to run side by side (default: 0)")
    parser.add_argument("--grid", choices=sorted(GRIDS), default=None, help="run an ablation grid instead")
    parser.add_argument(
        "--regimes",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=None,
        metavar="NAME[,NAME]",
        help="with --grid: train these of its regimes only (default: all)",
    )
    parser.add_argument("--only", action="store_true", help="train the rule alone, without the baseline (a grid cell)")
    parser.add_argument("--out", default="runs/quickstart", help="output folder (default: runs/quickstart)")
    parser.add_argument(
        "--tensorboard", default=None, metavar="DIR", help="also log with OpenRLHF's TensorboardLogger"
    )
    parser.add_argument("--wandb", choices=["offline"], default=None, help="also log with OpenRLHF's WandbLogger")
    parser.add_argument("--dry-run", action="store_true", help="print the planned groups and runs, then exit")
    parser.add_argument(
        "--resume", action="store_true", help="keep the groups that finished in --out before, train the others"
    )
    for flag, key in REGIME_FLAGS.items():
        kind = float if key == "lr" else int
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            help=f"the regime's {key} (default: {getattr(QUICKSTART, key)}; the grids set their own)",
        )
    parser.add_argument(
        "--cost-curve",
        default=None,
        metavar="FILE",
        help="a GPU's step curve (scripts/bench_gpu_step.py): lossless's budget prices draft slots on it, and rollout "
        "times are projected on it (projection only, default: docs/gpu_step_h200.json where the repository has it)",
    )
    parser.add_argument(
        "--draft-price",
        choices=DRAFT_PRICES,
        default="model",
        help="what lossless's budget prices draft slots on without --cost-curve: 'model' (default), a modelled step "
        "of this CPU engine, so that a seed drafts, and decodes, the same on every run; 'measured', the engine's own "
        "steps as they run, as on a real engine (drafts then move with this machine's noise)",
    )
    add_dtype_argument(parser, default="float32")
    parser.add_argument("--held-out-size", type=int, default=200, help="held-out prompts (default: 200)")
    parser.add_argument("--rollout-batch", type=int, default=32, help="prompts per step (default: 32)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (default: 8)")
    parser.add_argument("--warm-start-steps", type=int, default=400, help="supervised steps of the warm start")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="sequences the engine runs at once (default: a quarter of a step's samples, as KV-cache memory limits "
        "an engine of the paper's runs to a fraction of its 1024 samples per step)",
    )
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value, low in [
        ("--held-out-size", args.held_out_size, 1),
        ("--rollout-batch", args.rollout_batch, 1),
        ("--samples", args.samples, 2),
        ("--warm-start-steps", args.warm_start_steps, 1),
        ("--max-num-seqs", args.max_num_seqs, 1),
    ]:
        if value is not None and value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    overrides = {key: getattr(args, key) for key in REGIME_FLAGS.values() if getattr(args, key) is not None}
    if args.grid:
        given = [flag for flag, key in REGIME_FLAGS.items() if key in overrides]
        if args.only:
            parser.error("--grid and --only exclude each other: --grid trains every rule beside a baseline")
        if args.rollout_reuse is not None or args.lenience is not None or getattr(args, "reuse.params"):
            parser.error(
                f"--grid {args.grid} trains its own rules; drop --rollout_reuse, --lenience and --reuse.params"
            )
        if given:
            parser.error(f"--grid {args.grid} sets {', '.join(given)} per regime; drop them")
        unknown = [name for name in args.regimes or [] if name not in GRIDS[args.grid][0]]
        if unknown or args.regimes == []:
            parser.error(
                f"--regimes {','.join(args.regimes)}: --grid {args.grid} has the regimes "
                f"{', '.join(GRIDS[args.grid][0])}; pick from them"
            )
    elif args.regimes is not None:
        parser.error("--regimes picks regimes of a grid; add --grid, or set --epochs, --train-size and --lr instead")
    if args.cost_curve is not None:  # one clear error before anything starts
        try:
            StepCurve.load(args.cost_curve)
        except ValueError as error:
            parser.error(f"--cost-curve {error}")
    try:
        args.groups = planned_groups(args, overrides)
    except (UnknownPolicyError, PluginError) as error:
        parser.error(f"--rollout_reuse: {error}")
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    args.curve_file = args.cost_curve or (str(DEFAULT_CURVE) if DEFAULT_CURVE.is_file() else None)
    if not args.only and not args.grid and args.main_method.is_baseline:
        parser.error("--rollout_reuse off is the baseline, which always runs; pick a reuse rule such as spec")
    for flag, folder in (
        ("--out", args.out),
        ("--reuse.trace_dir", args.trace_dir),
        ("--tensorboard", args.tensorboard),
    ):
        if folder is not None:
            check_writable(parser, flag, Path(folder))
    return args


def check_writable(parser, flag: str, folder: Path) -> None:
    try:
        reuse_config.check_writable_folder(flag, folder)
    except ValueError as error:
        parser.error(str(error))


def planned_groups(args, overrides: dict):
    """The groups to train; sets `args.main_method` (the rule the RESULT line reports). The reuse flags other than the
    rule's own (logprobs, scoring, plugins, update_every) apply to every rule, a grid's included."""
    given = reuse_config.from_namespace(args, REUSE_FLAGS, policy=args.rollout_reuse or DEFAULT_POLICY)
    shared = {key: getattr(given, key) for key in ("reused_logprobs", "scoring", "plugins", "update_every")}
    if args.grid:
        regime_names, rules = GRIDS[args.grid]
        regimes = [REGIMES[name] for name in regime_names if name in (args.regimes or regime_names)]
        rules = [Method(m.name, replace(m.config, **shared)) for m in at_scale(rules, args)]
    else:
        lenience = given.lenience
        if lenience is None and args.rollout_reuse is None:
            lenience = DEFAULT_LENIENCE
        rules = [Method.of(given.policy, lenience, given.params, **shared)]
        if args.rollout_reuse is None and not args.only:  # the default: show the trade-off against the safe rule
            rules.append(Method(RECOMMENDED.name, replace(RECOMMENDED.config, **shared)))
        regimes = [replace(QUICKSTART, **overrides)]
    price = args.cost_curve or (str(STEP_MODEL) if args.draft_price == "model" else None)
    if price:  # lossless prices its draft slots on it: a GPU's curve (its drafts), or the modelled step (the seed's)
        rules = [with_cost_curve(m, price) for m in rules]
    from ..integration.vllm.engine_args import engine_kwargs

    for method in rules:  # what the engines need is there (vLLM's suffix decoding: its suffix tree)
        engine_kwargs(method.config.build_policy())
    args.main_method = rules[0]
    groups = plan(rules, regimes, args.seeds, baseline=not args.only)
    with_trace_dirs(groups, given.trace_dir)
    args.trace_dir = given.trace_dir
    return groups


def at_scale(rules: list[Method], args) -> list[Method]:
    """The grids' `suffix` at scale: its cache of responses sized to 1.2 steps' requests, as vLLM's 10,000 is at 512
    prompts x 16 samples a step (`plan.SUFFIX_AT_SCALE`)."""
    requests = args.rollout_batch * args.samples
    out = []
    for method in rules:
        if method.name == SUFFIX_AT_SCALE:
            config = {"method": "suffix", "suffix_decoding_max_cached_requests": math.ceil(1.2 * requests)}
            method = Method(method.name, replace(method.config, params={"speculative_config": config}))
        out.append(method)
    return out


def with_cost_curve(method: Method, curve: str) -> Method:
    if not budgeted(method.config):
        return method
    params = {**method.config.params, "cost_curve": str(Path(curve).resolve())}
    return Method(method.name, replace(method.config, params=params))
