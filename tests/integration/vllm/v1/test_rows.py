"""A row's state between steps (`vllm.rows`): its arrays grow and move with the request."""

from specrl_openrlhf.integration.vllm.v1.rows import RowState


def test_row_state_grows_and_moves_with_its_request():
    state = RowState(k=3, capacity=2)
    state.seen[1], state.cand[1] = 7, [4, 5, 6]
    state.grow(8)
    assert state.capacity == 8 and state.seen[1] == 7 and state.cand[1].tolist() == [4, 5, 6] and state.seen[5] == 0
    assert len(state.judged_bucket) == 8 * 3
    state.move(1, 4)
    assert state.seen[4] == 7 and state.cand[4].tolist() == [4, 5, 6] and state.seen[1] == 0


def test_rows_are_followed_afresh_once_the_arena_was_rebuilt_and_not_otherwise():
    state = RowState(k=4, capacity=4)
    state.on_arena(0)
    state.seen[:2], state.drafted[:2] = 7, 3  # two rows followed in arena version 0
    state.on_arena(0)
    assert state.seen[:2].tolist() == [7, 7] and state.drafted[:2].tolist() == [3, 3]
    state.on_arena(1)  # rebuilt: their nodes are the old arena's
    assert not state.seen.any() and not state.drafted.any() and state.arena_version == 1
