"""How RL comes back to a prompt in the simulator (`simulator.visits`): the other requests of a gap and their tail,
the corpus's returning prompts and the others, and the draft store's bytes and what an LRU store under its cap still
holds."""

import random
from collections import OrderedDict

import numpy as np
import pytest

from specrl_openrlhf.cache import _ENTRY_OVERHEAD_BYTES
from specrl_openrlhf.draft import DRAFT_OVERHEAD_BYTES
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.requests import Samples
from specrl_openrlhf.simulator.visits import (
    Gaps,
    OtherRequests,
    Stored,
    StoreHeld,
    gap_visits,
    lru_held_share,
    passes,
    store_bytes,
    subset,
)


def corpus(prompts=4, samples=2, epochs=3):
    """Response s of prompt p in epoch e: [1000 e + 10 p + s] + [p] x (p + 1), so each names its epoch, prompt and
    sample."""
    responses = [
        [[[1000 * e + 10 * p + s] + [p] * (p + 1) for s in range(samples)] for p in range(prompts)]
        for e in range(epochs)
    ]
    return Corpus([[1, 2, 3 + p] for p in range(prompts)], responses)


def test_a_gap_serves_the_other_prompts_in_turn_from_the_epoch_it_precedes_under_identities_of_their_own():
    toy = corpus()
    gap = OtherRequests(toy, (1, 3), epoch=2, visits=5)
    visits = [gap.visit(i) for i in range(gap.visits)]
    assert gap.responses == 10 and len({v.key for v in visits}) == 5  # every visit a request of its own
    others = [v.responses[0][0] % 1000 // 10 for v in visits]
    assert sorted(others[:2]) == [1, 3] and sorted(others[2:4]) == [1, 3]  # each other prompt once a turn
    assert all(v.responses[0][0] // 1000 == 2 and v.previous[0][0] // 1000 == 1 for v in visits)
    assert [v.source for v in visits[:2]] == [(q, 2) for q in others[:2]]  # the corpus's prompt and epoch
    assert OtherRequests(toy, (1, 3), epoch=0, visits=1).visit(0).previous == []  # a first visit: none before
    assert list(gap.newest_first()) == visits[::-1]


def test_a_fifo_of_n_responses_takes_the_gaps_last_visits_that_hold_them():
    gap = OtherRequests(corpus(), (0, 2), epoch=1, visits=6)  # 12 responses, 2 a visit
    assert gap.tail(4) == [gap.visit(4), gap.visit(5)]
    assert gap.tail(5) == [gap.visit(3), gap.visit(4), gap.visit(5)]  # whole visits: the FIFO drops the oldest one
    assert gap.tail(100) == [gap.visit(i) for i in range(6)] and gap.tail(0) == []


def test_a_gap_is_the_spacing_less_the_returning_prompts_epoch_in_rl_steps_of_visits():
    assert gap_visits(spacing=1, steps_per_epoch=1, prompts_per_step=16) == 0  # back at the next step: nothing
    assert gap_visits(spacing=156, steps_per_epoch=1, prompts_per_step=16) == 155 * 16
    assert gap_visits(spacing=3, steps_per_epoch=4, prompts_per_step=8) == 0  # the epoch alone spaces them more
    gaps = Gaps(corpus(), (1, 3), visits=4)
    assert gaps.before(2) == OtherRequests(corpus(), (1, 3), 2, 4)


def test_half_the_prompts_return_and_a_half_keeps_its_responses_aligned():
    assert passes(5) == [((0, 2, 4), (1, 3))]
    with pytest.raises(ValueError, match="the corpus has 1 prompt: the simulator needs two or more"):
        passes(1)
    toy = corpus()
    half = subset(toy, (3, 1))
    assert half.prompts == [toy.prompts[3], toy.prompts[1]]
    assert [[samples[0][0] for samples in epoch] for epoch in half.responses] == [[30, 10], [1030, 1010], [2030, 2010]]


def test_the_draft_store_holds_a_visit_then_two_by_its_own_accounting():
    toy = corpus(prompts=2, samples=2, epochs=3)

    def visit_bytes(epoch):  # the drafts the engine path commits: int32 tokens, float32 log-probs counted twice, ages
        return sum(14 * len(r) + DRAFT_OVERHEAD_BYTES for p in toy.responses[epoch] for r in p) / 2

    first, later = store_bytes(toy)
    assert first == round(_ENTRY_OVERHEAD_BYTES + visit_bytes(0))
    assert later == round(_ENTRY_OVERHEAD_BYTES + visit_bytes(1) + visit_bytes(2))  # claimed, and its own


def lru_returns(prompts: int, capacity: int, epochs: int, seed: int = 0) -> float:
    """The share of returns an LRU of `capacity` prompts still holds, each epoch a fresh shuffle."""
    rng, held, found, returns = random.Random(seed), OrderedDict(), 0, 0
    for epoch in range(epochs):
        order = list(range(prompts))
        rng.shuffle(order)
        for p in order:
            if epoch:
                returns += 1
                found += p in held
            held[p] = True
            held.move_to_end(p)
            if len(held) > capacity:
                held.popitem(last=False)
    return found / returns


@pytest.mark.parametrize("share", [0.3, 0.6, 0.9])
def test_an_lru_store_under_its_cap_holds_the_share_of_returns_the_formula_says(share):
    prompts = 2000
    assert lru_returns(prompts, int(share * prompts), epochs=4) == pytest.approx(
        lru_held_share(share * prompts, prompts), abs=0.02
    )
    assert lru_held_share(prompts, prompts) == 1.0 and lru_held_share(0, prompts) == 0.0


def test_a_returning_prompt_the_store_dropped_is_sent_without_drafts():
    toy = corpus(prompts=4, samples=2, epochs=2)
    assert StoreHeld().previous(toy, 1, 2) == toy.responses[0][2] and StoreHeld().previous(toy, 0, 2) == []
    store = StoreHeld(share=0.5, seed=3)
    held = [store.held(1, p) for p in range(400)]
    assert 0.4 < np.mean(held) < 0.6 and held == [store.held(1, p) for p in range(400)]  # seeded
    lost = next(p for p in range(4) if not store.held(1, p))
    assert store.previous(toy, 1, lost) == []

    class Recorder(Samples):
        asked: list = []

        def requests(self, epoch, prompts, corpus):
            self.asked.append(list(prompts))
            return super().requests(epoch, prompts, corpus)

    inner = Recorder()
    sent = Stored(inner, store).requests(1, [0, 1, 2, 3], toy)
    assert lost not in inner.asked[-1] and sorted({r.prompt_index for r in sent}) == [0, 1, 2, 3]
