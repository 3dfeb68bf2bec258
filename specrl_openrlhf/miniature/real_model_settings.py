"""The real-model regime's settings (`Settings`: what `bench_real_model.py` runs) and a rule's visit as it records it
(`Record`): what the run (`real_model`) and its report (`real_model_report`) share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..pricing.curves import StepCurve
from .plan import Method

RULES = (
    Method.of("off"),
    Method.of("spec", 1.65),
    Method.of("lossless", params={"verify": "requests"}),
    Method.of("lossless"),
    Method.of(
        "suffix"
    ),  # vLLM's suffix decoding with its defaults: a cache of 10,000 responses holds every visit here
    Method.of("ngram"),
)
SUFFIX_AT_SCALE = "suffix@scale"  # its cache sized to 1.2 visits' requests, as vLLM's 10,000 is at 512 x 16 a step
DEFAULT_CURVE = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"  # an H200's, in the repository


@dataclass(frozen=True, kw_only=True)
class Settings:
    prompts: int = 3  # training prompts, each visited once per visit
    prompts_per_step: int | None = None  # a visit's RL steps, each of this many prompts and a policy-gradient step
    # after it (None: one step of every prompt, the hot-cache case: a prompt comes back at the next step)
    samples: int = 8  # per prompt and visit (the size of a prompt's tree)
    visits: int = 3
    seeds: tuple[int, ...] = (0, 1, 2)
    max_tokens: int = 224
    temperature: float = 0.35  # folded into the weights (`smollm2.sharpen`); rollouts sample at temperature 1
    lr: float = 1e-4
    train_layers: int = 2  # trained: the last decoder layers and the final norm
    held_out: int = 8  # problems, sampled `eval_samples` times each after the last visit
    eval_samples: int = 1
    rules: tuple[str, ...] = tuple(m.name for m in RULES[:4])
    out: str = "runs/real_model"
    cost_curve: str | None = None  # lossless prices its draft slots on this GPU step curve; the projection uses it
    dtype: str = "auto"  # the engines' (`engine.cpu_dtype`)

    def __post_init__(self):
        if self.prompts_per_step is not None and not 1 <= self.prompts_per_step <= self.prompts:
            raise ValueError(f"--prompts-per-step must be in [1, --prompts], got {self.prompts_per_step}")
        for name in ("prompts", "samples", "visits", "max_tokens", "train_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        unknown = set(self.rules) - {m.name for m in RULES} - {SUFFIX_AT_SCALE}
        if unknown or "off" not in self.rules:
            names = [m.name for m in RULES[1:]] + [SUFFIX_AT_SCALE]
            raise ValueError(f"--rules takes off and any of {names}, got {list(self.rules)}")
        if self.cost_curve is not None:
            try:
                StepCurve.load(self.cost_curve)
            except ValueError as error:
                raise ValueError(f"--cost-curve {error}") from None
        from .engine import cpu_dtype

        cpu_dtype(self.dtype)  # an unknown dtype: one clear error

    def methods(self, host=None) -> list[Method]:
        """The rules to run, `lossless` priced on the cost curve where one is given, with `host` (a `HostCurve`) as
        its host column: a step of a model-free proposer pays the host's time too, as the projection prices it."""
        from dataclasses import replace

        at_scale = {
            "method": "suffix",
            "suffix_decoding_max_cached_requests": math.ceil(1.2 * self.step_prompts * self.samples),
        }
        known = {m.name: m for m in RULES}
        known[SUFFIX_AT_SCALE] = Method(
            SUFFIX_AT_SCALE, replace(known["suffix"].config, params={"speculative_config": at_scale})
        )
        methods = [known[name] for name in self.rules]
        if self.cost_curve:
            curve = str(Path(self.cost_curve).resolve())
            if host is not None:
                curve = StepCurve.load(curve).with_host(host).as_data()
            methods = [
                Method(m.name, replace(m.config, params={**m.config.params, "cost_curve": curve}))
                if m.config.policy == "lossless" and m.config.params.get("verify") != "requests"
                else m
                for m in methods
            ]
        return methods

    @property
    def step_prompts(self) -> int:
        """Prompts per RL step."""
        return self.prompts_per_step or self.prompts

    @property
    def curve_file(self) -> str | None:
        return self.cost_curve or (str(DEFAULT_CURVE) if DEFAULT_CURVE.is_file() else None)

    @property
    def curve_label(self) -> str:
        """The curve the projection uses, as the RESULT line names it: `default:h200` where none was named."""
        if self.cost_curve:
            return self.cost_curve
        if self.curve_file is None:
            return "none"
        return "default:" + DEFAULT_CURVE.stem.removeprefix("gpu_step_")


@dataclass
class Record:
    """One rule's visit in one seed."""

    seed: int
    rule: str
    visit: int
    seconds: float
    samples: int
    decoded: int
    reused: int
    reentries: int
    reward: float
    drafted: int = 0  # draft tokens the engine verified (in the engine; the request path counts scored ones)
    engine: dict = field(default_factory=dict)  # the engine's steps: the makespan split, the GPU projection
    steps: dict = field(default_factory=dict)  # the engine's steps themselves (`EngineSteps.as_dict`): priced later

    @property
    def kept(self) -> float:
        return self.reused / max(self.reused + self.decoded, 1)
