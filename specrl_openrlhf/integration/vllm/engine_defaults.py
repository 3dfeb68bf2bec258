"""The engine size vLLM gives an engine built as OpenRLHF builds it: `AsyncLLMEngine.from_engine_args` takes
`UsageContext.ENGINE_CONTEXT`, and OpenRLHF's `RolloutRayActor` passes no `max_num_seqs` and no
`max_num_batched_tokens`, so vLLM's `EngineArgs` sets them from `get_batch_defaults`, falling back to the
`SchedulerConfig` defaults where the usage context is not listed (`simulator.regime.REGIMES["openrlhf"]` names them;
a test holds the two together).
"""

from __future__ import annotations


def engine_context_defaults(world_size: int = 1) -> tuple[int, int]:
    """(rows, batched tokens) an engine of `world_size` GPUs gets under `ENGINE_CONTEXT` with neither set, on this
    platform. Raises ImportError where vLLM is not installed."""
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, rows = EngineArgs.get_batch_defaults(world_size)
    context = UsageContext.ENGINE_CONTEXT
    return (
        int(rows.get(context, SchedulerConfig.DEFAULT_MAX_NUM_SEQS)),
        int(tokens.get(context, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)),
    )
