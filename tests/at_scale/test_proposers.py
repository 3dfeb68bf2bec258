"""The engine's proposers as the simulator drives them (`at_scale.proposers`), between two visits: what each cache
holds of the other requests an engine served (`between_visits`)."""

from types import SimpleNamespace

import numpy as np
import pytest

from specrl_openrlhf.at_scale.proposers import SUFFIX_CACHED, Lossless, Ngram, Stock, Suffix
from specrl_openrlhf.integration.vllm.v1.arena import Arena
from specrl_openrlhf.policies.builtin import LosslessParams
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.engine import Schedule
from specrl_openrlhf.simulator.visits import OtherRequests, StoreHeld


def corpus(prompts=4, samples=2, epochs=2, length=6, seed=0):
    rng = np.random.default_rng(seed)
    responses = [
        [[rng.integers(10, 30_000, length).tolist() for _ in range(samples)] for _ in range(prompts)]
        for _ in range(epochs)
    ]
    return Corpus([[1, 2, 3 + p] for p in range(prompts)], responses)


def test_suffix_decodings_fifo_holds_the_last_n_responses_of_a_gap():
    pytest.importorskip("arctic_inference")
    toy = corpus()
    suffix = Suffix(max_model_len=64, max_num_seqs=8, cached=6)
    gap = OtherRequests(toy, (1, 3), epoch=1, visits=5)  # 10 responses: more than the FIFO holds
    suffix.between_visits(gap)
    held = list(suffix.proposer.suffix_cache.cached_requests)
    assert held == [f"{v.key}-s{s}" for v in gap.tail(6) for s in range(2)]  # the last 3 visits, oldest first
    small = OtherRequests(toy, (1, 3), epoch=1, visits=1)  # 2 more: the two oldest go
    suffix.between_visits(small)
    assert list(suffix.proposer.suffix_cache.cached_requests) == held[2:] + [
        f"{small.visit(0).key}-s{s}" for s in (0, 1)
    ]
    assert SUFFIX_CACHED == 10_000


def test_suffix_decodings_default_is_vllms():
    config = pytest.importorskip("vllm.config")
    fields = config.SpeculativeConfig.__dataclass_fields__
    assert fields["suffix_decoding_max_cached_requests"].default == SUFFIX_CACHED


def test_our_arena_takes_every_other_visit_and_the_rollout_registers_the_returning_prompts_last_visit_again():
    """A budget of 1 MiB in the simulator (history_mb 2 at scale 2) that a long gap overflows: the gap's last visits
    that fit in it are served (the older ones could not stay), the board rebuilds from the newest slots, the
    returning prompts' slots of their last visit among the first to go, and their visit registers it again from the
    draft store; where the store dropped it, it has none."""
    pytest.importorskip("numba")
    toy = corpus(prompts=4, samples=2, epochs=2, length=200)
    lossless = Lossless(64 + 200, Schedule(max_num_seqs=8), None, LosslessParams(history_mb=2), cost_scale=2)
    assert lossless.params["history_mb"] == 1  # the budget over the scale
    lossless.visit(0, [0, 2], toy)
    for p in (0, 2):
        lossless.board.update(lossless.keys[p], 3, False, lossless.params, toy.responses[0][p], [None, None])
    lossless._drain()
    gap = OtherRequests(toy, (1, 3), epoch=1, visits=300)  # 300 visits of 4 responses of 200 tokens
    lossless.between_visits(gap)
    assert lossless.board.version > 0 and lossless.board.arena.nbytes <= 1 << 20  # rebuilt within the budget
    assert all(lossless.keys[p] not in lossless.board.slots for p in (0, 2))  # the last visit left the arena

    def key(i):
        return lossless.key([-1, *gap.visit(i).key.encode()])

    fit = (1 << 20) // Arena.BYTES_PER_NODE // 800  # 800 tokens a visit: its previous visit's and its own
    assert key(299 - fit) not in lossless.board.slots and key(0) not in lossless.board.slots
    newest = key(299)
    assert len(lossless.board.slots[newest].responses) == 4  # an other visit: its previous visit and its own
    assert lossless.visit(1, [0, 2], toy) == 1.0  # registered again from the draft store
    assert lossless.board.slots[lossless.keys[0]].responses[0].tolist() == toy.responses[0][0][0]
    dropped = Lossless(64 + 200, Schedule(max_num_seqs=8), None, LosslessParams(), store=StoreHeld(share=0.0))
    assert dropped.visit(1, [0, 2], toy) == 0.0


