"""Interpolation on measured points, the one way every step price reads its tables: linear between points, the last
interval's slope past the end.

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np


def interval(points: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The interval of rising `points` each x falls in (the first or last one past the ends) and x's weight towards its
    upper end.

    >>> index, weight = interval(np.array([1.0, 2.0, 4.0]), np.array([1.5, 3.0, 8.0]))
    >>> index.tolist(), weight.tolist()
    ([0, 1, 1], [0.5, 0.5, 3.0])
    """
    below = np.searchsorted(points, x, side="right") - 1
    index = np.minimum(np.maximum(below, 0), len(points) - 2)  # np.clip costs more at one row
    return index, (x - points[index]) / (points[index + 1] - points[index])


def line(points: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`values` [G] at `points` [G], at x: the first point's value below the first point."""
    i, w = interval(points, np.maximum(x, points[0]))
    return (1 - w) * values[i] + w * values[i + 1]


def plane(xs: np.ndarray, ys: np.ndarray, table: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`table` [X, Y] at `xs` x `ys`, at (x, y), bilinear: each axis's first point's value below its first point."""
    i, u = interval(xs, np.maximum(x, xs[0]))
    j, v = interval(ys, np.maximum(y, ys[0]))
    return (1 - u) * ((1 - v) * table[i, j] + v * table[i, j + 1]) + u * (
        (1 - v) * table[i + 1, j] + v * table[i + 1, j + 1]
    )
