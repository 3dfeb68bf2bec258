"""The at-scale map as a picture (`bench_at_scale.py --map` draws it): a heatmap of each rule's projected speedup over
stock, one column a (corpus, model, GPU) cell, one panel a regime and host reading: the regime's host time paid
(`projected`) and the host hidden (`projected_async`); the map's table adds the reading with no host at all. Green
wins against stock, red loses; each square carries its figure.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

DEFAULT_IMAGE = Path("docs/img/at_scale_map.png")
READINGS = ("host measured (projected)", "host hidden (projected_async)", "no host (projected_no_host)")
DRAWN = (0, 1)  # the readings the picture draws (the table has all three)


def speedup_grid(speedups: dict[tuple, dict[str, tuple]]) -> tuple[list[str], list[tuple], np.ndarray]:
    """(the rules, stock left out; the cells; [readings, rules, cells] float64, NaN where a cell has no such rule).

    >>> rules, cells, grid = speedup_grid({("short", "m", "g"): {"off": (1.0, 1.0, 1.0), "exact": (1.2, 1.3, 1.4)}})
    >>> rules, cells, grid[:, 0, 0].tolist()
    (['exact'], [('short', 'm', 'g')], [1.2, 1.3, 1.4])
    """
    cells = list(speedups)
    rules = list(dict.fromkeys(r for cell in speedups.values() for r in cell if r != "off"))
    grid = np.full((len(READINGS), len(rules), len(cells)), math.nan)
    for j, cell in enumerate(cells):
        for i, rule in enumerate(rules):
            if rule in speedups[cell]:
                grid[:, i, j] = speedups[cell][rule]
    return rules, cells, grid


def draw_map(speedups: dict[tuple, dict[str, tuple]], path=DEFAULT_IMAGE) -> list[str]:
    """Draws the map to `path` (PNG; its folder made if missing): `speedups` by (corpus, regime, model, GPU), a panel
    for each regime and drawn reading; returns the panels' titles."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    rules, cells, grid = speedup_grid(speedups)
    if not rules:
        raise ValueError("the map has no rule besides stock to draw: --rules names off and at least one more")
    regimes = list(dict.fromkeys(cell[1] for cell in cells))
    columns = list(dict.fromkeys((c[0], *c[2:]) for c in cells))  # (corpus, model, GPU)
    finite = grid[np.isfinite(grid)]
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (1.0, 1.0)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(low, 0.99), vmax=max(high, 1.01))  # 1: ties stock, the colours' middle
    panels = [(regime, reading) for regime in regimes for reading in DRAWN]
    height = len(panels) * (0.38 * len(rules) + 1.2)
    figure = Figure(figsize=(max(8.0, 0.62 * len(columns) + 2.5), height), layout="constrained")
    axes = np.atleast_1d(figure.subplots(len(panels), 1, sharex=True))
    for ax, (regime, reading) in zip(axes, panels):
        values = np.full((len(rules), len(columns)), math.nan)
        for j, cell in enumerate(cells):
            if cell[1] == regime:
                values[:, columns.index((cell[0], *cell[2:]))] = grid[reading, :, j]
        image = ax.imshow(np.ma.masked_invalid(values), cmap="RdYlGn", norm=norm, aspect="auto")
        for (i, j), value in np.ndenumerate(values):
            ax.text(j, i, "-" if math.isnan(value) else f"{value:.2f}", ha="center", va="center", fontsize=6)
        ax.set_title(f"regime {regime}: speedup over stock, {READINGS[reading]}", fontsize=9)
        ax.set_yticks(range(len(rules)), rules, fontsize=7)
        ax.set_xticks(range(len(columns)), ["\n".join(c) for c in columns], fontsize=6)
    figure.colorbar(image, ax=list(axes), label="× stock", shrink=0.6)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return [ax.get_title() for ax in axes]
