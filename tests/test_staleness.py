"""The staleness meter on constructed drafts: every metric against its value worked out by hand."""

import math

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.staleness import reused_token_sums, scored_token_sums

LOG = np.log


def constructed_sample(policy, reused_logprobs="auto"):
    """Three draft tokens: p_prev 0.5 each, p_gen (when decoded) 0.8, 0.5 and 0.25, stored ages 1, 0 and 3; the
    current policy gives them 0.25, 0.5 and 1.0, so r = p_curr / p_prev = 0.5, 1 and 2."""
    planner = sr.SpeculativePlanner(policy, seed=0, reused_logprobs=reused_logprobs)
    draft = sr.Draft(
        np.array([5, 6, 7], np.int32),
        LOG([0.5, 0.5, 0.5]),
        "stop",
        gen_logprobs=LOG([0.8, 0.5, 0.25]),
        ages=np.array([1, 0, 3]),
    )
    sample = planner.new_sample([1, 2], 10, draft, b"k" * 16)
    if sample.scored is not None:  # what the scoring requests would return
        sample.scored = LOG([0.25, 0.5, 1.0]).astype(np.float32)
    planner.decide([sample])
    output, stored = planner.assemble(sample)
    return sample, output, stored


def test_every_metric_on_a_constructed_draft():
    sample, output, stored = constructed_sample(sr.make("spec", lenience=2.0))  # 2r >= 1 everywhere: all kept
    assert sample.cut == 3 and sample.ages_now.tolist() == [2, 1, 4]  # a visit older than when they were stored
    m = output.stats.as_dict()
    assert m["reuse/scored_tokens"] == 3
    # KL(p_prev || p_curr) by (r - 1) - log r: (-0.5 + log 2) + 0 + (1 - log 2) = 0.5 over three tokens
    assert m["reuse/kl_prev_curr"] == pytest.approx(0.5 / 3)
    assert m["reuse/rejection_rate_exact"] == pytest.approx(1 - (0.5 + 1 + 1) / 3)  # 1 - mean min(1, r)
    assert m["reuse/excess_acceptance"] == pytest.approx((3 - 2.5) / 3)  # min(1, 2r) = 1 everywhere
    assert m["reuse/drift_since_decode"] == pytest.approx(math.log(0.25 / 0.8 * 1.0 * 1.0 / 0.25) / 3)
    assert m["reuse/reused_token_age"] == pytest.approx(7 / 3)
    assert m["reuse/reused_older_than_2"] == pytest.approx(1 / 3)
    # the next draft keeps each token's p_gen and its age now; its p_prev is this visit's p_curr
    assert np.allclose(stored.gen_logprobs, LOG([0.8, 0.5, 0.25]))
    assert stored.ages.tolist() == [2, 1, 4] and np.allclose(stored.logprobs, sample.scored)


def test_exact_acceptance_has_no_excess_and_full_reuse_keeps_everything_in_excess():
    _, exact, _ = constructed_sample(sr.make("exact"))
    assert exact.stats.as_dict()["reuse/excess_acceptance"] == 0.0
    _, full, _ = constructed_sample(sr.make("full"), reused_logprobs="scored")  # the kept prefix gets scored
    m = full.stats.as_dict()
    assert m["reuse/scored_tokens"] == 3 and m["reuse/excess_acceptance"] == pytest.approx((3 - 2.5) / 3)
    _, unscored, _ = constructed_sample(sr.make("full"))  # draft logprobs reported: nothing scored, no meter
    assert unscored.stats.as_dict()["reuse/kl_prev_curr"] == 0.0
    assert unscored.stats.as_dict()["reuse/reused_token_age"] == pytest.approx(7 / 3)  # ages need no scoring


def test_newly_decoded_tokens_start_at_age_zero_with_their_own_p_gen():
    planner = sr.SpeculativePlanner(sr.make("exact"))
    sample = planner.new_sample([1], 5, None)
    output, stored = planner.assemble(sample, [7, 8], [-0.5, -0.25], "stop")
    assert stored.ages.tolist() == [0, 0] and stored.gen_logprobs.tolist() == [-0.5, -0.25]
    assert output.stats.as_dict()["reuse/reused_token_age"] == 0.0


def test_sums_add_up_across_samples():
    a = scored_token_sums(LOG([0.5]), LOG([0.25]), LOG([0.5]), 1.0)
    b = scored_token_sums(LOG([0.5, 0.5]), LOG([0.5, 1.0]), LOG([0.5, 0.25]), 1.0)
    both = scored_token_sums(LOG([0.5, 0.5, 0.5]), LOG([0.25, 0.5, 1.0]), LOG([0.5, 0.5, 0.25]), 1.0)
    assert {k: a[k] + b[k] for k in a} == pytest.approx(both)
    assert reused_token_sums([1, 3, 4]) == {"reused_age_sum": 8.0, "reused_old_tokens": 2.0}
