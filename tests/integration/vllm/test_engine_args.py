"""The engine arguments a rule needs (`engine_kwargs`)."""

import specrl_openrlhf as sr
from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs


def test_engines_get_room_for_a_draft_past_the_length_the_caller_planned():
    """vLLM skips the proposer for a whole step, and verifies k dummy tokens in every row, once a sequence of the
    batch is within k tokens of max_model_len: `engine_kwargs` adds k tokens of room to the caller's."""
    lossless, spec = sr.make("lossless", num_speculative_tokens=6), sr.make("spec")
    args = engine_kwargs(lossless, {"max_model_len": 100, "seed": 3})
    assert (
        args["max_model_len"] == 106
        and args["seed"] == 3
        and args["speculative_config"]["num_speculative_tokens"] == 6
    )
    assert engine_kwargs(spec, {"max_model_len": 100}) == {"max_model_len": 100}
    assert "max_model_len" not in engine_kwargs(lossless)  # the engine's own default then


def test_the_proposer_named_to_vllm_is_ours():
    import importlib

    from specrl_openrlhf.integration.vllm.engine_args import PROPOSER
    from specrl_openrlhf.integration.vllm.v1.proposer import HistoryProposer

    module, _, name = PROPOSER.rpartition(".")
    assert getattr(importlib.import_module(module), name) is HistoryProposer
