"""The training loop of a group: its runs take turns step by step (the machine's noise hits them alike), each step
one rollout batch through OpenRLHF's `SamplesGenerator`, one GRPO step and one weight sync; held-out evaluation
after the epochs the regime names.

Each step's logs have the shape OpenRLHF's trainer gives its loggers (per-sample `reuse/*` info as means over samples,
`rollout/*`, `timing/*`); they go to OpenRLHF's TensorBoard and wandb loggers when asked for, and become the step's row
through `analysis.run_series.step_row`, the function that reads OpenRLHF's own logs, so a quickstart run and a cluster
run are reported the same way.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from ..analysis.run_series import step_row
from ..pricing.curves import HostCurve, StepPrice
from ..pricing.measured import rule_cost
from ..pricing.projection import RL_MAX_ROWS, RL_SCALE, STOCK, projected_time
from ..pricing.steps import EngineSteps
from .actors import batches, generate_kwargs, held_out_accuracy, samples_generator, sync_weights
from .engine import machine
from .plan import Group, Run


def openrlhf_logs(experiences, rollout_s: float, train_s: float, sync_s: float) -> dict[str, float]:
    """One step's logs as OpenRLHF's trainer gives them to its loggers."""
    logs = {
        "rollout/reward_mean": sum(float(e.rewards.sum()) for e in experiences) / len(experiences),
        "rollout/num_samples": float(len(experiences)),
        "rollout/response_length_mean": sum(int(e.response_length.item()) for e in experiences) / len(experiences),
        "timing/generation": rollout_s,
        "timing/ppo_train": train_s,
        "timing/broadcast": sync_s,
    }
    for key in sorted({k for e in experiences for k in e.info if k.startswith("reuse/")}):
        logs[key] = sum(float(e.info[key].item()) for e in experiences if key in e.info) / len(experiences)
    return logs


def engine_columns(
    steps: EngineSteps, start: float, curve: StepPrice | None, host: HostCurve | None = None, rule=STOCK
) -> dict:
    """What a rollout's engine steps say: how many, mean rows per step, the makespan split (time at a full batch and
    in the tail, drafts per row in each), and the steps' time projected on a GPU's curve at scale 1 and 8, with every
    cost (`pricing.projection.RuleCost`: the host's time and the proposer's where the rule turns async scheduling
    off). How each rule compares with stock, the host's part shown, is the summary's (`summary.host_figures`), from
    the steps themselves."""
    split = steps.split(start)
    columns = {"engine_steps": len(steps), **split}
    accepted = int(steps.accepted.sum())
    if accepted:  # what the engine's own proposer drafted and kept (every rule verified in the engine)
        columns["engine_drafted"], columns["engine_accepted"] = int(steps.drafted.sum()), accepted
    if curve is not None:
        columns["gpu_s"] = projected_time(steps, curve, host=host, rule=rule)
        columns["gpu8_s"] = projected_time(steps, curve, RL_SCALE, RL_MAX_ROWS, host=host, rule=rule)
    return columns


def train_step(run: Run, generator, args, scratch: Path, epoch: int, step: int) -> dict | None:
    """One rollout batch, one GRPO step, one weight sync; the step's row. None when the epoch's data is used up."""
    import ray

    ray.get(run.actor.take_steps.remote())  # what the engine ran before (held-out evaluation) is not this rollout's
    rollout_start = time.perf_counter()
    experiences, _, _, exhausted = generator.generate_samples(**generate_kwargs(args.samples))
    rollout_s = time.perf_counter() - rollout_start
    if not experiences:
        return None
    steps = EngineSteps.from_dict(ray.get(run.actor.take_steps.remote()))
    with open(Path(args.out) / "steps" / f"{run.label}.jsonl", "a") as f:  # rows per step over the rollout: plots
        f.write(json.dumps({"epoch": epoch, "step": step, "start": rollout_start, **steps.as_dict()}) + "\n")
    start = time.perf_counter()
    losses = run.trainer.step(experiences)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    sync_weights(run, scratch)
    logs = openrlhf_logs(experiences, rollout_s, train_s, time.perf_counter() - start)
    for logger in run.loggers:
        logger.log_train(step, logs)
    rule = rule_cost(run.method.config.build_policy(), machine())
    columns = engine_columns(steps, rollout_start, args.projection_curve, args.host_curve, rule)
    row = with_engine_drafts(step_row(step, logs), columns)
    return {"kind": "step", "run": run.label, "epoch": epoch, **row, **losses, **columns}


def with_engine_drafts(row: dict, columns: dict) -> dict:
    """A step's row where the engine drafted by itself and no executor of ours counted it (vLLM's own speculation
    runs on OpenRLHF's executor): its accepted draft tokens are reused, not decoded, as the step log counts them.

    >>> with_engine_drafts({"decoded_tokens": 100.0}, {"engine_drafted": 60, "engine_accepted": 40})
    {'decoded_tokens': 60.0, 'reused_tokens': 40, 'draft_tokens': 60}
    """
    if "reused_tokens" in row or "engine_accepted" not in columns:
        return row
    decoded = row.get("decoded_tokens", 0.0) - columns["engine_accepted"]
    return {
        **row,
        "decoded_tokens": decoded,
        "reused_tokens": columns["engine_accepted"],
        "draft_tokens": columns["engine_drafted"],
    }


def epoch_row(run: Run, epoch: int, steps: list[dict], accuracy: float | None) -> dict:
    """An epoch's totals and per-draft means (weighted by drafts), and its held-out accuracy when evaluated."""

    def total(key):
        return sum(s.get(key) or 0.0 for s in steps)

    drafts = total("drafts_found")
    row = {
        "kind": "epoch",
        "run": run.label,
        "epoch": epoch,
        "step": steps[-1]["step"] + 1,  # training steps done when it was evaluated
        **{k: total(k) for k in ("decoded_tokens", "reused_tokens", "scored_tokens", "rollout_s", "train_s")},
        **{k: total(k) for k in ("engine_steps", "full_s", "tail_s", "gpu_s", "gpu8_s") if k in steps[-1]},
        "scoring_s": total("scoring_s"),
        "full_reuse_ratio": sum((s.get("full_reuse_ratio") or 0.0) * s["samples"] for s in steps) / total("samples"),
        "reward": sum(s["reward"] * s["samples"] for s in steps) / total("samples"),
        "held_out_accuracy": accuracy,
    }
    for key in ("mean_verified_prefix_len", "kl_prev_curr", "excess_acceptance", "drift_since_decode"):
        row[key] = sum((s.get(key) or 0.0) * (s.get("drafts_found") or 0.0) for s in steps) / drafts if drafts else 0.0
    row["reused_token_age"] = (
        sum((s.get("reused_token_age") or 0.0) * (s.get("drafts_found") or 0.0) for s in steps) / drafts
        if drafts
        else 0.0
    )
    return row


