"""GRPO on CPU, with and without speculative rollouts, side by side (`bash scripts/quickstart.sh`).

A tiny model is warm-started on a noisy teacher (see `task`), then trained with GRPO twice from the same weights,
on the same data and seeds: once with stock OpenRLHF rollouts (`off`) and once with speculative ones. Rollouts go
through OpenRLHF's own `SamplesGenerator` and `RolloutRayActor` (vLLM's async engine, one request per sample) on
Ray, with our agent executor for the speculative run; the reward is our math-verify reward file. After each step
the new weights are loaded into that run's engine. The two runs alternate step by step, so the machine's noise
hits both.

`--grid lenience` runs the paper's lenience ablation in miniature the same way: the baseline, `spec` at five
lenience values, `full`, `random` and `delayed`.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from ...config import ReuseConfig
from ...policies import DEFAULT_LENIENCE, PluginError, UnknownPolicyError
from ..openrlhf_cli import json_object
from .task import TaskConfig, splits
from .warm_start import WarmStartConfig, warm_start

REWARD_FILE = str(Path(__file__).resolve().parents[2] / "rewards" / "math_verify_reward.py")
LENIENCE_GRID = (1.0, math.exp(0.2), math.exp(0.5), math.exp(0.8), math.exp(2.0))
EVAL_SAMPLES = 4  # per held-out prompt, at the training temperature (the paper's pass@1 protocol)
MAX_NEW_TOKENS = 64


GRID_GROUP_SIZE = 4  # methods per group in --grid: each group trains beside its own baseline, in memory at once


@dataclass
class Run:
    """One training run: its reuse settings, its engine, its trainer and what it logged."""

    name: str
    config: ReuseConfig
    group: int = 0  # runs of one group train side by side, beside the group's baseline
    actor: object = None
    trainer: object = None
    shards: list = field(default_factory=list)  # held here: Ray ends an actor when its last handle goes
    tensorboard: object = None  # OpenRLHF's TensorboardLogger, with --tensorboard
    rows: list[dict] = field(default_factory=list)

    @property
    def reuses(self) -> bool:
        return self.config.enabled

    def describe(self) -> dict:
        policy = self.config.build_policy()
        return {
            "name": self.name,
            "policy": self.config.policy,
            "lenience": policy.lenience if policy.needs_scores else None,
            "group": self.group,
            "rule": policy.describe(),
        }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bash scripts/quickstart.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="spec", help="reuse policy run beside the baseline (default: spec)")
    parser.add_argument(
        "--lenience", type=float, default=None, help=f"lenience (default e^0.5 = {DEFAULT_LENIENCE:.4f})"
    )
    parser.add_argument(
        "--params", type=json_object, default={}, metavar="JSON", help="the rule's other parameters (--reuse.params)"
    )
    parser.add_argument("--epochs", type=int, default=3, help="passes over the train split (default: 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the training and the acceptance rule")
    parser.add_argument("--out", default="runs/quickstart", help="output folder (default: runs/quickstart)")
    parser.add_argument("--grid", choices=["lenience"], default=None, help="run the lenience ablation instead")
    parser.add_argument("--only", action="store_true", help="train --policy alone, without the baseline (a grid cell)")
    parser.add_argument("--trace-dir", default=None, help="record every cut draft here (--reuse.trace_dir)")
    parser.add_argument(
        "--tensorboard", default=None, metavar="DIR", help="also log as OpenRLHF does, with its TensorboardLogger"
    )
    parser.add_argument("--group-key", default=None, help=argparse.SUPPRESS)  # grid cells that share a baseline
    parser.add_argument("--train-size", type=int, default=384, help="train prompts (default: 384)")
    parser.add_argument("--held-out-size", type=int, default=200, help="held-out prompts (default: 200)")
    parser.add_argument("--rollout-batch", type=int, default=32, help="prompts per step (default: 32)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (default: 8)")
    parser.add_argument("--warm-start-steps", type=int, default=400, help="supervised steps of the warm start")
    parser.add_argument("--lr", type=float, default=1.5e-4, help="GRPO learning rate (default: 1.5e-4)")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="sequences the engine runs at once (default: a quarter of a step's samples, as KV-cache memory limits "
        "an engine of the paper's runs to a fraction of its 1024 samples per step)",
    )
    args = parser.parse_args(argv)
    for flag, value, low in [
        ("--epochs", args.epochs, 1),
        ("--seed", args.seed, 0),
        ("--train-size", args.train_size, 1),
        ("--held-out-size", args.held_out_size, 1),
        ("--rollout-batch", args.rollout_batch, 1),
        ("--samples", args.samples, 2),
        ("--warm-start-steps", args.warm_start_steps, 1),
        ("--max-num-seqs", args.max_num_seqs, 1),
    ]:
        if value is not None and value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr must be a positive number, got {args.lr}")
    if args.grid and args.only:
        parser.error("--grid and --only exclude each other: --grid trains every method beside a baseline")
    try:
        args.groups = planned_groups(args)
    except (UnknownPolicyError, PluginError, ValueError, TypeError) as error:
        unknown = isinstance(error, (UnknownPolicyError, PluginError))
        parser.error(f"--policy: {error}" if unknown else str(error))
    if not args.only and args.grid is None and args.groups[0][1].config.policy == "off":
        parser.error("--policy off is the baseline, which always runs; pick a reuse policy such as spec")
    for flag, folder in (("--out", args.out), ("--trace-dir", args.trace_dir), ("--tensorboard", args.tensorboard)):
        if folder is not None:
            check_writable(parser, flag, Path(folder))
    return args


def check_writable(parser, flag: str, folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        parser.error(f"{flag} {folder}: not a writable folder ({error.strerror or error}); pass another {flag}")


def planned_groups(args) -> list[list[Run]]:
    """Groups of runs that train side by side, each with its baseline first (none with --only). Every
    configuration is validated here, before anything starts."""

    def config(policy, lenience=None, name="", params=None):
        trace = str(Path(args.trace_dir).resolve() / name) if args.trace_dir else None
        return ReuseConfig(policy=policy, lenience=lenience, params=params or {}, seed=args.seed, trace_dir=trace)

    if args.grid == "lenience":
        names = [(f"spec_l{lenience:.2f}", "spec", lenience) for lenience in LENIENCE_GRID]
        names += [(policy, policy, None) for policy in ("full", "random", "delayed")]
        methods = [Run(name, config(policy, lenience, name)) for name, policy, lenience in names]
    else:
        name = "off" if args.policy == "off" else Path(args.policy.split(":")[-1]).stem.lower()
        methods = [Run(name, config(args.policy, args.lenience, name, args.params))]
    if args.only:
        groups = [methods]
    else:
        size = GRID_GROUP_SIZE if args.grid else 1
        groups = []
        for g, start in enumerate(range(0, len(methods), size)):
            baseline = Run("off" if g == 0 else f"off_g{g}", ReuseConfig(policy="off"))
            groups.append([baseline, *methods[start : start + size]])
    for g, group in enumerate(groups):
        for run in group:
            run.group = g
            run.config.build_policy()  # unknown names and bad lenience values fail here
    return groups


def openrlhf_args(args) -> types.SimpleNamespace:
    """The slice of OpenRLHF's argument namespace that `SamplesGenerator` and our run settings read."""
    ns = types.SimpleNamespace
    return ns(
        rollout=ns(
            batch_size=args.rollout_batch,
            n_samples_per_prompt=args.samples,
            vllm_generate_batch_size=None,
            temperature=1.0,
            top_p=1.0,
        ),
        vllm=ns(enable_sleep=False),
        algo=ns(dynamic_filtering_enable=False, advantage=ns(is_correction_level="token")),
        reward=ns(remote_url=[REWARD_FILE]),
        train=ns(agent_func_path=None),
    )


