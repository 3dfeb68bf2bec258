"""A step price as the draft budget's linear model (`pricing.linear`): one algorithm for every price, exact on a
price that is linear, and a price that needs the context refuses a budget without one, as its `time` does."""

import json
from pathlib import Path

import numpy as np
import pytest

from specrl_openrlhf.pricing import linear
from specrl_openrlhf.pricing.curves import HostCurve, StepCurve

H200 = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"


class Linear:
    """t = 2 ms + 10 us per row + 20 us per token carried + 1 ns per row and cached token (context needed)."""

    host = HostCurve([{"rows": 1, "seconds": 0.001}, {"rows": 1001, "seconds": 0.002}])

    def time(self, rows, tokens_per_row, context=None):
        if context is None:
            raise ValueError("pass the context")
        rows, tokens = np.asarray(rows, np.float64), np.asarray(tokens_per_row, np.float64)
        return 0.002 + 1e-5 * rows + 2e-5 * rows * tokens + 1e-9 * rows * context


def test_a_linear_price_gives_its_own_coefficients():
    base, per_row, per_token = linear.budget_cost(Linear(), 16, 8, 1000.0, (1.0, 2.0, 5.0))
    assert per_row == 0.0 and per_token == pytest.approx(2e-5 * 8)  # a draft slot stands for 8 of the GPU's
    # a one-token step at 128 rows, the cache read and the host's time in the base
    assert base + per_token * 16 == pytest.approx(0.002 + 128 * (1e-5 + 2e-5 + 1e-6) + 0.001 + 127e-6)
    assert linear.token_slope(Linear(), np.array([4.0, 64.0]), (1.0, 5.0), 0.0) == pytest.approx([2e-5, 2e-5])
    with pytest.raises(ValueError, match="pass the context"):
        linear.budget_cost(Linear(), 16, 8, None, (1.0, 5.0))


def test_a_curves_budget_is_the_one_algorithm_over_its_measured_tokens():
    curve = StepCurve.from_data(json.loads(H200.read_text()), str(H200))
    for rows, scale in ((16, 8), (1, 1), (64, 8)):
        expected = linear.budget_cost(curve, rows, scale, None, curve.tokens, curve.rows[0])
        np.testing.assert_array_equal(curve.budget_cost(rows, scale), expected)
    slopes = curve.token_slope(np.array([1.0, 700.0]))
    np.testing.assert_array_equal(
        slopes, linear.token_slope(curve, np.array([1.0, 700.0]), curve.tokens, None, curve.rows[0])
    )
