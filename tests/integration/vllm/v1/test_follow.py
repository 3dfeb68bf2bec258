"""The kernels that follow every row (`vllm.follow`): a row followed from one that holds a new request, drafts judged
where they were given, candidates anchored in the history; the step's survey; the core's definitions, compiled."""

import numpy as np
import pytest

from specrl_openrlhf import budget
from specrl_openrlhf.integration.vllm.v1.arena import NONE, Arena
from specrl_openrlhf.integration.vllm.v1.follow import (
    Arrivals,
    Sampled,
    Settings,
    anchor,
    decayed_sums,
    fit_step_cost,
    follow,
    goodput_allocate,
    record_step,
    record_verdicts,
    survey,
)
from specrl_openrlhf.integration.vllm.v1.rows import FOLLOWED, IDLE, NEW, RowState
from specrl_openrlhf.pricing.online import OnlineStepCost


def test_follow_tells_followed_rows_from_new_requests_and_judges_drafts():
    arena, state = Arena(64), RowState(k=4, capacity=3)
    root = arena.new_root(0)
    arena.insert(root, np.array([10, 11, 12, 13], np.int32), 0, 2)
    out = state.outputs
    tokens = np.zeros((3, 16), np.int32)
    tokens[0, :3], tokens[1, :3] = [1, 2, 10], [1, 2, 10]
    num = np.array([3, 3, 0], np.int32)
    state.prompt_len[:2] = 2
    settings = Settings(2, 4, 64, True, np.full(int(np.prod(budget.SHAPE)), 0.5), -1.0)
    index = np.arange(2, dtype=np.int64)
    arrivals = Arrivals(index, np.array([root] * 2), index * 0, index * 0 + 2, num, tokens)
    arena.size = anchor(arena.arrays, arena.size, arrivals, state.kernel_args(), settings, out)
    assert out.cand[0, :3].tolist() == [11, 12, 13] and out.length[0] == 3  # anchored in the history
    assert out.cand_accept[0, :3].tolist() == [0.5] * 3
    assert out.cand_bucket[0, 0] == budget.bucket(budget.ANCHORED, 0, 1.0, 0)
    state.drafted[0] = 2  # the first two of its candidate were given
    tokens[0, 3:5], tokens[1, :4] = [11, 99], [7, 7, 7, 7]  # row 0 kept 11, drew 99; row 1 holds a new request
    num[:] = [5, 4, 0]
    arena.reserve(8)
    step = Sampled(np.arange(3, dtype=np.int64), np.array([2, 1, 0], np.int32), num, tokens)  # tokens sampled
    arena.size = follow(arena.arrays, arena.size, step, state.kernel_args(), settings, out)
    assert out.status.tolist() == [FOLLOWED, NEW, IDLE] and out.accepted[0] == 1  # one draft slot accepted
    assert state.judged[0] == 2 and state.judged_hit[:2].tolist() == [True, False]  # the second one rejected
    assert state.cursor[0] == NONE and out.length[0] == 0  # [11, 99] is nowhere: nothing to propose


def test_survey_tells_a_decoding_step_from_one_that_started_a_row():
    seen, drafted = np.array([5, 7, 0], np.int32), np.array([2, 0, 0], np.int32)
    new, num_tokens = np.array([2, 1, 0], np.int32), np.array([7, 8, 0], np.int32)
    assert survey(seen, drafted, new, num_tokens, 2) == (True, 2, 3, 12.0)  # both rows followed: a decode's step
    assert survey(seen, drafted, new, num_tokens, 3)[0] is False  # the third row holds a request in prefill
    num_tokens[1] = 9  # the second row's request is not the one followed there
    assert survey(seen, drafted, new, num_tokens, 2)[0] is False


def test_the_compiled_definitions_agree_with_their_plain_python():
    """What the proposer compiles from the core modules (`follow`'s copies) gives what their plain Python gives."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 9))
        acceptance, lengths = rng.choice([0.2, 0.5, 0.9, 1.0], (n, k)), rng.integers(0, k + 1, n).astype(np.int64)
        cost = (0.005, 1e-5, float(rng.uniform(1e-6, 1e-3)))
        floor = budget.survival_floor(n, *cost)
        room = int(rng.integers(-1, n))  # the engine's room for slots (-1: no limit)
        ours, theirs = np.zeros(n, np.int64), np.zeros(n, np.int64)
        gain = goodput_allocate(acceptance, lengths, n, *cost, floor, False, ours, room)
        assert gain == budget.goodput_allocate(acceptance, lengths, n, *cost, floor, False, theirs, room)
        assert ours.tolist() == theirs.tolist()
    verdicts = rng.integers(0, int(np.prod(budget.SHAPE)), 500), rng.random(500) < 0.6, rng.random(500)
    compiled, plain = budget.AcceptanceModel(record=record_verdicts), budget.AcceptanceModel()
    for model in (compiled, plain):
        for chunk in np.array_split(np.arange(500), 7):
            model.observe(*(v[chunk] for v in verdicts))
    np.testing.assert_allclose(compiled.table, plain.table, rtol=1e-12)
    np.testing.assert_allclose(compiled.deciles, plain.deciles, rtol=1e-12)
    _, hits, predicted = verdicts
    assert decayed_sums(0.9, predicted, hits) == pytest.approx(budget.decayed_sums(0.9, predicted, hits))
    fitted, reference = OnlineStepCost(record=record_step, fit=fit_step_cost), OnlineStepCost()
    for _ in range(40):
        rows = int(rng.integers(1, 256))
        tokens, seconds, context = rows + int(rng.integers(0, 3 * rows)), rng.uniform(0.005, 0.02), rng.uniform(0, 1e5)
        for cost in (fitted, reference):
            cost.observe(rows, tokens, float(seconds), float(context))
    np.testing.assert_allclose(fitted.params, reference.params, rtol=1e-9, atol=1e-15)
