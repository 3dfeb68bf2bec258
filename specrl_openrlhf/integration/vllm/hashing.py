"""The one definition of a token sequence's hash, shared by both engines' proposers and the rollout: a polynomial in
`HASH_MULTIPLIER` modulo 2^63, folded a token at a time (h -> h x M + token + 1). It identifies a response (a finished
one registered again is skipped) and, over a row's last tokens, a *gram* (where else they occur).

Three forms compute the same value, each where it runs: `sequence_hash` (plain Python over a slice, which the V1
proposer compiles with numba and extends a token at a time), `token_hash` (numpy, a whole sequence at once, on the
host) and the V2 speculator's torch kernels (`v2.kernels`, on the device: int64 arithmetic wraps modulo 2^64, and the
mask takes it modulo 2^63). Pure Python and numpy: the V2 kernels import this module without vLLM.
"""

from __future__ import annotations

import numpy as np

HASH_MULTIPLIER = 0x1E3779B97F4A7C15  # odd, below 2^63 (a positive int64)
MASK = 0x7FFFFFFFFFFFFFFF  # the hash is kept modulo 2^63: a non-negative int64


def sequence_hash(h, tokens, start, stop):
    """`h` extended by tokens[start:stop] (start from 0 for a sequence's own hash)."""
    for i in range(start, stop):
        h = (h * HASH_MULTIPLIER + int(tokens[i]) + 1) & MASK
    return h


def token_hash(tokens) -> int:
    """`sequence_hash(0, tokens, 0, len(tokens))` of a whole sequence, vectorised: the sum of (token + 1) x M^(n-1-i),
    in uint64 arithmetic (which wraps modulo 2^64), then modulo 2^63."""
    values = np.asarray(tokens, np.int64).astype(np.uint64) + np.uint64(1)
    n = len(values)
    if n == 0:
        return 0
    powers = np.full(n, HASH_MULTIPLIER, np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        powers = np.cumprod(powers, dtype=np.uint64)[::-1]  # M^(n-1) ... M^0
        total = np.sum(values * powers, dtype=np.uint64)
    return int(total) & MASK
