"""Interpolation on a measured grid, the one way every step price reads its tables: linear between grid points, the
last interval's slope past the end.

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np


def cell(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The grid interval of each x (the first or last one past the ends) and x's weight towards its upper end.

    >>> index, weight = cell(np.array([1.0, 2.0, 4.0]), np.array([1.5, 3.0, 8.0]))
    >>> index.tolist(), weight.tolist()
    ([0, 1, 1], [0.5, 0.5, 3.0])
    """
    index = np.minimum(np.maximum(np.searchsorted(grid, x, side="right") - 1, 0), len(grid) - 2)  # np.clip, cheaper
    return index, (x - grid[index]) / (grid[index + 1] - grid[index])


def line(grid: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`values` [G] on `grid` [G] at x: the first point's value below the grid."""
    i, w = cell(grid, np.maximum(x, grid[0]))
    return (1 - w) * values[i] + w * values[i + 1]


def plane(xs: np.ndarray, ys: np.ndarray, table: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`table` [X, Y] on `xs` x `ys` at (x, y), bilinear: each axis's first point below its grid."""
    i, u = cell(xs, np.maximum(x, xs[0]))
    j, v = cell(ys, np.maximum(y, ys[0]))
    return (1 - u) * ((1 - v) * table[i, j] + v * table[i, j + 1]) + u * (
        (1 - v) * table[i + 1, j] + v * table[i + 1, j + 1]
    )
