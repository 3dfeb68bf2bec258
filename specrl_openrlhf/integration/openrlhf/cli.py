"""`python -m specrl_openrlhf.cli.train_ppo_ray`: OpenRLHF's own `train_ppo_ray`, plus rollout reuse.

OpenRLHF's module runs as it is (see `seams`): its parser, its validation, its `train`. Its parser gains our
argument group; once it has validated the arguments, `train_with_reuse` starts Ray with our worker setup hook, starts
the run's reuse actors (its settings, the shared draft cache) and hands the vLLM engines our agent executor through
OpenRLHF's `--train.agent_func_path`, then calls OpenRLHF's `train`. Without our flags, OpenRLHF runs untouched.

The peers (`vllm`, `suffix`, `ngram`: vLLM's own speculation) reuse nothing, but the run is ours all the same
(`steps_in`): their engines need the speculative config, and our executor reports, per sample, what vLLM drafted and
accepted (`reuse/`), as for `lossless` verified in the engine.

OpenRLHF builds its engines with vLLM's defaults for their size (it has no flag for it): the command says what size
each engine will have (and whether it runs without CUDA graphs, `--vllm.enforce_eager`), warns where a rule verified
in the engine drafts more than a step's budget carries, and our `--vllm.max_num_seqs` and
`--vllm.max_num_batched_tokens` reach every engine through the same seam as the speculative config (`engines`). For a
rule verified in the engine it also says which engine the installed vLLM runs (`vllm.versions`: the V1 `custom_class`
proposer, or the V2 speculator with or without adaptive verification), and refuses, as a usage error, a setting that
engine cannot run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import sys
import threading
import types
from pathlib import Path

from ... import config as reuse_config
from ...config import ReuseConfig
from ...policies import PluginError, ReusePolicy, UnknownPolicyError
from ...policies.base import V1_ENGINE, EngineTarget
from ...policies.builtin import HISTORY_PROPOSER
from ...policies.sampling import UnsupportedSamplingError, check_sampling
from .eval import WORKER_SETUP_HOOK

logger = logging.getLogger(__name__)

PROG = "python -m specrl_openrlhf.cli.train_ppo_ray"
OPENRLHF_FLAGS = {"enforce_eager": "--vllm.enforce_eager"}  # OpenRLHF's engine arguments we read, as its flags
AGENT_ENTRY = str(Path(__file__).with_name("agent_entry.py"))


def extend_parser(parser: argparse.ArgumentParser) -> None:
    """Our argument group, and a usage line short enough to read above an error (OpenRLHF's runs 160 lines)."""
    parser.usage = (
        f"{parser.prog} [OpenRLHF flags] [--rollout_reuse NAME] [--lenience L] [--reuse.* ...]  (--help: all flags)"
    )
    reuse_config.add_arguments(parser)


def steps_in(policy: ReusePolicy) -> bool:
    """Whether the run needs us: a rule that reuses drafts, or one that vLLM verifies by itself (the peers: their
    engines need its `speculative_config`, and our executor reports, per sample, what vLLM drafted and accepted).
    `off` leaves OpenRLHF as it is."""
    return policy.draft_age > 0 or policy.verifies_in_engine


def after_parse(parser: argparse.ArgumentParser, namespace):
    """Validate our flags with OpenRLHF's (a bad one is a usage error, before Ray starts), and say how large each
    engine will be (`engine_size_notes`). Returns what to put in the command module's namespace (our `train`, and for
    a rule verified in the engine or our engine size flags our `create_vllm_engines`), or None to leave it as it is
    (`off` without them, no dry run). The rule is built here, once for the run, and passed on."""
    try:
        config = reuse_config.from_namespace(namespace)
        policy = config.build_policy()  # loads the plugins: a bad rule is a usage error too
        path, path_line = engine_path_notes(namespace, config, policy)
        warnings = check_combination(namespace, config, policy, path)
    except (UnknownPolicyError, PluginError, UnsupportedSamplingError, ValueError, TypeError) as error:
        flag = "--rollout_reuse" if isinstance(error, (UnknownPolicyError, PluginError)) else ""
        parser.error(f"{flag + ': ' if flag and not str(error).startswith('--') else ''}{error}")
    size_line, size_warnings = engine_size_notes(namespace, config, policy, path.target if path else V1_ENGINE)
    for line in (path_line, size_line):
        if line:
            print(f"[specrl-openrlhf] {line}", file=sys.stderr)
    for warning in warnings + size_warnings:
        print(f"[specrl-openrlhf] warning: {warning}", file=sys.stderr)
    if not (steps_in(policy) or config.dry_run or config.engine_size_arguments):
        return None
    return functools.partial(take_over_names, config, policy=policy)


def take_over_names(config: ReuseConfig, module_globals: dict, policy: ReusePolicy | None = None) -> None:
    """Our `train` (`train_with_reuse`, which calls OpenRLHF's), and the engine arguments of ours (`policy`: the
    config's rule, built where the run starts)."""
    from .engines import with_engine_kwargs

    policy = config.build_policy() if policy is None else policy
    upstream_train = module_globals["train"]
    module_globals["train"] = lambda args: train_with_reuse(args, upstream_train, policy)
    if our_engine_kwargs(config, policy) and "create_vllm_engines" in module_globals:
        extra = functools.partial(our_engine_kwargs, config, policy)  # OpenRLHF's arguments in, ours added
        module_globals["create_vllm_engines"] = with_engine_kwargs(module_globals["create_vllm_engines"], extra)


def our_engine_kwargs(config: ReuseConfig, policy: ReusePolicy, base: dict | None = None) -> dict:
    """OpenRLHF's engine arguments `base` (default: none) with ours: the engine size our `--vllm.*` flags set, and
    what the rule's engines need on the installed vLLM (`engine_kwargs`: nothing for a rule verified by requests, or
    `off`)."""
    from ..vllm.engine_args import engine_kwargs

    return engine_kwargs(policy, {**(base or {}), **config.engine_size_arguments}, OPENRLHF_FLAGS)


def engine_kwargs_added(config: ReuseConfig, policy: ReusePolicy, base: dict) -> dict:
    """What `our_engine_kwargs` adds to OpenRLHF's engine arguments `base`, or changes in them."""
    return {k: v for k, v in our_engine_kwargs(config, policy, base).items() if k not in base or base[k] != v}


def openrlhf_engine_arguments(namespace) -> dict:
    """What OpenRLHF's `create_vllm_engines` will give each engine of the arguments that decide which engine runs
    (`vllm.versions.adaptive_blockers`)."""
    return {"enforce_eager": bool(lookup(namespace, "vllm.enforce_eager", False))}


def engine_path_notes(namespace, config: ReuseConfig, policy: ReusePolicy):
    """(the installed vLLM's `EnginePath` for OpenRLHF's engines, the start-up log's line) for a rule verified in the
    engine, with vLLM engines; (None, a line saying why not) where vLLM can't be imported here; else (None, None)."""
    if not (policy.verifies_in_engine and (lookup(namespace, "vllm.num_engines") or 0) >= 1):
        return None, None
    from ..vllm.versions import engine_path

    try:
        path = engine_path({**openrlhf_engine_arguments(namespace), **config.engine_size_arguments}, OPENRLHF_FLAGS)
    except ImportError as error:
        return None, f"vLLM can't be imported here ({error}): each engine runs what its own vLLM has"
    return path, path.line(policy)


def engine_size_notes(
    namespace, config: ReuseConfig, policy: ReusePolicy, target: EngineTarget = V1_ENGINE
) -> tuple[str | None, list[str]]:
    """A line saying how many rows and tokens a step each engine OpenRLHF starts will schedule (the flags given,
    else vLLM's defaults for an engine built as OpenRLHF builds it) and whether it captures CUDA graphs (OpenRLHF's
    `--vllm.enforce_eager`), and a warning where a rule verified in the engine drafts more tokens than that budget
    carries in every row (on an engine of kind `target`). (None, []) without vLLM engines."""
    engines = lookup(namespace, "vllm.num_engines") or 0
    if engines < 1:
        return None, []
    from ..vllm.engine_defaults import engine_size

    try:
        size = engine_size(
            config.max_num_seqs,
            config.max_num_batched_tokens,
            world_size=lookup(namespace, "vllm.tensor_parallel_size", 1) or 1,
        )
    except ImportError as error:
        return f"vLLM's engine defaults can't be read here ({error}): each engine's size is vLLM's to set", []
    given = config.engine_size_arguments
    origin = {
        name: f"--vllm.{name}" if name in given else f"{name}, vLLM's default"
        for name in ("max_num_seqs", "max_num_batched_tokens")
    }
    graphs = (  # OpenRLHF's own flag, which it hands every engine as vLLM's enforce_eager
        "without CUDA graphs (--vllm.enforce_eager)"
        if lookup(namespace, "vllm.enforce_eager", False)
        else "with CUDA graphs (no --vllm.enforce_eager)"
    )
    line = (
        f"each of the {engines} vLLM engine(s) OpenRLHF builds schedules at most {size.max_num_seqs} rows "
        f"({origin['max_num_seqs']}) and {size.max_num_batched_tokens} tokens a step "
        f"({origin['max_num_batched_tokens']}), {graphs}"
    )
    speculative = policy.engine_arguments(target).get("speculative_config", {})
    k = speculative.get("num_speculative_tokens")
    if not k or size.carries_drafts(k):
        return line, []
    need, rows = size.tokens_for_drafts(k), size.rows_carrying_drafts(k)
    fewer_rows = f", or fewer rows: --vllm.max_num_seqs {rows}" if rows else ""
    cut = (
        f"so our proposer drafts at most {size.max_num_batched_tokens - size.max_num_seqs} tokens a full step in all "
        "(the likeliest slots)"
        if speculative.get("model") == HISTORY_PROPOSER
        else "so vLLM cuts the drafts of the rows it schedules last and leaves the rest for the next step"
    )
    return line, [
        f"--rollout_reuse {config.policy} drafts up to k = {k} tokens a row: a full step of {size.max_num_seqs} rows "
        f"x (1 + {k}) = {need} tokens is over the engine's budget of {size.max_num_batched_tokens} "
        f"(max_num_batched_tokens), {cut}. Fix: --vllm.max_num_batched_tokens {need} (or more){fewer_rows}, or "
        "fewer draft tokens a step (num_speculative_tokens)"
    ]


def lookup(namespace, dotted: str, default=None):
    """A flag's value from argparse's flat namespace ("rollout.top_p" attributes) or OpenRLHF's hierarchized one."""
    if hasattr(namespace, dotted):
        return getattr(namespace, dotted)
    node = namespace
    for part in dotted.split("."):
        node = getattr(node, part, default)
    return node


def check_combination(namespace, config: ReuseConfig, policy: ReusePolicy, path=None) -> list[str]:
    """Errors (raised) and warnings (returned) for our flags together with OpenRLHF's (`policy`: the config's rule;
    `path`: the installed vLLM's engine, `engine_path_notes`, whose settings `vllm.versions.check_settings` checks)."""
    if not steps_in(policy):
        return []
    if path is not None:
        from ..vllm.versions import check_settings

        check_settings(policy, path)
    get = lambda name, default=None: lookup(namespace, name, default)  # noqa: E731
    if not get("vllm.num_engines"):
        raise ValueError("--rollout_reuse needs vLLM rollout engines: set --vllm.num_engines to 1 or more")
    # OpenRLHF samples with top_k -1, no penalties and min_tokens 1; temperature and top-p are flags; its engines
    # report processed logprobs when the IS correction is on.
    warnings = check_sampling(
        policy,
        temperature=get("rollout.temperature", 1.0),
        top_p=get("rollout.top_p", 1.0),
        min_tokens=1,
        processed_logprobs=get("algo.advantage.is_correction_level", "off") != "off",
    )
    if not policy.verifies_in_engine and not get("vllm.enable_prefix_caching", False):
        warnings.append(
            f"--rollout_reuse {config.policy} verifies drafts by requests, whose scoring chunks and continuations "
            "read the prompt and kept prefix from vLLM's prefix cache: add --vllm.enable_prefix_caching (off by "
            "default in OpenRLHF), or each of them computes it again"
        )
    if get("data.max_images_per_prompt", 0):
        warnings.append("prompts with images are generated normally: drafts are reused for text-only prompts")
    agent = get("train.agent_func_path")
    if agent and not Path(agent).is_file():
        raise ValueError(f"--train.agent_func_path {agent}: no such file (your agent composes with --rollout_reuse)")
    if config.cache_dir and not Path(config.cache_dir).is_dir():
        raise ValueError(f"--reuse.cache_dir {config.cache_dir}: no such directory")
    if config.trace_dir:
        reuse_config.check_writable_folder("--reuse.trace_dir", config.trace_dir)
    return warnings


def run_settings(args, config: ReuseConfig, policy: ReusePolicy | None = None) -> dict:
    """What every executor needs to know, held by the run's `ReuseRun` actor (`policy`: the config's rule, if
    built)."""
    return {
        "reuse_config": config.resolved(policy).to_json(),  # files its rule names travel as their data
        "num_shards": config.cache_shards,
        "samples_per_visit": args.rollout.n_samples_per_prompt,
        "training_signature": [args.rollout.temperature, args.rollout.top_p, -1],
        "remote_url": args.reward.remote_url,
        "inner_agent_func_path": args.train.agent_func_path,
        # a stateful rule updates once per training step's samples unless told otherwise
        "update_every": config.update_every or args.rollout.batch_size * args.rollout.n_samples_per_prompt,
    }


def namespace_to_dict(namespace) -> dict:
    if isinstance(namespace, (types.SimpleNamespace, argparse.Namespace)):
        return {k: namespace_to_dict(v) for k, v in vars(namespace).items()}
    if isinstance(namespace, dict):
        return {k: namespace_to_dict(v) for k, v in namespace.items()}
    if isinstance(namespace, (list, tuple)):
        return [namespace_to_dict(v) for v in namespace]
    return namespace if isinstance(namespace, (str, int, float, bool, type(None))) else repr(namespace)


def print_dry_run(args, config: ReuseConfig, policy: ReusePolicy) -> None:
    openrlhf_args = namespace_to_dict(args)
    for field in reuse_config.flag_fields():  # ours, `--vllm.max_num_seqs` among OpenRLHF's `vllm` group included
        *parents, name = reuse_config.dest(field).split(".")
        node = openrlhf_args
        for part in parents:
            node = node.get(part, {})
        node.pop(name, None)
    if openrlhf_args.get("reuse") == {}:
        del openrlhf_args["reuse"]
    resolved = {"reuse": dataclasses.asdict(config), "policy": policy.describe()}
    if steps_in(policy):
        # what the vLLM engines get: our executor, wrapping the user's agent or OpenRLHF's reward path, the engine size
        # our flags set, and for a rule verified in the engine, its speculative config (our proposer, or vLLM's own
        # for the peers)
        resolved["engines"] = {
            "agent_func_path": AGENT_ENTRY,
            "engine_kwargs": engine_kwargs_added(config, policy, openrlhf_engine_arguments(args)),
            **run_settings(args, config, policy),
        }
    elif config.engine_size_arguments:  # `off` with our engine size: OpenRLHF's engines get it, nothing else
        resolved["engines"] = {"engine_kwargs": our_engine_kwargs(config, policy)}
    resolved["openrlhf_args"] = openrlhf_args
    print(json.dumps(resolved, indent=2, default=str))


def latest_checkpoint_dir(ckpt_path: str) -> Path | None:
    """The DeepSpeed tag directory that `--ckpt.load_enable` resumes from (`<ckpt.path>/_actor/<latest>`)."""
    latest = Path(ckpt_path) / "_actor" / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    return Path(ckpt_path) / "_actor" / tag if tag else None


class CheckpointWatcher(threading.Thread):
    """Saves the draft cache into each new OpenRLHF checkpoint (`<tag>/specrl_draft_cache/`), so checkpoint
    rotation removes it along with the checkpoint and a resumed run starts warm."""

    def __init__(self, reuse, ckpt_path: str, poll_s: float):
        super().__init__(name="specrl-checkpoint-watcher", daemon=True)
        self.reuse, self.ckpt_path, self.poll_s = reuse, ckpt_path, poll_s
        self.seen = latest_checkpoint_dir(ckpt_path)
        self.stopped = threading.Event()

    def run(self):
        from .draft_store import CACHE_DIRNAME

        while not self.stopped.wait(self.poll_s):
            try:
                current = latest_checkpoint_dir(self.ckpt_path)
                if current is not None and current != self.seen and current.is_dir():
                    self.reuse.save(current / CACHE_DIRNAME)
                    logger.info("draft cache saved with checkpoint %s", current)
                    self.seen = current
            except Exception as error:  # a failed save must not stop training
                logger.warning("could not save the draft cache with the checkpoint: %s", error)


def openrlhf_runtime_env() -> dict:
    """The runtime env OpenRLHF's `train` starts Ray with (its env vars, defaults as it reads them), plus our worker
    setup hook, which marks OpenRLHF's evaluation requests (see `eval`)."""
    env_vars = {
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
    }
    return {"env_vars": env_vars, "worker_process_setup_hook": WORKER_SETUP_HOOK}


def start_ray() -> None:
    """Start Ray as OpenRLHF's `train` would, with our worker setup hook; OpenRLHF then finds it running."""
    import ray

    if ray.is_initialized():  # OpenRLHF will not call ray.init either: our workers lack the evaluation mark
        logger.warning(
            "Ray was started before OpenRLHF's train(): evaluation requests can't be told from training ones and may "
            "reuse drafts. Start Ray with runtime_env={'worker_process_setup_hook': %r}",
            WORKER_SETUP_HOOK,
        )
        return
    ray.init(runtime_env=openrlhf_runtime_env())


def train_with_reuse(args, upstream_train, policy: ReusePolicy | None = None) -> None:
    """Stands in for OpenRLHF's `train(args)` at the end of its `__main__` block (see `seams`); `policy`: the rule
    `after_parse` built (else it is built here)."""
    config = reuse_config.from_namespace(args)
    policy = config.build_policy() if policy is None else policy
    if config.dry_run:
        print_dry_run(args, config, policy)
        return
    if not steps_in(policy):
        return upstream_train(args)

    from .draft_store import CACHE_DIRNAME, start_reuse

    load_dir = config.cache_dir
    if load_dir is None and args.ckpt.load_enable:
        resumed = latest_checkpoint_dir(args.ckpt.path)
        if resumed is not None and (resumed / CACHE_DIRNAME).is_dir():
            load_dir = str(resumed / CACHE_DIRNAME)
    settings = run_settings(args, config, policy)
    start_ray()
    reuse = start_reuse(settings, config, load_dir=load_dir, policy=policy)
    watcher = CheckpointWatcher(reuse, args.ckpt.path, config.checkpoint_poll_s)
    watcher.start()
    # OpenRLHF's agent seam: its engines build our executor, which wraps the run's own (settings above). Set after
    # OpenRLHF's validation, so `--reward.remote_url` and reward models keep working as the user configured them.
    args.train.agent_func_path = AGENT_ENTRY
    try:
        upstream_train(args)
    finally:
        watcher.stopped.set()
