"""The kernels that follow every row (`vllm.follow`): a row followed from one that holds a new request, drafts judged
where they were given, candidates anchored in the history."""

import numpy as np

from specrl_openrlhf import budget
from specrl_openrlhf.integration.vllm.arena import NONE, Arena
from specrl_openrlhf.integration.vllm.follow import Arrivals, Sampled, Settings, anchor, follow
from specrl_openrlhf.integration.vllm.rows import FOLLOWED, IDLE, NEW, RowState


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
    arrivals = Arrivals(index, np.array([root] * 2), index * 0, num, tokens)
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
