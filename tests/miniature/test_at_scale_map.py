"""The map (`miniature.at_scale_map`): each cell names the fastest rule by each host reading and `lossless`'s best
path against `exact` and suffix decoding."""

import math

import pytest

from specrl_openrlhf.miniature.at_scale_map import cell, map_table
from specrl_openrlhf.pricing.projection import Projection


def projection(projected: float, projected_async: float, breakeven: float = math.nan) -> Projection:
    return Projection(projected, projected_async, breakeven, True, 1.0, 1.0, 1.0, 38.0)


def test_a_cell_names_the_fastest_rule_by_each_host_reading_and_lossless_against_its_peers():
    result = {
        "off": projection(1.0, 1.0),
        "lossless": projection(0.6, 1.3, 200.0),  # the engine path: behind with the host paid, ahead with it hidden
        "lossless:requests": projection(0.9, 0.9, 1300.0),
        "exact": projection(1.2, 1.2),
        "suffix": projection(0.45, 0.7),
    }
    c = cell("long", "qwen3-8b", "h100", result)
    assert (c["best"], c["projected"]) == ("exact", 1.2)
    assert (c["best_async"], c["projected_async"]) == ("lossless", 1.3)
    assert c["lossless_path"] == "lossless:requests" and c["lossless"] == 0.9 and c["breakeven_host_ms"] == 1300.0
    assert c["over_exact"] == pytest.approx(0.75) and c["over_suffix"] == pytest.approx(2.0)
    table = map_table([c])
    row = "| long | qwen3-8b | h100 | exact | 1.20 | lossless | 1.30 | lossless:requests | 0.90 | 0.75 | 2.00 |"
    assert row in table


def test_a_cell_without_a_peer_says_nan_not_a_number_made_up():
    c = cell("short", "qwen3-1.7b", "b200", {"off": projection(1.0, 1.0), "lossless": projection(1.1, 1.2, 30.0)})
    assert c["lossless_path"] == "lossless" and math.isnan(c["over_exact"]) and math.isnan(c["over_suffix"])
