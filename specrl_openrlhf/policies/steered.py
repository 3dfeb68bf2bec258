"""A lenient rule whose lenience a coordinator steers across batches: the base of adaptive rules."""

from __future__ import annotations

import math
from abc import abstractmethod

import torch

from ..params import check_value
from .base import DraftBatch, ReusePolicy, check_lenience, lenient_cut


def check_steering(owner: str, params) -> None:
    """Validate the steering fields every `SteeredLenience.Params` has: lenience, gain and max_lenience."""
    check_lenience(owner, params.lenience)
    check_value(f"{owner}: gain", params.gain, float, above=0)
    if not 1.0 <= params.lenience <= params.max_lenience < math.inf:
        raise ValueError(
            f"{owner}: need 1 <= lenience <= max_lenience < inf, got {params.lenience} and {params.max_lenience}"
        )


class SteeredLenience(ReusePolicy):
    """SPEC-RL's lenient cut with a lenience that moves between updates: log ℓ += gain · error(feedback), kept within
    [0, log max_lenience]. Subclasses say what they measure (`feedback`: sums, so reports from several engines add
    up) and how far it is from their target (`error`: positive loosens, negative tightens). Their `Params` have
    `lenience` (the start), `gain` and `max_lenience`; `check_steering` validates them.

    Worked examples: policies/adaptive_lenience.py (a target share of kept tokens) and policies/excess_budget.py (a
    budget on excess acceptance).
    """

    prefix_decidable = True  # within a batch the lenience is fixed, so the first rejection still decides the cut
    keeps_state = True

    def __init__(self, params=None):
        super().__init__(params)
        self.log_lenience = math.log(self.params.lenience)

    @property
    def lenience(self) -> float:
        return math.exp(self.log_lenience)

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return lenient_cut(batch, self.lenience)

    @abstractmethod
    def error(self, feedback: dict[str, float]) -> float | None:
        """Target minus measured, from the summed feedback since the last update; None when there is nothing to
        steer by (no draft token was offered)."""

    def update(self, feedback: dict[str, float]) -> None:
        error = self.error(feedback)
        if error is None:
            return
        stepped = self.log_lenience + self.params.gain * error
        self.log_lenience = min(max(stepped, 0.0), math.log(self.params.max_lenience))

    def state_dict(self) -> dict[str, float]:
        return {"log_lenience": self.log_lenience}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.log_lenience = float(state["log_lenience"])
