"""Our V2 speculator as the simulator drives it (`at_scale.speculator_v2`): between two visits, what its slots hold of
the other requests an engine served, and the returning prompts' last visit registered again from the draft store."""

from specrl_openrlhf.policies.builtin import LosslessParams
from specrl_openrlhf.simulator.visits import OtherRequests, StoreHeld
from tests.at_scale.test_proposers import corpus


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
