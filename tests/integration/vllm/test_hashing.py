"""The token hash both engines share (`vllm.hashing`): its three forms agree, and it is kept modulo 2^63."""

import numpy as np

from specrl_openrlhf.integration.vllm.hashing import MASK, sequence_hash, token_hash


def test_the_vectorised_hash_is_the_one_folded_a_token_at_a_time():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 17, 300):
        tokens = rng.integers(0, 200_000, n)
        assert token_hash(tokens) == sequence_hash(0, tokens, 0, n) <= MASK
    tokens = rng.integers(0, 200_000, 40)
    assert sequence_hash(sequence_hash(0, tokens, 0, 25), tokens, 25, 40) == token_hash(tokens)  # extended in parts
    assert token_hash([1, 2]) != token_hash([2, 1])
