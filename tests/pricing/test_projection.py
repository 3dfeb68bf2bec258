"""Steps priced with every cost, and a rule against stock with the host's part shown (`pricing.projection`): known
answers, computed by hand, on tiny synthetic curves."""

import json
import math

import numpy as np
import pytest

from specrl_openrlhf.pricing.curves import HostCurve, StepCurve
from specrl_openrlhf.pricing.projection import (
    STOCK,
    Pricing,
    RuleCost,
    StepCosts,
    missing_field,
    project,
    project_steps,
    projected_ratio,
    projected_time,
    step_costs,
)
from specrl_openrlhf.pricing.steps import EngineSteps

# t = 4 ms + 10 us per row + 20 us per token carried, measured on a grid of rows x tokens per row
GRID = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r + 2e-5 * r * q} for r in (32, 64, 128) for q in (1, 2, 5)]
# a 2 x 2 curve: t = 4 ms + 10 us per token carried; prefill 1 ms + 10 us a token
TINY = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r * q} for r in (32, 64) for q in (1, 2)]
TINY_PREFILL = [{"tokens": 100, "seconds": 0.005}, {"tokens": 1100, "seconds": 0.015}]


def steps(*rows_and_tokens, drafted=0, dt=0.01):
    """Decoding steps (rows, tokens carried), one every `dt` seconds."""
    records = [(dt * (i + 1), 0, 0, r, t, drafted, 0) for i, (r, t) in enumerate(rows_and_tokens)]
    return EngineSteps.of(records)


def test_projected_time_sums_the_curve_over_the_steps(tmp_path):
    (tmp_path / "curve.json").write_text(json.dumps({"device": "test GPU", "curve": GRID}))
    curve = StepCurve.load(tmp_path / "curve.json")
    stock = steps((64, 64), (64, 64), (32, 32))  # three decoding steps, one token a row
    drafted = steps((64, 192), (32, 64), drafted=160)  # two steps carrying drafts (3 and 2 tokens a row)
    expected = {
        "stock": 2 * (0.004 + 64e-5 + 2e-5 * 64) + (0.004 + 32e-5 + 2e-5 * 32),
        "drafted": (0.004 + 64e-5 + 2e-5 * 192) + (0.004 + 32e-5 + 2e-5 * 64),
    }
    assert projected_time(stock, curve) == pytest.approx(expected["stock"])
    assert projected_time(drafted, curve) == pytest.approx(expected["drafted"])
    assert projected_ratio(stock, drafted, curve) == pytest.approx(expected["stock"] / expected["drafted"])
    # at the RL scale each step serves 8 times the rows (at most 512), with the same tokens per row
    at_scale = 2 * (0.004 + 512e-5 + 2e-5 * 512) + (0.004 + 256e-5 + 2e-5 * 256)
    assert projected_time(stock, curve, 8, 512) == pytest.approx(at_scale)


def test_step_costs_on_a_tiny_curve_by_hand():
    """Three steps: 64 rows at 2 tokens; 32 rows at 1 with 100 prefill tokens; 600 prefill tokens alone."""
    curve = StepCurve(TINY, prefill=TINY_PREFILL)
    host = HostCurve([{"rows": 32, "seconds": 0.001}, {"rows": 64, "seconds": 0.006}])
    costs = step_costs([64, 32, 0], [128, 32, 0], [0, 100, 600], Pricing(curve, host=host), proposer_s=0.002)
    # 4 + 1.28 ms; 4 + 0.32 + 1 (100 prefill tokens less the column's intercept); 4.32 (the smallest step) + 6
    np.testing.assert_allclose(costs.gpu, [0.00528, 0.00532, 0.01032])
    np.testing.assert_allclose(costs.host, [0.006, 0.001, 0.001])
    np.testing.assert_allclose(costs.rows, [64, 32, 1])
    assert costs.total(async_scheduling=True) == pytest.approx(0.006 + 0.00532 + 0.01032 + 0.006)
    assert costs.total(async_scheduling=False) == pytest.approx(0.02092 + 0.008 + 0.006)
    assert costs.total(async_scheduling=False, host_factor=2.0) == pytest.approx(0.02092 + 0.016 + 0.006)
    assert costs.total(async_scheduling=True, host_factor=0.0) == pytest.approx(0.02092 + 0.006)
    assert Pricing(curve, host=host).prefill == "measured" and Pricing(StepCurve(TINY)).prefill == "modelled"


