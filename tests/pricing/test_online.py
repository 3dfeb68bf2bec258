"""The running engine's step time fitted online (`specrl_openrlhf.pricing.online`): a linear step cost recovered from
noisy steps, stalls left out, and the prior that splits a row's cost with its tokens until drafts vary."""

import doctest

import numpy as np
import pytest

from specrl_openrlhf.pricing import online
from specrl_openrlhf.pricing.online import OnlineStepCost


def test_doctests():
    assert doctest.testmod(online).failed == 0


def test_the_cost_fit_recovers_a_linear_step_cost_from_noisy_steps():
    rng = np.random.default_rng(1)
    cost = OnlineStepCost()
    for _ in range(3000):
        rows = int(rng.integers(1, 256))
        tokens = rows + int(rng.integers(0, 4 * rows + 1))
        seconds = (0.005 + 0.00002 * rows + 0.00008 * tokens) * rng.lognormal(0.0, 0.05)
        cost.observe(rows, tokens, seconds)
    cost.observe(64, 64, 5.0)  # a stall (a weight load, a collection) is not a step
    base, per_row, per_token, _ = cost.params
    assert base == pytest.approx(0.005, rel=0.1) and per_token == pytest.approx(0.00008, rel=0.05)
    assert per_row == pytest.approx(0.00002, abs=0.00001)


def test_until_drafts_vary_the_prior_splits_a_rows_cost_with_its_tokens():
    cost = OnlineStepCost()
    for rows in (8, 16, 32, 64) * 10:  # plain decoding: tokens = rows
        cost.observe(rows, rows, 0.004 + 0.0002 * rows)
    base, per_row, per_token, _ = cost.params
    assert base == pytest.approx(0.004, rel=0.05) and per_row == pytest.approx(per_token, rel=0.05)
    assert per_row + per_token == pytest.approx(0.0002, rel=0.05)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="step cost"):
        OnlineStepCost(half_life=0)
