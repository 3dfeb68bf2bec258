"""Where a draft's randomness comes from: the one place acceptance uniforms are seeded.

The rollout, replay and the trace records all draw a draft's uniforms from the same tuple (`entropy_of`), so runs are
reproducible, every visit draws fresh numbers, and a cut never depends on how requests were batched or routed.

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np

NO_OWN_DRAFT = 1 << 32  # the length field of a tree sample's entropy when it has no previous response of its own


def prompt_number(key: bytes) -> int:
    """A prompt key (`cache.prompt_key`) as the integer its randomness and its trace records name it by."""
    return int.from_bytes(key[:8] or b"\0", "little")


def entropy_of(seed: int, key: bytes | int, visit: int, index: int, length: int) -> tuple[int, ...]:
    """What a draft's uniforms are drawn from: the run's seed, the prompt, and the draft's visit, index and length, so
    that runs are reproducible while every visit draws fresh randomness. Traces record it (`trace.ENTROPY_WIDTH`)."""
    prompt = prompt_number(key) if isinstance(key, bytes) else int(key)
    return int(seed), prompt, int(visit), int(index), int(length)


def uniforms_for(entropy, length: int) -> np.ndarray:
    """[length] float64, the acceptance uniforms drawn from `entropy` (`entropy_of`)."""
    return np.random.default_rng([int(e) for e in entropy]).random(length)
