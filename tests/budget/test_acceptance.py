"""What a slot is worth (`specrl_openrlhf.budget.acceptance`): acceptance learned from verdicts, by bucket."""

import doctest

import numpy as np
import pytest

from specrl_openrlhf.budget import acceptance
from specrl_openrlhf.budget.acceptance import ANCHORED, REENTERED, AcceptanceModel, features


def test_doctests():
    assert doctest.testmod(acceptance).failed == 0


def observe(model, slot, accepted, predicted=None):
    model.observe(np.array([slot]), np.array([accepted]), None if predicted is None else np.array([predicted]))


def predict(model, slot) -> float:
    return float(model.predict(np.array([slot]))[0])


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
    with pytest.raises(ValueError, match="acceptance model"):
        AcceptanceModel(prior=1.0)
