"""Engine steps projected on a GPU's step curve (`analysis.projection`): known answers on a synthetic curve."""

import doctest
import json

import pytest

from specrl_openrlhf.analysis import projection
from specrl_openrlhf.analysis.projection import EngineSteps, projected_ratio, projected_time
from specrl_openrlhf.step_curve import StepCurve

# t = 4 ms + 10 us per row + 20 us per token carried, measured on a grid of rows x tokens per row
GRID = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r + 2e-5 * r * q} for r in (32, 64, 128) for q in (1, 2, 5)]


def steps(*rows_and_tokens, drafted=0, dt=0.01):
    """Decoding steps (rows, tokens carried), one every `dt` seconds."""
    records = [(dt * (i + 1), 0, 0, r, t, drafted, 0) for i, (r, t) in enumerate(rows_and_tokens)]
    return EngineSteps.of(records)


def test_doctests():
    assert doctest.testmod(projection).failed == 0


def test_projected_time_sums_the_curve_over_the_steps(tmp_path):
    (tmp_path / "curve.json").write_text(json.dumps({"device": "test GPU", "curve": GRID}))
    curve = StepCurve.load(tmp_path / "curve.json")
    stock = steps((64, 64), (64, 64), (32, 32))  # three decoding steps, one token a row
    drafted = steps((64, 192), (32, 64), drafted=160)  # two steps carrying drafts (3 and 2 tokens a row)
    expected = {
        "stock": 2 * (0.004 + 64e-5 + 2e-5 * 64) + (0.004 + 32e-5 + 2e-5 * 32),
        "drafted": (0.004 + 64e-5 + 2e-5 * 192) + (0.004 + 32e-5 + 2e-5 * 64),
    }
    assert projected_time(stock, curve) == pytest.approx(expected["stock"])
    assert projected_time(drafted, curve) == pytest.approx(expected["drafted"])
    assert projected_ratio(stock, drafted, curve) == pytest.approx(expected["stock"] / expected["drafted"])
    # at the RL scale each step serves 8 times the rows (at most 512), with the same tokens per row
    at_scale = 2 * (0.004 + 512e-5 + 2e-5 * 512) + (0.004 + 256e-5 + 2e-5 * 256)
    assert projected_time(stock, curve, 8, 512) == pytest.approx(at_scale)


def test_the_makespan_split_finds_the_tail():
    record = steps((32, 32), (32, 40), (31, 31), (20, 30), (8, 8), (2, 6), dt=0.01)
    split = record.split(start=0.0)
    assert split["full_steps"] == 3 and split["tail_steps"] == 3 and split["peak_rows"] == 32
    assert split["full_s"] == pytest.approx(0.03) and split["tail_s"] == pytest.approx(0.03)
    assert record.split()["full_s"] == pytest.approx(0.03)  # the first step's time: the median gap
    both = record + record
    assert len(both) == 12 and EngineSteps.from_dict(both.as_dict()).rows.tolist() == both.rows.tolist()
