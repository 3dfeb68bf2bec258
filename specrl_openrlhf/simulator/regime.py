"""What the simulator runs: the engine an RL run's rollouts go through and the RL step it serves (`Regime`), in the
GPU's units, as a user names them; and the regimes every verdict is read in (`REGIMES`).

Terminology:
- *regime*: the engine (its rows, its token budget a step, the share of the GPU's memory it takes and so its KV cache,
  prefix caching, CUDA graphs or none) and the RL step (the requests one engine serves, the longest response), and the
  host whose time a step pays (`host`). A verdict holds for its regime only: every verdict names it.
- *visits* (`Regime.steps_between_visits`, `Regime.visits`): how RL comes back to a prompt. A prompt returns
  `steps_between_visits` RL steps after its visit (the dataset's prompts over an RL step's), and a run visits it
  `visits` times (episodes, or epochs over the dataset); between two visits each engine serves the other prompts'
  requests, which its caches hold in place of the prompt's. A first visit has no earlier one to draft from.
- *scale* (`Regime.scale`): the corpus holds fewer requests an RL step than a GPU's engine serves, so each simulated
  request (and row, and token of the budget, and of the KV cache) stands for `scale` of the GPU's: the one
  definition of it. The simulator runs `Regime.schedule`, the regime divided by its scale.

Engine-free: the standard library only. Where vLLM is importable, `specrl_openrlhf.integration.vllm.engine_defaults`
reads the engine defaults that `openrlhf` names, and a test holds the two together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..params import check_fields, limits
from .engine import Schedule

HOSTS = ("shipped", "here", "none")  # besides a host step curve file: `Regime.host`
# OpenRLHF's DAPO example (`train_dapo_ray_hybrid_engine.sh`): --data.max_samples 20000 at --rollout.batch_size 128.
DAPO_PROMPTS, DAPO_SPACING = 20_000, 20_000 // 128


@dataclass(frozen=True, kw_only=True)
class Regime:
    """An engine and the RL step it serves, in the GPU's units (see the module's terminology)."""

    name: str = "custom"
    """What the regime is called in every verdict (`openrlhf`, `paper`, `throughput`, or `custom`)."""
    max_num_seqs: int = field(default=128, metadata=limits(at_least=1, means="vLLM's max_num_seqs"))
    """Rows the engine decodes at once (vLLM's `max_num_seqs`)."""
    max_num_batched_tokens: int = field(
        default=2048, metadata=limits(at_least=1, means="vLLM's max_num_batched_tokens")
    )
    """Tokens an engine step carries, every decoding row's sampled token and draft and every prefill chunk (vLLM's
    `max_num_batched_tokens`): a draft the budget can't carry is cut."""
    gpu_memory_utilization: float = field(default=0.95, metadata=limits(above=0, at_most=1))
    """The share of the GPU's memory the engine takes (vLLM's `gpu_memory_utilization`): what the weights leave of it
    is the KV cache, which bounds the rows a step runs and queues the rest."""
    prefix_caching: bool = True
    """vLLM's prefix cache (`enable_prefix_caching`), for every rule: a prompt's samples prefill it once, and the
    request path's continuations read what its scoring wrote (the request path needs it on)."""
    requests_per_engine: int = field(default=256, metadata=limits(at_least=1))
    """An RL step's requests one engine serves: prompts x samples a step over the engines."""
    max_response_tokens: int | None = field(default=None, metadata=limits(at_least=1))
    """The longest response a request may take: recorded responses past it are cut there (None: as recorded)."""
    enforce_eager: bool = False
    """vLLM's `enforce_eager`: the engine runs without CUDA graphs, so every step pays its kernel launches on top of
    its kernels (`pricing.eager`), and vLLM's adaptive verification, which needs full CUDA graphs, is off."""
    steps_between_visits: int = field(default=DAPO_SPACING, metadata=limits(at_least=1))
    """RL steps from a prompt's visit to its next (the dataset's prompts over an RL step's; 1: the very next step):
    between them each engine serves `steps_between_visits - 1` RL steps of other prompts' requests, and its caches
    hold what they left."""
    visits: int = field(default=1, metadata=limits(at_least=1))
    """Visits a run makes to each prompt (its episodes, or epochs over the dataset): 1, no prompt returns, and no rule
    has a previous visit to reuse; a run's figure is its first visit once and its later visits `visits - 1` times."""
    dataset_prompts: int = field(default=DAPO_PROMPTS, metadata=limits(at_least=1))
    """The dataset's prompts: the draft store holds each one's last visit between its visits."""
    host: str = "shipped"
    """The engine's host time a step: `shipped` (the curve the package ships, measured on the machine it names),
    `here` (measured on this machine, cached), `none` (no host time at all), or a host step curve file."""
    source: str = ""
    """Where the regime's figures come from."""

    def __post_init__(self):
        check_fields(self, owner=f"regime {self.name}")

    @property
    def full_batch(self) -> int:
        """The most rows a step of the RL step runs: the engine's rows, or its requests where they are fewer."""
        return min(self.max_num_seqs, self.requests_per_engine)

    def scale(self, samples: int, prompts: int) -> int:
        """GPU requests each simulated one stands for: the RL step's requests over the most a corpus of `prompts`
        prompts x `samples` samples holds in one step (at least 1)."""
        return max(1, math.ceil(self.requests_per_engine / (samples * prompts)))

    def schedule(self, samples: int, prompts: int, kv_capacity_tokens: int | None, seed: int = 0) -> Schedule:
        """The simulator's schedule for a corpus of `prompts` x `samples` a step: every figure of the regime over its
        `scale` (rows and the token budget at least 1 each; the KV cache of `kv_capacity_tokens`, None: unbounded),
        and an RL step of the corpus's prompts that make up its requests at that scale."""
        scale = self.scale(samples, prompts)
        per_step = max(1, min(prompts, math.ceil(self.requests_per_engine / (samples * scale))))
        return Schedule(
            max_num_seqs=max(1, round(self.max_num_seqs / scale)),
            prompts_per_step=per_step,
            max_num_batched_tokens=max(1, self.max_num_batched_tokens // scale),
            seed=seed,
            kv_capacity_tokens=None if kv_capacity_tokens is None else max(1, kv_capacity_tokens // scale),
            prefix_caching=self.prefix_caching,
        )

    def with_fields(self, **given) -> Regime:
        """This regime with the fields `given` (None: unchanged), named `custom` where any changed it."""
        changed = {key: value for key, value in given.items() if value is not None and getattr(self, key) != value}
        if not changed:
            return self
        return replace(self, **changed, name=f"{self.name}+custom", source=f"{self.source}; changed: {changed}")

    def describe(self) -> str:
        """The regime in one line, as every verdict prints it."""
        longest = "as recorded" if self.max_response_tokens is None else f"at most {self.max_response_tokens}"
        return (
            f"{self.name}: {self.max_num_seqs} rows, {self.max_num_batched_tokens:,} tokens a step, "
            f"gpu_memory_utilization {self.gpu_memory_utilization:g}, prefix caching "
            f"{'on' if self.prefix_caching else 'off'}, "
            f"CUDA graphs {'off (enforce_eager)' if self.enforce_eager else 'on'}; "
            f"{self.requests_per_engine:,} requests an engine an RL step, "
            f"responses {longest}; {self.describe_visits()}; host {self.host}"
        )

    def describe_visits(self) -> str:
        """How the regime's run comes back to a prompt, in words."""
        spacing = "the next RL step" if self.steps_between_visits == 1 else f"{self.steps_between_visits} RL steps"
        later = "no prompt returns" if self.visits == 1 else f"then {self.visits - 1} later visits"
        return (
            f"{self.dataset_prompts:,} prompts, a prompt back after {spacing}, "
            f"{self.visits} visit{'s' if self.visits > 1 else ''} a prompt ({later})"
        )

    def fields(self) -> str:
        """`regime=.. max_num_seqs=.. ...` for a RESULT line."""
        return (
            f"regime={self.name} max_num_seqs={self.max_num_seqs} "
            f"max_num_batched_tokens={self.max_num_batched_tokens} "
            f"gpu_memory_utilization={self.gpu_memory_utilization:g} requests_per_engine={self.requests_per_engine} "
            f"prefix_caching={'on' if self.prefix_caching else 'off'} "
            f"enforce_eager={'on' if self.enforce_eager else 'off'} "
            f"steps_between_visits={self.steps_between_visits} visits={self.visits} "
            f"dataset_prompts={self.dataset_prompts} host={self.host}"
        )


# vLLM's scheduler defaults where no usage context sets them (`SchedulerConfig.DEFAULT_MAX_NUM_SEQS` and
# `DEFAULT_MAX_NUM_BATCHED_TOKENS`): `AsyncLLMEngine.from_engine_args` takes `UsageContext.ENGINE_CONTEXT`, which
# `EngineArgs.get_batch_defaults` does not list, and OpenRLHF's `RolloutRayActor` passes neither.
ENGINE_CONTEXT_ROWS, ENGINE_CONTEXT_TOKENS = 128, 2048

REGIMES = {
    "openrlhf": Regime(
        name="openrlhf",
        max_num_seqs=ENGINE_CONTEXT_ROWS,
        max_num_batched_tokens=ENGINE_CONTEXT_TOKENS,
        gpu_memory_utilization=0.95,
        requests_per_engine=256,
        enforce_eager=True,
        steps_between_visits=DAPO_SPACING,
        visits=1,
        dataset_prompts=DAPO_PROMPTS,
        source="OpenRLHF 0.11.2: vLLM's engine-context defaults (its RolloutRayActor passes no max_num_seqs and no "
        "max_num_batched_tokens), its --vllm.gpu_memory_utilization default 0.95, its DAPO example's step "
        "(128 prompts x 8 samples on 4 engines: 256 requests an engine) and dataset (--data.max_samples 20000 at "
        "--rollout.batch_size 128: a prompt returns after 156 RL steps; one episode, --train.num_episodes 1: no "
        "prompt returns, visits 1; a run of more episodes gets the later visits), and --vllm.enforce_eager, which 6 "
        "of the 8 example commands of OpenRLHF 3c3be623 that launch train_ppo_ray set (its DAPO example among them)",
    ),
    "paper": Regime(
        name="paper",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.5,
        requests_per_engine=1024,
        max_response_tokens=4096,
        steps_between_visits=6,
        visits=15,
        dataset_prompts=6144,
        source="the SPEC-RL paper's runs under veRL: 1,024 prompts x 8 samples on 8 H100s (1,024 requests a GPU), "
        "responses up to 4,096 tokens; veRL's rollout defaults (1,024 rows, 8,192 tokens, gpu_memory_utilization 0.5, "
        "enforce_eager False: CUDA graphs captured); DeepMath-6K, 6,144 prompts at 1,024 a step for 15 epochs: a "
        "prompt returns every 6 RL steps, 15 visits, the first without drafts",
    ),
    "throughput": Regime(
        name="throughput",
        max_num_seqs=1024,
        max_num_batched_tokens=16384,
        gpu_memory_utilization=0.95,
        requests_per_engine=256,
        steps_between_visits=DAPO_SPACING,
        visits=1,
        dataset_prompts=DAPO_PROMPTS,
        source="the openrlhf regime with --vllm.max_num_seqs 1024 and --vllm.max_num_batched_tokens 16384 (what "
        "vllm.LLM takes on a GPU of 70 GiB or more) and without --vllm.enforce_eager (CUDA graphs, vLLM's default): "
        "the same RL step on a wider, faster engine",
    ),
}
DEFAULT_REGIME = "openrlhf"


def regime(name: str) -> Regime:
    """A named regime; a ValueError names the choices."""
    if name not in REGIMES:
        raise ValueError(f"--regime {name!r}: choose one of {', '.join(REGIMES)}")
    return REGIMES[name]
