"""The Ray draft cache: a claim finds the commits sent before it, and under faults, a soak of many visits with shard
kills, aborted requests and weight updates."""

import asyncio
import random
import subprocess
import sys
import time

import numpy as np
import pytest

import specrl_openrlhf as sr

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from vllm import SamplingParams  # noqa: E402

from specrl_openrlhf.cache import DraftCache, prompt_key, shard_of  # noqa: E402
from specrl_openrlhf.draft import Draft  # noqa: E402
from specrl_openrlhf.integration.openrlhf.draft_store import (  # noqa: E402
    RayDraftStore,
    packed,
    start_reuse,
    unpacked,
)
from specrl_openrlhf.integration.rollout.generator import AsyncSpeculativeGenerator, gather_samples  # noqa: E402
from specrl_openrlhf.integration.vllm.edge import engine_limits  # noqa: E402
from specrl_openrlhf.miniature.tiny_model import EOS_ID  # noqa: E402
from specrl_openrlhf.miniature.weights import perturbed_state_dict, write_weights  # noqa: E402

PROMPTS = [[3 + p, 40, 41, 42, 43] * 7 for p in range(3)]  # revisited every visit
N, MAX_TOKENS, VISITS, SHARD_BYTES = 4, 48, 40, 20_000  # a shard holds the revisited prompts and a few one-offs
# The last visits kill nothing and bring more one-off prompts: a restarted shard's eviction count starts again (it
# reloads the drafts saved at SAVE_AT_VISIT, within its cap) and must build up again before the end.
QUIET_VISITS = 5
SAVE_AT_VISIT = 8  # the drafts saved as at a checkpoint: shards killed later reload them
FAIL_EVERY = 17  # one shard call in this many fails as a call in flight to a killed shard does (FlakyLinkStore)


def test_the_store_imports_no_torch():
    """Every shard and the run's coordinator start a process that imports this module: torch (its import time and
    memory, in every shard) loads only where a stateful rule's coordinator is built."""
    code = "import sys, specrl_openrlhf.integration.openrlhf.draft_store; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


class OutOfOrderShardStore(RayDraftStore):
    """The Ray store over an in-process shard that applies a commit `lag_s` after it was sent and a claim at once, as
    Ray may run an async actor's calls (our shards') out of order."""

    def __init__(self, lag_s: float):
        super().__init__(num_shards=1)
        self.lag_s, self.shard = lag_s, DraftCache()

    async def _call(self, shard: int, method: str, payload: bytes, retry: bool = True):
        items = unpacked(payload)
        if method == "commit":
            await asyncio.sleep(self.lag_s)
            for key, visit_id, draft, _ in items:
                self.shard.commit(key, visit_id, draft)
            return None
        return packed([self.shard.claim(k, v, age, count, history) for k, v, age, count, _, history in items]), 0


def test_a_claim_finds_the_commits_sent_before_it():
    """A visit's samples commit without waiting; the prompt's next visit claims at once. Its claim must find those
    commits however late the shard runs them (in CI the engine test once found drafts for 3 prompts of 4)."""
    key = prompt_key([5, 6, 7])
    responses = [np.arange(4) + i for i in range(2)]

    async def two_visits() -> list:
        store = OutOfOrderShardStore(lag_s=0.05)
        assert await store.claim(key, "first", 1, 2) == [None, None]
        for tokens in responses:
            await store.commit(key, "first", Draft(tokens, np.zeros(4), "stop"))
        return await store.claim(key, "second", 1, 2)

    drafts = asyncio.run(two_visits())
    assert [d.token_ids.tolist() for d in drafts] == [r.tolist() for r in responses]


class FlakyLinkStore(RayDraftStore):
    """The Ray store, with one shard call in `FAIL_EVERY` failing as Ray fails a call in flight to a killed shard, on
    the call and on its retry. The soak's kills meet a call in flight only by chance (rarely on a fast machine, where
    a visit's calls take a few ms of its 0.1-0.2 s); these failures reach the driver's fallback in every run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = self.failed = 0

    async def _call(self, shard: int, method: str, *args, retry: bool = True):
        if retry:  # the first attempt (`_call` retries once, with retry=False)
            self.calls += 1
            if self.calls % FAIL_EVERY == 0:
                self.failed += 1
                raise ray.exceptions.ActorUnavailableError(f"{method} met a killed shard (injected)", None)
        return await super()._call(shard, method, *args, retry=retry)

    async def drain(self) -> None:
        """Return once every commit queued so far has been answered: none can land later."""
        await asyncio.gather(*(commits.drain() for commits in self._commits.values()))


def settled_stats(shard, timeout=120.0):
    """The shard's stats once it answers (a shard killed late in the soak may still be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(shard.stats.remote())
        except ray.exceptions.RayActorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def within_cap(shards, when: str) -> list[dict]:
    """Every shard's stats, each asserted within its memory cap (the cap holds after every call, `DraftCache`)."""
    stats = [settled_stats(s) for s in shards]
    held = [f"shard {i}: {s['bytes']} of {s['max_bytes']} bytes, {s['prompts']} prompts" for i, s in enumerate(stats)]
    assert all(s["bytes"] <= s["max_bytes"] for s in stats), f"{when}: {'; '.join(held)}"
    return stats


