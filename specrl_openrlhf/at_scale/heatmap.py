"""The at-scale map as a picture (`bench_at_scale.py --map` draws it): a heatmap of each rule's projected speedup over
stock, one column a (corpus, model, GPU) cell, in two panels: this machine's host time paid (`projected`) and the host
hidden (`projected_async`). Green wins against stock, red loses; each square carries its figure.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

DEFAULT_IMAGE = Path("docs/img/at_scale_map.png")
PANELS = ("host measured (projected)", "host hidden (projected_async)", "no host (projected_no_host)")


def speedup_grid(speedups: dict[tuple, dict[str, tuple[float, float]]]) -> tuple[list[str], list[tuple], np.ndarray]:
    """(the rules, stock left out; the cells; [2, rules, cells] float64, NaN where a cell has no such rule).

    >>> rules, cells, grid = speedup_grid({("short", "m", "g"): {"off": (1.0, 1.0, 1.0), "exact": (1.2, 1.3, 1.4)}})
    >>> rules, cells, grid[:, 0, 0].tolist()
    (['exact'], [('short', 'm', 'g')], [1.2, 1.3, 1.4])
    """
    cells = list(speedups)
    rules = list(dict.fromkeys(r for cell in speedups.values() for r in cell if r != "off"))
    grid = np.full((len(PANELS), len(rules), len(cells)), math.nan)
    for j, cell in enumerate(cells):
        for i, rule in enumerate(rules):
            if rule in speedups[cell]:
                grid[:, i, j] = speedups[cell][rule]
    return rules, cells, grid


def draw_map(speedups: dict[tuple, dict[str, tuple[float, float]]], path=DEFAULT_IMAGE) -> list[str]:
    """Draws the map to `path` (PNG; its folder made if missing); returns the panels' titles."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    rules, cells, grid = speedup_grid(speedups)
    if not rules:
        raise ValueError("the map has no rule besides stock to draw: --rules names off and at least one more")
    finite = grid[np.isfinite(grid)]
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (1.0, 1.0)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(low, 0.99), vmax=max(high, 1.01))  # 1: ties stock, the colours' middle
    figure = Figure(figsize=(max(8.0, 0.85 * len(cells) + 2.5), 2 * (0.45 * len(rules) + 1.6)), layout="constrained")
    axes = figure.subplots(len(PANELS), 1, sharex=True)
    for panel, (ax, title) in enumerate(zip(axes, PANELS)):
        image = ax.imshow(np.ma.masked_invalid(grid[panel]), cmap="RdYlGn", norm=norm, aspect="auto")
        for (i, j), value in np.ndenumerate(grid[panel]):
            ax.text(j, i, "-" if math.isnan(value) else f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set_title(f"speedup over stock, {title}", fontsize=10)
        ax.set_yticks(range(len(rules)), rules, fontsize=8)
        ax.set_xticks(range(len(cells)), ["\n".join(c) for c in cells], fontsize=7)
    figure.colorbar(image, ax=list(axes), label="× stock", shrink=0.8)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return [ax.get_title() for ax in axes]
