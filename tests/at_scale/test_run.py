"""The rules run and priced (`at_scale.run`): the fastest rule and its margin by each host reading."""

import doctest
import math

from specrl_openrlhf.at_scale import run
from specrl_openrlhf.at_scale.run import fastest
from specrl_openrlhf.pricing.projection import Projection


def projection(projected: float, projected_async: float) -> Projection:
    return Projection(projected, projected_async, math.nan, True, 1.0, 1.0, 1.0, 38.0)


def test_doctests():
    assert doctest.testmod(run).failed == 0


def test_the_fastest_rule_is_read_per_host_and_its_margin_is_over_the_runner_up():
    result = {"off": projection(1.0, 1.0), "suffix": projection(0.8, 1.6), "exact": projection(1.25, 1.25)}
    assert fastest(result, "projected") == ("exact", 1.25)  # stock is the runner-up with the host paid
    rule, margin = fastest(result, "projected_async")
    assert rule == "suffix" and margin == 1.6 / 1.25
    assert fastest(result, "projected", ["off", "suffix"]) == ("off", 1.25)  # every rule loses: stock is fastest


def test_a_lone_rule_has_no_margin():
    rule, margin = fastest({"off": projection(1.0, 1.0)}, "projected")
    assert rule == "off" and math.isnan(margin)
