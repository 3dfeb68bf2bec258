"""`ReuseConfig`: everything a run needs to know about rollout reuse, validated on construction."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from .policies import ReusePolicy, check_lenience, load_plugin, make
from .policies.registry import absolute_reference
from .rollout import REUSED_LOGPROBS, SCORING_MODES


@dataclass(frozen=True, kw_only=True)
class ReuseConfig:
    """Rollout-reuse settings (the `--rollout_reuse`, `--lenience` and `--reuse.*` flags).

    >>> ReuseConfig(policy="spec", lenience=1.65).build_policy().describe()
    'spec(lenience=1.65)'
    """

    policy: str = "off"
    lenience: float | None = None  # None: the policy's default
    params: dict = dataclasses.field(default_factory=dict)  # the rule's other parameters (`--reuse.params`)
    seed: int = 0
    reused_logprobs: str = "auto"
    scoring: str = "chunked"  # see SpeculativePlanner
    cache_max_gb: float = 4.0  # across all shards
    cache_shards: int = 1
    cache_dir: str | None = None  # load drafts from here at start (a run resumed from a checkpoint sets it)
    plugins: tuple[str, ...] = ()
    trace_dir: str | None = None  # record every cut draft here, for `python -m specrl_openrlhf replay`
    update_every: int | None = None  # samples per update of a stateful rule (None: one training step's samples)

    def __post_init__(self):
        if not isinstance(self.policy, str) or not self.policy:
            raise TypeError(f"--rollout_reuse must be a policy name or path/to/rule.py:ClassName, got {self.policy!r}")
        object.__setattr__(self, "policy", absolute_reference(self.policy))
        if self.lenience is not None:
            check_lenience("--lenience", self.lenience)
        if not isinstance(self.params, dict) or not all(isinstance(k, str) for k in self.params):
            raise TypeError(f"--reuse.params must be a JSON object of parameter names, got {self.params!r}")
        if self.reused_logprobs not in REUSED_LOGPROBS:
            raise ValueError(
                f"--reuse.logprobs must be one of {', '.join(REUSED_LOGPROBS)}, got {self.reused_logprobs!r}"
            )
        if self.scoring not in SCORING_MODES:
            raise ValueError(f"--reuse.scoring must be one of {', '.join(SCORING_MODES)}, got {self.scoring!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--reuse.seed must be an integer >= 0, got {self.seed!r}")
        if self.update_every is not None and (
            isinstance(self.update_every, bool) or not isinstance(self.update_every, int) or self.update_every < 1
        ):
            raise ValueError(f"--reuse.update_every must be an integer >= 1, got {self.update_every!r}")
        if not (isinstance(self.cache_max_gb, (int, float)) and math.isfinite(self.cache_max_gb)) or (
            self.cache_max_gb <= 0
        ):
            raise ValueError(f"--reuse.cache_max_gb must be a positive number of GiB, got {self.cache_max_gb!r}")
        if isinstance(self.cache_shards, bool) or not isinstance(self.cache_shards, int) or self.cache_shards < 1:
            raise ValueError(f"--reuse.cache_shards must be an integer >= 1, got {self.cache_shards!r}")
        object.__setattr__(self, "plugins", tuple(str(p) for p in self.plugins))

    @property
    def enabled(self) -> bool:
        return self.build_policy().draft_age > 0

    @property
    def cache_max_bytes(self) -> int:
        return int(self.cache_max_gb * (1 << 30))

    def build_policy(self) -> ReusePolicy:
        """Load the plugins, then build the policy (unknown names and bad parameters raise here)."""
        for path in self.plugins:
            load_plugin(path)
        params = dict(self.params) if self.lenience is None else {**self.params, "lenience": self.lenience}
        return make(self.policy, **params)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReuseConfig:
        data = json.loads(text)
        data["plugins"] = tuple(data.get("plugins", ()))
        return cls(**data)
