"""The quickstart's run (`bash scripts/quickstart.sh`; its flags and what it trains: `quickstart_args`): for each
planned group, its seed's warm-started model, one engine a run, the runs trained side by side (`training`), then the
tables, the summary and the RESULT line (`summary`)."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..pricing.curves import StepCurve
from . import draft_price
from .draft_price import budgeted
from .plan import describe_plan
from .quickstart_args import parse_args
from .resume import finished_groups
from .run_loggers import open_loggers


def warm_start_with_progress(config, task, bar) -> Path:
    """The warm-started model of a seed: the package's own for the default settings (`warm_start.SHIPPED`), else
    built once per settings (minutes on a CPU) and cached."""
    from tqdm import tqdm

    from .warm_start import warm_start

    with tqdm(
        total=config.steps, desc=f"warm start, seed {config.seed}", unit="step", leave=False, disable=False
    ) as b:

        def progress(step, total, loss):
            b.update(step - b.n)
            b.set_postfix(loss=f"{loss:.3f}")

        return warm_start(config, task, progress=progress)


def run_group(group, args, out: Path, bar, scratch: Path, accuracy_before: dict) -> None:
    """One group: its seed's data and warm start, its engines, the held-out accuracy before (once a seed: every engine
    of a seed starts from the same weights), then its runs trained side by side."""
    from transformers import AutoTokenizer

    from . import summary
    from .actors import held_out_accuracy, start_group, stop_group
    from .task import TaskConfig, splits
    from .training import train_group
    from .warm_start import WarmStartConfig

    task = TaskConfig(train_size=group.regime.train_size, held_out_size=args.held_out_size, seed=group.seed)
    train, held_out = splits(task)
    model_dir = warm_start_with_progress(WarmStartConfig(steps=args.warm_start_steps, seed=group.seed), task, bar)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    start_group(group, model_dir, args, lambda message: bar.write(f"[quickstart] {message}"))
    try:
        for run in group.runs:
            open_loggers(run, args, out)
            held_out_accuracy(run, held_out[:8], args, tokenizer)  # warms the engine up, untimed
        if accuracy_before.get(group.seed) is None:
            before = accuracy_before[group.seed] = held_out_accuracy(group.runs[0], held_out, args, tokenizer)
            bar.write(f"[quickstart] seed {group.seed}: held-out accuracy of the warm start {before:.3f}")
        for run in group.runs:
            run.accuracy_before = accuracy_before[group.seed]
        show = lambda rows: bar.write(summary.format_table(rows))  # noqa: E731
        train_group(group, train, held_out, args, tokenizer, scratch, bar, show)
    finally:
        stop_group(group)


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
    from transformers.utils import logging as transformers_logging

    from ..integration.openrlhf.eval import WORKER_SETUP_HOOK, install_in_worker
    from ..pricing.measured import shipped_host_curve
    from . import summary
    from .engine import CPU_ENGINE_ENV, cache_model_info, dtype_line
    from .warm_start import DEFAULT_TASK, WarmStartConfig, warm_start

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
    args.host_curve = shipped_host_curve() if args.curve_file else None
    if args.host_curve is not None:
        print(f"[quickstart] host steps: {args.host_curve.describe()}")
    if any(budgeted(run.method.config) for group in todo for run in group.runs):
        print(f"[quickstart] {draft_price.describe(args.draft_price, args.cost_curve)}")
    (out / "steps").mkdir(parents=True, exist_ok=True)
    # vLLM's model-info cache filled while Ray starts: every warm start is the tiny model's class, as the shipped one
    model_info = threading.Thread(target=cache_model_info, args=(warm_start(WarmStartConfig(), DEFAULT_TASK),))
    model_info.start()
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": WORKER_SETUP_HOOK, "env_vars": CPU_ENGINE_ENV},
    )
    model_info.join()
    accuracy_before = {run.seed: run.accuracy_before for g in groups if g.key in done for run in g.runs}
    try:
        install_in_worker()  # SamplesGenerator runs here: its evaluation requests carry the mark too
        with tempfile.TemporaryDirectory(prefix="specrl-weights-") as scratch_dir:  # weights on their way to an engine
            bar = tqdm(total=steps, desc="GRPO", unit="step", mininterval=1.0, disable=False)
            for group in todo:
                run_group(group, args, out, bar, Path(scratch_dir), accuracy_before)
                summary.write_outputs(out, groups, {"wall_s": time.perf_counter() - started}, settings)  # so far
            bar.close()
    finally:
        ray.shutdown()
    return summary.finish(args, out, groups, accuracy_before, time.perf_counter() - started, settings)


if __name__ == "__main__":
    sys.exit(main())
