"""A step price as the draft budget's linear model (`budget.DraftBudget.allocate`): a step of `rows` rows costs base +
per_row x rows + per_token x draft tokens. One algorithm for every step price (a measured `curves.StepCurve`, a
`kernels.KernelStepModel`): a one-token step's time at rows x scale, and the least-squares slope of the step's time
over the tokens per row the price names, per row.

Core module: numpy only; reads a price through its `time`, `host` and `eager`, imports none.
"""

from __future__ import annotations

import numpy as np


def eager_step(price, seconds):
    """`seconds` of forwards on `price` as an engine without CUDA graphs runs them where the price says it is one
    (`price.eager`, an `eager.EagerLaunches`), else as they are."""
    eager = getattr(price, "eager", None)
    return seconds if eager is None else eager.step(seconds)


def token_slope(price, rows, tokens_per_row, context=None, least_rows: float = 1.0):
    """Seconds per carried token more at `rows` rows (scalars or arrays): the least-squares slope of `price.time`
    over `tokens_per_row` [Q], per row. Fewer rows than `least_rows` are priced as that many (a price that prices
    fewer rows as its first measured row has its slope per that many rows' tokens)."""
    rows = np.asarray(rows, np.float64)
    flat = np.maximum(np.atleast_1d(rows).ravel(), least_rows)
    tokens = np.asarray(tokens_per_row, np.float64)
    times = price.time(np.repeat(flat, len(tokens)), np.tile(tokens, len(flat)), context).reshape(len(flat), -1)
    times = eager_step(price, times)
    centred = tokens - tokens.mean()
    slopes = np.maximum((times * centred).sum(axis=1) / (centred**2).sum(), 0.0) / flat
    return float(slopes[0]) if rows.ndim == 0 else slopes.reshape(rows.shape)


def budget_cost(price, rows: int, scale: int, context, tokens_per_row, least_rows: float = 1.0) -> np.ndarray:
    """[3] (base, per_row, per_token) that price a step of `rows` rows at `context` cached tokens a row as `price`
    does at rows x `scale`, each row and draft slot standing for `scale` of the GPU's: the one-token step and the
    host's time (`price.host`, where there is one) in the base, the token slope (`token_slope` over
    `tokens_per_row`) x scale a draft token, an engine without CUDA graphs' launches in both (`eager_step`). A price
    that needs the context refuses None, as its `time` does."""
    big = float(rows * scale)
    one = float(eager_step(price, price.time(max(big, least_rows), 1.0, context)))
    per_token = token_slope(price, big, tokens_per_row, context, least_rows) * scale
    host = price.host.time(big) if price.host is not None else 0.0  # a fixed cost of the step
    return np.array([one + host - per_token * rows, 0.0, per_token])
