"""The prefix tree of a prompt's previous responses and the walk through it (`specrl_openrlhf.tree`), and how the
planner scores a tree once per visit. Exactness under a learner that trains on the drafts is tested in
tests/policies/test_lossless.py."""

import doctest

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf import tree as tree_module
from specrl_openrlhf.scoring import MAX_POINT_PROBES, ScoringAnswer
from specrl_openrlhf.tree import ROOT, DraftTree, walk

from .helpers import draft


def test_docstrings():
    assert doctest.testmod(tree_module).failed == 0


def scored_tree(responses, logprob=-0.1) -> DraftTree:
    tree = DraftTree([draft(t, finish=f) for t, f in responses])
    tree.logprobs[1:] = logprob
    return tree


def test_shared_prefixes_are_one_path_and_each_leaf_one_branch():
    tree = DraftTree(
        [draft([1, 2, 3]), draft([1, 2], finish="length"), draft([1, 2, 4, 0]), draft([1, 2, 3]), draft([7])]
    )
    assert tree.num_nodes == 1 + 3 + 2 + 1  # 1 2 3 | 4 0 | 7
    assert tree.token[tree.children(ROOT)].tolist() == [1, 7]
    assert tree.token[tree.children(tree.paths[0][1])].tolist() == [3, 4]  # in the order their responses came
    assert np.array_equal(tree.paths[3], tree.paths[0]) and np.array_equal(tree.paths[1], tree.paths[0][:2])
    assert tree.branches == [0, 2, 4]  # [1, 2] ends inside another branch: it is no branch of its own
    assert tree.stop[tree.paths[0][-1]] and not tree.stop[tree.paths[1][-1]]
    assert tree.depth[tree.paths[2]].tolist() == [1, 2, 3, 4] and tree.source[tree.paths[2]].tolist() == [0, 0, 2, 2]


def own_cut(tokens_logprobs, uniforms) -> int:
    """What `lossless` keeps of the own draft alone: up to the first u_i > p_curr(y_i)."""
    rejected = np.flatnonzero(uniforms[: len(tokens_logprobs)] > np.exp(tokens_logprobs))
    return int(rejected[0]) if len(rejected) else len(tokens_logprobs)


def test_a_walk_keeps_at_least_what_its_own_draft_keeps_for_the_same_uniforms():
    rng = np.random.default_rng(0)
    switched = 0
    for _ in range(300):
        responses = [rng.integers(1, 4, rng.integers(1, 9)).tolist() for _ in range(rng.integers(1, 6))]
        tree = DraftTree([draft(r, finish="length") for r in responses])
        tree.logprobs[1:] = np.log(rng.uniform(0.05, 0.6, tree.num_nodes - 1))
        own = int(rng.integers(len(responses)))
        uniforms = rng.random(tree.max_depth + 1)
        route = walk(tree, uniforms, own, max_depth=64)
        alone = own_cut(tree.logprobs[tree.paths[own]], uniforms)
        assert len(route.nodes) >= alone
        assert np.array_equal(route.nodes[:alone], tree.paths[own][:alone])
        switched += route.switches > 0
        # the kept path is a path of the tree: each node the child of the one before
        assert np.array_equal(tree.parent[route.nodes], np.concatenate([[ROOT], route.nodes])[:-1])
    assert switched > 30  # the tree keeps more than the own draft often enough to matter


def test_leaving_the_tree_excludes_every_child_of_the_node_with_their_mass():
    tree = scored_tree([([1, 2], "length"), ([3, 2], "length"), ([4], "length")])
    tree.logprobs[tree.children(ROOT)] = np.log([0.2, 0.3, 0.1])
    route = walk(tree, np.array([0.9, 0.0, 0.0]), own=0, max_depth=10)
    assert len(route.nodes) == 0 and route.rejected
    assert route.excluded == (1, 3, 4) and route.excluded_mass == pytest.approx(0.6)
    # u in (0.2, 0.5]: the interval of the second child, after the own branch's
    route = walk(tree, np.array([0.45, 0.0, 0.0]), own=0, max_depth=10)
    assert tree.token[route.nodes].tolist() == [3, 2] and route.switches == 1 and route.branch == 1
    assert route.excluded == () and not route.rejected  # a leaf without a stop: the continuation goes on freely


