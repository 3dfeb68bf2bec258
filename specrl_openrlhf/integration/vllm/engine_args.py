"""The engine arguments a rule needs: for a rule vLLM verifies at every step, its speculative config for the engine
the installed vLLM runs (`versions`) and what it relies on (`ReusePolicy.engine_arguments`), with room past
`max_model_len`, checked against vLLM's own config."""

from __future__ import annotations

import importlib.util
import logging

from ...policies.speculative import SpeculativeConfigError
from .versions import check_settings, engine_path

logger = logging.getLogger(__name__)


def engine_kwargs(policy, base: dict | None = None, flags: dict[str, str] | None = None) -> dict:
    """The engine arguments `base` (default: none) with what an engine needs for `policy`: for a rule verified in the
    engine, its speculative config for the installed vLLM's engine (drafting up to k tokens a step; on vLLM >= 0.34
    with adaptive verification where `base` allows it), per-request acceptance counts (each verification step's
    drafted and accepted tokens) on every finished output, and where `base` sets `max_model_len`, k tokens of room
    past it. vLLM's V1 runner skips the proposer for a whole step, and has every row of the batch verify k dummy draft
    tokens (token 0), as soon as one sequence of the batch is within k tokens of `max_model_len` (docs/upstream.md):
    the room keeps that from happening to responses that stay within the length the caller planned. Nothing for any
    other rule (its engine must run logits-processor plugins, which vLLM's V1 runner does not build under
    speculative decoding). A setting the installed vLLM cannot run raises `SpeculativeConfigError` naming it, as
    `flags` name `base`'s keys (`versions.adaptive_blockers`)."""
    base = dict(base or {})
    if not policy.engine_arguments():  # the same for every engine: nothing
        return base
    path = engine_path(base, flags)
    check_settings(policy, path)
    extra = policy.engine_arguments(path.target)
    check_keys(extra["speculative_config"])
    check_installed(extra["speculative_config"], path.target.runner)
    logger.info("%s", path.line(policy))
    k = int(extra["speculative_config"].get("num_speculative_tokens") or 0)
    if base.get("max_model_len"):
        base["max_model_len"] = int(base["max_model_len"]) + k
    return {**base, **extra}


def check_installed(config: dict, runner: str = "v1") -> None:
    """A method that needs a package this environment lacks is refused here, naming the fix (vLLM's own message
    names an old version of it, and comes from the engine, once it starts). vLLM 0.34's suffix speculator runs on
    the GPU and needs none."""
    if config.get("method") == "suffix" and runner == "v1" and importlib.util.find_spec("arctic_inference") is None:
        raise SpeculativeConfigError(
            "speculative_config method 'suffix' needs arctic-inference's suffix tree: `PYTHON=$(which python) bash "
            "scripts/build_suffix_tree.sh` builds it (docs/install.md, 'Suffix decoding on GPUs')"
        )


def check_keys(config: dict) -> None:
    """Every key of `config` is one of vLLM's speculative config's (where vLLM can be imported here)."""
    try:
        import dataclasses

        from vllm.config import SpeculativeConfig
    except ImportError:
        return
    known = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise SpeculativeConfigError(
            f"speculative_config key(s) {unknown} are not vLLM's: see the fields of vllm.config.SpeculativeConfig"
        )
