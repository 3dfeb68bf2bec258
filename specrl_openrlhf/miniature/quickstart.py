"""GRPO on CPU with stock rollouts and speculative ones, side by side (`bash scripts/quickstart.sh`).

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

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from .. import config as reuse_config
from ..policies import PluginError, UnknownPolicyError
from ..pricing.curves import StepCurve
from .engine import add_dtype_argument
from .plan import GRIDS, REGIMES, SUFFIX_AT_SCALE, Method, Regime, plan, with_trace_dirs

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
        prog="bash scripts/quickstart.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
            flag, type=kind, default=None, help=f"the regime's {key} (default: {getattr(Regime(), key)})"
        )
    parser.add_argument(
        "--cost-curve",
        default=None,
        metavar="FILE",
        help="a GPU's step curve (scripts/bench_gpu_step.py): lossless's budget prices draft slots on it, and rollout "
        "times are projected on it (projection only, default: docs/gpu_step_h200.json where the repository has it)",
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
        regimes = [replace(REGIMES["default"], **overrides)]
    if args.cost_curve:  # lossless prices its draft slots on the curve: the drafts a GPU would choose
        rules = [with_cost_curve(m, args.cost_curve) for m in rules]
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
    if method.config.policy != "lossless" or method.config.params.get("verify") == "requests":
        return method
    params = {**method.config.params, "cost_curve": str(Path(curve).resolve())}
    return Method(method.name, replace(method.config, params=params))


def describe_plan(groups) -> str:
    lines = []
    for group in groups:
        regime = group.regime
        lines.append(
            f"{group.key}: {regime.train_size} prompts x {regime.epochs} epochs, lr {regime.lr:g}, "
            + (f"held-out every {regime.eval_every} epoch(s)" if regime.eval_every else "held-out at the end")
            + ": "
            + ", ".join(r.label for r in group.runs)
        )
    return "\n".join(lines)


def open_loggers(run, args, out: Path) -> None:
    """OpenRLHF's own TensorBoard and wandb loggers for a run, and the `cell.json` that tells the report its group."""
    import types

    described = run.describe()
    if args.tensorboard:
        from openrlhf.utils.logging_utils import TensorboardLogger

        folder = Path(args.tensorboard) / run.label
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cell.json").write_text(json.dumps(described))
        logger_args = types.SimpleNamespace(tensorboard_dir=args.tensorboard, wandb=types.SimpleNamespace())
        logger_args.wandb.run_name = run.label
        run.loggers.append(TensorboardLogger(types.SimpleNamespace(logger=logger_args)))
    if args.wandb:
        run.loggers.append(DeferredWandbLogger(run.label, run.group, described))


class DeferredWandbLogger:
    """OpenRLHF's WandbLogger for one run, in wandb's offline mode (`--wandb offline`). That logger logs through
    wandb's one current run per process, and a group's runs train side by side, so each run's logs are kept and
    handed to a WandbLogger of its own when the run ends: what it writes is what OpenRLHF's logger writes."""

    def __init__(self, name: str, group: str, cell: dict):
        self.name, self.group, self.cell = name, group, cell
        self.calls: list[tuple[str, int, dict]] = []

    def log_train(self, step: int, logs: dict) -> None:
        self.calls.append(("log_train", step, dict(logs)))

    def log_eval(self, step: int, logs: dict) -> None:
        self.calls.append(("log_eval", step, dict(logs)))

    def close(self) -> None:
        import types

        from openrlhf.utils.logging_utils import WandbLogger

        wandb = types.SimpleNamespace(key=None, org=None, project="specrl-quickstart", group=self.group)
        wandb.run_name = self.name
        logger = WandbLogger(types.SimpleNamespace(logger=types.SimpleNamespace(wandb=wandb), **self.cell))
        for method, step, logs in self.calls:
            getattr(logger, method)(step, logs)
        logger.close()


def warm_start_with_progress(config, task, bar) -> Path:
    """The warm-started model of a seed: built once per settings (a minute or two) and cached."""
    from tqdm import tqdm

    from .warm_start import warm_start

    with tqdm(
        total=config.steps, desc=f"warm start, seed {config.seed}", unit="step", leave=False, disable=False
    ) as b:

        def progress(step, total, loss):
            b.update(step - b.n)
            b.set_postfix(loss=f"{loss:.3f}")

        return warm_start(config, task, progress=progress)


