"""Each rule with CUDA graphs and without (`at_scale.eager_modes`): stock's loss, each rule's own, the table and the
RESULT fields, on projections of known seconds."""

import math

import pytest

from specrl_openrlhf.at_scale.eager_modes import Modes, mode_fields, mode_table
from specrl_openrlhf.pricing.projection import Projection


def projection(stock_s: float, rule_s: float, rule_async_s: float) -> Projection:
    return Projection(stock_s / rule_s, stock_s / rule_async_s, math.nan, True, stock_s, rule_s, rule_async_s, 1.0)


def test_stock_loses_what_its_steps_launch_and_a_rule_that_saves_steps_loses_less():
    modes = Modes(
        {
            False: {"off": projection(10.0, 10.0, 10.0), "suffix": projection(10.0, 8.0, 8.0)},
            True: {"off": projection(12.0, 12.0, 12.0), "suffix": projection(12.0, 9.0, 9.0)},
        },
        {False: {"off": 0.0, "suffix": 0.5}, True: {"off": 0.0, "suffix": 0.5}},
    )
    assert modes.stock_loss == pytest.approx(1.2) and modes.rule_loss("suffix") == pytest.approx(9 / 8)
    assert modes.rule_loss("suffix", "async") == pytest.approx(9 / 8)
    text = mode_table(modes)
    assert "| suffix | 50.0% | 1.25 | 1.25 | 50.0% | 1.33 | 1.33 | 1.125 | 1.125 |" in text
    assert "stock without CUDA graphs takes 1.200x its time with them (12.00 s against 10.00 s)" in text
    fields = dict(f.split("=") for f in mode_fields(modes).split())
    assert fields["stock_eager_over_graphs"] == "1.2000" and fields["projected_eager[suffix]"] == "1.333"
    assert fields["projected_graphs[suffix]"] == "1.250" and fields["kept_eager[suffix]"] == "0.500"
    assert "projected_graphs[off]" not in fields
