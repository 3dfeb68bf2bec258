"""A prompt's history (`specrl_openrlhf.history`): the trie of its responses, and the cursors samples keep in it."""

import doctest

import numpy as np
import pytest

from specrl_openrlhf import history as history_module
from specrl_openrlhf.history import ROOT, History
from tests.helpers import draft, history_of


def test_doctests():
    assert doctest.testmod(history_module).failed == 0


def test_shared_prefixes_are_one_path_and_each_leaf_one_branch():
    history = History.of_drafts(
        [draft([1, 2, 3]), draft([1, 2], finish="length"), draft([1, 2, 4, 0]), draft([1, 2, 3]), draft([7])]
    )
    nodes = history.arrays
    assert history.num_nodes == 1 + 3 + 2 + 1  # 1 2 3 | 4 0 | 7
    assert history.token_of(history.children(ROOT)).tolist() == [1, 7]
    assert history.token_of(history.children(history.paths[0][1])).tolist() == [3, 4]  # in the order they came
    assert np.array_equal(history.paths[3], history.paths[0]) and np.array_equal(
        history.paths[1], history.paths[0][:2]
    )
    assert history.branches == [0, 2, 4]  # [1, 2] ends inside another branch: it is no branch of its own
    assert nodes.stop[history.paths[0][-1]] and not nodes.stop[history.paths[1][-1]]
    assert nodes.depth[history.paths[2]].tolist() == [1, 2, 3, 4]
    assert nodes.source[history.paths[2]].tolist() == [0, 0, 2, 2]
    assert nodes.count[history.paths[0]].tolist() == [4, 4, 2] and nodes.count[ROOT] == 5
    assert len(history) == 5 and history.max_depth == 4


def test_a_node_keeps_the_likeliest_p_prev_of_its_responses():
    history = history_of([5, 6], [5, 7], logprobs=[[-1.0, -0.5], [-0.2, -0.3]])
    assert history.arrays.logprob[history.paths[0]].tolist() == [-0.2, -0.5]


def test_cursors_follow_the_sample_inside_the_tree_and_leave_it():
    history = history_of([1, 2, 3, 9], [1, 4, 5, 9])
    here = history.advance([ROOT], [1])
    assert history.token_of(history.children(here[0])).tolist() == [2, 4]
    assert history.advance(here, [4, 5]) == history.advance([ROOT], [1, 4, 5]) == [history.paths[1][2]]
    assert history.advance([ROOT], [1, 7]) == [] and history.advance(here, [7, 2]) == []  # left the tree
    assert History().advance([ROOT], []) == [ROOT] and History().advance([ROOT], [5]) == []


def test_finished_siblings_join_the_history():
    history = history_of([1, 2, 3])
    assert history.advance([ROOT], [7, 8]) == []
    history.add([7, 8, 9, 2])  # a sibling of the visit finished
    assert history.token_of(history.children(history.advance([ROOT], [7, 8])[0])).tolist() == [9]


def test_a_path_becomes_a_draft_with_its_sources_columns():
    older = draft([5, 6, 9], [-0.1, -0.2, -0.3]).numbered(3, 0)
    newer = draft([5, 6], [-1.0, -2.0]).numbered(4, 1)
    history = History.of_drafts([newer, older])
    path = history.draft_along(history.paths[1])
    assert path.token_ids.tolist() == [5, 6, 9] and path.finish_reason == "stop"
    assert path.logprobs.tolist() == pytest.approx([-1.0, -2.0, -0.3])  # 5 and 6 from the first response through them
    assert path.ages.tolist() == [0, 0, 1] and (path.visit, path.index) == (4, 1)  # 9 is a visit older


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="3 tokens came with 2 log-probs"):
        History().add([1, 2, 3], [0.0, 0.0])
    with pytest.raises(ValueError, match="min_accept_prob"):
        history_module.logprob_floor(1.0)