class ByContext:
    """A step price that models context (as `pricing.kernels` does): 1 ms + 1 us per row and cached token read;
    it refuses a step without its context, and records what it was asked."""

    device, source = "model GPU", "by hand"

    def __init__(self):
        self.asked = []

    def time(self, rows, tokens_per_row, context=None):
        if context is None:
            raise ValueError("pass the context")
        self.asked.append(np.asarray(context).tolist())
        return 0.001 + 1e-6 * np.asarray(rows) * np.asarray(context)

    def prefill_cost(self, tokens, rows=0.0, context=None, sequences=1.0, carried=None):
        self.sequences = np.asarray(sequences).tolist()
        self.prefill_asked = {"context": None if context is None else np.asarray(context).tolist(), "carried": carried}
        return 1e-6 * np.asarray(tokens, np.float64) + 1e-4 * (np.asarray(sequences, np.float64) - 1)

    def logits_cost(self, tokens):
        return 1e-7 * np.asarray(tokens, np.float64)


def test_any_step_price_works_and_reads_each_decoding_rows_mean_context():
    price = ByContext()
    costs = step_costs([10, 20, 0], [10, 20, 0], [0, 0, 500], Pricing(price), decode_context=[1000, 8000, 0])
    assert price.asked[0] == [100.0, 400.0]  # the mean per decoding row, of the decoding steps only
    np.testing.assert_allclose(costs.gpu, [0.001 + 1e-6 * 10 * 100, 0.001 + 1e-6 * 20 * 400, 0.001 + 500e-6])
    with pytest.raises(ValueError, match="pass the context"):  # not recorded: never a silent default
        step_costs([10], [10], [0], Pricing(price), decode_context=[math.nan])
    scoring = step_costs([0], [0], [500], Pricing(price, scale=2), prefill_rows=[3], logit_tokens=[400])
    assert price.sequences == [6.0]  # each step's prefill sequences, scaled with its tokens
    np.testing.assert_allclose(scoring.gpu, [0.001 + 1000e-6 + 5e-4 + 800e-7])  # and the prompt log-probs' logits
    recorded = EngineSteps.of([(0.1, 0, 0, 10, 10, 0, 0, 1000), (0.2, 0, 0, 20, 20, 0, 0, 8000)])
    assert projected_time(recorded, price) == pytest.approx(0.002 + 1e-6 * (1000 + 8000))


def test_a_prefill_is_priced_at_its_sequences_context_beside_the_decoding_rows_tokens():
    """Two steps at scale 2: 256 rows x 4 tokens beside 2 prompts' chunks that had 1,000 tokens cached between them;
    4 fresh prompts alone (the smallest step's one token beside them)."""
    price = ByContext()
    step_costs(
        [256, 0],
        [1024, 0],
        [512, 800],
        Pricing(price, scale=2),
        decode_context=[256 * 100, 0],
        prefill_rows=[2, 4],
        prefill_context=[1000, 0],
    )
    assert price.prefill_asked["context"] == [500.0, 0.0]  # each sequence's, the mean over the step's prefills
    assert np.asarray(price.prefill_asked["carried"]).tolist() == [2048.0, 1.0]  # rows x scale x tokens a row


def test_recorded_steps_keep_a_steps_prompts_apart():
    price = ByContext()
    recorded = EngineSteps.of([(0.1, 16, 8192, 0, 0, 0, 0)])  # 16 prompts of 512 tokens prefilled in one step
    projected_time(recorded, price)
    assert price.sequences == [16.0]


def costs_of(gpu, host, proposer=0.0, rows=64.0):
    gpu = np.asarray(gpu, np.float64)
    return StepCosts(gpu, np.asarray(host, np.float64), np.full(gpu.shape, proposer), np.full(gpu.shape, rows))


FLAT_HOST = HostCurve([{"rows": 32, "seconds": 0.002}, {"rows": 64, "seconds": 0.002}])