def generate_kwargs(args, n: int) -> dict:
    return dict(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, max_len=256, n_samples_per_prompt=n)


def batches(problems, size: int, seed: int) -> list[tuple]:
    """A shuffled epoch in OpenRLHF's dataloader format: (datasources, prompts, labels, images) per batch."""
    import random

    order = list(problems)
    random.Random(seed).shuffle(order)
    return [
        (None, [p.prompt for p in order[i : i + size]], [p.answer for p in order[i : i + size]], [None] * size)
        for i in range(0, len(order), size)
    ]


def start_runs(runs: list[Run], model_dir: Path, args, progress) -> None:
    """One rollout actor per run (all started at once) and one trainer per run, from the same weights."""
    import ray

    from ..draft_store import RUN_ENV, create_draft_cache
    from ..openrlhf_cli import AGENT_ENTRY, run_settings
    from .engine import cpu_engine_kwargs
    from .grpo import GRPOConfig, GRPOTrainer
    from .weights import EXTENSION, rollout_actor_class

    actor_class = rollout_actor_class()
    namespace = openrlhf_args(args)
    for index, run in enumerate(runs):
        executor = {"remote_rm_url": [REWARD_FILE]}  # the baseline: OpenRLHF's own single-turn executor
        options = {}
        if run.reuses:
            run.shards = create_draft_cache(
                run_settings(namespace, run.config),
                num_shards=1,
                max_bytes=1 << 30,
                run=run.name,
                keep_visits=run.config.build_policy().draft_age,
            )
            executor = {"agent_func_path": AGENT_ENTRY, "remote_rm_url": None}
            options = {"runtime_env": {"env_vars": {RUN_ENV: run.name}}}
        run.actor = actor_class.options(**options).remote(
            model=str(model_dir),
            num_gpus=0,
            distributed_executor_backend="uni",
            logprobs_mode="processed_logprobs",  # as OpenRLHF sets it when the IS correction is on
            max_logprobs=1,
            **executor,
            **cpu_engine_kwargs(
                kv_cache_bytes=128 << 20,
                max_model_len=256,
                max_num_seqs=args.max_num_seqs or max(args.rollout_batch * args.samples // 4, 1),
                max_num_batched_tokens=8192,
                seed=args.seed + index,
                worker_extension_cls=EXTENSION,
            ),
        )
    for run in runs:
        run.trainer = GRPOTrainer(model_dir, GRPOConfig(lr=args.lr, seed=args.seed))
        if args.tensorboard:
            from openrlhf.utils.logging_utils import TensorboardLogger

            logger_args = types.SimpleNamespace(tensorboard_dir=args.tensorboard, wandb=types.SimpleNamespace())
            logger_args.wandb.run_name = run.name
            run.tensorboard = TensorboardLogger(types.SimpleNamespace(logger=logger_args))
            cell = {**run.describe(), "group": f"quickstart#{run.group}"}  # what `report` groups runs by
            (Path(args.tensorboard) / run.name).mkdir(parents=True, exist_ok=True)
            (Path(args.tensorboard) / run.name / "cell.json").write_text(json.dumps(cell))
    ray.get([run.actor.get_num_unfinished_requests.remote() for run in runs])  # engines up
    progress(f"{len(runs)} engines up")


def stop_runs(runs: list[Run]) -> None:
    """Free a group's engines and caches before the next group starts."""
    import ray

    ray.get([run.actor.flush_traces.remote() for run in runs if run.actor is not None])
    for run in runs:
        for handle in [run.actor, *run.shards]:
            if handle is not None:
                ray.kill(handle, no_restart=True)
        if run.tensorboard is not None:
            run.tensorboard.close()
        run.actor, run.shards, run.trainer, run.tensorboard = None, [], None, None


def reuse_sums(experiences) -> dict[str, float]:
    """Batch totals of the per-sample `reuse/` metrics in each Experience's info (stock runs have none)."""

    def total(key, weight=None):
        return sum(
            float(e.info[key].item()) * (float(e.info[weight].item()) if weight else 1.0)
            for e in experiences
            if key in e.info
        )

    def ratio(numerator, denominator):
        return numerator / denominator if denominator else 0.0

    found, scored = total("reuse/drafts_found"), total("reuse/scored_tokens")
    latency = {phase: total(f"reuse/time_{phase}_s") for phase in ("scoring", "generation", "assembly")}
    return {
        "drafts_found": found,
        "full_reuse_ratio": ratio(total("reuse/full_reuse_ratio"), len(experiences)),
        "draft_tokens": total("reuse/draft_tokens"),
        "reused_tokens": total("reuse/reused_tokens"),
        "kept_share": ratio(total("reuse/reused_tokens"), total("reuse/draft_tokens")),  # of the draft tokens offered
        "scored_tokens": scored,
        "mean_verified_prefix_len": ratio(total("reuse/reused_tokens"), found),
        "acceptance_rate": ratio(total("reuse/acceptance_rate", "reuse/scored_tokens"), scored),
        # nonzero only if the engine's weights changed since the drafts were written: the weight sync at work
        "mean_log_ratio": ratio(total("reuse/mean_log_ratio", "reuse/scored_tokens"), scored),
        "scoring_share": ratio(latency["scoring"], sum(latency.values())),  # of the samples' summed latency
        "fallbacks": total("reuse/fallbacks"),
        "lenience": ratio(total("reuse/lenience", "reuse/drafts_found"), found) if found else None,
    }


def train_step(run: Run, generator, args, scratch: Path, epoch: int, step: int) -> dict | None:
    """One rollout batch, one GRPO step, one weight sync. None when the epoch's data is used up."""
    import ray

    from .weights import write_weights

    start = time.perf_counter()
    experiences, _, _, exhausted = generator.generate_samples(**generate_kwargs(args, args.samples))
    rollout_s = time.perf_counter() - start
    if not experiences:
        return None
    start = time.perf_counter()
    losses = run.trainer.step(experiences)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    path = write_weights(run.trainer.state_dict(), scratch / f"{run.name}.safetensors")
    ray.get(run.actor.reload_weights.remote(path))
    sync_s = time.perf_counter() - start
    sums = reuse_sums(experiences)
    response_tokens = sum(int(e.response_length.item()) for e in experiences)
    decoded = sum(float(e.info["reuse/decoded_tokens"].item()) for e in experiences) if run.reuses else response_tokens
    row = {
        "kind": "step",
        "run": run.name,
        "epoch": epoch,
        "step": step,
        "samples": len(experiences),
        "response_tokens": response_tokens,
        "decoded_tokens": decoded,
        **sums,
        "rollout_s": rollout_s,
        "scoring_s": rollout_s * sums["scoring_share"],
        "train_s": train_s,
        "sync_s": sync_s,
        "reward": sum(float(e.rewards.sum()) for e in experiences) / len(experiences),
        **losses,
        "exhausted": exhausted,
    }
    if run.tensorboard is not None:
        run.tensorboard.log_train(step, openrlhf_train_logs(row, experiences))
    return row


def openrlhf_train_logs(row: dict, experiences) -> dict[str, float]:
    """One step's logs in the shape OpenRLHF's trainer gives its loggers: per-sample info as means over samples,
    `rollout/*` stats and `timing/*` per phase."""
    logs = {
        "rollout/reward_mean": row["reward"],
        "rollout/num_samples": float(len(experiences)),
        "rollout/response_length_mean": row["response_tokens"] / len(experiences),
        "timing/generation": row["rollout_s"],
        "timing/ppo_train": row["train_s"],
        "timing/broadcast": row["sync_s"],
    }
    for key in sorted({k for e in experiences for k in e.info if k.startswith("reuse/")}):
        logs[key] = sum(float(e.info[key].item()) for e in experiences if key in e.info) / len(experiences)
    return logs


def warm_up(runs: list[Run], held_out, args, tokenizer) -> None:
    """A first batch through every engine, so no run's first timed step pays for its engine's warm-up."""
    for run in runs:
        held_out_accuracy(run, held_out[: args.rollout_batch], args, tokenizer)


def held_out_accuracy(run: Run, held_out, args, tokenizer) -> float:
    """pass@1 over EVAL_SAMPLES samples per held-out prompt, through OpenRLHF's `generate_eval_samples`; marked
    as evaluation, so speculative runs generate it normally."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    loader = batches(held_out, args.rollout_batch, seed=0)
    generator = SamplesGenerator(types.SimpleNamespace(args=openrlhf_args(args)), None, loader, tokenizer, [run.actor])
    experiences = generator.generate_eval_samples(**generate_kwargs(args, EVAL_SAMPLES))
    return sum(float(e.rewards.sum()) for e in experiences) / max(len(experiences), 1)


def epoch_row(run: Run, epoch: int, steps: list[dict], accuracy: float) -> dict:
    def total(key):
        return sum(s[key] for s in steps)

    found = total("drafts_found")
    samples = total("samples")
    return {
        "kind": "epoch",
        "run": run.name,
        "epoch": epoch,
        "step": steps[-1]["step"] + 1,  # training steps done when it was evaluated
        "decoded_tokens": total("decoded_tokens"),
        "reused_tokens": total("reused_tokens"),
        "scored_tokens": total("scored_tokens"),
        "full_reuse_ratio": sum(s["full_reuse_ratio"] * s["samples"] for s in steps) / samples,
        "mean_verified_prefix_len": total("reused_tokens") / found if found else 0.0,
        "rollout_s": total("rollout_s"),
        "scoring_s": total("scoring_s"),
        "train_s": total("train_s"),
        "reward": sum(s["reward"] * s["samples"] for s in steps) / samples,
        "held_out_accuracy": accuracy,
    }


EPOCH_COLUMNS = [
    ("epoch", "epoch", "{:>5}"),
    ("run", "run", "{:>12}"),
    ("decoded", "decoded_tokens", "{:>8.0f}"),
    ("reused", "reused_tokens", "{:>7.0f}"),
    ("full", "full_reuse_ratio", "{:>5.2f}"),
    ("prefix", "mean_verified_prefix_len", "{:>6.1f}"),
    ("rollout_s", "rollout_s", "{:>9.1f}"),
    ("score_s", "scoring_s", "{:>7.1f}"),
    ("train_s", "train_s", "{:>7.1f}"),
    ("reward", "reward", "{:>6.3f}"),
    ("held-out", "held_out_accuracy", "{:>8.3f}"),
]


def format_table(rows: list[dict]) -> str:
    widths = [len(fmt.format(0 if "f" in fmt else "")) for _, _, fmt in EPOCH_COLUMNS]
    lines = [" ".join(f"{title:>{w}}" for (title, _, _), w in zip(EPOCH_COLUMNS, widths))]
    lines += [" ".join(fmt.format(row[key]) for _, key, fmt in EPOCH_COLUMNS) for row in rows]
    return "\n".join(lines)


def write_outputs(out: Path, groups: list[list[Run]], summary: dict, settings: dict) -> Path:
    """metrics.json (every row, the runs and the summary: what `python -m specrl_openrlhf.report` reads) and
    metrics.csv."""
    runs = [run for group in groups for run in group]
    rows = [row for run in runs for row in run.rows]
    group_key = settings.get("group_key")
    described = [{**run.describe(), "group_key": group_key} for run in runs]
    path = out / "metrics.json"
    path.write_text(json.dumps({"settings": settings, "summary": summary, "runs": described, "rows": rows}, indent=1))
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def train_group(group: list[Run], train, held_out, args, tokenizer, scratch: Path, bar, table: list) -> None:
    """Every epoch: the runs take turns step by step (the machine's noise hits them alike), then each is evaluated."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    steps_per_epoch = math.ceil(len(train) / args.rollout_batch)
    for epoch in range(args.epochs):
        loader = batches(train, args.rollout_batch, seed=args.seed * 1000 + epoch)
        generators = {
            run.name: SamplesGenerator(
                types.SimpleNamespace(args=openrlhf_args(args)), loader, None, tokenizer, [run.actor]
            )
            for run in group
        }
        steps = {run.name: [] for run in group}
        for step in range(steps_per_epoch):
            for run in group:
                row = train_step(run, generators[run.name], args, scratch, epoch, epoch * steps_per_epoch + step)
                if row is None:
                    continue
                run.rows.append(row)
                steps[run.name].append(row)
                bar.update()
                bar.set_postfix(epoch=epoch, run=run.name, reward=f"{row['reward']:.2f}")
        for run in group:
            row = epoch_row(run, epoch, steps[run.name], held_out_accuracy(run, held_out, args, tokenizer))
            if run.tensorboard is not None:
                run.tensorboard.log_eval(row["step"], {"eval_held_out_pass1": row["held_out_accuracy"]})
            run.rows.append(row)
            table.append(row)
        bar.write(format_table([r for r in table if r["epoch"] == epoch and any(r["run"] == g.name for g in group)]))


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    import ray
    from openrlhf.trainer.ppo_utils import samples_generator
    from tqdm import tqdm
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from ... import report
    from ..openrlhf_eval import WORKER_SETUP_HOOK, install_in_worker

    samples_generator.tqdm = functools.partial(tqdm, disable=True)  # OpenRLHF's per-batch bars; ours is below
    logging.getLogger("openrlhf").setLevel(logging.WARNING)
    transformers_logging.disable_progress_bar()  # its per-load bars would break up ours
    out, groups = Path(args.out).resolve(), args.groups
    runs = [run for group in groups for run in group]
    task = TaskConfig(train_size=args.train_size, held_out_size=args.held_out_size, seed=args.seed)
    train, held_out = splits(task)
    steps_per_epoch = math.ceil(len(train) / args.rollout_batch)
    settings = {k: v for k, v in vars(args).items() if k != "groups"} | {"runs": [r.name for r in runs]}
    print(
        f"[quickstart] {', '.join(r.name for r in runs)}: {len(train)} train / {len(held_out)} held-out problems, "
        f"{args.epochs} epochs x {steps_per_epoch} steps of {args.rollout_batch} prompts x {args.samples} samples"
        + (f", in {len(groups)} groups" if len(groups) > 1 else "")
    )
    started = time.perf_counter()

    with tqdm(total=args.warm_start_steps, desc="warm start", unit="step", leave=False, mininterval=1.0) as bar:

        def progress(step, total, loss):
            bar.update(step - bar.n)
            bar.set_postfix(loss=f"{loss:.3f}")

        model_dir = warm_start(WarmStartConfig(steps=args.warm_start_steps, seed=args.seed), task, progress=progress)
    print(f"[quickstart] warm-started model: {model_dir} ({time.perf_counter() - started:.0f}s)")

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": WORKER_SETUP_HOOK, "env_vars": {"VLLM_LOGGING_LEVEL": "ERROR"}},
    )
    try:
        install_in_worker()  # SamplesGenerator runs here: its evaluation requests carry the mark too
        table: list[dict] = []
        accuracy_before = None
        with tempfile.TemporaryDirectory(prefix="specrl-weights-") as scratch_dir:  # weights on their way to an engine
            scratch = Path(scratch_dir)
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            bar = tqdm(total=args.epochs * steps_per_epoch * len(runs), desc="GRPO", unit="step", mininterval=1.0)
            for group in groups:
                start_runs(group, model_dir, args, lambda message: bar.write(f"[quickstart] {message}"))
                try:
                    warm_up(group, held_out, args, tokenizer)
                    if accuracy_before is None:  # every engine starts from the same weights
                        accuracy_before = held_out_accuracy(group[0], held_out, args, tokenizer)
                        bar.write(f"[quickstart] held-out accuracy of the warm start: {accuracy_before:.3f}")
                    train_group(group, train, held_out, args, tokenizer, scratch, bar, table)
                finally:
                    stop_runs(group)
            bar.close()
    finally:
        ray.shutdown()

    summary = {"acc_before": accuracy_before, "wall_s": time.perf_counter() - started}
    metrics = write_outputs(out, groups, summary, settings)
    series = report.load_cpu_metrics(metrics)
    files = report.write_report(series, out)
    rows = report.table_rows(series)
    print("\n" + format_table(table))
    print("\nwhole run, against each group's baseline (the paper's Table 3 shape):")
    print(report.markdown(rows))
    if args.grid is None and not args.only:
        base, method = series
        by_name = {row["run"]: row for row in rows}
        result = comparison(base, method, by_name[base.name], by_name[method.name])
        print(
            f"\nsummary ({method.name} against {base.name}):\n"
            f"  decoded tokens   {base.total('decoded_tokens'):,.0f} / {method.total('decoded_tokens'):,.0f}"
            f" = {result['token_ratio']:.2f}x fewer ({result['token_ratio_later']:.2f}x from the 2nd epoch on, when"
            f" drafts exist)\n"
            f"  rollout time     {base.total('rollout_s'):.1f}s / {method.total('rollout_s'):.1f}s"
            f" = ratio {result['time_ratio']:.2f}\n"
            f"  step time        {result['base_step_s']:.1f}s / {result['method_step_s']:.1f}s"
            f" = ratio {result['step_time_ratio']:.2f} (rollout + training + weight sync)\n"
            f"  held-out acc.    warm start {accuracy_before:.3f}, {base.name} {result['acc_off']:.3f},"
            f" {method.name} {result['acc_spec']:.3f}"
        )
    print(f"outputs: {out}/ metrics.csv, metrics.json, " + ", ".join(str(p.relative_to(out)) for p in files.values()))
    print(f"wall time {summary['wall_s']:.0f}s")
    if args.grid is None and not args.only:
        print(
            f"RESULT token_ratio={result['token_ratio']:.2f} time_ratio={result['time_ratio']:.2f} "
            f"step_time_ratio={result['step_time_ratio']:.2f} acc_before={accuracy_before:.3f} "
            f"acc_off={result['acc_off']:.3f} acc_spec={result['acc_spec']:.3f} policy={method.name} out={out}"
        )
    else:
        print(f"RESULT grid={args.grid or 'cell'} runs={len(runs)} out={out}")
    return 0


def comparison(base, method, base_row: dict, method_row: dict) -> dict[str, float]:
    """A method's run against its baseline (baseline / method: above 1 means the method is cheaper): the report's
    rows for the whole run, plus what only the quickstart shows."""

    def ratio(a, b):
        return a / b if b else math.nan

    def later(run, key):  # from the second epoch on, when the method has drafts
        return sum(r[key] for r in run.steps if r["epoch"] > 0)

    def step_s(run):  # rollout + training + weight sync
        return run.total("rollout_s") + run.total("train_s") + run.total("sync_s")

    return {
        "token_ratio": method_row["token_ratio"],
        "token_ratio_later": ratio(later(base, "decoded_tokens"), later(method, "decoded_tokens")),
        "time_ratio": method_row["speedup"],
        "base_step_s": step_s(base),
        "method_step_s": step_s(method),
        "step_time_ratio": ratio(step_s(base), step_s(method)),
        "acc_off": base_row["acc_held_out"],
        "acc_spec": method_row["acc_held_out"],
    }


if __name__ == "__main__":
    sys.exit(main())
