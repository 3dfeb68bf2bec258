"""The rules at each spacing (`at_scale.spacing`): a first visit apart from later ones, and the run's figure as its
regime's visits mix them, by time."""

import numpy as np
import pytest

from specrl_openrlhf.at_scale.run import RuleRun
from specrl_openrlhf.at_scale.spacing import parse_spacings, visit_costs, visit_kept, visit_projections
from specrl_openrlhf.pricing.curves import HostCurve, StepCurve
from specrl_openrlhf.pricing.projection import Pricing, RuleCost, StepCosts, project
from specrl_openrlhf.simulator.regime import REGIMES, Regime

EPOCHS = np.array([0, 0, 1, 1, 2, 3])  # a first visit of two steps, three later visits


def rule_run(gpu, kept_tokens, cost=None) -> RuleRun:
    gpu = np.asarray(gpu, np.float64)
    costs = StepCosts(gpu, gpu / 4, np.zeros_like(gpu), np.full(len(gpu), 8.0))
    steps = np.arange(len(gpu))
    return RuleRun({}, costs, cost or RuleCost(), 0.0, EPOCHS, steps, {}, np.zeros(len(gpu)), 0, None, kept_tokens)


STOCK = rule_run([4, 4, 3, 3, 6, 6], {e: (0, 100) for e in range(4)})
RULE = rule_run([4, 2, 1, 1, 3, 2], {0: (10, 100), 1: (60, 100), 2: (40, 100), 3: (50, 100)}, RuleCost(False, 1.0))
PRICE = StepCurve([{"rows": r, "tokens": q, "seconds": 0.001 * r * q} for r in (1, 8) for q in (1, 2)])
HOST = HostCurve([{"rows": 1, "seconds": 0.0005}, {"rows": 8, "seconds": 0.001}])


def test_spacings_are_rl_steps_each_once_and_the_regimes_last():
    openrlhf = REGIMES["openrlhf"]
    assert parse_spacings("1,8,regime", openrlhf) == [1, 8, 156]
    assert parse_spacings("regime,1,156,1", openrlhf) == [1, 156] and parse_spacings("4", openrlhf) == [4, 156]
    for bad in ("0", "x", "1,-2", ""):
        with pytest.raises(ValueError, match="--spacing"):
            parse_spacings(bad, openrlhf)


def test_a_run_of_as_many_visits_as_the_corpus_holds_is_every_step_once():
    whole = visit_costs(RULE, visits=4)["run"]  # a first visit and three later: each drafted epoch once
    assert whole.total(False) == pytest.approx(RULE.costs.total(False))
    pricing = Pricing(PRICE, host=HOST)
    mixed = visit_projections({"off": STOCK, "rule": RULE}, HOST, PRICE, 8, visits=4)["run"]["rule"]
    assert mixed.projected == pytest.approx(project(STOCK.costs, RULE.costs, RULE.cost, pricing, 8).projected)
    assert visit_kept(RULE, 4)["run"] == pytest.approx(160 / 400)


def test_a_first_visit_and_later_ones_are_apart_and_the_run_weighs_them_by_time():
    costs = visit_costs(RULE, visits=1)
    assert costs["run"] is costs["first"] and costs["first"].total(False) == pytest.approx(
        RULE.costs.take(EPOCHS == 0).total(False)
    )
    assert costs["later"].total(False) == pytest.approx(RULE.costs.take(EPOCHS > 0).total(False))
    kept = visit_kept(RULE, visits=1)
    assert kept == {"first": 0.1, "later": 0.5, "run": 0.1}
    # 15 visits: the first once, the later ones' mean 14 times
    mixed = visit_costs(RULE, visits=15)["run"]
    later = RULE.costs.take(EPOCHS > 0).total(False) / 3
    assert mixed.total(False) == pytest.approx(RULE.costs.take(EPOCHS == 0).total(False) + 14 * later)
    assert visit_kept(RULE, 15)["run"] == pytest.approx((10 + 14 * 50) / (100 + 14 * 100))
    by_part = visit_projections({"off": STOCK, "rule": RULE}, HOST, PRICE, 8, visits=15)
    stock = visit_costs(STOCK, 15)
    for part in ("first", "later", "run"):
        assert by_part[part]["rule"].stock_s == pytest.approx(stock[part].total(True))
    assert by_part["run"]["off"].projected == pytest.approx(1.0)


def test_a_corpus_of_one_epoch_has_a_first_visit_alone():
    one = rule_run([1, 1, 1, 1, 1, 1], {0: (1, 2)})
    one.epochs = np.zeros(6, int)
    assert set(visit_projections({"off": one, "rule": one}, HOST, PRICE, 8, visits=3)) == {"first", "run"}
    assert Regime().visits == 1
