"""A GPU's step curve (`step_curve`): exact on its grid, linear between and beyond, a prefill column, and the data
that travels to the engines: a bad file or object is one error naming it."""

import doctest
import json

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf import step_curve
from specrl_openrlhf.policies.builtin import LosslessParams
from specrl_openrlhf.step_curve import StepCurve

# t = 4 ms + 10 us per row + 20 us per token carried, measured on a grid of rows x tokens per row
GRID = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r + 2e-5 * r * q} for r in (32, 64, 128) for q in (1, 2, 5)]
PREFILL = [{"tokens": t, "seconds": 0.003 + 1e-5 * t} for t in (256, 1024, 4096)]


def test_doctests():
    assert doctest.testmod(step_curve).failed == 0


def test_the_curve_is_exact_on_its_grid_and_linear_between_and_beyond():
    curve = StepCurve(GRID)
    for point in GRID:
        assert curve.time(point["rows"], point["tokens"]) == pytest.approx(point["seconds"])
    assert curve.time(96, 3) == pytest.approx(0.004 + 1e-5 * 96 + 2e-5 * 96 * 3)  # inside: bilinear, exact here
    assert curve.time(256, 9) == pytest.approx(0.004 + 1e-5 * 256 + 2e-5 * 256 * 9)  # past the grid: its slopes
    assert curve.time(4, 1) == curve.time(32, 1)  # a small batch costs what the smallest measured one does
    np.testing.assert_allclose(curve.time([32, 64], [1, 2]), [curve.time(32, 1), curve.time(64, 2)])
    one, per_token = curve.linear_at(64)
    assert one == pytest.approx(0.004 + 64 * 3e-5) and per_token == pytest.approx(2e-5)


def test_prefill_is_priced_on_its_column_or_on_the_grids_token_slope():
    measured = StepCurve(GRID, prefill=PREFILL)
    assert measured.prefill_measured and measured.prefill_cost(2048) == pytest.approx(2048e-5)  # less its intercept
    assert measured.prefill_cost(0) == 0.0
    modelled = StepCurve(GRID)
    assert not modelled.prefill_measured
    assert modelled.prefill_cost(100, rows=64) == pytest.approx(100 * 2e-5 / 1)  # the grid's per-token cost
    np.testing.assert_allclose(modelled.prefill_cost(np.array([0, 10]), rows=np.array([32, 64])), [0.0, 10 * 2e-5])


def test_a_curve_travels_as_data(tmp_path):
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"device": "test GPU", "curve": GRID, "prefill": PREFILL}))
    curve = StepCurve.load(path)
    again = StepCurve.from_data(json.loads(json.dumps(curve.as_data())))
    assert again.device == "test GPU" and again.prefill_measured
    np.testing.assert_array_equal(again.seconds, curve.seconds)
    # the rule reads the file once, where it is built, and holds the data: its engines read no file
    params = LosslessParams(cost_curve=str(path))
    path.unlink()
    assert params.cost_curve == curve.as_data()
    assert sr.make("lossless", cost_curve=params.cost_curve).params.cost_curve == params.cost_curve


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such step curve file"),
        ("{not json", "not a readable step curve"),
        (json.dumps([1, 2]), "a JSON object with a 'curve' list"),
        (json.dumps({"curve": [{"rows": 32, "tokens": 1}]}), "each point needs rows, tokens and seconds"),
        (json.dumps({"curve": GRID[:-1]}), "full grid of at least 2 x 2 points; missing"),
        (json.dumps({"curve": GRID, "prefill": [{"tokens": 5, "seconds": 0.1}]}), "prefill column needs at least 2"),
        (json.dumps({"curve": [dict(p, seconds=-1.0) for p in GRID]}), "must be positive"),
    ],
)
def test_a_bad_curve_is_one_error_naming_its_file(tmp_path, content, message):
    path = tmp_path / "curve.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        StepCurve.load(path)
    assert str(path) in str(error.value)
    with pytest.raises(ValueError, match=f"cost_curve: {path}"):
        sr.make("lossless", cost_curve=str(path))
