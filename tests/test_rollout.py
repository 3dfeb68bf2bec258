import math

import numpy as np
import pytest

from specrl_openrlhf import (
    Draft,
    ReuseConfig,
    ReusePolicy,
    SpeculativePlanner,
    UnsupportedSamplingError,
    check_sampling,
    make,
)


def draft(tokens, logprobs=None, finish="stop"):
    logprobs = [-1.0] * len(tokens) if logprobs is None else logprobs
    return Draft(np.asarray(tokens, np.int32), np.asarray(logprobs, np.float32), finish)


def test_truncates_to_budget_context_and_vocabulary():
    planner = SpeculativePlanner(make("full"), max_token_id=99, max_model_len=20)
    assert planner.new_sample([1] * 5, 3, draft([5, 6, 7, 8])).draft.token_ids.tolist() == [5, 6, 7]
    assert planner.new_sample([1] * 15, 10, draft([5] * 10)).draft_len == 4  # 15 + 4 + 1 = 20
    oov = planner.new_sample([1], 10, draft([5, 6, 120, 7]))
    assert oov.draft.token_ids.tolist() == [5, 6] and oov.stats.invalid_drafts == 1 and not oov.draft_ended
    negative = planner.new_sample([1], 10, draft([-3, 6]))
    assert negative.draft is None and negative.stats.invalid_drafts == 1


def test_full_eos_draft_needs_no_generation():
    planner = SpeculativePlanner(make("full"))
    sample = planner.new_sample([1, 2], 10, draft([5, 6, 2], [-0.5, -0.25, -0.125]))
    planner.decide([sample])
    assert sample.cut == 3 and planner.continuation(sample) is None
    output, next_draft = planner.assemble(sample)
    assert output.token_ids == [5, 6, 2] and output.finish_reason == "stop" and output.stats.decoded_tokens == 0
    assert output.logprobs == [-0.5, -0.25, -0.125]  # random/full report the draft's logprobs by default
    assert output.stats.fully_reused == 1 and next_draft.token_ids.tolist() == [5, 6, 2]


def test_draft_at_length_limit_is_complete_and_longer_budget_continues():
    planner = SpeculativePlanner(make("full"))
    at_limit = planner.new_sample([1], 3, draft([5, 6, 7, 8], finish="length"))
    planner.decide([at_limit])
    assert planner.continuation(at_limit) is None
    assert planner.assemble(at_limit)[0].finish_reason == "length"
    short = planner.new_sample([1], 10, draft([5, 6], finish="length"))  # budget grew since
    planner.decide([short])
    assert planner.continuation(short) == ([1, 5, 6], 8)


def test_partial_reuse_assembly_with_scored_logprobs():
    planner = SpeculativePlanner(make("exact"), seed=3)
    sample = planner.new_sample([1, 2], 6, draft([5, 6, 7, 2], [-1.0, -1.0, -1.0, -1.0]), b"k" * 16)
    sample.scored = np.array([-1.0, -1.0, -50.0, -1.0], np.float32)  # token 2 is implausible now
    planner.decide([sample])
    assert sample.cut == 2
    assert planner.continuation(sample) == ([1, 2, 5, 6], 4)
    output, next_draft = planner.assemble(sample, [9, 2], [-0.3, -0.4], "stop")
    assert output.token_ids == [5, 6, 9, 2] and output.finish_reason == "stop"
    assert output.logprobs == pytest.approx([-1.0, -1.0, -0.3, -0.4])
    assert output.stats.reused_tokens == 2 and output.stats.decoded_tokens == 2 and output.stats.scored_tokens == 4
    assert output.stats.log_ratio_sum == pytest.approx(-49.0)
    assert next_draft.logprobs.tolist() == pytest.approx([-1.0, -1.0, -0.3, -0.4])


def test_reported_logprobs_option():
    scored = np.array([-2.0, -2.0], np.float32)
    outputs = {}
    for choice in ["scored", "draft"]:
        planner = SpeculativePlanner(make("spec", lenience=math.inf), reused_logprobs=choice)
        sample = planner.new_sample([1], 2, draft([5, 6], [-1.0, -1.0], "length"))
        sample.scored = scored
        planner.decide([sample])
        outputs[choice], stored = planner.assemble(sample)
        assert stored.logprobs.tolist() == [-2.0, -2.0]  # the cache keeps current-policy logprobs either way
    assert outputs["scored"].logprobs == [-2.0, -2.0] and outputs["draft"].logprobs == [-1.0, -1.0]


def test_no_draft_is_plain_generation():
    planner = SpeculativePlanner(make("spec"))
    sample = planner.new_sample([1, 2], 5, None)
    planner.decide([sample])
    assert planner.scoring_prompt(sample) is None and planner.continuation(sample) == ([1, 2], 5)


def test_uniforms_are_reproducible_and_fresh_per_visit():
    planner = SpeculativePlanner(make("spec"), seed=11)
    d = draft([5] * 50)
    a = planner.new_sample([1], 60, d, b"x" * 16).uniforms
    b = planner.new_sample([1], 60, d, b"x" * 16).uniforms
    later = planner.new_sample([1], 60, Draft(d.token_ids, d.logprobs, "stop", visit=1), b"x" * 16).uniforms
    other_seed = SpeculativePlanner(make("spec"), seed=12).new_sample([1], 60, d, b"x" * 16).uniforms
    assert np.array_equal(a, b) and not np.array_equal(a, later) and not np.array_equal(a, other_seed)


class Overrun(ReusePolicy):
    needs_scores = False

    def cut(self, batch):
        return batch.lengths + 5


def test_plugin_cuts_are_clamped():
    planner = SpeculativePlanner(make("full"))
    planner.policy = Overrun()
    sample = planner.new_sample([1], 10, draft([5, 6]))
    planner.decide([sample])
    assert sample.cut == 2


@pytest.mark.parametrize(
    "settings",
    [{"temperature": 0.7}, {"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.1}, {"repetition_penalty": 1.1}],
)
def test_unsupported_sampling_fails_clearly(settings):
    with pytest.raises(UnsupportedSamplingError, match="temperature 1.0"):
        check_sampling(make("spec"), **settings)
    check_sampling(make("random"), **settings)  # no scoring, no constraint
    check_sampling(make("spec"), temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)


def test_config_validation():
    assert ReuseConfig(policy="spec", lenience=1.65).build_policy().params.lenience == 1.65
    assert ReuseConfig.from_json(ReuseConfig(policy="exact", plugins=("a.py",)).to_json()).plugins == ("a.py",)
    with pytest.raises(ValueError, match="--lenience"):
        ReuseConfig(policy="spec", lenience=0.0)
    with pytest.raises(ValueError, match="--reuse.logprobs"):
        ReuseConfig(reused_logprobs="mine")
    with pytest.raises(ValueError, match="--reuse.cache_max_gb"):
        ReuseConfig(cache_max_gb=-1)
