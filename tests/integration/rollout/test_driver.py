"""What every driver shares (`integration.rollout.driver`): the draft store's front and its one `claim` contract,
the store's failures, visits, stock generation."""

import asyncio
from types import SimpleNamespace

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.cache import DraftCache, prompt_key
from specrl_openrlhf.integration.rollout import driver as driver_module
from specrl_openrlhf.integration.rollout.driver import LocalDraftStore, StockDriver, VisitTracker
from tests.helpers import PROMPTS, draft, generator, params, rollout


def test_every_store_claims_as_the_cache_does():
    """One contract: drafts for `count` samples in slot order (None where there is none), then with `history` > 1 the
    responses of the visits before."""
    cache, store = DraftCache(keep_visits=2), LocalDraftStore(keep_visits=2)
    key = prompt_key([1, 2])
    for visit in range(3):
        for target in (cache, store.cache):
            target.claim(key, f"v{visit}", 1, count=2)
            for i in range(2):
                target.commit(key, f"v{visit}", draft([visit, i]))
    direct = cache.claim(key, "v3", 1, count=3, history=2)
    fronted = asyncio.run(store.claim(key, "v3", 1, 3, False, 2))
    tokens = lambda drafts: [None if d is None else d.token_ids.tolist() for d in drafts]  # noqa: E731
    assert tokens(direct) == tokens(fronted) == [[2, 0], [2, 1], None, [1, 0], [1, 1]]


def test_visits_close_after_their_samples_and_follow_ups_are_their_own():
    visits = VisitTracker(samples_per_visit=2)
    (a, slot_a), (b, slot_b), (c, slot_c) = (visits.join(b"k") for _ in range(3))
    assert a is b and (slot_a, slot_b) == (0, 1) and c is not a and slot_c == 0
    follow_up, slot = visits.join(b"k", follow_up=True)
    assert follow_up is not c and slot == 0 and visits.size(True) == 1


def test_the_prompts_a_driver_drafted_are_bounded(monkeypatch):
    monkeypatch.setattr(driver_module, "DRAFTED_PROMPTS_KEPT", 3)
    stock = StockDriver(None, sr.make("off"), LocalDraftStore(), samples_per_visit=1)
    for p in range(5):
        asyncio.run(stock.commit(prompt_key([p]), "v", draft([p]), False, sr.ReuseStats()))
    assert list(stock.drafted) == [prompt_key([p]) for p in (2, 3, 4)]


def test_stock_generation_counts_a_fallback_only_when_it_is_one():
    async def generate(prompt, params):
        completion = SimpleNamespace(token_ids=[5, 6], logprobs=None, finish_reason="stop")
        return SimpleNamespace(outputs=[completion], num_cached_tokens=0)

    stock = StockDriver(generate, sr.make("off"), None, samples_per_visit=1)
    plain = SimpleNamespace(logprobs=None)
    out = asyncio.run(stock.generate([1], plain, False))
    assert out.token_ids == [5, 6] and out.stats.decoded_tokens == 2 and out.stats.fallbacks == 0
    assert asyncio.run(stock.generate_stock([1], plain, fallback=True)).stats.fallbacks == 1
    assert stock.available and stock.verifies_in_engine is None and stock.engine_report == {} and stock.trace is None


vllm = pytest.importorskip("vllm")


@pytest.mark.engine
def test_dead_store_falls_back(async_engine, caplog):
    class DeadStore:
        async def claim(self, *args):
            raise ConnectionError("cache actor died")

        commit = claim

    gen = generator(async_engine[0], sr.make("spec"), store=DeadStore(), samples_per_visit=2)
    batch = rollout(async_engine, gen, PROMPTS[:2], params(n=2, max_tokens=16))
    assert batch.stats.fallbacks == 4 and batch.stats.decoded_tokens > 0
    assert all(len(o.logprobs) == len(o.token_ids) for row in batch.outputs for o in row)
    assert "cache actor died" in caplog.text
