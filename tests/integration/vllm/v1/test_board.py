"""The V1 board (`vllm.v1.board`): updates are queued and inserted between steps, a bounded slice at a time; a new
visit starts its prompt's slot afresh unless its rows are already in flight; memory stays within `history_mb`, the
prompts whose rows are in flight and the latest registered kept."""

import logging

import numpy as np

from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm.hashing import token_hash as response_hash
from specrl_openrlhf.integration.vllm.histories import params_message, update_histories
from specrl_openrlhf.integration.vllm.v1.arena import BEST, COUNT
from specrl_openrlhf.integration.vllm.v1.board import HistoryBoard
from specrl_openrlhf.policies.builtin import LosslessParams


def params(**kw) -> dict:
    return params_message(LosslessParams(**kw))


def test_updates_are_queued_and_inserted_a_bounded_slice_at_a_time():
    board = HistoryBoard()
    for p in range(5):
        board.update(prompt_key([p]), 1, True, params(), [[10 + p, 11, 12]] * 3, [None] * 3)
    assert board.arena.size == 0 and len(board.pending) == 5  # the rpc only queues
    board.drain(set(), seconds=0.0)
    assert len(board.pending) == 4 and len(board.slots) == 1  # at least one update a step
    board.drain(set())
    assert not board.pending and len(board.slots) == 5
    slot = board.slots[prompt_key([2])]
    nodes = board.arena.nodes
    assert nodes[nodes[slot.root, BEST], COUNT] == 3


def test_a_new_visit_starts_afresh_unless_its_rows_are_in_flight():
    board = HistoryBoard()
    key = prompt_key([7])
    board.update(key, 1, True, params(), [[1, 2, 3]], [None])
    board.drain(set())
    first = board.slots[key]
    board.update(key, 1, True, params(), [[4, 5, 6]], [None])  # the next visit, no row of it here yet
    board.drain(set())
    assert board.slots[key].id != first.id and [r.tolist() for r in board.slots[key].responses] == [[4, 5, 6]]
    live = board.slots[key]
    board.update(key, 1, True, params(), [[8, 9], [4, 5, 6]], [None] * 2)  # its rows already run in the slot
    live.in_flight.add(response_hash([4, 5, 6]))  # one of them was inserted while in flight
    board.drain({live.id})
    assert board.slots[key] is live and [r.tolist() for r in live.responses] == [[4, 5, 6], [8, 9]]


def test_a_returning_prompts_history_survives_the_memory_budget(caplog):
    """Past `history_mb` the arena is rebuilt: the slots of the rows in flight first, then the latest registered,
    up to half the budget; the prompts that left the engine longest ago go. A step's own prompts always stay."""
    board = HistoryBoard()
    rng = np.random.default_rng(0)
    rule = params(history_mb=1)
    keys = [prompt_key([p]) for p in range(64)]
    for key in keys:  # 64 prompts x 8 responses x 256 tokens: about 0.13M nodes, past 1 MiB
        board.update(key, 1, True, rule, rng.integers(0, 50_000, (8, 256)).tolist(), [None] * 8)
        board.drain(set())
    assert board.arena.nbytes <= 1 << 20 and board.version > 0
    assert keys[-1] in board.slots and keys[0] not in board.slots  # the latest kept, the oldest gone
    live = board.slots[keys[-2]].id
    for p in range(64, 72):
        board.update(prompt_key([p]), 1, True, rule, rng.integers(0, 50_000, (8, 256)).tolist(), [None] * 8)
        board.drain({live})
    assert keys[-2] in board.slots  # rows in flight keep their prompt's slot
    caplog.set_level(logging.WARNING)
    board.update(prompt_key([99]), 1, True, rule, rng.integers(0, 50_000, (64, 256)).tolist(), [None] * 64)
    board.drain({live, 10**6}, seconds=10.0)
    assert "history_mb=1 is too small" in caplog.text


def test_the_rpc_answers_the_proposers_and_the_histories_memory(monkeypatch):
    from specrl_openrlhf.integration.vllm.v1 import board as boards

    board = HistoryBoard()
    monkeypatch.setattr(boards, "BOARD", board)
    answer = update_histories(None, [(prompt_key([1]), 1, True, params(), [[5, 6]], [None])])
    assert answer["proposers"] == 0 and "history_mb" in answer and len(board.pending) == 1
