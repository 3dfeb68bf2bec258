"""Where a batch row proposes from (`integration.vllm.rows`): its prompt's history, the shared one, its own tokens."""

import numpy as np

from specrl_openrlhf.budget import OWN, SHARED
from specrl_openrlhf.integration.vllm.histories import HistoryBoard, SharedHistory
from specrl_openrlhf.integration.vllm.rows import Row
from specrl_openrlhf.policies.builtin import LosslessParams


def board_with(shared_responses, **params) -> HistoryBoard:
    board = HistoryBoard()
    board.params, board.shared = LosslessParams(min_match=2, **params), SharedHistory(min_match=2)
    for response in shared_responses:
        board.shared.add(response)
    return board


def test_the_longer_of_a_shared_match_and_an_own_tokens_match_wins():
    tokens = np.array([1, 50, 51, 52, 9, 7, 50, 51, 52], np.int32)  # the row's last 3 tokens occurred before in it
    row = Row(1, -1, 0)
    row.reenter(board_with([[60, 51, 52, 70, 71]]), tokens, len(tokens))  # the shared tree matches 2 of them
    assert row.kind == OWN and row.pointer == 4 and row.proposal(3, -np.inf).tokens == [9, 7, 50]
    row = Row(1, -1, 0)
    row.reenter(board_with([[60, 50, 51, 52, 70, 71]]), tokens, len(tokens))  # now it matches 3: a tie goes shared
    assert row.kind == SHARED and row.proposal(2, -np.inf).tokens == [70, 71]


def test_a_row_walks_its_own_tokens_while_it_takes_what_they_propose():
    tokens = np.array([1, 50, 51, 52, 9, 7, 50, 51, 52], np.int32)
    row = Row(1, -1, 0)
    row.reenter(board_with([]), tokens, len(tokens))
    row.advance([9, 7])  # accepted what its own tokens proposed
    assert row.pointer == 6 and row.proposal(2, -np.inf).tokens == [50, 51]
    row.advance([8])  # the engine sampled another token: the row stands nowhere until it re-enters
    assert row.pointer is None and not row.placed


def test_each_place_can_be_turned_off():
    tokens = np.array([1, 50, 51, 52, 9, 7, 50, 51, 52], np.int32)
    row = Row(1, -1, 0)
    row.reenter(board_with([[60, 50, 51, 52, 70]], shared=False, lookup=False), tokens, len(tokens))
    assert not row.placed
