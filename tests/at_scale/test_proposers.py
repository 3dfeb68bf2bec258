"""The engine's proposers as the simulator drives them (`at_scale.proposers`), between two visits: what each cache
holds of the other requests an engine served (`between_visits`)."""

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


def test_vllm_034s_suffix_ring_keeps_the_newest_responses_of_a_gap_that_fit():
    """vLLM 0.34's ring (`SuffixV2`, 2,000 tokens here): a gap of 300 visits of 2 responses of 200 tokens overwrites
    the returning prompts' last visit and all but the gap's newest responses that fit."""
    pytest.importorskip("numba")
    from specrl_openrlhf.at_scale.suffix_v2 import SuffixV2

    toy = corpus(prompts=4, samples=2, epochs=2, length=200)
    ring = SuffixV2(k=8, depth=24, corpus_tokens=2000)
    for s in range(2):
        ring.pending.append((f"e0-p0-s{s}", np.array([3, *toy.responses[0][0][s]], np.int64)))
    assert ring.visit(1, [0], toy) == 1.0  # the prompt's last visit in the ring
    gap = OtherRequests(toy, (1, 3), epoch=1, visits=300)
    ring.between_visits(gap)
    assert ring.visit(1, [0], toy) == 0.0  # overwritten
    newest = [f"{gap.visit(299).key}-s{s}" for s in (0, 1)]
    assert all(ring._intact(request) for request in newest)
    assert not ring._intact(f"{gap.visit(290).key}-s0")  # 20 responses of 204 tokens: more than the ring


def test_our_v2_speculator_takes_the_gaps_newest_visits_its_slots_hold_and_the_returning_ones_again():
    """`LosslessV2`'s store (its slots at 1 MiB): a long gap takes them, least recently used first, the returning
    prompts' among them, the gap's newest visits kept; the returning prompts' visit registers their last visit again
    from the draft store (none where the store dropped it)."""
    from specrl_openrlhf.at_scale.speculator_v2 import LosslessV2
    from specrl_openrlhf.cache import prompt_key

    toy = corpus(prompts=4, samples=2, epochs=2, length=200)
    v2 = LosslessV2(64 + 200, 8, LosslessParams(history_mb=1, engine="v2"), adaptive=None)
    book = v2.drafter.book
    assert v2.visit(0, [0, 2], toy) == 0.0 and v2.keys[0] in book.slots  # a first visit: nothing before it
    gap = OtherRequests(toy, (1, 3), epoch=1, visits=3 * book.size.slots)
    v2.between_visits(gap)
    newest = [prompt_key([-1, *gap.visit(i).key.encode()]) for i in range(gap.visits - book.size.slots, gap.visits)]
    assert list(book.slots) == newest  # the gap's newest visits, oldest first; the returning prompts' gone
    assert v2.visit(1, [0, 2], toy) == 1.0 and v2.keys[0] in book.slots  # back from the draft store
    dropped = LosslessV2(264, 8, LosslessParams(engine="v2"), None, StoreHeld(share=0.0))
    assert dropped.visit(1, [0, 2], toy) == 0.0
