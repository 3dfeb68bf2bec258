"""The engine arguments a rule needs: for `lossless` verified in the engine, our proposer and what it relies on."""

from __future__ import annotations

PROPOSER = "specrl_openrlhf.integration.vllm.proposer.HistoryProposer"  # vLLM's `custom_class` proposer


def engine_kwargs(policy, base: dict | None = None) -> dict:
    """The engine arguments `base` (default: none) with what an engine needs for `policy`: for a rule verified in the
    engine, the proposer (drafting up to the rule's `num_speculative_tokens` k at a step), per-request acceptance
    counts (each verification step's drafted and accepted tokens) on every finished output, and where `base` sets
    `max_model_len`, k tokens of room past it. vLLM skips the proposer for a whole step, and has every row of the
    batch verify k dummy draft tokens (token 0), as soon as one sequence of the batch is within k tokens of
    `max_model_len` (docs/upstream.md): the room keeps that from happening to responses that stay within the
    length the caller planned. Nothing for any other rule (its engine must run logits-processor plugins, which vLLM
    does not build under speculative decoding)."""
    base = dict(base or {})
    if not policy.verifies_in_engine:
        return base
    k = int(policy.params.num_speculative_tokens)
    if base.get("max_model_len"):
        base["max_model_len"] = int(base["max_model_len"]) + k
    return {
        **base,
        "speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k},
        "per_request_spec_decode_metrics": "detailed",
        # a visit's samples are served in slot order: where the engine has more samples than slots, later ones start
        # after earlier ones finished, and draft from them too (`engine_path.EnginePathDriver`)
        "scheduling_policy": "priority",
    }
