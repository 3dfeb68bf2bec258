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


def allocate(budget, acceptance, rows, cost, **kw) -> list[int]:
    """`DraftBudget.allocate` on per-row lists of acceptances (padded into its [n, k] matrix)."""
    k = max((len(a) for a in acceptance), default=0)
    matrix = np.zeros((len(acceptance), max(k, 1)))
    for i, a in enumerate(acceptance):
        matrix[i, : len(a)] = a
    return budget.allocate(matrix, np.array([len(a) for a in acceptance], np.int64), rows, cost, **kw).tolist()


def observe(model, slot, accepted, predicted=None):
    model.observe(np.array([slot]), np.array([accepted]), None if predicted is None else np.array([predicted]))


def predict(model, slot) -> float:
    return float(model.predict(np.array([slot]))[0])


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
        counts = allocate(DraftBudget(), acceptance, rows, cost)
        best = max(
            goodput(acceptance, c, rows, cost) for c in itertools.product(*[range(len(a) + 1) for a in acceptance])
        )
        assert goodput(acceptance, counts, rows, cost) == pytest.approx(best)
        assert all(0 <= n <= len(a) for n, a in zip(counts, acceptance))


def test_it_drafts_nothing_when_no_slot_pays():
    unlikely = [np.full(8, 0.02) for _ in range(32)]
    assert allocate(DraftBudget(), unlikely, 32, CPU) == [0] * 32
    assert allocate(DraftBudget(), [], 32, CPU) == []
    compute_bound = np.array([0.0, 0.0, 0.001])  # every carried token costs what a row does
    assert allocate(DraftBudget(), [np.full(4, 0.9)], 1, compute_bound) == [0]


def test_it_drafts_long_when_few_rows_are_left():
    acceptance = np.full(8, 0.6)
    busy = allocate(DraftBudget(), [acceptance] * 256, 256, CPU)
    tail = allocate(DraftBudget(), [acceptance] * 2, 2, CPU)
    assert max(busy) <= 1 and min(tail) >= 6  # in the tail a step's fixed cost dominates: slots of survival 5% pay


def test_on_a_gpus_curve_drafts_pay_at_small_batches_only():
    """The H200's fitted forward of a Qwen3-1.7B shape (docs/benchmarks.md, "The step on a GPU"): a slot pays when its
    survival exceeds per_token x goodput, which is about 7% at 32 rows and 37% at 512, and rises as drafts raise the
    goodput: at 512 rows even drafts of 90% a token pay only to their fourth slot."""
    h200 = np.array([0.00462, 0.000012, 0.0000122])
    acceptance = np.full(8, 0.3)  # survival 0.3, 0.09, 0.027, ...
    assert allocate(DraftBudget(), [acceptance] * 32, 32, h200) == [2] * 32
    assert allocate(DraftBudget(), [acceptance] * 512, 512, h200) == [0] * 512
    likely = np.full(8, 0.9)  # survival 0.9, 0.81, 0.73, 0.66, 0.59, ...
    assert allocate(DraftBudget(), [likely] * 512, 512, h200) == [4] * 512
    assert allocate(DraftBudget(), [likely] * 32, 32, h200) == [8] * 32


def test_the_cost_fit_recovers_a_linear_step_cost_from_noisy_steps():
    rng = np.random.default_rng(1)
    cost = StepCost()
    for _ in range(3000):
        rows = int(rng.integers(1, 256))
        tokens = rows + int(rng.integers(0, 4 * rows + 1))
        seconds = (0.005 + 0.00002 * rows + 0.00008 * tokens) * rng.lognormal(0.0, 0.05)
        cost.observe(rows, tokens, seconds)
    cost.observe(64, 64, 5.0)  # a stall (a weight load, a collection) is not a step
    base, per_row, per_token, _ = cost.params
    assert base == pytest.approx(0.005, rel=0.1) and per_token == pytest.approx(0.00008, rel=0.05)
    assert per_row == pytest.approx(0.00002, abs=0.00001)


