"""Lenience values: the paper's default and their validation (no torch: the config checks flags with it).

Core module: standard library only.
"""

from __future__ import annotations

import math

DEFAULT_LENIENCE = math.exp(0.5)  # the paper's GRPO default


def check_lenience(owner: str, value) -> None:
    """Validate a lenience value, naming the owner, the value and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{owner}: lenience must be a number, got {value!r} ({type(value).__name__}); "
            f"pass a positive float such as --lenience 1.6487 (e^0.5)"
        )
    if math.isnan(value) or value <= 0:
        raise ValueError(
            f"{owner}: lenience must be > 0, got {value!r}; use 1.0 for exact speculative acceptance, "
            f"e^0.5 = 1.6487 for the paper's GRPO default, or the policy 'full' for unlimited reuse"
        )
