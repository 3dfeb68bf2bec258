"""A step price from its data, whichever kind it is: a measured step curve (`curves.StepCurve`) or a kernel step model
(`kernels.KernelStepModel`), and a price at a verification step's attention bound. It sits above both, which import
nothing from it.

Core module: numpy only.
"""

from __future__ import annotations

from pathlib import Path

from .curves import StepCurve, StepPrice, read_json
from .kernels import ATTENTION, KernelStepModel


def load_price(data, source: str = "") -> StepPrice:
    """A step price from its JSON data, or a file of it: a measured curve (`StepCurve`: a 'curve' of points) or a
    kernel step model (`KernelStepModel`: its 'dense' tables). Bad data is one ValueError naming `source`."""
    if isinstance(data, (str, Path)):
        source = source or str(data)
        data = read_json(data, "step curve", "scripts/bench_gpu_step.py writes one; KernelStepModel.build a model")
    if isinstance(data, dict) and "dense" in data:
        return KernelStepModel.from_data(data, source)
    return StepCurve.from_data(data, source)


def at_attention(price: StepPrice, attention: str) -> StepPrice:
    """`price` with a verification step's attention at `attention` ("once", the lower bound; "per_token", the upper
    bound; `kernels.ATTENTION`) where it models attention (a kernel step model); a measured curve measured the one its
    GPU ran, and is itself at either."""
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}: choose one of {', '.join(ATTENTION)}")
    return price.with_attention(attention) if isinstance(price, KernelStepModel) else price
