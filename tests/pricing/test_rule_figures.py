"""A rule's figures from simulated steps (`pricing.rule_figures`): its proposer's time per row at a full batch counts
every RL step's full batch, its fitted cost, the tail."""

import doctest

import numpy as np
import pytest

from specrl_openrlhf.pricing import rule_figures
from specrl_openrlhf.pricing.curves import StepCurve
from specrl_openrlhf.pricing.projection import Pricing

TINY = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r * q} for r in (8, 16) for q in (1, 2)]


def test_doctests():
    result = doctest.testmod(rule_figures)
    assert result.attempted >= 2 and result.failed == 0


def columns(records):
    """Records (rows decoding, proposer seconds, RL step), one token a row, no prefill or drafts."""
    rows, proposer_s, rl_step = (np.array(c, np.float64) for c in zip(*records))
    zeros = np.zeros(len(rows))
    return {
        "decode_rows": rows,
        "decode_tokens": rows,
        "prefill_rows": zeros,
        "prefill_tokens": zeros,
        "drafted": zeros,
        "accepted": zeros,
        "proposer_s": proposer_s,
        "register_s": zeros,
        "rl_step": rl_step,
    }


def test_the_proposers_cost_per_row_counts_every_rl_steps_full_batch():
    """Two RL steps whose full-batch steps cost 1000 and 100 us a row: 550 us over both, not the last step's 100."""
    records = [(8, 0.008, 0), (8, 0.008, 0), (2, 0.0, 0), (8, 0.0008, 1), (8, 0.0008, 1), (2, 0.0, 1)]
    cols = columns(records)
    costs = rule_figures.simulated_costs(cols, Pricing(StepCurve(TINY)))
    f = rule_figures.figures(cols, costs, async_scheduling=False)
    assert f["proposer_us"] == pytest.approx((0.016 + 0.0016) / 32 * 1e6)
    assert f["proposer_us_all"] == pytest.approx((0.016 + 0.0016) / 36 * 1e6)
    assert f["steps"] == 6 and f["proposer_s"] == pytest.approx(0.0176)
    # each tail step: 8 rows' step time (fewer rows cost what the first measured does), 4.08 ms, of the six steps'
    step = 0.004 + 8e-5
    assert f["tail"] == pytest.approx(2 * step / (6 * step + 0.0176))


def test_a_rule_that_keeps_async_scheduling_overlaps_its_host_and_still_pays_its_proposer():
    cols = columns([(8, 0.001, 0), (8, 0.001, 0)])
    costs = rule_figures.simulated_costs(cols, Pricing(StepCurve(TINY)))
    assert rule_figures.figures(cols, costs, True)["projected_s"] == pytest.approx(2 * (0.004 + 8e-5 + 0.001))