def test_until_drafts_vary_the_prior_splits_a_rows_cost_with_its_tokens():
    cost = StepCost()
    for rows in (8, 16, 32, 64) * 10:  # plain decoding: tokens = rows
        cost.observe(rows, rows, 0.004 + 0.0002 * rows)
    base, per_row, per_token, _ = cost.params
    assert base == pytest.approx(0.004, rel=0.05) and per_row == pytest.approx(per_token, rel=0.05)
    assert per_row + per_token == pytest.approx(0.0002, rel=0.05)


def test_acceptance_is_calibrated_on_recorded_verdicts():
    """Verdicts drawn with a known chance per kind of slot: predictions land on it, and the calibration table's
    predicted and observed means agree in every decile it filled."""
    rng = np.random.default_rng(2)
    truth = {
        int(features(ANCHORED, 0, 1.0, 0)): 0.95,
        int(features(ANCHORED, 2, 0.6, 0)): 0.6,
        int(features(REENTERED, 0, 0.3, 5)): 0.25,
        int(features(REENTERED, 5, 0.1, 20)): 0.05,
    }
    model = AcceptanceModel()
    slots = np.array(list(truth))
    chance = np.array([truth[s] for s in slots])
    for _ in range(200):  # a step's verdicts at a time, as the proposer gives them
        drawn = rng.integers(len(slots), size=100)
        model.observe(slots[drawn], rng.random(100) < chance[drawn], model.predict(slots[drawn]))
    for slot, p in truth.items():
        assert predict(model, slot) == pytest.approx(p, abs=0.03)
    filled = model.calibration[model.calibration[:, 0] > 500]
    assert len(filled) >= 3
    assert np.allclose(filled[:, 1] / filled[:, 0], filled[:, 2] / filled[:, 0], atol=0.03)


def test_acceptance_follows_a_policy_that_moves():
    model, slot = AcceptanceModel(half_life=500), int(features(ANCHORED, 0, 1.0, 0))
    model.observe(np.full(2000, slot), np.ones(2000, bool))
    model.observe(np.full(2000, slot), np.zeros(2000, bool))  # the policy moved away from the history
    assert predict(model, slot) < 0.1


def test_an_unseen_slot_is_predicted_from_what_is_known_of_its_kind():
    model = AcceptanceModel()
    model.observe(np.full(500, features(ANCHORED, 0, 1.0, 0)), np.ones(500, bool))
    assert predict(model, features(ANCHORED, 3, 1.0, 0)) > 0.9  # same kind and support, another position
    unseen = predict(model, features(REENTERED, 0, 0.2, 4))  # nothing known of its kind: the overall rate
    assert unseen == pytest.approx((500 + 4 * 0.5) / (500 + 4), abs=0.01)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="step cost"):
        StepCost(half_life=0)
    with pytest.raises(ValueError, match="acceptance model"):
        AcceptanceModel(prior=1.0)


def test_the_static_mode_drafts_every_candidate_slot():
    static = allocate(
        DraftBudget(), [[0.01, 0.01], [0.9]], rows=256, cost=np.array([0.004, 0.0, 0.001]), mode="static"
    )
    assert static == [2, 1]


def test_after_idle_steps_the_likeliest_slot_is_explored():
    """Where nothing pays, one slot (the likeliest) every `EXPLORE_EVERY` steps keeps acceptance learned."""
    budget, cost = DraftBudget(explore_every=4), np.array([0.004, 0.0, 0.001])
    counts = [allocate(budget, [[0.2, 0.1], [0.3]], rows=64, cost=cost) for _ in range(8)]
    assert counts == [[0, 0]] * 3 + [[0, 1]] + [[0, 0]] * 3 + [[0, 1]]
    assert allocate(budget, [], rows=64, cost=cost) == [] and budget.idle_steps == 0  # nothing to draft: not idle
