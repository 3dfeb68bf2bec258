"""Stateful rules: feedback from several engines adds up, one coordinator updates the rule, every engine loads the
new state; the adaptive-lenience worked example holds its target while the drift changes."""

import math

import numpy as np
import pytest
import torch

import specrl_openrlhf as sr
from specrl_openrlhf.policies import policy_class
from specrl_openrlhf.policies.stateful import FeedbackBuffer, FeedbackCoordinator
from tests.helpers import ADAPTIVE


class Counting(sr.ReusePolicy):
    """Counts the draft tokens it was offered; its state is the total seen at the last update."""

    needs_scores = False
    keeps_state = True

    def __init__(self, params=None):
        super().__init__(params)
        self.seen, self.updates = 0.0, []

    def cut(self, batch):
        return batch.lengths

    def feedback(self, batch, cuts):
        return {"offered": float(batch.lengths.sum())}

    def update(self, feedback):
        self.updates.append(feedback)
        self.seen += feedback["offered"]

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def test_reports_from_engines_add_up_and_update_once_per_period():
    coordinator = FeedbackCoordinator(Counting(), update_every=8)
    engines = [Counting(), Counting()]
    buffers = [FeedbackBuffer(), FeedbackBuffer()]
    for buffer in buffers:
        for _ in range(3):  # three batches of 2 samples each, 5 tokens per batch
            buffer.add({"offered": 5.0}, samples=2)
    states = [coordinator.report(*buffer.take()) for buffer in buffers]
    assert states == [{"seen": 0.0}, {"seen": 30.0}]  # 6 samples: no update yet; 12 samples: one update of both
    assert coordinator.policy.updates == [{"offered": 30.0}] and coordinator.updates == 1
    for engine in engines:
        engine.load_state_dict(states[-1])
    assert [e.seen for e in engines] == [30.0, 30.0] and buffers[0].take() == ({}, 0)


def test_a_poisoned_report_does_not_poison_the_rule():
    coordinator = FeedbackCoordinator(Counting(), update_every=1)
    assert coordinator.report({"offered": math.nan}, samples=4) == {"seen": 0.0}
    assert coordinator.report({"offered": 3.0}, samples=4) == {"seen": 3.0}


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_update_every_is_validated(value):
    with pytest.raises(ValueError, match="--reuse.update_every"):
        FeedbackCoordinator(Counting(), update_every=value)


def kept_share_under(policy, drift: float, batches: int, seed: int) -> list[float]:
    """Cut batches of drafts whose per-token log-ratio log p_curr - log p_prev is -drift on average, feeding the
    rule back after every batch as a coordinator would; returns the kept share of each batch."""
    rng = np.random.default_rng(seed)
    coordinator = FeedbackCoordinator(policy, update_every=64)
    shares = []
    for _ in range(batches):
        lengths = torch.from_numpy(rng.integers(20, 60, 64))
        draft = torch.from_numpy(rng.uniform(-1.0, 0.0, (64, 60))).float()
        scored = draft - torch.from_numpy(rng.exponential(drift, (64, 60))).float()
        batch = sr.DraftBatch(draft, scored, lengths, torch.from_numpy(rng.random((64, 60))))
        cuts = policy.cut(batch)
        shares.append(float(cuts.sum() / lengths.sum()))
        policy.load_state_dict(coordinator.report(policy.feedback(batch, cuts), 64))
    return shares


def test_adaptive_lenience_holds_its_target_as_the_drift_changes():
    rule = policy_class(ADAPTIVE)(policy_class(ADAPTIVE).Params(target_kept=0.6))
    calm = kept_share_under(rule, drift=0.2, batches=60, seed=0)
    calm_lenience = rule.lenience
    stormy = kept_share_under(rule, drift=1.0, batches=60, seed=1)
    assert np.mean(calm[-20:]) == pytest.approx(0.6, abs=0.05)
    assert np.mean(stormy[-20:]) == pytest.approx(0.6, abs=0.05)
    assert rule.lenience > calm_lenience  # stronger drift needs more lenience for the same share
    fixed = kept_share_under(sr.make("spec"), drift=1.0, batches=20, seed=1)
    assert np.mean(fixed) < 0.5  # a fixed lenience does not hold it
