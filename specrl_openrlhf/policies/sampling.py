"""What sampling settings a reuse rule can be verified under (`check_sampling`).

It reads only a rule's class attributes: no torch or numpy is used here.
"""

from __future__ import annotations

from .base import ReusePolicy

PENALTIES = {"repetition_penalty": (1.0, None), "presence_penalty": (0.0, None), "frequency_penalty": (0.0, None)}


class UnsupportedSamplingError(ValueError):
    """Sampling settings under which p_prev and p_curr would describe different distributions."""


def check_sampling(
    policy: ReusePolicy, *, min_tokens: int = 0, processed_logprobs: bool = False, **settings
) -> list[str]:
    """Fail unless the scored (always raw) logprobs describe the distribution samples are drawn from; return
    warnings for what is close but not exact.

    vLLM's prompt logprobs, which scoring uses, are raw: temperature 1, no top-p/top-k/min-p, no penalties. A
    lenient ratio between a raw p_curr and a tempered or truncated p_prev is meaningless, so policies that score
    drafts need plain sampling. Policies that do not score (random, full, off) accept any settings. With
    `min_tokens` > 0 the engine masks EOS at the first positions; when the engine reports processed logprobs (as
    OpenRLHF sets it for the IS correction), a draft's p_prev there is renormalised without EOS while the scored
    p_curr is not: their ratio is off by 1 - p(EOS) at those positions, which the warning says.
    Keyword arguments are SamplingParams fields (temperature, top_p, top_k, min_p and the penalties).
    """
    if policy.verifies_in_engine:  # vLLM verifies under the request's own temperature, top-p and top-k
        # under speculative decoding vLLM ignores min-p and logit bias; penalties are refused as untested with drafts
        _refuse(
            settings,
            {"min_p": (0.0, None), "logit_bias": (None, {}), **PENALTIES},
            f"reuse policy {policy.name!r} verifies drafts inside vLLM, which samples with temperature, top-p and "
            "top-k as asked but ignores min-p and logit bias under speculative decoding (and penalties are not "
            "tested there); sampling uses {names}. Drop them"
            + (
                ", or set verify='requests' (--reuse.params '{\"verify\": \"requests\"}'), which needs plain sampling."
                if policy.draft_age
                else "."
            ),
        )
        return []
    if not policy.needs_scores:
        return []
    _refuse(
        settings,
        {"temperature": (1.0,), "top_p": (1.0, None), "top_k": (0, -1, None), "min_p": (0.0, None), **PENALTIES},
        f"reuse policy {policy.name!r} scores drafts with vLLM prompt logprobs, which are always raw "
        "(temperature 1, no top-p/top-k/min-p/penalties), but sampling uses {names}. Sample with "
        "temperature 1.0, top_p 1.0 and top_k -1 (the paper's setting, --rollout.temperature 1.0 "
        "--rollout.top_p 1.0), or pick a policy that does not score drafts (random, full, off).",
    )
    if min_tokens and processed_logprobs:
        return [
            f"the engine masks EOS at the first {min_tokens} position(s) (min_tokens) and reports processed logprobs: "
            "there a draft's p_prev is renormalised without EOS and p_curr is not, so their ratio is off by "
            "1 - p(EOS), which is negligible unless responses often end at once"
        ]
    return []


def _refuse(settings: dict, allowed: dict, message: str) -> None:
    """Raise `message`, its "{names}" replaced by the offending settings, when one is outside its allowed values."""
    bad = {k: v for k, v in settings.items() if k in allowed and v not in allowed[k]}
    if bad:
        raise UnsupportedSamplingError(message.replace("{names}", ", ".join(f"{k}={v}" for k, v in bad.items())))