def finished_groups(out: Path, groups) -> set[str]:
    """With --resume: the groups whose runs all finished in an earlier run into `out` (their rows are taken over).
    Runs are matched by group and rule, not by label: labels change when the seeds or regimes given change."""
    path = out / "metrics.json"
    if not path.is_file():
        return set()
    earlier = json.loads(path.read_text())
    rows = {}
    for row in earlier.get("rows", []):
        rows.setdefault(row["run"], []).append(row)
    before = {info["name"]: info.get("acc_before") for info in earlier.get("runs", [])}
    names = {(info.get("group"), info.get("method")): info["name"] for info in earlier.get("runs", [])}
    done = set()
    for group in groups:
        last = group.regime.epochs - 1
        found = [names.get((group.key, run.method.name)) for run in group.runs]
        if all(
            name is not None and any(r["kind"] == "epoch" and r["epoch"] == last for r in rows.get(name, []))
            for name in found
        ):
            for run, name in zip(group.runs, found):
                run.rows = [dict(row, run=run.label) for row in rows[name]]
                run.accuracy_before = before.get(name)
            done.add(group.key)
    return done


def main(argv=None) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    groups = args.groups
    if args.dry_run:
        print(describe_plan(groups))
        return 0
    import logging

    import ray
    from tqdm import tqdm
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from ..integration.openrlhf.eval import WORKER_SETUP_HOOK, install_in_worker
    from . import summary
    from .actors import held_out_accuracy, start_group, stop_group
    from .engine import CPU_ENGINE_ENV, dtype_line
    from .host_steps import host_curve
    from .task import TaskConfig, splits
    from .training import train_group
    from .warm_start import WarmStartConfig

    logging.getLogger("openrlhf").setLevel(logging.WARNING)
    transformers_logging.disable_progress_bar()  # its per-load bars would break up ours
    out = Path(args.out).resolve()
    if args.wandb:  # wandb's own settings: runs in OUT/wandb, nothing sent anywhere
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(out), WANDB_SILENT="true")
    done = finished_groups(out, groups) if args.resume else set()
    todo = [group for group in groups if group.key not in done]
    steps = sum(g.regime.epochs * g.regime.steps_per_epoch(args.rollout_batch) * len(g.runs) for g in todo)
    print(
        f"[quickstart] {sum(len(g.runs) for g in groups)} runs in {len(groups)} group(s) of {args.rollout_batch} "
        f"prompts x {args.samples} samples per step"
        + (f", {len(done)} finished before" if done else "")
        + ":\n"
        + describe_plan(groups)
        + f"\n[quickstart] {dtype_line(args.dtype)}"
    )
    started = time.perf_counter()
    settings = {
        k: v for k, v in vars(args).items() if k not in ("groups", "main_method", "projection_curve", "host_curve")
    }
    args.projection_curve = StepCurve.load(args.curve_file) if args.curve_file else None
    args.host_curve = host_curve(None, print) if args.curve_file else None  # measured alone, before any engine
    (out / "steps").mkdir(parents=True, exist_ok=True)
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": WORKER_SETUP_HOOK, "env_vars": CPU_ENGINE_ENV},
    )
    accuracy_before = {run.seed: run.accuracy_before for g in groups if g.key in done for run in g.runs}
    try:
        install_in_worker()  # SamplesGenerator runs here: its evaluation requests carry the mark too
        with tempfile.TemporaryDirectory(prefix="specrl-weights-") as scratch_dir:  # weights on their way to an engine
            bar = tqdm(total=steps, desc="GRPO", unit="step", mininterval=1.0, disable=False)
            for group in todo:
                task = TaskConfig(
                    train_size=group.regime.train_size, held_out_size=args.held_out_size, seed=group.seed
                )
                train, held_out = splits(task)
                model_dir = warm_start_with_progress(
                    WarmStartConfig(steps=args.warm_start_steps, seed=group.seed), task, bar
                )
                tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
                start_group(group, model_dir, args, lambda message: bar.write(f"[quickstart] {message}"))
                try:
                    for run in group.runs:
                        open_loggers(run, args, out)
                        held_out_accuracy(run, held_out[:8], args, tokenizer)  # warms the engine up, untimed
                    if accuracy_before.get(group.seed) is None:  # every engine of a seed starts from the same weights
                        accuracy_before[group.seed] = held_out_accuracy(group.runs[0], held_out, args, tokenizer)
                        bar.write(
                            f"[quickstart] seed {group.seed}: held-out accuracy of the warm start "
                            f"{accuracy_before[group.seed]:.3f}"
                        )
                    for run in group.runs:
                        run.accuracy_before = accuracy_before[group.seed]
                    train_group(
                        group,
                        train,
                        held_out,
                        args,
                        tokenizer,
                        Path(scratch_dir),
                        bar,
                        lambda rows: bar.write(summary.format_table(rows)),
                    )
                finally:
                    stop_group(group)
                summary.write_outputs(out, groups, {"wall_s": time.perf_counter() - started}, settings)  # so far
            bar.close()
    finally:
        ray.shutdown()
    return summary.finish(args, out, groups, accuracy_before, time.perf_counter() - started, settings)


if __name__ == "__main__":
    sys.exit(main())
