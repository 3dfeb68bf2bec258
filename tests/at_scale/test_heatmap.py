"""The map's picture (`at_scale.heatmap`): a PNG with a panel for each regime and host reading, every rule but
stock a row, every (corpus, model, GPU) a column."""

import doctest

import pytest

from specrl_openrlhf.at_scale import heatmap
from specrl_openrlhf.at_scale.heatmap import READINGS, draw_map, speedup_grid

SPEEDUPS = {
    ("short", "openrlhf", "qwen3-8b", "h100"): {
        "off": (1.0, 1.0, 1.0),
        "lossless": (0.6, 1.3, 1.4),
        "exact": (1.2, 1.2, 1.2),
    },
    ("long", "paper", "qwen3-8b", "h100"): {
        "off": (1.0, 1.0, 1.0),
        "lossless": (0.9, 1.1, 1.2),
        "lossless@per_token": (0.7, 0.8, 0.9),
    },
}


def test_doctests():
    assert doctest.testmod(heatmap).failed == 0


def test_the_grid_has_a_row_a_rule_a_column_a_cell_and_nan_where_a_cell_lacks_the_rule():
    rules, cells, grid = speedup_grid(SPEEDUPS)
    assert rules == ["lossless", "exact", "lossless@per_token"] and cells == list(SPEEDUPS)
    assert grid.shape == (3, 3, 2)
    assert grid[0, 0].tolist() == [0.6, 0.9] and grid[1, 0].tolist() == [1.3, 1.1]
    assert grid[0, 1, 0] == 1.2 and grid[0, 1, 1] != grid[0, 1, 1]  # exact is not in the long cell


def test_the_map_is_written_as_a_png_with_a_panel_a_regime_and_reading(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "img" / "map.png"
    titles = draw_map(SPEEDUPS, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a panel a regime and drawn reading: host measured, host hidden (the table has the third)
    assert titles == [
        f"regime {regime}: speedup over stock, {READINGS[r]}" for regime in ("openrlhf", "paper") for r in (0, 1)
    ]


def test_a_map_with_stock_alone_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no rule besides stock"):
        draw_map({("short", "r", "m", "g"): {"off": (1.0, 1.0, 1.0)}}, tmp_path / "map.png")
