"""Draft budgets (`specrl_openrlhf.budget`): the slots that pay, the step cost fitted online, acceptance learned from
verdicts. Exactness does not rest on any of it (a budget only chooses the proposal); the engine tests check that."""

import doctest
import itertools

import numpy as np
import pytest

from specrl_openrlhf import budget as budget_module
from specrl_openrlhf.budget import ANCHORED, REENTERED, AcceptanceModel, DraftBudget, StepCost, features

CPU = np.array([0.006, 0.00005, 0.00005])  # base, per row, per token (s): a step of 32 rows costs about 9 ms


def test_doctests():
    assert doctest.testmod(budget_module).failed == 0


def goodput(acceptance, counts, rows, cost):
    base, per_row, per_token = cost
    gained = sum(np.cumprod(a[:n]).sum() for a, n in zip(acceptance, counts))
    return (rows + gained) / (base + per_row * rows + per_token * (rows + sum(counts)))


def test_it_picks_the_slots_with_the_best_goodput():
    """Against every way to cut three rows' drafts (prefixes of up to 4 slots each)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        acceptance = [rng.uniform(0.05, 1.0, rng.integers(0, 5)) for _ in range(3)]
        rows = int(rng.integers(3, 64))
        cost = CPU * rng.uniform(0.2, 5.0, 3)
        counts = DraftBudget().allocate(acceptance, rows, cost)
        best = max(
            goodput(acceptance, c, rows, cost) for c in itertools.product(*[range(len(a) + 1) for a in acceptance])
        )
        assert goodput(acceptance, counts, rows, cost) == pytest.approx(best)
        assert all(0 <= n <= len(a) for n, a in zip(counts, acceptance))


def test_it_drafts_nothing_when_no_slot_pays():
    unlikely = [np.full(8, 0.02) for _ in range(32)]
    assert DraftBudget().allocate(unlikely, 32, CPU) == [0] * 32
    assert DraftBudget().allocate([], 32, CPU) == []
    compute_bound = np.array([0.0, 0.0, 0.001])  # every carried token costs what a row does
    assert DraftBudget().allocate([np.full(4, 0.9)], 1, compute_bound) == [0]


def test_it_drafts_long_when_few_rows_are_left():
    acceptance = np.full(8, 0.6)
    busy = DraftBudget().allocate([acceptance] * 256, 256, CPU)
    tail = DraftBudget().allocate([acceptance] * 2, 2, CPU)
    assert max(busy) <= 1 and min(tail) >= 6  # in the tail a step's fixed cost dominates: slots of survival 5% pay


def test_on_a_gpus_step_curve_drafts_pay_at_small_batches_only():
    """The H200's fitted forward of a Qwen3-1.7B shape (docs/benchmarks.md, "The step on a GPU"): a slot pays when its
    survival exceeds per_token x goodput, which is about 7% at 32 rows and 37% at 512, and rises as drafts raise the
    goodput: at 512 rows even drafts of 90% a token pay only to their fourth slot."""
    h200 = np.array([0.00462, 0.000012, 0.0000122])
    acceptance = np.full(8, 0.3)  # survival 0.3, 0.09, 0.027, ...
    assert DraftBudget().allocate([acceptance] * 32, 32, h200) == [2] * 32
    assert DraftBudget().allocate([acceptance] * 512, 512, h200) == [0] * 512
    likely = np.full(8, 0.9)  # survival 0.9, 0.81, 0.73, 0.66, 0.59, ...
    assert DraftBudget().allocate([likely] * 512, 512, h200) == [4] * 512
    assert DraftBudget().allocate([likely] * 32, 32, h200) == [8] * 32


def test_the_cost_fit_recovers_a_linear_step_cost_from_noisy_steps():
    rng = np.random.default_rng(1)
    cost = StepCost()
    for _ in range(3000):
        rows = int(rng.integers(1, 256))
        tokens = rows + int(rng.integers(0, 4 * rows + 1))
        seconds = (0.005 + 0.00002 * rows + 0.00008 * tokens) * rng.lognormal(0.0, 0.05)
        cost.observe(rows, tokens, seconds)
    cost.observe(64, 64, 5.0)  # a stall (a weight load, a collection) is not a step
    base, per_row, per_token = cost.params
    assert base == pytest.approx(0.005, rel=0.1) and per_token == pytest.approx(0.00008, rel=0.05)
    assert per_row == pytest.approx(0.00002, abs=0.00001)


def test_until_drafts_vary_the_prior_splits_a_rows_cost_with_its_tokens():
    cost = StepCost()
    for rows in (8, 16, 32, 64) * 10:  # plain decoding: tokens = rows
        cost.observe(rows, rows, 0.004 + 0.0002 * rows)
    base, per_row, per_token = cost.params
    assert base == pytest.approx(0.004, rel=0.05) and per_row == pytest.approx(per_token, rel=0.05)
    assert per_row + per_token == pytest.approx(0.0002, rel=0.05)


def test_acceptance_is_calibrated_on_recorded_verdicts():
    """Verdicts drawn with a known chance per kind of slot: predictions land on it, and the calibration table's
    predicted and observed means agree in every decile it filled."""
    rng = np.random.default_rng(2)
    truth = {
        features(ANCHORED, 0, 1.0): 0.95,
        features(ANCHORED, 2, 0.6): 0.6,
        features(REENTERED, 0, 0.3, 5): 0.25,
        features(REENTERED, 5, 0.1, 20): 0.05,
    }
    model = AcceptanceModel()
    slots = list(truth)
    for _ in range(20000):
        slot = slots[rng.integers(len(slots))]
        model.observe(slot, rng.random() < truth[slot], model.predict(slot))
    for slot, p in truth.items():
        assert model.predict(slot) == pytest.approx(p, abs=0.03)
    filled = model.calibration[model.calibration[:, 0] > 500]
    assert len(filled) >= 3
    assert np.allclose(filled[:, 1] / filled[:, 0], filled[:, 2] / filled[:, 0], atol=0.03)


def test_acceptance_follows_a_policy_that_moves():
    model, slot = AcceptanceModel(half_life=500), features(ANCHORED, 0, 1.0)
    for _ in range(2000):
        model.observe(slot, True)
    for _ in range(2000):  # the policy moved away from the history
        model.observe(slot, False)
    assert model.predict(slot) < 0.1


def test_an_unseen_slot_is_predicted_from_what_is_known_of_its_kind():
    model = AcceptanceModel()
    for _ in range(500):
        model.observe(features(ANCHORED, 0, 1.0), True)
    assert model.predict(features(ANCHORED, 3, 1.0)) > 0.9  # same kind and support, another position
    unseen = model.predict(features(REENTERED, 0, 0.2, 4))  # nothing known of its kind: the overall rate
    assert unseen == pytest.approx((500 + 4 * 0.5) / (500 + 4), abs=0.01)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="step cost"):
        StepCost(half_life=0)
    with pytest.raises(ValueError, match="acceptance model"):
        AcceptanceModel(prior=1.0)


def test_the_static_mode_drafts_every_candidate_slot():
    budget = DraftBudget()
    assert budget.allocate([[0.01, 0.01], [0.9]], rows=256, cost=np.array([0.004, 0.0, 0.001]), mode="static") == [
        2,
        1,
    ]


def test_after_idle_steps_the_likeliest_slot_is_explored():
    """Where nothing pays, one slot (the likeliest) every `EXPLORE_EVERY` steps keeps acceptance learned."""
    budget, cost = DraftBudget(explore_every=4), np.array([0.004, 0.0, 0.001])
    counts = [budget.allocate([[0.2, 0.1], [0.3]], rows=64, cost=cost) for _ in range(8)]
    assert counts == [[0, 0]] * 3 + [[0, 1]] + [[0, 0]] * 3 + [[0, 1]]
    assert budget.allocate([], rows=64, cost=cost) == [] and budget.idle_steps == 0  # nothing to draft: not idle
