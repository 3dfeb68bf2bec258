"""`python -m specrl_openrlhf.cli.train_ppo_ray`: OpenRLHF's own `train_ppo_ray`, plus rollout reuse.

The installed OpenRLHF's `__main__` block (its parser, its validation) runs unchanged: we execute it from its
source with two substitutions. Its `argparse.ArgumentParser` gains our argument group, so `--help` lists both
and every OpenRLHF flag, and every OpenRLHF error, stays OpenRLHF's. Its final `train(args)` call goes through
`train_with_reuse`, which starts the shared draft cache and hands OpenRLHF our agent executor. No OpenRLHF source
file is edited.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.util
import json
import logging
import os
import sys
import threading
import types
from pathlib import Path

from ..config import ReuseConfig
from ..policies import DEFAULT_LENIENCE, PluginError, UnknownPolicyError, registered
from ..rollout import REUSED_LOGPROBS, SCORING_MODES, UnsupportedSamplingError, check_sampling
from .openrlhf_eval import WORKER_SETUP_HOOK

logger = logging.getLogger(__name__)

PROG = "python -m specrl_openrlhf.cli.train_ppo_ray"
UPSTREAM_MODULE = "openrlhf.cli.train_ppo_ray"
AGENT_ENTRY = str(Path(__file__).with_name("agent_entry.py"))


def json_object(text: str) -> dict:
    """argparse type of `--reuse.params`: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}); write e.g. '{{\"target_kept\": 0.9}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object; write e.g. '{{\"target_kept\": 0.9}}'")
    return value


def add_reuse_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("speculative rollouts (specrl-openrlhf)")
    group.add_argument(
        "--rollout_reuse",
        default="off",
        metavar="NAME",
        help=f"reuse policy: {', '.join(registered())} or one from --reuse.plugin (default: off = stock OpenRLHF)",
    )
    group.add_argument(
        "--lenience",
        type=float,
        default=None,
        help=f"lenience l > 0 of the spec/delayed rule (default e^0.5 = {DEFAULT_LENIENCE:.4f}; paper: e^0.5 GRPO, "
        "e^0.3 PPO, e^0.15 DAPO)",
    )
    group.add_argument(
        "--reuse.params",
        type=json_object,
        default={},
        metavar="JSON",
        help="the rule's other parameters, e.g. '{\"target_kept\": 0.9}' (see its Params dataclass)",
    )
    group.add_argument("--reuse.seed", type=int, default=0, help="seed of the acceptance randomness")
    group.add_argument(
        "--reuse.logprobs",
        choices=REUSED_LOGPROBS,
        default="auto",
        help="rollout logprobs reported for reused tokens: scored (current policy), draft (the draft's own), auto "
        "(scored when the policy scores drafts)",
    )
    group.add_argument(
        "--reuse.scoring",
        choices=SCORING_MODES,
        default="chunked",
        help="chunked: score drafts chunk by chunk up to the first rejection, reading the prompt from vLLM's prefix "
        "cache; full: each draft in one request that recomputes its prompt",
    )
    group.add_argument("--reuse.cache_max_gb", type=float, default=4.0, help="draft cache memory cap, all shards")
    group.add_argument("--reuse.cache_shards", type=int, default=1, help="draft cache actors (shards)")
    group.add_argument(
        "--reuse.cache_dir",
        default=None,
        help="load drafts from this directory at start (default: the resumed checkpoint's, with --ckpt.load_enable)",
    )
    group.add_argument(
        "--reuse.plugin", action="append", default=[], metavar="FILE.py", help="load policies from this file"
    )
    group.add_argument(
        "--reuse.checkpoint_poll_s", type=float, default=10.0, help="how often to look for new checkpoints to save"
    )
    group.add_argument(
        "--reuse.trace_dir",
        default=None,
        metavar="DIR",
        help="record every cut draft here (p_prev, p_curr, length, finish) for `python -m specrl_openrlhf replay`",
    )
    group.add_argument(
        "--reuse.update_every",
        type=int,
        default=None,
        metavar="SAMPLES",
        help="samples per update of a stateful rule (default: one step, rollout.batch_size x n_samples_per_prompt)",
    )
    group.add_argument(
        "--reuse.dry_run", action="store_true", help="print the resolved configuration, then exit before Ray starts"
    )


def lookup(namespace, dotted: str, default=None):
    """A flag's value from argparse's flat namespace ("reuse.seed" attributes) or OpenRLHF's hierarchized one."""
    if hasattr(namespace, dotted):
        return getattr(namespace, dotted)
    node = namespace
    for part in dotted.split("."):
        node = getattr(node, part, default)
    return node


def reuse_config_from(namespace) -> ReuseConfig:
    get = lambda name: lookup(namespace, name)  # noqa: E731
    return ReuseConfig(
        policy=get("rollout_reuse"),
        lenience=get("lenience"),
        params=namespace_to_dict(get("reuse.params") or {}),  # OpenRLHF turns dict values into namespaces
        seed=get("reuse.seed"),
        reused_logprobs=get("reuse.logprobs"),
        scoring=get("reuse.scoring"),
        cache_max_gb=get("reuse.cache_max_gb"),
        cache_shards=get("reuse.cache_shards"),
        cache_dir=get("reuse.cache_dir"),
        plugins=tuple(get("reuse.plugin")),
        trace_dir=get("reuse.trace_dir"),
        update_every=get("reuse.update_every"),
    )


def check_combination(namespace) -> list[str]:
    """Errors (raised) and warnings (returned) for our flags together with OpenRLHF's; flat dotted namespace."""
    config = reuse_config_from(namespace)
    policy = config.build_policy()
    if policy.draft_age == 0:
        return []
    get = lambda name, default=None: lookup(namespace, name, default)  # noqa: E731
    if not get("vllm.num_engines"):
        raise ValueError("--rollout_reuse needs vLLM rollout engines: set --vllm.num_engines to 1 or more")
    # OpenRLHF samples with top_k -1 and no penalties; temperature and top-p are flags.
    check_sampling(policy, temperature=get("rollout.temperature", 1.0), top_p=get("rollout.top_p", 1.0))
    warnings = []
    if get("data.max_images_per_prompt", 0):
        warnings.append("prompts with images are generated normally: drafts are reused for text-only prompts")
    agent = get("train.agent_func_path")
    if agent and not Path(agent).is_file():
        raise ValueError(f"--train.agent_func_path {agent}: no such file (your agent composes with --rollout_reuse)")
    if config.cache_dir and not Path(config.cache_dir).is_dir():
        raise ValueError(f"--reuse.cache_dir {config.cache_dir}: no such directory")
    if config.trace_dir:
        existing = next(
            p for p in [Path(config.trace_dir).resolve(), *Path(config.trace_dir).resolve().parents] if p.exists()
        )
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            raise ValueError(
                f"--reuse.trace_dir {config.trace_dir}: {existing} is not a writable folder; pass another"
            )
    return warnings


class ReuseArgumentParser(argparse.ArgumentParser):
    """OpenRLHF's parser class, with our group added and our flags validated right after parsing."""

    prog_name = PROG  # `main` sets the name the user typed

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("prog", self.prog_name)
        super().__init__(*args, **kwargs)
        add_reuse_arguments(self)

    def parse_args(self, args=None, namespace=None):
        namespace = super().parse_args(args, namespace)
        try:
            for warning in check_combination(namespace):
                print(f"[specrl-openrlhf] warning: {warning}", file=sys.stderr)
        except (UnknownPolicyError, PluginError, UnsupportedSamplingError, ValueError, TypeError) as error:
            flag = "--rollout_reuse" if isinstance(error, UnknownPolicyError) else ""
            self.error(f"{flag + ': ' if flag else ''}{error}")
        return namespace


def upstream_main_block(module: str = UPSTREAM_MODULE) -> tuple[types.CodeType, types.CodeType, str]:
    """The installed OpenRLHF CLI's light top-level imports and its `if __name__ == "__main__":` body, compiled
    from source without importing the module (that pulls in DeepSpeed and flash-attn, which a dry run or --help
    must not need)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{PROG}: OpenRLHF is not installed ({module} not found); see docs/install.md")
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    light_imports = [
        node
        for node in tree.body
        if (isinstance(node, ast.Import) and not any(a.name.split(".")[0] in ("ray", "openrlhf") for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] not in ("ray", "openrlhf"))
    ]
    imports = compile(ast.Module(body=light_imports, type_ignores=[]), spec.origin, "exec")
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            body = ast.Module(body=node.body, type_ignores=[])
            return imports, compile(body, spec.origin, "exec"), spec.origin
    raise SystemExit(f"{PROG}: no __main__ block in {spec.origin}; this OpenRLHF version is not supported")


def namespace_to_dict(namespace) -> dict:
    if isinstance(namespace, (types.SimpleNamespace, argparse.Namespace)):
        return {k: namespace_to_dict(v) for k, v in vars(namespace).items()}
    if isinstance(namespace, dict):
        return {k: namespace_to_dict(v) for k, v in namespace.items()}
    if isinstance(namespace, (list, tuple)):
        return [namespace_to_dict(v) for v in namespace]
    return namespace if isinstance(namespace, (str, int, float, bool, type(None))) else repr(namespace)


def run_settings(args, config: ReuseConfig) -> dict:
    """What every executor needs to know, published through the draft cache actors."""
    return {
        "reuse_config": config.to_json(),
        "num_shards": config.cache_shards,
        "samples_per_visit": args.rollout.n_samples_per_prompt,
        "training_signature": [args.rollout.temperature, args.rollout.top_p, -1],
        "remote_url": args.reward.remote_url,
        "inner_agent_func_path": args.train.agent_func_path,
        # a stateful rule updates once per training step's samples unless told otherwise
        "update_every": config.update_every or args.rollout.batch_size * args.rollout.n_samples_per_prompt,
    }


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

    def __init__(self, shards, ckpt_path: str, poll_s: float):
        super().__init__(name="specrl-checkpoint-watcher", daemon=True)
        self.shards, self.ckpt_path, self.poll_s = shards, ckpt_path, poll_s
        self.seen = latest_checkpoint_dir(ckpt_path)
        self.stopped = threading.Event()

    def run(self):
        from .draft_store import CACHE_DIRNAME, save_draft_cache

        while not self.stopped.wait(self.poll_s):
            try:
                current = latest_checkpoint_dir(self.ckpt_path)
                if current is not None and current != self.seen and current.is_dir():
                    save_draft_cache(self.shards, current / CACHE_DIRNAME)
                    logger.info("draft cache saved with checkpoint %s", current)
                    self.seen = current
            except Exception as error:  # a failed save must not stop training
                logger.warning("could not save the draft cache with the checkpoint: %s", error)


def train_with_reuse(args, upstream_train=None) -> None:
    """Replaces OpenRLHF's `train(args)` at the end of its `__main__` block."""
    config = reuse_config_from(args)
    if args.reuse.dry_run:
        openrlhf_args = namespace_to_dict(args)
        for ours in ("reuse", "rollout_reuse", "lenience"):
            openrlhf_args.pop(ours, None)
        resolved = {"reuse": dataclasses.asdict(config), "policy": config.build_policy().describe()}
        if config.enabled:
            # what the vLLM engines get: our executor, wrapping the user's agent or OpenRLHF's reward path
            resolved["engines"] = {"agent_func_path": AGENT_ENTRY, **run_settings(args, config)}
        resolved["openrlhf_args"] = openrlhf_args
        print(json.dumps(resolved, indent=2, default=str))
        return
    upstream = importlib.import_module(UPSTREAM_MODULE)

    upstream_train = upstream_train or upstream.train
    if not config.enabled:
        return upstream_train(args)

    from .draft_store import CACHE_DIRNAME, create_draft_cache

    load_dir = config.cache_dir
    if load_dir is None and args.ckpt.load_enable:
        resumed = latest_checkpoint_dir(args.ckpt.path)
        if resumed is not None and (resumed / CACHE_DIRNAME).is_dir():
            load_dir = str(resumed / CACHE_DIRNAME)
    settings = run_settings(args, config)
    original_create = upstream.create_vllm_engines
    watcher = None

    def create_vllm_engines_with_reuse(*engine_args, **engine_kwargs):
        nonlocal watcher
        shards = create_draft_cache(
            settings,
            num_shards=config.cache_shards,
            max_bytes=config.cache_max_bytes,
            load_dir=load_dir,
            keep_visits=config.build_policy().draft_age,
        )
        watcher = CheckpointWatcher(shards, args.ckpt.path, args.reuse.checkpoint_poll_s)
        watcher.start()
        engine_kwargs["agent_func_path"] = AGENT_ENTRY
        return original_create(*engine_args, **engine_kwargs)

    upstream.create_vllm_engines = create_vllm_engines_with_reuse
    original_init = upstream.ray.init
    upstream.ray.init = ray_init_with_worker_hook(original_init)
    try:
        if upstream.ray.is_initialized():  # OpenRLHF will not call ray.init: our workers lack the eval mark
            logger.warning(
                "Ray was started before OpenRLHF's train(): evaluation requests can't be told from training ones "
                "and may reuse drafts. Start Ray with runtime_env={'worker_process_setup_hook': %r}",
                WORKER_SETUP_HOOK,
            )
        upstream_train(args)
    finally:
        upstream.create_vllm_engines = original_create
        upstream.ray.init = original_init
        if watcher is not None:
            watcher.stopped.set()


def ray_init_with_worker_hook(init):
    """`ray.init` that adds our worker setup hook (see `openrlhf_eval`) to the runtime env OpenRLHF passes. A job
    submitted with a setup hook of its own keeps it, with a warning: Ray takes one hook per job."""
    import json
    import os

    @functools.wraps(init)
    def init_with_hook(*args, runtime_env=None, **kwargs):
        runtime_env = dict(runtime_env or {})
        job_env = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
        if "worker_process_setup_hook" in runtime_env or "worker_process_setup_hook" in job_env:
            logger.warning(
                "a worker_process_setup_hook is already set; call %s() from it so that evaluation requests never "
                "reuse drafts",
                WORKER_SETUP_HOOK,
            )
        else:
            runtime_env["worker_process_setup_hook"] = WORKER_SETUP_HOOK
        return init(*args, runtime_env=runtime_env, **kwargs)

    return init_with_hook


def main(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Run OpenRLHF's `__main__` block with our flags. `prog` is the command name help and errors show: ours, or
    OpenRLHF's own when `python -m openrlhf.cli.train_ppo_ray` came through `_specrl_openrlhf_hook`."""
    imports, code, origin = upstream_main_block()
    argv = sys.argv[1:] if argv is None else argv
    namespace = {"__name__": "__main__", "__file__": origin}
    exec(imports, namespace)
    shim = types.ModuleType("argparse")
    shim.__dict__.update(argparse.__dict__)
    shim.ArgumentParser = type("ArgumentParser", (ReuseArgumentParser,), {"prog_name": prog})
    namespace.update(argparse=shim, train=train_with_reuse)
    saved_argv = sys.argv
    sys.argv = [prog] + list(argv)
    try:
        exec(code, namespace)
    finally:
        sys.argv = saved_argv
