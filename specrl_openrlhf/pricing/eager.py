"""A vLLM engine step without CUDA graphs (`enforce_eager`, which 6 of the 8 OpenRLHF example commands set): the
forward's kernels launched one at a time by the host, priced on top of the kernels' own GPU time (`EagerLaunches`).

Terminology:
- *kernel time*: the GPU's time of a step's kernels, as measured inside CUDA graphs (`kernels.KernelStepModel`,
  aiconfigurator's timings: it has no eager mode);
- *launches*: the kernels a forward launches, `LAUNCHES_PER_LAYER` a decoder layer x layers + `FIXED_LAUNCHES`. A
  CUDA graph replays them all in one launch; eager, the host launches each, `LAUNCH_US` apiece, ahead of the GPU, so
  the host's launches and the GPU's kernels overlap and the step takes the longer of the two;
- *exposed*: what the eager forward's host work leaves the GPU waiting on all the same (the work between launches,
  the first launches before the GPU has any), `EXPOSED_US_PER_LAYER` a decoder layer, calibrated on vLLM's one
  measured V1 figure. A step of any size pays it: a verification step carries more tokens than a decoding step but
  launches the same kernels, so a rule that saves steps saves it too.

An eager step's forward: max(kernel time, launches x LAUNCH_US) + layers x EXPOSED_US_PER_LAYER (`step`). The
constants' sources (docs/design.md, "Pricing", has the figures they were checked against):
- LAUNCHES_PER_LAYER (12): counted in vLLM 0.34's `Qwen3DecoderLayer.forward` and `Qwen3Attention.forward`
  (`model_executor/models/qwen3.py`), one kernel each: the input and post-attention RMSNorms (fused with the residual
  add), the QKV GEMM, the q and k head norms, the rotary embedding, the KV-cache write and the attention kernel, the
  output GEMM, the gate-up GEMM, SiLU-and-mul, the down GEMM;
- FIXED_LAUNCHES (2): the embedding and the final norm (the logits and the sampler run outside the graph in either
  mode, so both pay them);
- LAUNCH_US (5 µs): vllm-omni PR #6516's measured time inside one kernel launch call (DeepSpeed PR #8271 measured
  1,300 launches in a 5.22 ms OPT-1.3B step on an H100, flat from batch 1 to 32: 4.0 µs each);
- EXPOSED_US_PER_LAYER (53.7 µs): vLLM PR #10058, Llama 3.1 8B (32 layers) at batch 8, 128 output tokens, on the V1
  engine: 1.26 s without CUDA graphs against 1.04 s with them, 1.72 ms a step, over 32 layers. At that step the
  kernels (about 6.8 ms on an H100) outlast the launches (2.2 ms), so the difference is all exposed.

Core module: numpy only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..params import check_fields, limits

LAUNCHES_PER_LAYER = 12  # vLLM 0.34's Qwen3 decoder layer, one kernel per op (the module's docstring)
FIXED_LAUNCHES = 2  # the embedding and the final norm
LAUNCH_US = 5.0  # vllm-omni PR #6516: about 5 µs inside each launch call
EXPOSED_US_PER_LAYER = (1.26 - 1.04) / 128 * 1e6 / 32  # vLLM PR #10058: 1.72 ms a step over Llama 3.1 8B's 32 layers
SOURCE = (
    "eager: max(kernels, launches x 5 µs) + 53.7 µs a layer exposed (launches counted in vLLM 0.34's qwen3.py, "
    "vllm-omni PR #6516's launch cost, vLLM PR #10058's eager step at 8B)"
)


@dataclass(frozen=True, kw_only=True)
class EagerLaunches:
    """What a forward without CUDA graphs adds to its kernels' time, for a model of `layers` decoder layers (see the
    module's terminology)."""

    layers: int = field(metadata=limits(at_least=1, means="the model's decoder layers"))
    launches_per_layer: int = field(default=LAUNCHES_PER_LAYER, metadata=limits(at_least=0))
    fixed_launches: int = field(default=FIXED_LAUNCHES, metadata=limits(at_least=0))
    launch_us: float = field(default=LAUNCH_US, metadata=limits(at_least=0))
    exposed_us_per_layer: float = field(default=EXPOSED_US_PER_LAYER, metadata=limits(at_least=0))
    source: str = SOURCE

    def __post_init__(self):
        check_fields(self, owner="eager launches")

    @property
    def launches(self) -> int:
        """Kernels a forward launches."""
        return self.launches_per_layer * self.layers + self.fixed_launches

    @property
    def launch_s(self) -> float:
        """Seconds the host takes to launch them: no eager step is shorter."""
        return self.launches * self.launch_us * 1e-6

    @property
    def exposed_s(self) -> float:
        """Seconds a step's GPU waits on the host besides."""
        return self.layers * self.exposed_us_per_layer * 1e-6

    def step(self, kernels_s):
        """Seconds of eager forwards whose kernels take `kernels_s` inside CUDA graphs (a scalar or an array of served
        steps): the longer of the kernels and the launches, plus what is exposed.

        >>> eager = EagerLaunches(layers=36)
        >>> round(eager.step(0.0068) * 1e3, 2), round(eager.step(0.001) * 1e3, 2)  # kernel-bound, launch-bound
        (8.73, 4.1)
        """
        out = np.maximum(np.asarray(kernels_s, np.float64), self.launch_s) + self.exposed_s
        return float(out) if out.ndim == 0 else out

    def describe(self) -> str:
        return (
            f"no CUDA graphs: {self.launches} launches at {self.launch_us:g} µs ({self.launch_s * 1e3:.2f} ms) "
            f"beside the kernels, {self.exposed_s * 1e3:.2f} ms exposed a step"
        )

    def as_data(self) -> dict:
        return asdict(self)

    @classmethod
    def from_data(cls, data, source: str = "") -> EagerLaunches:
        """From `as_data`'s JSON object; malformed data is one ValueError naming `source`."""
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source or 'eager launches'}: not an eager launch model ({error})") from None
