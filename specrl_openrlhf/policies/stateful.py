"""Rules that keep state across batches: feedback is summed, one coordinator updates the rule.

Every engine cuts its own batches with its own copy of the rule. It adds each batch's `feedback` to a
`FeedbackBuffer` and reports it now and then; the coordinator (in-process, or one Ray actor for a whole run) sums
the reports of all engines, calls `update` once per `update_every` samples, and answers with the rule's new state,
which the engine loads. Feedback values are sums by contract, so adding reports is how batches and engines combine.
"""

from __future__ import annotations

import math

from ..params import check_value
from .base import ReusePolicy


def add_feedback(total: dict[str, float], feedback: dict[str, float]) -> None:
    for key, value in feedback.items():
        total[key] = total.get(key, 0.0) + float(value)


class FeedbackBuffer:
    """An engine's feedback not yet reported."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.samples = 0

    def add(self, feedback: dict[str, float], samples: int) -> None:
        add_feedback(self.sums, feedback)
        self.samples += samples

    def take(self) -> tuple[dict[str, float], int]:
        sums, samples = self.sums, self.samples
        self.sums, self.samples = {}, 0
        return sums, samples


class FeedbackCoordinator:
    """The authoritative copy of a stateful rule.

    >>> import specrl_openrlhf as sr
    >>> coordinator = FeedbackCoordinator(sr.make("spec"), update_every=8)
    >>> coordinator.report({}, samples=8)
    {}
    >>> coordinator.updates
    1
    """

    def __init__(self, policy: ReusePolicy, update_every: int):
        check_value("--reuse.update_every", update_every, int, at_least=1)
        self.policy = policy
        self.update_every = update_every
        self.pending = FeedbackBuffer()
        self.updates = 0

    def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        """Add one engine's report; update the rule when enough samples have been reported. Returns the state."""
        self.pending.add(feedback, samples)
        if self.pending.samples >= self.update_every:
            sums, _ = self.pending.take()
            if all(math.isfinite(v) for v in sums.values()):  # a poisoned report must not poison the rule
                self.policy.update(sums)
            self.updates += 1
        return self.policy.state_dict()
