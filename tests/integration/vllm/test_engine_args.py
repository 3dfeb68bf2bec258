"""The engine arguments a rule needs (`engine_kwargs`), for the engine the installed vLLM runs, checked against its
own speculative config. Marked vllm_wheel: scripts/test_vllm034.sh runs them under vLLM 0.33's and 0.34's modules."""

import dataclasses

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.integration.vllm import versions
from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs
from specrl_openrlhf.policies.builtin import HISTORY_PROPOSER, HISTORY_SPECULATOR

pytestmark = pytest.mark.vllm_wheel


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


@pytest.mark.parametrize("eager", [False, True])
def test_lossless_gets_the_engine_the_installed_vllm_runs_in_keys_its_config_has(eager):
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = engine_kwargs(sr.make("lossless"), {"enforce_eager": eager})
    assert set(args) <= {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    config = args["speculative_config"]
    if versions.runner_of(versions.installed()) == "v1":
        assert config["method"] == "custom_class" and config["model"] == HISTORY_PROPOSER
    else:
        assert config["method"] == HISTORY_SPECULATOR and config["enable_adaptive_verification"] is not eager
    assert set(config) <= {f.name for f in dataclasses.fields(SpeculativeConfig)}


def test_the_proposer_named_to_vllm_is_ours():
    import importlib

    from specrl_openrlhf.integration.vllm.v1.proposer import HistoryProposer

    module, _, name = HISTORY_PROPOSER.rpartition(".")
    assert getattr(importlib.import_module(module), name) is HistoryProposer