def test_unscored_children_are_left_out_of_the_proposal():
    tree = scored_tree([([1, 2], "length"), ([3, 2], "length")])
    tree.logprobs[tree.paths[0][0]] = np.nan  # the own branch's first token: its scoring failed
    route = walk(tree, np.array([0.01, 0.0, 0.0]), own=0, max_depth=10)
    assert tree.token[route.nodes].tolist() == [3, 2]  # u <= p(3): the known child
    route = walk(tree, np.array([0.99, 0.0, 0.0]), own=0, max_depth=10)
    assert route.excluded == (3,) and len(route.nodes) == 0  # 1 may come out of the continuation: exact


def test_a_walk_ends_at_a_stop_or_the_budget():
    tree = scored_tree([([1, 2, 0], "stop"), ([1, 5, 6, 7], "length")], logprob=0.0)
    route = walk(tree, np.zeros(5), own=0, max_depth=10)
    assert route.complete and tree.token[route.nodes].tolist() == [1, 2, 0] and route.excluded == ()
    route = walk(tree, np.zeros(5), own=1, max_depth=2)
    assert not route.complete and tree.token[route.nodes].tolist() == [1, 5]


def test_a_walk_follows_p_curr_at_a_node():
    """At one node: children with p = 0.5, 0.3 and the rest 0.2 outside the tree; 20k walks."""
    tree = scored_tree([([1], "length"), ([2], "length")])
    tree.logprobs[tree.children(ROOT)] = np.log([0.5, 0.3])
    rng = np.random.default_rng(1)
    outcomes = [walk(tree, rng.random(2), own=1, max_depth=4) for _ in range(20_000)]
    kept = np.array([tree.token[o.nodes[0]] if len(o.nodes) else 0 for o in outcomes])
    assert abs((kept == 1).mean() - 0.5) < 0.015 and abs((kept == 2).mean() - 0.3) < 0.015
    assert all(o.excluded == (1, 2) for o in outcomes if not len(o.nodes))


# ---- the planner: one tree per visit, scored once for all of its samples --------------------------------------------


def answer(table_logprob: float = -0.5):
    """A stand-in engine: every token has the same log-prob; positions the prefix cache served (`cached` prompt
    tokens) come back without one, as the integration edge parses vLLM's answer."""

    def score(request, cached: int = 0) -> ScoringAnswer:
        first = max(request.start, cached + 1 - (len(request.token_ids) - request.end))
        values = np.full(request.end - request.start, np.nan, np.float32)
        values[max(first - request.start, 0) :] = table_logprob
        return ScoringAnswer(values, {t: table_logprob for t in request.next_token_ids}, cached, first)

    return score


def tree_planner(**params):
    return sr.SpeculativePlanner(sr.make("lossless", draft="tree", **params), seed=3, stop_token_ids=[0])


def previous(responses, visit=4):
    return [draft(r, finish="stop" if r[-1] == 0 else "length").numbered(visit, i) for i, r in enumerate(responses)]


def test_a_visit_scores_each_branch_once_then_every_sample_walks():
    planner = tree_planner()
    claimed = previous([[5, 6, 7, 0], [5, 6, 8, 0], [5, 6, 7, 0], [9, 0]])
    samples = planner.visit_samples([1], 16, claimed, b"k" * 16, count=4)
    assert all(s.tree is samples[0].tree for s in samples) and [s.own for s in samples] == [0, 1, 2, 3]
    score, rounds = answer(), []
    for requests in planner.scorer.visit_rounds(samples):
        rounds.append(requests)
        for request in requests:
            planner.scorer.take_visit_scores(samples, request, score(request))
    assert len(rounds) == 1  # one round trip: the prompt probe and the branches together
    probe, *branches = rounds[0]
    assert probe.token_ids == [1] and set(probe.next_token_ids) == {5, 9}
    assert [r.token_ids for r in branches] == [[1, 5, 6, 7], [1, 5, 6, 8], [1, 9]]  # the last as the one that follows
    assert [r.next_token_ids for r in branches] == [(0,), (0,), (0,)] and all(r.read_cache for r in branches)
    tree = samples[0].tree
    assert samples[0].stats.scored_tokens == tree.num_nodes - 1 and samples[0].stats.scoring_requests == 4
    assert not any(s.stats.scored_tokens for s in samples[1:])
    planner.decide(samples)
    for sample in samples:
        assert sample.decided and sample.cut == len(sample.draft) and sample.draft_ended == (sample.excluded == ())
        assert sample.stats.tree_branches == 3 and sample.stats.tree_nodes == 8
        request = planner.next_request(sample)
        if sample.draft_ended:
            assert request is None
        else:
            assert request.excluded and request.token_ids[: 1 + sample.cut] == [1, *sample.draft.token_ids.tolist()]


