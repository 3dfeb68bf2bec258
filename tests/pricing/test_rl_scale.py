"""A rule against stock at rows x 1 and at the RL scale (`pricing.rl_scale`): the RL scale prices each step at 8 times
its rows, at most 512, and a figure at it is named with the scale."""

import doctest

import pytest

from specrl_openrlhf.pricing import rl_scale
from specrl_openrlhf.pricing.curves import StepCurve
from specrl_openrlhf.pricing.rl_scale import RL_SCALES, project_at_rl_scales, scale_fields
from tests.pricing.test_projection import GRID, steps


def test_doctests():
    assert doctest.testmod(rl_scale).failed == 0


def test_a_rule_is_priced_at_rows_x_1_and_at_the_rl_scale_capped_at_512_rows():
    curve = StepCurve(GRID)  # t = 4 ms + 10 us per row + 20 us per token carried
    stock = steps((64, 64), (64, 64), (32, 32))
    drafted = steps((64, 192), (32, 64), drafted=160)
    projections = project_at_rl_scales(stock, drafted, curve)
    assert sorted(projections) == list(RL_SCALES) == [1, 8]
    at_1 = (
        2 * (0.004 + 64e-5 + 2e-5 * 64) + (0.004 + 32e-5 + 2e-5 * 32),
        (0.004 + 64e-5 + 2e-5 * 192) + (0.004 + 32e-5 + 2e-5 * 64),
    )
    at_8 = (  # 8 times the rows, at most 512, with the same tokens per row
        2 * (0.004 + 512e-5 + 2e-5 * 512) + (0.004 + 256e-5 + 2e-5 * 256),
        (0.004 + 512e-5 + 2e-5 * 1536) + (0.004 + 256e-5 + 2e-5 * 512),
    )
    for scale, (stock_s, rule_s) in ((1, at_1), (8, at_8)):
        assert projections[scale].stock_s == pytest.approx(stock_s)
        assert projections[scale].projected == pytest.approx(stock_s / rule_s)
    fields = scale_fields(projections, ("projected", "breakeven_host_ms"))
    assert list(fields) == ["projected", "breakeven_host_ms", "projected8", "breakeven_host_ms8"]
    assert fields["projected8"] == projections[8].projected
