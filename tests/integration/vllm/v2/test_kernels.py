"""The V2 drafting kernels (`vllm.v2.kernels`) on CPU tensors: the device hash is the host's, a chain is the likeliest
path the candidates vote for, a match counts the agreeing tokens back, and a slot's bucket is the core's."""

import numpy as np
import torch

from specrl_openrlhf.budget import ANCHORED, REENTERED, SHARED, features
from specrl_openrlhf.integration.vllm.hashing import token_hash
from specrl_openrlhf.integration.vllm.v2 import kernels
from specrl_openrlhf.integration.vllm.v2.kernels import NONE


def test_the_device_hash_is_the_hosts():
    rng = np.random.default_rng(0)
    windows = rng.integers(0, 150_000, (5, 7))
    device = kernels.fold_hash(torch.as_tensor(windows, dtype=torch.int32))
    assert device.tolist() == [token_hash(w) for w in windows]


def test_the_chain_is_the_path_most_candidates_take_and_stops_where_none_goes_on():
    cont = torch.tensor([[[5, 6, 7], [5, 6, 8], [5, 9, NONE], [4, NONE, NONE]]])  # [1 row, 4 candidates, k 3]
    alive = torch.tensor([[True, True, True, False]])
    chain, support, length = kernels.vote_chain(cont, alive)
    assert chain.tolist() == [[5, 6, 7]] and length.tolist() == [3]  # 6 by 2 of 3, then a tie: the first candidate
    assert np.allclose(support.tolist(), [[1.0, 2 / 3, 0.5]])
    chain, _, length = kernels.vote_chain(cont, torch.tensor([[False, False, True, False]]))
    assert chain.tolist() == [[5, 9, NONE]] and length.tolist() == [2]
    _, _, length = kernels.vote_chain(cont, torch.zeros(1, 4, dtype=torch.bool))
    assert length.tolist() == [0]


def test_a_match_counts_the_agreeing_tokens_back_from_the_candidates_position():
    tokens = torch.full((1, 2, 8), NONE, dtype=torch.int32)
    tokens[0, 1, :6] = torch.tensor([3, 4, 5, 6, 7, 8])
    tail = torch.tensor([[6, 5, 9, 3]])  # the row's last tokens, newest first
    q = torch.tensor([[4, 3]])
    found = kernels.match_lengths(tokens, torch.tensor([[0, 0]]), torch.tensor([[1, 1]]), q, tail)
    assert found.tolist() == [[2, 0]]  # before position 4: 6, 5 agree, then 4 is not 9; before 3: 5 is not 6
    none = kernels.match_lengths(tokens, torch.tensor([[-1, 0]]), torch.tensor([[1, 1]]), q, tail)
    assert none[0, 0] == 0


def test_a_slots_bucket_is_the_cores():
    kind = torch.tensor([ANCHORED, REENTERED, SHARED])
    support = torch.tensor([[1.0, 0.6, 0.2], [0.3, 1.0, 0.8], [0.5, 0.5, 0.1]])
    match = torch.tensor([40, 9, 17])
    found = kernels.buckets(kind, support, match, kernels.bucket_edges("cpu"))
    for b in range(3):
        for j in range(3):
            expected = features(int(kind[b]), j, float(support[b, j]), int(match[b]))
            assert int(found[b, j]) == int(expected), (b, j)


def test_indexed_positions_keep_the_newest_entry_of_each_column_group():
    tokens = torch.full((2, 3, 8), NONE, dtype=torch.int32)
    tokens[0, 1, :4] = torch.tensor([1, 2, 3, 4])  # column id 1: way 1 of 2
    tokens[1, 1, :4] = torch.tensor([1, 2, 3, 9])  # column id 4: way 0
    tokens[1, 2, :4] = torch.tensor([1, 2, 3, 7])  # column id 5: way 1, older than column 1
    seq = torch.tensor([[0, 5, 0], [0, 7, 2]])
    table = torch.full((16, 2), NONE, dtype=torch.int64)
    slot, column, q = torch.tensor([0, 1, 1, 0]), torch.tensor([1, 1, 2, 1]), torch.tensor([3, 3, 3, 1])
    kernels.index_positions(table, tokens, seq, slot, column, q, torch.ones(4, dtype=torch.bool), 3, 4, 4)
    h = kernels.fold_hash(torch.tensor([[1, 2, 3]]))
    entries = table[kernels.bucket_of(h, 16)][0]
    found = {(int(e) >> 4) & 15 for e in entries if e >= 0}  # the columns indexed under the gram [1, 2, 3]
    assert found == {1, 4}  # one a way, the newer of a way; q = 1 had no gram (min_match 3)