def train_group(group: Group, train, held_out, args, tokenizer, scratch: Path, bar, on_epoch) -> None:
    """Every epoch of the group's regime; `on_epoch(rows)` gets the epoch's rows of every run."""
    regime = group.regime
    steps_per_epoch = math.ceil(len(train) / args.rollout_batch)
    for epoch in range(regime.epochs):
        loader = batches(train, args.rollout_batch, seed=group.seed * 1000 + epoch)
        generators = {run.label: samples_generator(run, args, tokenizer, prompts=loader) for run in group.runs}
        steps = {run.label: [] for run in group.runs}
        for step in range(steps_per_epoch):
            for run in group.runs:
                row = train_step(run, generators[run.label], args, scratch, epoch, epoch * steps_per_epoch + step)
                if row is None:
                    continue
                run.rows.append(row)
                steps[run.label].append(row)
                bar.update()
                bar.set_postfix(group=group.key, run=run.method.name, reward=f"{row['reward']:.2f}")
        rows = []
        for run in group.runs:
            accuracy = held_out_accuracy(run, held_out, args, tokenizer) if regime.evaluates_after(epoch) else None
            row = epoch_row(run, epoch, steps[run.label], accuracy)
            if accuracy is not None:
                for logger in run.loggers:
                    logger.log_eval(row["step"], {"eval_held_out_pass1": accuracy})
            run.rows.append(row)
            rows.append(row)
        on_epoch(rows)
