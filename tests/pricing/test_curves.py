"""A GPU's step curve (`pricing.curves`): exact on its grid, linear between and beyond, a prefill column, the context
it was measured at, and the data that travels to the engines: a bad file or object is one error naming it."""

import doctest
import json
from pathlib import Path

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.policies.builtin import LosslessParams
from specrl_openrlhf.pricing import curves
from specrl_openrlhf.pricing.curves import HostCurve, StepCurve, describe, fit_linear
from specrl_openrlhf.pricing.projection import Pricing, step_costs

H200 = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"

# t = 4 ms + 10 us per row + 20 us per token carried, measured on a grid of rows x tokens per row
GRID = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r + 2e-5 * r * q} for r in (32, 64, 128) for q in (1, 2, 5)]
PREFILL = [{"tokens": t, "seconds": 0.003 + 1e-5 * t} for t in (256, 1024, 4096)]


def test_doctests():
    result = doctest.testmod(curves)
    assert result.attempted >= 2 and result.failed == 0


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
    assert modelled.prefill_cost(100, rows=64) == pytest.approx(100 * 2e-5)  # the grid's cost of a carried token
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


def test_a_step_of_prefill_alone_pays_a_carried_tokens_slope_not_its_first_rows():
    """Without a prefill column a prefill token costs what a carried token does on the grid: `prefill_cost(tokens,
    rows=1)` once priced each token at the first row's slope per row (32 rows' worth), 32 times too much."""
    modelled = StepCurve(GRID)
    assert modelled.prefill_cost(100, 1.0) == pytest.approx(100 * 2e-5)
    assert modelled.prefill_cost(100, 0.0) == pytest.approx(100 * 2e-5)
    h200 = StepCurve.load(H200)
    assert h200.prefill_cost(8192, 1.0) == pytest.approx(h200.prefill_cost(8192, 32.0))
    assert h200.prefill_cost(8192, 1.0) < 0.1  # 2.43 s before the fix
    # a step of prefill alone: the curve's smallest step once, and its tokens
    alone = step_costs([0], [0], [100], Pricing(modelled))
    assert alone.gpu[0] == pytest.approx(0.004 + 32e-5 + 2e-5 * 32 + 100 * 2e-5)


def test_rows_below_the_first_row_pay_a_carried_tokens_slope_for_their_prefill():
    """`time` prices fewer rows than the first as that many, so the slope is per that many rows' tokens: a step of 8
    decoding rows once paid 32 / 8 times too much for its prefill tokens. Never more a token for fewer rows."""
    curve = StepCurve(GRID)
    assert curve.token_slope(8) == pytest.approx(2e-5) and curve.token_slope(1) == pytest.approx(2e-5)
    np.testing.assert_allclose(curve.token_slope(np.array([4.0, 32.0, 64.0])), [2e-5] * 3)
    costs = step_costs([8], [8], [100], Pricing(curve))
    assert costs.gpu[0] == pytest.approx(curve.time(32, 1) + 100 * 2e-5)
    h200 = StepCurve.load(H200)
    slopes = h200.token_slope(np.array([1.0, 8.0, 32.0, 64.0, 512.0]))
    assert slopes[0] == slopes[1] == slopes[2] and np.all(np.diff(slopes[2:]) >= 0)


def test_a_curve_names_the_context_it_was_measured_at_and_ignores_the_one_asked(tmp_path):
    h200 = StepCurve.load(H200)
    assert h200.context == 512 and describe(h200) == f"NVIDIA H200 ({H200}) at context 512"
    assert h200.time(64, 2, context=4096) == h200.time(64, 2)
    assert h200.prefill_cost(1000, 64, context=4096) == h200.prefill_cost(1000, 64)
    np.testing.assert_array_equal(h200.budget_cost(16, 8, 4096.0), h200.budget_cost(16, 8))
    assert h200.linear_at(64, context=4096) == h200.linear_at(64)
    again = StepCurve.from_data(h200.as_data(), "again")
    assert again.context == 512 and again.with_host(None).context == 512
    assert StepCurve(GRID).context is None and describe(StepCurve(GRID, "GPU")) == "GPU (the step curve)"
    with pytest.raises(ValueError, match="'context' must be a number of tokens"):
        StepCurve.from_data({"curve": GRID, "context": "long"}, "bad.json")


def test_a_host_curve_says_when_and_how_it_was_taken(tmp_path):
    taken = {"time": "2026-01-02T03:04:05+00:00", "machine": "cpu x", "load": 1.5, "format": 3}
    curve = HostCurve([{"rows": 16, "seconds": 0.001}, {"rows": 64, "seconds": 0.002}], "cpu x", "h.json", taken)
    (tmp_path / "h.json").write_text(json.dumps(curve.as_data()))
    back = HostCurve.load(tmp_path / "h.json")
    assert back.taken == taken
    assert back.describe() == f"{tmp_path / 'h.json'}, measured 2026-01-02T03:04:05+00:00 on cpu x at load 1.50"
    bare = HostCurve([{"rows": 16, "seconds": 0.001}, {"rows": 64, "seconds": 0.002}])
    assert "when unknown" in bare.describe() and "taken" not in bare.as_data()


def test_a_linear_fit_recovers_the_coefficients_it_was_drawn_from():
    fit = fit_linear(GRID)  # t = 4 ms + 10 us per row + 20 us per token carried
    assert fit["base_s"] == pytest.approx(0.004) and fit["per_row_s"] == pytest.approx(1e-5)
    assert fit["per_token_s"] == pytest.approx(2e-5) and fit["rel_rms"] == pytest.approx(0.0, abs=1e-9)
    noisy = [dict(p, seconds=p["seconds"] * (1.05 if i % 2 else 0.95)) for i, p in enumerate(GRID)]
    assert 0.02 < fit_linear(noisy)["rel_rms"] < 0.06
