"""A rule against stock at the two scales every benchmark prints: rows x 1, as the CPU run's steps ran, and the RL
scale (rows x `RL_SCALE`, at most `RL_MAX_ROWS`), as a GPU engine at RL batch sizes would run them
(`projection.rl_pricing`). A figure at the RL scale carries the scale in its name: `projected8` beside `projected`.

Core module: numpy only, through `projection`.
"""

from __future__ import annotations

from .curves import HostCurve, StepPrice
from .projection import RL_SCALE, STOCK, Projection, RuleCost, project_steps, rl_pricing
from .steps import EngineSteps

RL_SCALES = (1, RL_SCALE)


def project_at_rl_scales(
    stock: EngineSteps, rule: EngineSteps, curve: StepPrice, host: HostCurve | None = None, cost: RuleCost = STOCK
) -> dict[int, Projection]:
    """`rule`'s steps against `stock`'s on `curve` (`projection.project_steps`), at each of `RL_SCALES`, by scale."""
    return {scale: project_steps(stock, rule, rl_pricing(curve, scale, host), cost) for scale in RL_SCALES}


def scaled_name(name: str, scale: int) -> str:
    """A figure's name at `scale`: `name` at rows x 1, `name8` at rows x 8."""
    return name if scale == 1 else f"{name}{scale}"


def scale_fields(projections: dict[int, Projection], names: tuple[str, ...]) -> dict[str, float]:
    """Each of `names` (a `Projection`'s figures) at each scale, named by `scaled_name`.

    >>> from types import SimpleNamespace
    >>> scale_fields({1: SimpleNamespace(projected=1.2), 8: SimpleNamespace(projected=1.05)}, ("projected",))
    {'projected': 1.2, 'projected8': 1.05}
    """
    return {scaled_name(name, scale): getattr(p, name) for scale, p in projections.items() for name in names}
