"""What the quickstart trains: the regimes, the rules and the seeds, and which runs train side by side.

A *group* is the runs that train step by step in turn, on the same data from the same weights: a baseline (`off`)
and up to `MAX_RULES_PER_GROUP` rules, each on its own engine. One group per regime and seed (more when a grid has
more rules than fit in one), so every rule is compared with a baseline of its own regime and seed: the paired
differences `summary` reports over seeds.

The grids are data (`GRIDS`): regimes by rules. A regime is how often prompts come back and how far the policy moves
between visits (train size x epochs at a fixed number of steps, and the learning rate): the knobs of staleness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import ReuseConfig
from ..references import short_name

MAX_RULES_PER_GROUP = 5  # each group holds its engines in memory at once, and idle engines still cost CPU


@dataclass(frozen=True, kw_only=True)
class Regime:
    """Staleness knobs at a fixed budget: `train_size` x `epochs` / rollout batch = steps."""

    name: str = "default"
    train_size: int = 384
    epochs: int = 3
    lr: float = 1.5e-4
    eval_every: int = 0  # epochs between held-out evaluations; 0: after the last epoch only (it always is)

    def __post_init__(self):
        for key, low in (("train_size", 1), ("epochs", 1), ("eval_every", 0)):
            if getattr(self, key) < low:
                raise ValueError(f"regime {self.name}: {key} must be >= {low}, got {getattr(self, key)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"regime {self.name}: lr must be a positive number, got {self.lr}")

    def steps_per_epoch(self, rollout_batch: int) -> int:
        return math.ceil(self.train_size / rollout_batch)

    def evaluates_after(self, epoch: int) -> bool:
        return epoch + 1 == self.epochs or (self.eval_every > 0 and (epoch + 1) % self.eval_every == 0)


# The quickstart's own run (no grid): 3 visits of 128 prompts, 12 steps of 32 (4 updates between visits), a third of
# the grids' steps, so that a first run takes minutes.
QUICKSTART = Regime(train_size=128)
# The grids' regimes: the same 36 steps of 32 prompts, spread as 3 visits of 384 prompts (12 updates between visits)
# or 12 visits of 96 (3 updates between visits), at the default learning rate or a third of it.
REGIMES = {
    "default": Regime(),
    "many-visits": Regime(name="many-visits", train_size=96, epochs=12),
    "low-lr": Regime(name="low-lr", lr=5e-5),
    "many-visits-low-lr": Regime(name="many-visits-low-lr", train_size=96, epochs=12, lr=5e-5),
    "smoke": Regime(name="smoke", train_size=8, epochs=2),  # gpu_smoke's CPU twin: 2 steps of its 8 prompts
}


@dataclass(frozen=True)
class Method:
    """A rule as the quickstart trains it: the name its run goes by, and its settings."""

    name: str
    config: ReuseConfig

    @classmethod
    def of(cls, policy: str, lenience: float | None = None, params: dict | None = None, **settings) -> Method:
        config = ReuseConfig(policy=policy, lenience=lenience, params=params or {}, **settings)
        return cls(method_name(config), config)

    @property
    def is_baseline(self) -> bool:
        return self.config.policy == "off"


def method_name(config: ReuseConfig) -> str:
    """`off`, `spec@1.65`, `exact`, `AdaptiveLenience`: short, and distinct for distinct lenience values."""
    name = short_name(config.policy)
    if config.lenience is not None:
        name += f"@{_lenience_label(config.lenience)}"
    if config.params:
        name += "(" + ",".join(f"{k}={v}" for k, v in sorted(config.params.items())) + ")"
    return name


def _lenience_label(value: float) -> str:
    exponent = math.log(value)
    if abs(exponent - round(exponent, 1)) < 1e-9 and round(exponent, 1) != 0:
        return f"e^{round(exponent, 1):g}"
    return f"{value:.3g}"


OFF = Method.of("off")
SUFFIX_AT_SCALE = "suffix@scale"  # suffix decoding with a cache of 1.2 steps' requests (quickstart_args.at_scale)
GRIDS = {  # name -> (regimes, rules), every rule trained beside the baseline of its regime and seed
    "lenience": (
        ("default",),
        tuple(Method.of("spec", ell) for ell in (1.0, math.exp(0.2), math.exp(0.5), math.exp(0.8), math.exp(2.0)))
        + (Method.of("full"), Method.of("random"), Method.of("delayed")),
    ),
    "drift": (
        ("default", "many-visits", "low-lr", "many-visits-low-lr"),
        (Method.of("spec", math.exp(0.5)), Method.of("exact")),
    ),
    "tree": (  # lossless verified in the engine (the default) and on the request path, against SPEC-RL's rule
        ("default", "many-visits"),
        (
            Method.of("spec", 1.65),
            Method.of("lossless"),
            Method.of("lossless", params={"verify": "requests"}),
            Method.of("lossless", params={"history": 2}),
        ),
    ),
    "peers": (  # lossless against vLLM's own speculation: suffix decoding (its defaults, and its cache as at scale)
        ("default",),
        (
            Method.of("lossless"),
            Method.of("suffix"),
            Method(SUFFIX_AT_SCALE, ReuseConfig(policy="suffix")),
            Method.of("ngram"),
        ),
    ),
    "smoke": (  # each kind of rule, for gpu_smoke's CPU twin, which checks that each keeps drafts: `lossless` drafts
        # every slot, as its budget does on a GPU where drafts are nearly free (on a CPU it may rightly draft nothing)
        ("smoke",),
        (Method.of("spec"), Method.of("lossless", params={"budget": "static"}), Method.of("suffix")),
    ),
    "frontier": (  # decoded tokens against accuracy: SPEC-RL's rule, lossless verified in the engine and on requests
        ("default", "many-visits"),
        (
            Method.of("spec", 1.65),
            Method.of("lossless"),
            Method.of("lossless", params={"history": 2}),
            Method.of("lossless", params={"verify": "requests"}),
            Method.of("lossless", params={"draft": "own", "verify": "requests"}),
        ),
    ),
}


@dataclass
class Run:
    """One training run and, while it trains, its engine, trainer and logs."""

    method: Method
    regime: Regime
    seed: int
    group: str  # runs of one group train side by side; the group's first run is their baseline
    label: str = ""  # unique in the whole quickstart: folders, plots and tables use it
    accuracy_before: float | None = None  # held-out accuracy of the seed's warm start
    actor: object = None
    trainer: object = None
    handles: list = field(default_factory=list)  # the run's reuse actors: Ray ends an actor with its last handle
    loggers: list = field(default_factory=list)  # OpenRLHF's TensorBoard and wandb loggers, when asked for
    rows: list[dict] = field(default_factory=list)

    @property
    def reuses(self) -> bool:
        return self.method.config.enabled

    def describe(self) -> dict:
        policy = self.method.config.build_policy()
        return {
            "name": self.label,
            "method": self.method.name,
            "policy": self.method.config.policy,
            "lenience": policy.lenience if policy.needs_scores and math.isfinite(policy.lenience or 1.0) else None,
            "rule": policy.describe(),
            "regime": self.regime.name,
            "seed": self.seed,
            "group": self.group,
            "acc_before": self.accuracy_before,
        }


@dataclass
class Group:
    key: str
    regime: Regime
    seed: int
    runs: list[Run]


def plan(rules: list[Method], regimes: list[Regime], seeds: list[int], *, baseline: bool = True) -> list[Group]:
    """Groups for every regime and seed: the baseline and up to MAX_RULES_PER_GROUP rules each. Run labels are the
    method names, prefixed by the regime and seed where there are several. Every config is built here, so an
    unknown rule or a bad parameter fails before anything starts."""
    for method in rules:
        method.config.build_policy()
    names = [m.name for m in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"the same rule twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    size = math.ceil(len(rules) / math.ceil(len(rules) / MAX_RULES_PER_GROUP)) if rules else 1  # even groups
    chunks = [rules[i : i + size] for i in range(0, len(rules), size)] or [[]]
    groups = []
    for regime in regimes:
        for seed in seeds:
            for part, chunk in enumerate(chunks):
                key = f"{regime.name}/s{seed}" + (f"#{part}" if len(chunks) > 1 else "")
                methods = ([OFF] if baseline else []) + list(chunk)
                runs = [Run(m, regime, seed, key) for m in methods]
                groups.append(Group(key, regime, seed, runs))
    several = len(regimes) > 1 or len(seeds) > 1
    for group in groups:
        for run in group.runs:
            run.label = run.method.name
            if several:
                run.label = f"{run.regime.name}-s{run.seed}-{run.method.name}"
            if len(chunks) > 1 and run.method.is_baseline:
                run.label += f"#{group.key.rpartition('#')[2]}"
    return groups


def with_trace_dirs(groups: list[Group], trace_dir: str | None) -> None:
    """Each reusing run records its drafts in `trace_dir/<run label>`."""
    if trace_dir is None:
        return
    for group in groups:
        for run in group.runs:
            if run.reuses:
                config = replace(run.method.config, trace_dir=str(Path(trace_dir).resolve() / run.label))
                run.method = Method(run.method.name, config)


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
