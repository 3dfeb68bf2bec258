"""Scoring on the request path (`specrl_openrlhf.request_path.scoring`) as the planner runs it for a visit's tree:
each branch scored once for all of the visit's samples, what the prefix cache served probed again, and failures left
unknown.
Chunks, forecasts and sibling recovery of own drafts are tested in tests/request_path/test_planner.py."""

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.request_path.scoring import MAX_POINT_PROBES
from specrl_openrlhf.request_path.scoring_messages import ScoringAnswer
from tests.helpers import draft


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
    for requests in planner.visit_rounds(samples):
        rounds.append(requests)
        for request in requests:
            planner.take_visit_answer(samples, request, score(request))
    assert len(rounds) == 1  # one round trip: the prompt probe and the branches together
    probe, *branches = rounds[0]
    assert probe.token_ids == [1] and set(probe.next_token_ids) == {5, 9}
    assert [r.token_ids for r in branches] == [[1, 5, 6, 7], [1, 5, 6, 8], [1, 9]]  # the last as the one that follows
    assert [r.next_token_ids for r in branches] == [(0,), (0,), (0,)] and all(r.read_cache for r in branches)
    tree = samples[0].tree
    assert samples[0].stats.scored_tokens == tree.history.num_nodes - 1 and samples[0].stats.scoring_requests == 4
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
    score, rounds = answer(), planner.visit_rounds(samples)
    for requests in rounds:
        for request in requests:
            # the first branch request read the prompt and [5, 6] from the cache: no log-probs for 5 and 6
            cached = 4 if request.token_ids[2:] == [5, 6] else 0
            planner.take_visit_answer(samples, request, score(request, cached))
        if request.start == request.end and request.start > 0:  # the rescoring round: point probes
            assert len(requests) <= MAX_POINT_PROBES
    tree = samples[0].tree
    assert tree.scored and not len(tree.unknown())


def test_a_failed_answer_leaves_nodes_unknown_and_the_walk_stops_before_them():
    planner = tree_planner()
    samples = planner.visit_samples([1], 16, previous([[5, 6], [5, 8]]), b"k" * 16, 2)
    for _ in planner.visit_rounds(samples):
        pass  # every request failed: nothing taken
    tree = samples[0].tree
    assert tree.scored and len(tree.unknown()) == tree.history.num_nodes - 1
    planner.decide(samples)
    for sample in samples:  # no child known: no proposal, generation from the prompt
        assert sample.cut == 0 and sample.excluded == () and planner.next_request(sample).token_ids == [1]


def test_two_visits_of_history_join_one_tree():
    planner = tree_planner(history=2)
    assert planner.policy.visits_kept == 2
    claimed = previous([[5, 6], [5, 7]]) + previous([[5, 6, 9], [3]], visit=3)
    samples = planner.visit_samples([1], 16, claimed, b"k" * 16, count=2)
    tree = samples[0].tree
    assert len(tree.history) == 4 and tree.history.branches == [1, 2, 3] and [s.own for s in samples] == [0, 1]
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
