"""The runs' Ray side: one OpenRLHF `RolloutRayActor` per run (with our executor when the run reuses drafts), its
reuse actors, the weight sync after each step, and held-out evaluation through OpenRLHF's `generate_eval_samples`.

OpenRLHF's `SamplesGenerator` reads a slice of its argument namespace; `openrlhf_args` builds that slice, the same
fields its `train_ppo_ray` would set for this task.
"""

from __future__ import annotations

import itertools
import random
import types
from dataclasses import replace
from pathlib import Path

from .plan import Group, Run

REWARD_FILE = str(Path(__file__).resolve().parents[1] / "rewards" / "math_verify_reward.py")
MAX_NEW_TOKENS = 64
MAX_LEN = 256
EVAL_SAMPLES = 4  # per held-out prompt, at the training temperature (the paper's pass@1 protocol)
_run_ids = itertools.count()


def openrlhf_args(rollout_batch: int, samples: int) -> types.SimpleNamespace:
    """The fields of OpenRLHF's hierarchized arguments that `SamplesGenerator` and our run settings read."""
    ns = types.SimpleNamespace
    return ns(
        rollout=ns(
            batch_size=rollout_batch,
            n_samples_per_prompt=samples,
            vllm_generate_batch_size=None,
            temperature=1.0,
            top_p=1.0,
        ),
        vllm=ns(enable_sleep=False),
        algo=ns(dynamic_filtering_enable=False, advantage=ns(is_correction_level="token")),
        reward=ns(remote_url=[REWARD_FILE]),
        train=ns(agent_func_path=None),
    )


def generate_kwargs(samples: int) -> dict:
    return dict(
        temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, max_len=MAX_LEN, n_samples_per_prompt=samples
    )


def batches(problems, size: int, seed: int) -> list[tuple]:
    """A shuffled epoch in OpenRLHF's dataloader format: (datasources, prompts, labels, images) per batch."""
    order = list(problems)
    random.Random(seed).shuffle(order)
    return [
        (None, [p.prompt for p in order[i : i + size]], [p.answer for p in order[i : i + size]], [None] * size)
        for i in range(0, len(order), size)
    ]


def start_group(group: Group, model_dir: Path, args, progress) -> None:
    """One rollout actor per run (started together), its reuse actors, and a trainer per run from the same weights."""
    import ray

    from ..integration.openrlhf.cli import AGENT_ENTRY, run_settings
    from ..integration.openrlhf.draft_store import RUN_ENV, start_reuse
    from ..integration.vllm.engine_args import engine_kwargs
    from .engine import cpu_dtype, cpu_engine_kwargs
    from .grpo import GRPOConfig, GRPOTrainer
    from .weights import EXTENSION, rollout_actor_class

    actor_class = rollout_actor_class()
    namespace = openrlhf_args(args.rollout_batch, args.samples)
    for index, run in enumerate(group.runs):
        executor = {"remote_rm_url": [REWARD_FILE]}  # the baseline: OpenRLHF's own single-turn executor
        options = {}
        policy = run.method.config.build_policy()
        if run.reuses:
            run_id = f"quickstart{next(_run_ids)}"
            config = replace(run.method.config, cache_max_gb=1.0, seed=run.seed)
            run.handles = start_reuse(run_settings(namespace, config), config, run=run_id).handles
            executor = {"agent_func_path": AGENT_ENTRY, "remote_rm_url": None}
            options = {"runtime_env": {"env_vars": {RUN_ENV: run_id}}}
        engine = cpu_engine_kwargs(
            dtype=cpu_dtype(args.dtype),
            kv_cache_bytes=128 << 20,
            max_model_len=MAX_LEN,
            max_num_seqs=args.max_num_seqs or max(args.rollout_batch * args.samples // 4, 1),
            max_num_batched_tokens=8192,
            seed=run.seed + index,
            worker_extension_cls=EXTENSION,
        )
        run.actor = actor_class.options(**options).remote(
            model=str(model_dir),
            num_gpus=0,
            distributed_executor_backend="uni",
            logprobs_mode="processed_logprobs",  # as OpenRLHF sets it when the IS correction is on
            max_logprobs=max(1, policy.resample_top_k),
            **executor,
            **engine_kwargs(policy, engine),  # our proposer, for `lossless` verified in the engine
        )
    for run in group.runs:
        run.trainer = GRPOTrainer(model_dir, GRPOConfig(lr=run.regime.lr, seed=run.seed))
    ray.get([run.actor.get_num_unfinished_requests.remote() for run in group.runs])  # engines up
    progress(f"{group.key}: {len(group.runs)} engines up")


def stop_group(group: Group) -> None:
    """Free a group's engines and reuse actors before the next group starts."""
    import ray

    ray.get([run.actor.flush_traces.remote() for run in group.runs if run.actor is not None])
    for run in group.runs:
        for handle in [run.actor, *run.handles]:
            if handle is not None:
                ray.kill(handle, no_restart=True)
        for logger in run.loggers:
            logger.close()
        run.actor, run.handles, run.trainer, run.loggers = None, [], None, []


def samples_generator(run: Run, args, tokenizer, prompts=None, eval_prompts=None):
    """OpenRLHF's `SamplesGenerator` over the run's engine."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    strategy = types.SimpleNamespace(args=openrlhf_args(args.rollout_batch, args.samples))
    return SamplesGenerator(strategy, prompts, eval_prompts, tokenizer, [run.actor])


def sync_weights(run: Run, scratch: Path) -> None:
    """The trainer's weights into the run's engine (its prefix cache is dropped, as OpenRLHF's broadcast does)."""
    import ray

    from .weights import write_weights

    path = write_weights(run.trainer.state_dict(), scratch / f"weights-{id(run)}.safetensors")
    ray.get(run.actor.reload_weights.remote(path))


def held_out_accuracy(run: Run, held_out, args, tokenizer) -> float:
    """pass@1 over EVAL_SAMPLES samples per held-out prompt, through OpenRLHF's `generate_eval_samples`; marked
    as evaluation, so speculative runs generate it normally."""
    loader = batches(held_out, args.rollout_batch, seed=0)
    experiences = samples_generator(run, args, tokenizer, eval_prompts=loader).generate_eval_samples(
        **generate_kwargs(EVAL_SAMPLES)
    )
    return sum(float(e.rewards.sum()) for e in experiences) / max(len(experiences), 1)