def claims_of_a_killed_rollout(runner, shards) -> None:
    """The moment that matters for the cap, seeded: a rollout killed once its claims landed and before any of its
    samples committed. Its step brings new prompts whose entries alone outgrow each shard's cap, so a claim that adds
    its entry without evicting leaves the shard over its cap, whatever the soak left in it (once no commit of the
    soak's can land after them: a commit evicts)."""
    probe = DraftCache()
    probe.claim(prompt_key([0]), "v")
    before = within_cap(shards, "before the claims")
    cap = max(s["max_bytes"] for s in before)
    per_shard, prompts = cap // probe.nbytes + 1, {i: [] for i in range(len(shards))}
    for k in range(10 * per_shard * len(shards)):
        prompt = [90 + k % 40, 100 + k // 40, 42] * 7
        if len(wanted := prompts[shard_of(prompt_key(prompt), len(shards))]) < per_shard:
            wanted.append(prompt)
    assert all(len(p) == per_shard for p in prompts.values())
    store = RayDraftStore(len(shards), "soak")  # the killed rollout's: its commits never come

    async def claim_all():
        await asyncio.gather(*[store.claim(prompt_key(p), "killed", 1, N) for p in sum(prompts.values(), [])])

    runner.run(claim_all())
    before = ", ".join(f"{s['bytes']} bytes, {s['prompts']} prompts" for s in before)
    within_cap(shards, f"after {per_shard} new prompts per shard claimed and never committed (before: {before})")


@pytest.mark.slow  # a stress test: in .ci/run's slow pass
def test_soak_with_shard_kills_and_aborts(ray_cluster, async_engine, tiny_model_dir, tmp_path, aborting_generate):
    engine, runner = async_engine
    rng = random.Random(0)
    config = sr.ReuseConfig(policy="spec", cache_shards=2, cache_max_gb=2 * SHARD_BYTES / (1 << 30))
    reuse = start_reuse({"reuse_config": config.to_json(), "num_shards": 2}, config, run="soak")
    shards = reuse.shards
    max_token_id, max_model_len = engine_limits(engine.model_config, engine.tokenizer)
    policy = sr.make("spec", lenience=1.65)
    planner = sr.SpeculativePlanner(policy, seed=1, max_token_id=max_token_id, max_model_len=max_model_len)
    aborted = []

    generate = aborting_generate(  # about 1 request in 10 is aborted after a few tokens
        engine, lambda params: rng.randrange(2, 20) if rng.random() < 0.1 else None, aborted
    )

    store = FlakyLinkStore(2, "soak")
    generator = AsyncSpeculativeGenerator(generate, policy, store, samples_per_visit=N, planner=planner)
    sp = SamplingParams(n=N, max_tokens=MAX_TOKENS, logprobs=0)
    history = {}  # every response returned so far, per prompt
    kills, errors, totals = 0, 0, sr.ReuseStats()
    try:
        for visit in range(VISITS):
            path = tmp_path / "w.safetensors"
            write_weights(perturbed_state_dict(tiny_model_dir, 0.05, seed=visit), path)  # a small RL step
            runner.run(engine.collective_rpc("reload_safetensors", args=(str(path),)))
            runner.run(engine.reset_prefix_cache())
            one_offs = 1 if visit < VISITS - QUIET_VISITS else 4  # prompts seen once, as in long tails
            prompts = PROMPTS + [[50 + k % 40, 60 + k // 40, 41] * 7 for k in range(4 * visit, 4 * visit + one_offs)]
            pending = asyncio.run_coroutine_threadsafe(gather_samples(generator, prompts, sp), runner.loop)
            if visit < VISITS - QUIET_VISITS and rng.random() < 0.2:  # kill a shard mid-visit; Ray restarts it
                time.sleep(rng.uniform(0.0, 0.3))
                ray.kill(shards[rng.randrange(2)], no_restart=False)
                kills += 1
            batch = pending.result(timeout=300)
            for row in batch.outputs[: len(PROMPTS)]:
                totals = sum((out.stats for out in row), totals)
            errors += sum(out.stats.cache_errors for row in batch.outputs for out in row)
            within_cap(shards, f"after visit {visit} (its commits may still be in flight)")
            if visit == SAVE_AT_VISIT:
                reuse.save(tmp_path / "drafts")
            for prompt, row in zip(prompts, batch.outputs):
                assert len(row) == N  # every sample comes back
                ids = [o.draft_id for o in row if o.draft_id is not None]
                assert len(ids) == len(set(ids))  # no two samples share a draft
                for out in row:
                    assert 0 < len(out.token_ids) <= MAX_TOKENS and len(out.logprobs) == len(out.token_ids)
                    assert np.isfinite(out.logprobs).all() and out.finish_reason in ("stop", "length", "abort")
                    if out.finish_reason == "stop":
                        assert out.token_ids[-1] == EOS_ID and EOS_ID not in out.token_ids[:-1]
                    prefix = tuple(out.token_ids[: out.verified_prefix_len])
                    if prefix:  # a verified prefix comes from this prompt's own earlier responses, never another's
                        assert any(old[: len(prefix)] == prefix for old in history[tuple(prompt)])
                history.setdefault(tuple(prompt), []).extend(tuple(o.token_ids) for o in row)
            assert len(generator.driver.visits) == 0  # every visit closed
    finally:
        write_weights(perturbed_state_dict(tiny_model_dir, 0.0, seed=0), path)
        runner.run(engine.collective_rpc("reload_safetensors", args=(str(path),)))
        runner.run(engine.reset_prefix_cache())
    stats = within_cap(shards, "at the end")
    assert 0 < sum(s["restarts"] for s in stats) <= kills and len(aborted) > 0  # a kill while restarting merges
    assert store.failed > 0 and errors >= store.failed  # every failed claim or commit was counted on a sample
    assert sum(s["evicted_prompts"] for s in stats) > 0  # ...which the one-off prompts did reach
    # Reuse survives it all: most samples of the revisited prompts found a draft and kept part of it.
    assert totals.drafts_found > totals.samples // 2 and totals.reused_tokens > totals.decoded_tokens // 4
    runner.run(store.drain())
    claims_of_a_killed_rollout(runner, shards)
    for handle in reuse.handles:
        ray.kill(handle, no_restart=True)
