"""The size vLLM gives the engines OpenRLHF builds (`engine_defaults`), read from vLLM: its defaults under
`ENGINE_CONTEXT`, and the `SchedulerConfig` it builds from the arguments OpenRLHF's own `create_vllm_engines` hands
each `RolloutRayActor` (no engine started). `simulator.regime.REGIMES["openrlhf"]` must name the same size: these
tests fail when vLLM changes its defaults. scripts/test_vllm029.sh runs them on vLLM 0.29 too."""

import dataclasses
import inspect

import pytest

from specrl_openrlhf.config import ReuseConfig
from specrl_openrlhf.integration.vllm.engine_defaults import EngineSize, engine_context_defaults, engine_size
from specrl_openrlhf.simulator.regime import ENGINE_CONTEXT_ROWS, ENGINE_CONTEXT_TOKENS, REGIMES

pytestmark = pytest.mark.vllm_config
vllm = pytest.importorskip("vllm")

OPENRLHF = REGIMES["openrlhf"]


def the_usage_context_of_from_engine_args():
    """What `AsyncLLMEngine.from_engine_args` builds OpenRLHF's engines under (it passes none)."""
    return inspect.signature(vllm.AsyncLLMEngine.from_engine_args).parameters["usage_context"].default


def test_vllms_engine_context_defaults_are_the_openrlhf_regimes():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    assert the_usage_context_of_from_engine_args() is UsageContext.ENGINE_CONTEXT
    for world_size in (1, 2, 8):  # an engine of 1, 2 or 8 GPUs (OpenRLHF's --vllm.tensor_parallel_size)
        tokens, rows = EngineArgs.get_batch_defaults(world_size)  # (budgets, rows) by usage context
        assert all(isinstance(context, UsageContext) for context in (*tokens, *rows))
        assert engine_context_defaults(world_size) == (OPENRLHF.max_num_seqs, OPENRLHF.max_num_batched_tokens)
    assert (OPENRLHF.max_num_seqs, OPENRLHF.max_num_batched_tokens) == (ENGINE_CONTEXT_ROWS, ENGINE_CONTEXT_TOKENS)


def test_the_size_is_each_flag_given_else_vllms_default():
    rows, tokens = engine_context_defaults()
    assert engine_size() == EngineSize(max_num_seqs=rows, max_num_batched_tokens=tokens)
    assert engine_size(256, 8192) == EngineSize(max_num_seqs=256, max_num_batched_tokens=8192)
    assert engine_size(max_num_batched_tokens=4096) == EngineSize(max_num_seqs=rows, max_num_batched_tokens=4096)
    assert engine_size(max_num_batched_tokens=64).max_num_seqs == 64  # vLLM lowers its default rows to the budget


def test_a_row_carries_one_sampled_token_and_k_drafts():
    default = EngineSize(max_num_seqs=128, max_num_batched_tokens=2048)
    assert default.tokens_for_drafts(16) == 2176 and not default.carries_drafts(16)
    assert default.rows_carrying_drafts(16) == 120 and default.carries_drafts(15) and default.carries_drafts(8)
    assert EngineSize(max_num_seqs=128, max_num_batched_tokens=4096).carries_drafts(16)
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer"):
        EngineSize(max_num_seqs=0, max_num_batched_tokens=2048)


def openrlhfs_actor_kwargs(monkeypatch, model_dir) -> tuple[list[dict], set]:
    """What OpenRLHF 0.11.2's own `create_vllm_engines` hands each `RolloutRayActor` (two engines, the tiny model;
    its placement group stood in for, so no Ray), and the names among them that the actor keeps from vLLM."""
    vllm_engine = pytest.importorskip("openrlhf.trainer.ray.vllm_engine")
    init = inspect.signature(vllm_engine.RolloutRayActor.__ray_actor_class__.__init__)
    # its keyword-only parameters, and the two it pops from **kwargs before `vllm.AsyncEngineArgs(*args, **kwargs)`
    not_vllms = {p.name for p in init.parameters.values() if p.kind is p.KEYWORD_ONLY} | {
        "num_gpus",
        "full_determinism",
    }
    calls = []

    class Recorder:
        @classmethod
        def options(cls, **_):
            return cls

        @classmethod
        def remote(cls, **kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(vllm_engine, "RolloutRayActor", Recorder)
    # train_ppo_ray's call: engines, TP, model, seed, determinism, prefix caching, eager, max_len, a shared placement
    # group (colocated: no placement group of its own), memory, sleep, logprobs mode
    vllm_engine.create_vllm_engines(2, 1, str(model_dir), 0, False, False, True, 1024, object(), 0.95, False, None)
    return calls, not_vllms


@pytest.mark.parametrize(
    "config",
    [
        ReuseConfig(),
        ReuseConfig(policy="lossless"),
        ReuseConfig(policy="lossless", max_num_batched_tokens=4096),
        ReuseConfig(max_num_seqs=256, max_num_batched_tokens=8192),
        ReuseConfig(max_num_batched_tokens=64),
    ],
    ids=["off", "lossless", "lossless-4096-tokens", "256-rows-8192-tokens", "64-tokens"],
)
def test_the_scheduler_vllm_builds_for_openrlhfs_engines_has_the_size_we_say(config, tiny_model_dir, monkeypatch):
    """OpenRLHF's engine arguments, with ours added as the command adds them (`our_engine_kwargs`, what each actor's
    constructor passes on), built into vLLM's config under the usage context `from_engine_args` takes: its
    `SchedulerConfig` has the size `engine_size` gives, and without our flags the `openrlhf` regime's."""
    from specrl_openrlhf.integration.openrlhf.cli import our_engine_kwargs

    policy = config.build_policy()
    calls, not_vllms = openrlhfs_actor_kwargs(monkeypatch, tiny_model_dir)
    assert len(calls) == 2 and not {"max_num_seqs", "max_num_batched_tokens"} & set(calls[0])
    for actor_kwargs in calls:
        ours = our_engine_kwargs(config, policy, actor_kwargs)
        args = vllm.AsyncEngineArgs(**{k: v for k, v in ours.items() if k not in not_vllms})
        scheduler = args.create_engine_config(usage_context=the_usage_context_of_from_engine_args()).scheduler_config
        size = engine_size(config.max_num_seqs, config.max_num_batched_tokens)
        assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == dataclasses.astuple(size)
    if not config.engine_size_arguments:
        assert dataclasses.astuple(size) == (OPENRLHF.max_num_seqs, OPENRLHF.max_num_batched_tokens)
    k = policy.engine_arguments().get("speculative_config", {}).get("num_speculative_tokens")
    if k:  # lossless's default k = 16: 128 rows x 17 = 2176 tokens, over vLLM's 2048; 4096 carries them
        assert size.carries_drafts(k) == (config.max_num_batched_tokens == 4096)
