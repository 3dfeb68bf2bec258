"""Reuse metrics: sums that add across samples, and what each rule reports per sample to OpenRLHF."""

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.metrics import PREFIX, ReuseStats, sample_metric_names


def test_stats_add_up_and_ratios_come_from_the_sums():
    a = ReuseStats(samples=1, drafts_found=1, reused_tokens=3, examined_tokens=4, tree_nodes=10, tree_branches=2)
    b = ReuseStats(samples=1, drafts_found=1, reused_tokens=1, examined_tokens=4, tree_nodes=10, tree_branches=2)
    metrics = (a + b).as_dict()
    assert metrics[f"{PREFIX}accepted_token_rate"] == 0.5 and metrics[f"{PREFIX}tree_nodes"] == 10.0
    assert all(key.startswith(PREFIX) for key in metrics)


def test_each_rule_reports_the_metrics_that_can_move_for_it():
    every = set(ReuseStats().as_dict())
    spec = sample_metric_names(sr.make("spec"))
    tree = sample_metric_names(sr.make("lossless", verify="requests"))
    own = sample_metric_names(sr.make("lossless", draft="own", verify="requests"))
    engine = sample_metric_names(sr.make("lossless"))
    random = sample_metric_names(sr.make("random"))
    residual = sample_metric_names(sr.make("residual"))
    assert f"{PREFIX}samples" not in spec | tree | random  # OpenRLHF averages per sample
    assert {f"{PREFIX}lenience", f"{PREFIX}excess_acceptance"} <= spec and not {f"{PREFIX}tree_nodes"} & spec
    assert {f"{PREFIX}tree_nodes", f"{PREFIX}branch_switches", f"{PREFIX}resampled_tokens"} <= tree
    assert f"{PREFIX}lenience" not in tree and f"{PREFIX}tree_nodes" not in own
    assert f"{PREFIX}excess_acceptance" in tree  # the staleness meter reports for every rule that scores
    assert f"{PREFIX}kl_prev_curr" in tree and f"{PREFIX}kl_prev_curr" not in random
    assert f"{PREFIX}residual_tail_mass" in residual and f"{PREFIX}residual_tail_mass" not in tree
    assert max(len(spec), len(tree), len(random)) < len(every) - 5
    # verified in the engine: what it drafted and accepted, no scoring requests and no meter (no p_curr of drafts)
    assert {f"{PREFIX}accepted_per_step", f"{PREFIX}reentries", f"{PREFIX}draft_tokens"} <= engine
    assert not {f"{PREFIX}scoring_requests", f"{PREFIX}kl_prev_curr", f"{PREFIX}tree_nodes"} & engine
    assert f"{PREFIX}accepted_per_step" not in tree | spec
    budget = {f"{PREFIX}predicted_acceptance", f"{PREFIX}observed_acceptance", f"{PREFIX}step_token_ms"}
    assert budget <= engine and not budget & (tree | spec)


def test_a_samples_engine_report_becomes_the_budgets_gauges():
    report = {"reports": 2.0, "steps": 100.0, "slots": 250.0, "verdicts": 200.0, "predicted": 120.0}
    report.update(accepted=100.0, cost_base_s=0.012, cost_row_s=0.0002, cost_token_s=0.0001, cost_kv_s=4e-8)
    assert sr.metrics.budget_gauges({}) == {}  # before the engine reported
    first = ReuseStats(samples=1, **sr.metrics.budget_gauges(report))
    metrics = (first + ReuseStats(samples=1)).as_dict()  # a sample without a report does not dilute the means
    assert metrics[f"{PREFIX}engine_reports"] == 0.5 and metrics[f"{PREFIX}drafted_slots"] == 2.5
    assert metrics[f"{PREFIX}predicted_acceptance"] == 0.6 and metrics[f"{PREFIX}observed_acceptance"] == 0.5
    assert metrics[f"{PREFIX}step_base_ms"] == 6.0 and metrics[f"{PREFIX}step_token_ms"] == 0.05  # two proposers
    assert metrics[f"{PREFIX}step_kv_ms"] == pytest.approx(0.02)  # per 1,000 KV tokens


def test_drafts_vllm_accepted_past_a_responses_end_are_not_counted_as_reused():
    """48 tokens, 8 verification steps of 8 drafts: vLLM reports 44 accepted, but its last step's accepted drafts ran
    past max_tokens; the prefill and every step but the last sampled a token of their own: 40 reused, 8 decoded."""
    stats = sr.metrics.verified_in_engine([1, 1, 3, 7, 8, 8, 8, 8], [8] * 8, 48)
    assert (stats.reused_tokens, stats.decoded_tokens, stats.draft_tokens) == (40, 8, 64)
    untouched = sr.metrics.verified_in_engine([2, 0, 1], [3, 3, 3], 10)  # no step ran past the end: all of them
    assert (untouched.reused_tokens, untouched.decoded_tokens, untouched.reentries) == (3, 7, 2)
