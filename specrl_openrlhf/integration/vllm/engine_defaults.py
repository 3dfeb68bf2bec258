"""The engine size vLLM gives an engine built as OpenRLHF builds it, and whether a step's budget carries every row's
drafts.

Terminology:
- *rows*: `max_num_seqs`, the requests a step decodes at most.
- *budget*: `max_num_batched_tokens`, the tokens a step computes at most, every decoding row's sampled token and
  draft tokens and every prefill chunk included.
- *k*: the draft tokens a row may carry at a step (`speculative_config.num_speculative_tokens`): a decoding row with
  k drafts takes 1 + k tokens of the budget. vLLM schedules the running rows in order until the budget is spent, so
  where rows x (1 + k) exceeds the budget, the row at its edge has its drafts cut and the rows after it wait a step.

`AsyncLLMEngine.from_engine_args` takes `UsageContext.ENGINE_CONTEXT`, and OpenRLHF's `RolloutRayActor` passes no
`max_num_seqs` and no `max_num_batched_tokens`, so vLLM's `EngineArgs` sets them from `get_batch_defaults`, falling
back to the `SchedulerConfig` defaults where the usage context is not listed (vLLM 0.29 and 0.32 list only
`LLM_CLASS` and `OPENAI_API_SERVER`; `simulator.regime.REGIMES["openrlhf"]` names the fallback, and a test holds the
two together and reads the `SchedulerConfig` vLLM builds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...params import check_fields, limits


@dataclass(frozen=True, kw_only=True)
class EngineSize:
    """The rows and the token budget of an engine's step, as vLLM sets them (`engine_size`)."""

    max_num_seqs: int = field(metadata=limits(at_least=1, means="vLLM's max_num_seqs"))
    """Rows a step decodes at most."""
    max_num_batched_tokens: int = field(metadata=limits(at_least=1, means="vLLM's max_num_batched_tokens"))
    """Tokens a step computes at most (the budget), draft tokens included."""

    def __post_init__(self):
        check_fields(self)

    def tokens_for_drafts(self, k: int) -> int:
        """The budget every row needs to carry k draft tokens at one step: rows x (1 + k)."""
        return self.max_num_seqs * (1 + k)

    def carries_drafts(self, k: int) -> bool:
        """Whether a step can carry k draft tokens in every row."""
        return self.tokens_for_drafts(k) <= self.max_num_batched_tokens

    def rows_carrying_drafts(self, k: int) -> int:
        """The most rows whose k draft tokens the budget carries at one step."""
        return self.max_num_batched_tokens // (1 + k)


def engine_context_defaults(world_size: int = 1) -> tuple[int, int]:
    """(rows, budget) an engine of `world_size` GPUs gets under `ENGINE_CONTEXT` with neither set, on this platform
    (vLLM 0.29 and 0.32). Raises ImportError where vLLM is not installed."""
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, rows = EngineArgs.get_batch_defaults(world_size)
    context = UsageContext.ENGINE_CONTEXT
    return (
        int(rows.get(context, SchedulerConfig.DEFAULT_MAX_NUM_SEQS)),
        int(tokens.get(context, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)),
    )


def engine_size(
    max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None, *, world_size: int = 1
) -> EngineSize:
    """The size vLLM sets for an engine built under `ENGINE_CONTEXT` (as OpenRLHF builds its engines) given these
    arguments: each one given, else the engine-context default; a default row count is lowered to a smaller given
    budget, as vLLM lowers it. This is vLLM's rule for a model with chunked prefill (which vLLM turns on for text
    decoders): without it, vLLM raises a default budget to `max_model_len`. Raises ImportError where vLLM is not
    installed and either is not given."""
    defaults = (None, None)
    if max_num_seqs is None or max_num_batched_tokens is None:
        defaults = engine_context_defaults(world_size)
    tokens = defaults[1] if max_num_batched_tokens is None else max_num_batched_tokens
    rows = min(defaults[0], tokens) if max_num_seqs is None else max_num_seqs
    return EngineSize(max_num_seqs=rows, max_num_batched_tokens=tokens)
