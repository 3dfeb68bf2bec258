"""One record per engine step (`integration.vllm.step_log`), from vLLM's stats: on made-up stats, and on the
session's stock engine."""

import asyncio
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm")

from specrl_openrlhf.integration.vllm.step_log import StepLog, steps_of, take_steps  # noqa: E402


def config(details: bool):
    return SimpleNamespace(observability_config=SimpleNamespace(enable_logging_iteration_details=details))


DETAILS = ("num_ctx_requests", "num_ctx_tokens", "num_generation_requests", "num_generation_tokens")


def stats(*counts, drafted=None, accepted=0):
    """vLLM's `SchedulerStats` of one step: its iteration details (`DETAILS`, in order) and its drafts."""
    details = SimpleNamespace(**dict(zip(DETAILS, counts)), is_dummy=False)
    spec = None if drafted is None else SimpleNamespace(num_draft_tokens=drafted, num_accepted_tokens=accepted)
    return SimpleNamespace(iteration_details=details, spec_decoding_stats=spec)


def test_a_step_is_recorded_with_its_rows_tokens_and_drafts():
    log = StepLog(config(details=True))
    log.record(stats(2, 70, 0, 0), None)  # two prompts' prefill
    log.record(stats(0, 0, 2, 7, drafted=5, accepted=3), None)  # decoding with drafts
    log.record(SimpleNamespace(iteration_details=None, spec_decoding_stats=None), None)  # a step with no details
    steps = log.take()
    assert steps.rows.tolist() == [2, 2] and steps.tokens.tolist() == [70, 7]
    assert steps.drafted.tolist() == [0, 5] and steps.accepted.tolist() == [0, 3] and len(log.take()) == 0


@pytest.mark.vllm_wheel
def test_the_installed_vllm_loads_it_and_it_reads_vllms_own_stats():
    """vLLM's own stat-logger loader (every vLLM we support, 0.33's and 0.34's modules under
    scripts/test_vllm034.sh) builds it; it records vLLM's own `SchedulerStats` of a step."""
    from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories
    from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    assert StepLog in load_stat_logger_plugin_factories()
    log = StepLog(config(details=True))
    details = SchedulerIterationDetails(0, 1, 30, 2, 9, 1.0)
    drafts = SpecDecodingStats(num_spec_tokens=4, num_drafts=2, num_draft_tokens=7, num_accepted_tokens=5)
    log.record(SchedulerStats(iteration_details=details, spec_decoding_stats=drafts), None)
    steps = log.take()
    assert steps.rows.tolist() == [3] and steps.drafted.tolist() == [7] and steps.accepted.tolist() == [5]


def test_without_iteration_details_nothing_is_recorded():
    log = StepLog(config(details=False))
    log.record(stats(0, 0, 4, 4), None)
    assert not log.enabled and len(log.take()) == 0


@pytest.mark.engine
def test_the_stock_engine_records_one_token_a_row(async_engine):
    engine, runner = async_engine
    assert steps_of(engine) is not None  # our CPU engines ask vLLM for iteration details
    take_steps(engine)
    params = vllm.SamplingParams(max_tokens=8, ignore_eos=True)

    async def four():
        from specrl_openrlhf.integration.vllm.edge import engine_generate

        return await asyncio.gather(*[engine_generate(engine)([3, 4, 5 + i], params) for i in range(4)])

    runner.run(four())
    steps = take_steps(engine)
    assert steps.prefill_rows.sum() == 4 and steps.decode_rows.sum() == 4 * 7  # the first token comes with prefill
    assert (steps.decode_tokens == steps.decode_rows).all() and steps.drafted.sum() == 0
