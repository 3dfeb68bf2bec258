"""One record per engine step, for every rule, stock included: rows, tokens carried, draft tokens and accepted ones.

`StepLog` is a vLLM stat logger (entry point `vllm.stat_logger_plugins`): vLLM builds one for each `AsyncLLM` in an
environment where this package is installed and calls `record` once per engine step, in order. It records only in
engines started with `enable_logging_iteration_details=True` (vLLM's switch for per-step scheduler details; our CPU
engines set it, with `disable_log_stats=True` so that vLLM does not also log a line per step), and does nothing in
any other. Per step it reads vLLM's public stats:
- `SchedulerStats.iteration_details`: the requests the step scheduled (in prefill, `ctx`, and decoding, `gen`) and
  the tokens each kind carried (a decoding row carries 1 + its drafts);
- `SchedulerStats.spec_decoding_stats`: the draft tokens the step verified and those it accepted (None: none).
The records of an engine are `steps_of(engine)` (the `AsyncLLM`, in the process that runs it); `take` empties them.
They become `pricing.steps.EngineSteps`, which `pricing.projection` prices on a GPU's step curve.
"""

from __future__ import annotations

import time
import weakref

from vllm.v1.metrics.loggers import StatLoggerBase

from ...pricing.steps import EngineSteps

MAX_STEPS = 1 << 22  # steps an engine keeps (a few hundred MB at most); the oldest are dropped past it
_LOGS: weakref.WeakValueDictionary[int, StepLog] = weakref.WeakValueDictionary()  # by id of the engine's VllmConfig


class StepLog(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0):
        observability = getattr(vllm_config, "observability_config", None)
        self.enabled = bool(getattr(observability, "enable_logging_iteration_details", False))
        self.rows: list[tuple] = []  # (time, ctx rows, ctx tokens, decode rows, decode tokens, drafted, accepted)
        _LOGS[id(vllm_config)] = self

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        details = getattr(scheduler_stats, "iteration_details", None) if self.enabled else None
        if details is None or getattr(details, "is_dummy", False):
            return
        spec = scheduler_stats.spec_decoding_stats
        drafted, accepted = (spec.num_draft_tokens, spec.num_accepted_tokens) if spec is not None else (0, 0)
        self.rows.append(
            (
                time.perf_counter(),
                details.num_ctx_requests,
                details.num_ctx_tokens,
                details.num_generation_requests,
                details.num_generation_tokens,
                drafted,
                accepted,
            )
        )
        if len(self.rows) > MAX_STEPS:
            del self.rows[: len(self.rows) - MAX_STEPS]

    def log_engine_initialized(self):
        pass

    def take(self) -> EngineSteps:
        """The steps recorded since the last `take`, as `EngineSteps`."""
        rows, self.rows = self.rows, []
        return EngineSteps.of(rows)


def steps_of(engine) -> StepLog | None:
    """The step log of an `AsyncLLM` (None where the engine records none: no details, or no plugin loaded)."""
    log = _LOGS.get(id(engine.vllm_config))
    return log if log is not None and log.enabled else None


def take_steps(engine) -> EngineSteps:
    """What `steps_of(engine)` recorded since it was last taken (empty where it records nothing)."""
    log = steps_of(engine)
    return log.take() if log is not None else EngineSteps.of([])
