"""Interpolation on measured points (`pricing.interpolation`): exact on its points, linear between, the first value
below the first point and the last slope past the end."""

import doctest

import numpy as np

from specrl_openrlhf.pricing import interpolation


def test_doctests():
    result = doctest.testmod(interpolation)
    assert result.attempted >= 1 and result.failed == 0


def test_a_line_and_a_plane_are_exact_on_their_points_and_linear_between():
    xs, ys = np.array([1.0, 2.0, 4.0]), np.array([0.0, 10.0])
    values = 3.0 * xs  # [X]
    table = xs[:, None] + ys[None, :] / 10  # [X, Y]: x + y / 10
    np.testing.assert_allclose(interpolation.line(xs, values, np.array([1.0, 3.0, 6.0, 0.5])), [3.0, 9.0, 18.0, 3.0])
    x, y = np.array([1.0, 3.0, 8.0, 0.0]), np.array([0.0, 5.0, 20.0, -4.0])
    np.testing.assert_allclose(interpolation.plane(xs, ys, table, x, y), [1.0, 3.5, 10.0, 1.0])
