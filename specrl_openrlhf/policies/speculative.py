"""vLLM's own speculative decoding as rules: the peers a user would pick instead of reusing rollouts.

`vllm` hands a `speculative_config` (vLLM's engine argument) to every engine the run starts and reuses nothing
itself: vLLM drafts and verifies at every step. Any method vLLM offers can be named (EAGLE or MTP on GPUs); `suffix`
(vLLM's suffix decoding: a tree of the engine's previous responses, arctic-inference's) and `ngram` (prompt lookup)
are short names, and the ones that run on CPU here. A model-free proposal is verified with the one-hot rule, which is
exact for any proposal (docs/design.md); on CPU, our vLLM plugin fixes vLLM's sampler for every method.

A config is checked when the rule is built, before any engine starts: its method, and for `suffix` and `ngram` each
key and value, naming the key and the fix. Other methods' keys are checked against vLLM's own config at start-up
(`integration.vllm.engine_args`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..params import check_value
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
SUFFIX_DEFAULT_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth, its default k on the V1 runner too
SUFFIX_V2_MAX_DEFAULT_K = 8  # vLLM 0.34's GPU suffix speculator verifies every slot: its default k is min(8, depth)
NGRAM_DEFAULT_K = 8  # vLLM requires k for n-gram; ours when the config leaves it out
TOKENS = "speculative_config.num_speculative_tokens"


class SpeculativeConfigError(ValueError):
    """A speculative config vLLM would refuse or misread."""


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
        object.__setattr__(self, "speculative_config", check_speculative_config(self.speculative_config))
        named = self.speculative_config["method"]
        if self.method is not None and named != self.method:
            raise SpeculativeConfigError(
                f"speculative_config.method is {named!r} but this rule is {self.method!r}: use --rollout_reuse vllm "
                f"for another method"
            )


@dataclass(frozen=True, kw_only=True)
class SuffixParams(VllmParams):
    """The parameter of `suffix`."""

    speculative_config: dict = field(default_factory=lambda: {"method": "suffix"})
    """vLLM's suffix decoding settings: `suffix_decoding_max_tree_depth` (24), `suffix_decoding_max_cached_requests`
    (10000 responses kept FIFO in one tree per engine), `suffix_decoding_max_spec_factor` (1.0),
    `suffix_decoding_min_token_prob` (0.1): vLLM's defaults."""

    method: str | None = field(default="suffix", init=False, repr=False)


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
        adaptive verification where the engine allows it and the config does not say."""
        config = dict(self.params.speculative_config)
        if engine.runner == "v2" and config["method"] == "suffix":
            if not self.params.tokens_given:
                depth = config.get("suffix_decoding_max_tree_depth", SUFFIX_DEFAULT_DEPTH)
                config["num_speculative_tokens"] = min(SUFFIX_V2_MAX_DEFAULT_K, depth)
            config.setdefault("enable_adaptive_verification", engine.adaptive_verification)
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
