"""The draft store at a regime's dataset (`at_scale.store`): the memory it needs by its own accounting, whether the
default cap holds it, and what an LRU store under it still holds at a spacing."""

import pytest

from specrl_openrlhf.at_scale.store import default_cap, draft_store
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.regime import REGIMES
from specrl_openrlhf.simulator.visits import lru_held_share, store_bytes

pytest.importorskip("ray")  # the store's shards give the follow-up turns their share of the cap


def corpus(length: int) -> Corpus:
    responses = [[[[7] * length for _ in range(8)] for _ in range(4)] for _ in range(3)]
    return Corpus([[1, 2, p] for p in range(4)], responses)


def test_the_store_needs_two_visits_a_prompt_of_the_regimes_dataset_and_says_whether_the_cap_holds_them():
    gb, cap = default_cap()
    assert gb == 6.0 and cap == 9 << 29  # --reuse.cache_max_gb 6, a quarter for follow-up turns
    short = draft_store(corpus(100), REGIMES["openrlhf"], 156)
    assert short.needed == 20_000 * store_bytes(corpus(100))[1] and short.held_share == 1.0
    assert "holds every prompt's last visit" in short.describe() and "20,000 prompts" in short.describe()
    long = draft_store(corpus(4096), REGIMES["openrlhf"], 156)  # 4,096-token responses: 7.3 GiB
    assert long.needed > cap and long.held_share == pytest.approx(lru_held_share(cap / long.later_bytes, 20_000))
    assert f"holds {cap // long.later_bytes:,} prompts (LRU)" in long.describe()
    assert draft_store(corpus(4096), REGIMES["openrlhf"], 8).held_share == 1.0  # 8 RL steps: 1,026 prompts between
