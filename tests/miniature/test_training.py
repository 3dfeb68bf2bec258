"""A quickstart step's row (`miniature.training`): what the engine's step log adds to it."""

import doctest

from specrl_openrlhf.miniature import training
from specrl_openrlhf.miniature.training import engine_columns, with_engine_drafts
from specrl_openrlhf.pricing.steps import EngineSteps


def test_doctests():
    assert doctest.testmod(training).failed == 0


def steps(drafted, accepted):
    rows = [(0.01 * (i + 1), 0, 0, 4, 4 + d, d, a) for i, (d, a) in enumerate(zip(drafted, accepted))]
    return EngineSteps.of(rows)


def test_a_rule_vllm_verifies_by_itself_counts_its_accepted_drafts_as_reused():
    """vLLM's own speculation on OpenRLHF's executor: the step log's accepted drafts leave the decoded tokens."""
    columns = engine_columns(steps([8, 8, 0], [5, 2, 0]), 0.0, None)
    assert (columns["engine_drafted"], columns["engine_accepted"]) == (16, 7)
    row = with_engine_drafts({"decoded_tokens": 40.0, "samples": 4.0}, columns)
    assert (row["decoded_tokens"], row["reused_tokens"], row["draft_tokens"]) == (33.0, 7, 16)


def test_stock_and_our_executors_rows_are_left_as_they_are():
    stock = engine_columns(steps([0, 0], [0, 0]), 0.0, None)
    assert "engine_accepted" not in stock
    assert with_engine_drafts({"decoded_tokens": 40.0}, stock) == {"decoded_tokens": 40.0}
    ours = {"decoded_tokens": 10.0, "reused_tokens": 30.0}  # our executor counted them (lossless): never twice
    assert with_engine_drafts(ours, engine_columns(steps([8], [6]), 0.0, None)) == ours