def test_nodes_the_prefix_cache_served_are_probed_again():
    planner = tree_planner()
    samples = planner.visit_samples([1, 2], 16, previous([[5, 6, 7], [5, 6, 8], [5, 4]]), b"k" * 16, 3)
    score, rounds = answer(), planner.scorer.visit_rounds(samples)
    for requests in rounds:
        for request in requests:
            # the first branch request read the prompt and [5, 6] from the cache: no log-probs for 5 and 6
            cached = 4 if request.token_ids[2:] == [5, 6] else 0
            planner.scorer.take_visit_scores(samples, request, score(request, cached))
        if request.start == request.end and request.start > 0:  # the rescoring round: point probes
            assert len(requests) <= MAX_POINT_PROBES
    tree = samples[0].tree
    assert tree.scored and not len(tree.unknown())


def test_a_failed_answer_leaves_nodes_unknown_and_the_walk_stops_before_them():
    planner = tree_planner()
    samples = planner.visit_samples([1], 16, previous([[5, 6], [5, 8]]), b"k" * 16, 2)
    for _ in planner.scorer.visit_rounds(samples):
        pass  # every request failed: nothing taken
    tree = samples[0].tree
    assert tree.scored and len(tree.unknown()) == tree.num_nodes - 1
    planner.decide(samples)
    for sample in samples:  # no child known: no proposal, generation from the prompt
        assert sample.cut == 0 and sample.excluded == () and planner.next_request(sample).token_ids == [1]


def test_two_visits_of_history_join_one_tree():
    planner = tree_planner(history=2)
    assert planner.policy.visits_kept == 2
    claimed = previous([[5, 6], [5, 7]]) + previous([[5, 6, 9], [3]], visit=3)
    samples = planner.visit_samples([1], 16, claimed, b"k" * 16, count=2)
    tree = samples[0].tree
    assert len(tree.responses) == 4 and tree.branches == [1, 2, 3] and [s.own for s in samples] == [0, 1]
    tree.logprobs[1:] = 0.0  # every child certain: each walk keeps its own branch, then goes on along another
    tree.scored = True
    planner.decide(samples)
    first = samples[0]
    assert first.draft.token_ids.tolist() == [5, 6, 9] and first.stats.branch_switches == 1  # past its end
    assert first.ages_now.tolist() == [1, 1, 2]  # 9 was decoded a visit before 5 and 6: one visit older
    assert samples[1].draft.token_ids.tolist() == [5, 7] and samples[1].excluded == ()


def test_visit_samples_keep_own_drafts_and_their_uniforms():
    """A tree sample draws the uniforms its own draft would: with no other response, it cuts where the own draft
    does."""
    claimed = previous([[5, 6, 7, 8]])
    own = sr.SpeculativePlanner(sr.make("lossless", draft="own", verify="requests"), seed=3).visit_samples(
        [1], 16, claimed, b"k" * 16
    )
    tree = tree_planner().visit_samples([1], 16, claimed, b"k" * 16)
    assert np.array_equal(tree[0].uniforms[:4], own[0].uniforms)
    own[0].scored[:] = tree[0].tree.logprobs[1:] = np.log([0.9, 0.5, 0.5, 0.9])
    tree[0].tree.scored = True
    planner = tree_planner()
    planner.decide(tree)
    sr.SpeculativePlanner(sr.make("lossless", draft="own", verify="requests"), seed=3).decide(own)
    assert tree[0].cut == own[0].cut and tree[0].excluded == own[0].excluded
    assert tree[0].excluded_mass == pytest.approx(own[0].excluded_mass) or not own[0].excluded


def test_params_are_validated():
    with pytest.raises(ValueError, match="draft must be one of"):
        sr.make("lossless", draft="forest")
    with pytest.raises(ValueError, match="history must be 1 or 2"):
        sr.make("lossless", history=3)
    with pytest.raises(ValueError, match="history applies"):
        sr.make("lossless", draft="own", history=2, verify="requests")
    with pytest.raises(ValueError, match="add verify='requests'"):
        sr.make("lossless", draft="own")
    with pytest.raises(ValueError, match="verify must be one of"):
        sr.make("lossless", verify="gpu")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        sr.make("lossless", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="min_accept_prob"):
        sr.make("lossless", min_accept_prob=1.0)
    assert (
        sr.make("lossless").draft_choice == "tree"
        and sr.make("lossless", draft="own", verify="requests").visits_kept == 1
    )