def test_the_host_is_shown_four_ways_and_the_tie_solved_by_hand():
    """Stock: two 10 ms steps, 2 ms of host each, hidden. The rule: one 12 ms step, its 2 ms host paid serially and
    1 ms of proposer: 13 + 2h ms against stock's 20 ms ties at h = 3.5, 7 ms of host a full-batch step; with no host,
    13 ms against 20."""
    pricing = Pricing(StepCurve(TINY, prefill=TINY_PREFILL), host=FLAT_HOST)
    stock, rule = costs_of([0.010, 0.010], [0.002, 0.002]), costs_of([0.012], [0.002], proposer=0.001)
    p = project(stock, rule, RuleCost(False, 1.0), pricing, full_rows=64)
    assert p.projected == pytest.approx(0.020 / 0.015) and p.projected_async == pytest.approx(0.020 / 0.013)
    assert p.breakeven_host_ms == pytest.approx(7.0) and p.wins_below and p.host_ms == pytest.approx(2.0)
    assert p.missing == () and p.prefill == "measured"
    assert p.fields("lossless") == (
        "projected[lossless]=1.333 projected_async[lossless]=1.538 projected_no_host[lossless]=1.538 "
        "breakeven_host_ms[lossless]=7.00"
    )
    assert p.projected_no_host == pytest.approx(0.020 / 0.013)
    assert "ties stock at 7.00 ms of host a full-batch step, wins below it" in p.describe()


def test_the_tie_follows_stocks_steps_where_their_host_overtakes_the_forward():
    """Stock's second step (10 ms forward, 10 ms host) turns host-bound past h = 1: stock then grows by 10 ms a unit
    of h, the rule (15 + 2h ms) by 2: they never tie, the rule wins at every host time (inf). A rule that loses with
    no host time and grows faster never ties either (NaN)."""
    pricing = Pricing(StepCurve(TINY), host=FLAT_HOST)
    stock = costs_of([0.010, 0.010], [0.0, 0.010])
    wins = project(stock, costs_of([0.015], [0.002]), RuleCost(False), pricing)
    assert math.isinf(wins.breakeven_host_ms) and "wins at every host time" in wins.describe()
    loses = project(costs_of([0.010], [0.002]), costs_of([0.030], [0.004]), RuleCost(False), pricing)
    assert math.isnan(loses.breakeven_host_ms) and "loses at every host time" in loses.describe()
    # a rule that loses with no host time but pays less host than stock once stock is host-bound wins above the tie:
    # stock 10 + max(10, 20h) ms, the rule 22 + 2h: past h = 1/2, 10 + 20h = 22 + 2h at h = 2/3, 1.33 ms of host
    above = project(costs_of([0.010, 0.010], [0.0, 0.020]), costs_of([0.022], [0.002]), RuleCost(False), pricing)
    assert above.breakeven_host_ms == pytest.approx(2.0 * 2 / 3) and not above.wins_below
    assert "wins above it" in above.describe()


def test_a_missing_input_is_named_never_a_silent_zero():
    curve = StepCurve(TINY)
    unmeasured = RuleCost(False, None)
    p = project_steps(steps((64, 64)), steps((64, 128)), Pricing(curve), unmeasured)
    assert p.missing == ("host", "proposer_cost") and p.prefill == "modelled"
    assert math.isnan(p.breakeven_host_ms) and math.isnan(p.host_ms) and "no host curve" in p.describe()
    assert "missing=host,proposer_cost" in p.describe() and "prefill=modelled" in p.describe()
    assert missing_field({"off": (), "suffix": ("host", "proposer_cost"), "ngram": ("host",)}) == (
        "missing=host,proposer_cost[suffix]"
    )
    assert missing_field({"off": STOCK.missing}) == "missing=none"


def test_a_rule_that_keeps_async_scheduling_hides_its_host_as_stock_does():
    """The request path keeps async scheduling: `projected` is `projected_async`. Stock: two steps of 10 ms forward;
    the rule: one of 16 ms, both 4 ms of host: the rule's host overtakes its forward past h = 4, stock's never
    before h = 2.5; 16 ms against 20 until then, then stock grows 8 ms a unit of h against the rule's 0: never ties."""
    pricing = Pricing(StepCurve(TINY), host=FLAT_HOST)
    p = project(costs_of([0.010, 0.010], [0.004, 0.004]), costs_of([0.016], [0.004]), STOCK, pricing)
    assert p.projected == p.projected_async == pytest.approx(0.020 / 0.016)
    assert math.isinf(p.breakeven_host_ms) and p.wins_below and p.missing == ()