def test_stock_and_the_ngram_proposer_keep_nothing_across_requests():
    pytest.importorskip("vllm")
    gap = OtherRequests(corpus(), (1, 3), epoch=1, visits=2)
    for proposer in (Stock(), Ngram(max_model_len=64, max_num_seqs=8)):
        assert proposer.between_visits(gap) is None and proposer.memory_bytes() == 0


def test_a_rebuild_by_the_drain_inside_a_step_follows_every_row_afresh(monkeypatch):
    """The registrations a step drains first may take the arena past `history_mb`, and the board rebuilds it there
    (`HistoryBoard.rebuild`): the rows followed until then stand on the old arena's nodes, which `follow` would write
    through (the paper regime's segfault, past the new arena's arrays): they are followed afresh in the new arena."""
    pytest.importorskip("numba")
    from specrl_openrlhf.integration.vllm.v1 import board as boards
    from specrl_openrlhf.integration.vllm.v1 import proposer as module
    from specrl_openrlhf.integration.vllm.v1.arena import PARENT, TOKEN

    monkeypatch.setattr(boards, "BOARD", boards.BOARD)  # `Lossless` installs a board of its own: put it back after
    lossless = Lossless(64, Schedule(max_num_seqs=8), None, LosslessParams(history_mb=2), cost_scale=2)  # 1 MiB
    board, rng = lossless.board, np.random.default_rng(0)
    for p in range(30):  # 15,000 nodes: within the budget (16,384 nodes' arrays)
        board.update(lossless.key([9, 9, p]), 3, True, lossless.params, [rng.integers(10, 30_000, 500)], [None])
    lossless._drain()
    assert board.version == 0 and board.arena.size > 15_000

    stale = []
    follow = module.follow

    def checked(arena, size, step, rows, settings, out):  # the rows `follow` inserts below: on the arena's nodes
        for r in step.indices.tolist():
            s, new, n = int(rows.seen[r]), int(step.new[r]), int(step.num_tokens[r])
            if new and s and s + new == n and not 0 <= rows.own[r] < size:
                stale.append((r, int(rows.own[r]), size))
        return size if stale else follow(arena, size, step, rows, settings, out)  # never through a stale node

    monkeypatch.setattr(module, "follow", checked)
    prompt, rows = [1, 2, 3], 2
    batch = SimpleNamespace(token_ids_cpu=np.zeros((rows, 64), np.int32), num_tokens_no_spec=np.zeros(rows, np.int32))
    batch.token_ids_cpu[:, :3], batch.num_tokens_no_spec[:] = prompt, 3

    def sample(tokens):
        for r, token in enumerate(tokens):
            batch.token_ids_cpu[r, batch.num_tokens_no_spec[r]] = token
            batch.num_tokens_no_spec[r] += 1
        lossless.propose(batch, [[t] for t in tokens])

    sample([40, 50])  # the rows arrive (their nodes past 15,000), then are followed
    sample([41, 51])
    board.update(lossless.key([8, 8, 8]), 3, True, lossless.params, [rng.integers(10, 30_000, 3_000)], [None])
    sample([42, 52])  # its drain takes the arena past the budget: rebuilt, about 8,700 nodes kept
    assert board.version == 1 and board.arena.size < 15_000
    sample([43, 53])
    assert not stale and not lossless.proposer.failed
    state, nodes = lossless.proposer.rows, board.arena.nodes
    for r, response in enumerate(([40, 41, 42, 43], [50, 51, 52, 53])):  # each row's path: its response, in the arena
        node, path = int(state.own[r]), []
        while node >= 0 and nodes[node, TOKEN] >= 0:
            path.append(int(nodes[node, TOKEN]))
            node = int(nodes[node, PARENT])
        assert path[::-1] == response
