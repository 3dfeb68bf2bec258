"""The proposal component: what a sample proposes from its prompt's history at every step (`HistoryIndex`), and the
replay of one-hot verification on a recorded response (`verify_steps`)."""

import doctest
import math

import numpy as np
import pytest

from specrl_openrlhf import proposal
from specrl_openrlhf.proposal import HistoryIndex, verify_steps


def test_doctests():
    assert doctest.testmod(proposal).failed == 0


def index_of(*responses, min_match=2, min_accept_prob=0.0, logprobs=None):
    index = HistoryIndex(min_match, min_accept_prob)
    for i, response in enumerate(responses):
        index.add(response, None if logprobs is None else logprobs[i])
    return index


def test_without_history_nothing_is_proposed():
    index = HistoryIndex()
    assert len(index) == 0 and index.anchored([]) == [] and index.propose(index.anchored([5]), 4) == []
    assert index.reentry([1, 2, 3, 4, 5]) == []


def test_inside_the_tree_the_likeliest_child_leads_and_the_path_follows_it():
    index = index_of(
        [1, 2, 3, 9], [1, 4, 5, 9], [1, 4, 6, 9], logprobs=[[0, -2, 0, 0], [0, -0.5, -1, 0], [0, -0.5, -0.2, 0]]
    )
    here = index.anchored([1])
    assert index.propose(here, 8) == [4, 6, 9]  # 4 (p_prev e^-0.5) over 2 (e^-2); then 6 (e^-0.2) over 5
    assert index.propose(here, 1) == [4]  # at most k
    assert index.propose(index.anchored([1, 2]), 8) == [3, 9]
    assert index.anchored([1, 7]) == []  # left the tree


def test_a_draft_stops_where_the_history_says_it_is_unlikely_accepted():
    logprobs = [[0.0, math.log(0.5), math.log(0.5), math.log(0.5)]]
    assert index_of([1, 2, 3, 4], logprobs=logprobs).propose([1], 8) == [2, 3, 4]
    # cumulative 0.5, 0.25, 0.125: with a floor of 0.2 the third token is not proposed
    assert index_of([1, 2, 3, 4], min_accept_prob=0.2, logprobs=logprobs).propose([1], 8) == [2, 3]


def test_finished_siblings_join_the_history():
    index = index_of([1, 2, 3])
    assert index.anchored([7, 8]) == []
    index.add([7, 8, 9, 2])  # a sibling of the visit finished
    assert index.propose(index.anchored([7, 8]), 4) == [9, 2]


def test_a_reentry_takes_the_longest_suffix_match_of_at_least_min_match():
    index = index_of([5, 6, 7, 8, 1], [9, 6, 7, 3, 1], min_match=2)
    assert index.propose(index.reentry([0, 5, 6, 7]), 2) == [8, 1]  # [5, 6, 7] matches the first response only
    both = index.reentry([0, 4, 6, 7])  # only [6, 7] matches: both responses continue from there
    assert sorted(index.tokens[p] for p in both) == [3, 8]
    assert index.reentry([0, 4, 7]) == []  # [4, 7] is nowhere: no match of 2 tokens
    assert index_of([5, 6, 7], min_match=3).reentry([0, 6, 7]) == []  # two tokens are not enough for min_match 3


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_match"):
        HistoryIndex(0)
    with pytest.raises(ValueError, match="min_accept_prob"):
        HistoryIndex(4, 1.0)
    with pytest.raises(ValueError, match="3 tokens came with 2 log-probs"):
        HistoryIndex().add([1, 2, 3], [0.0, 0.0])


def test_verify_steps_counts_what_one_hot_verification_keeps():
    rng = np.random.default_rng(0)
    history = [rng.integers(2, 6, 12).tolist() for _ in range(4)]
    index = index_of(*history, min_match=2)
    assert verify_steps(index, history[0], k=64) == (11, 11, 0)  # a history response itself: every draft kept
    accepted, drafted, reentries = verify_steps(index, [history[1][0], 9, *history[2][3:]], k=4)
    assert accepted < drafted and reentries >= 0
    assert verify_steps(HistoryIndex(), [1, 2, 3], k=4) == (0, 0, 0)
