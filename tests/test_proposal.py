"""Proposals over a prompt's history (`specrl_openrlhf.proposal`): the majority path and the request path's exact
walk through the tree. Exactness under a learner that trains on the drafts is tested in
tests/policies/test_lossless.py."""

import doctest

import numpy as np
import pytest

from specrl_openrlhf import proposal
from specrl_openrlhf.history import ROOT, History
from specrl_openrlhf.proposal import majority_path, walk
from tests.helpers import draft


def test_doctests():
    assert doctest.testmod(proposal).failed == 0


# ---- the majority path --------------------------------------------------------------------------------------------


def test_the_majority_path_follows_most_responses_while_most_go_on():
    history = History.of_drafts([draft(r) for r in ([1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 4, 6])])
    nodes = majority_path(history)
    assert history.token_of(nodes).tolist() == [1, 2, 4]
    assert history.draft_along(nodes).finish_reason == "stop"  # a response ended there by a stop
    assert len(majority_path(History.of_drafts([draft([1]), draft([2]), draft([3])]))) == 1  # ties: the first
    assert len(majority_path(History())) == 0


# ---- the exact walk through the tree ------------------------------------------------------------------------------


def scored(responses, logprob=-0.1):
    history = History.of_drafts([draft(t, finish=f) for t, f in responses])
    p_curr = np.full(history.num_nodes, logprob, np.float32)
    p_curr[ROOT] = np.nan
    return history, p_curr


def own_cut(tokens_logprobs, uniforms) -> int:
    """What `lossless` keeps of the own draft alone: up to the first u_i > p_curr(y_i)."""
    rejected = np.flatnonzero(uniforms[: len(tokens_logprobs)] > np.exp(tokens_logprobs))
    return int(rejected[0]) if len(rejected) else len(tokens_logprobs)


def test_a_walk_keeps_at_least_what_its_own_draft_keeps_for_the_same_uniforms():
    rng = np.random.default_rng(0)
    switched = 0
    for _ in range(300):
        responses = [rng.integers(1, 4, rng.integers(1, 9)).tolist() for _ in range(rng.integers(1, 6))]
        history = History.of_drafts([draft(r, finish="length") for r in responses])
        p_curr = np.log(rng.uniform(0.05, 0.6, history.num_nodes)).astype(np.float32)
        own = int(rng.integers(len(responses)))
        uniforms = rng.random(history.max_depth + 1)
        route = walk(history, p_curr, uniforms, own, max_depth=64)
        alone = own_cut(p_curr[history.paths[own]], uniforms)
        assert len(route.nodes) >= alone
        assert np.array_equal(route.nodes[:alone], history.paths[own][:alone])
        switched += route.switches > 0
        # the kept path is a path of the tree: each node the child of the one before
        parents = history.arrays.parent[route.nodes]
        assert np.array_equal(parents, np.concatenate([[ROOT], route.nodes])[:-1])
    assert switched > 30  # the tree keeps more than the own draft often enough to matter


def test_leaving_the_tree_excludes_every_child_of_the_node_with_their_mass():
    history, p_curr = scored([([1, 2], "length"), ([3, 2], "length"), ([4], "length")])
    p_curr[history.children(ROOT)] = np.log([0.2, 0.3, 0.1])
    route = walk(history, p_curr, np.array([0.9, 0.0, 0.0]), own=0, max_depth=10)
    assert len(route.nodes) == 0 and route.rejected
    assert route.excluded == (1, 3, 4) and route.excluded_mass == pytest.approx(0.6)
    # u in (0.2, 0.5]: the interval of the second child, after the own branch's
    route = walk(history, p_curr, np.array([0.45, 0.0, 0.0]), own=0, max_depth=10)
    assert history.token_of(route.nodes).tolist() == [3, 2] and route.switches == 1 and route.branch == 1
    assert route.excluded == () and not route.rejected  # a leaf without a stop: the continuation goes on freely


def test_unscored_children_are_left_out_of_the_proposal():
    history, p_curr = scored([([1, 2], "length"), ([3, 2], "length")])
    p_curr[history.paths[0][0]] = np.nan  # the own branch's first token: its scoring failed
    route = walk(history, p_curr, np.array([0.01, 0.0, 0.0]), own=0, max_depth=10)
    assert history.token_of(route.nodes).tolist() == [3, 2]  # u <= p(3): the known child
    route = walk(history, p_curr, np.array([0.99, 0.0, 0.0]), own=0, max_depth=10)
    assert route.excluded == (3,) and len(route.nodes) == 0  # 1 may come out of the continuation: exact


def test_a_walk_ends_at_a_stop_or_the_budget():
    history, p_curr = scored([([1, 2, 0], "stop"), ([1, 5, 6, 7], "length")], logprob=0.0)
    route = walk(history, p_curr, np.zeros(5), own=0, max_depth=10)
    assert route.complete and history.token_of(route.nodes).tolist() == [1, 2, 0] and route.excluded == ()
    route = walk(history, p_curr, np.zeros(5), own=1, max_depth=2)
    assert not route.complete and history.token_of(route.nodes).tolist() == [1, 5]


def test_a_walk_follows_p_curr_at_a_node():
    """At one node: children with p = 0.5, 0.3 and the rest 0.2 outside the tree; 20k walks."""
    history, p_curr = scored([([1], "length"), ([2], "length")])
    p_curr[history.children(ROOT)] = np.log([0.5, 0.3])
    rng = np.random.default_rng(1)
    outcomes = [walk(history, p_curr, rng.random(2), own=1, max_depth=4) for _ in range(20_000)]
    kept = np.array([history.token_of(o.nodes[:1])[0] if len(o.nodes) else 0 for o in outcomes])
    assert abs((kept == 1).mean() - 0.5) < 0.015 and abs((kept == 2).mean() - 0.3) < 0.015
    assert all(o.excluded == (1, 2) for o in outcomes if not len(o.nodes))
