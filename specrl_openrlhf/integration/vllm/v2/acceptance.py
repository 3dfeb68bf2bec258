"""The acceptance model on the device: the core's `budget.acceptance` (its buckets, prior, shrinkage and half-life),
kept in device tensors and updated from vLLM's verdicts with no host sync.

A verdict: one draft slot of a row, accepted or not. The engine reports, per row, the tokens it sampled (its accepted
draft tokens + 1) and the draft tokens it rejected: the slots up to the first rejection were accepted, that one was
rejected, later ones were never judged (as the V1 proposer reads them from the tokens). Counts are summed per step as
integers (order-free, so every tensor-parallel rank keeps the same model bit for bit), then weighed: a step's verdicts
weigh alike, each step 1/decay^n more than the last for its n verdicts (the core weighs each verdict 1/decay more than
the one before it: the same fading, by steps). Every bucket's prediction is shrunk towards its kind-and-support bucket,
that towards all slots, that towards the prior, as `budget.acceptance.record_verdicts` computes it.
"""

from __future__ import annotations

import math

import torch

from ....budget.acceptance import ACCEPTANCE_HALF_LIFE_VERDICTS, COARSE, RESCALE_AT, SHAPE

BUCKETS = int(math.prod(SHAPE))


class DeviceAcceptance:
    """Decayed counts per bucket on the device, and the table of every bucket's predicted acceptance."""

    def __init__(self, device, prior: float = 0.5, strength: float = 4.0, half_life=ACCEPTANCE_HALF_LIFE_VERDICTS):
        self.prior, self.strength = float(prior), float(strength)
        self.log_decay = math.log(0.5) / half_life  # log of the per-verdict decay (< 0)
        self.coarse_of = torch.as_tensor(COARSE, device=device)  # [BUCKETS] each bucket's coarser one
        self.fine = torch.zeros(BUCKETS, 2, dtype=torch.float64, device=device)  # [accepted, seen], weighted
        self.coarse = torch.zeros(SHAPE[0] * SHAPE[2], 2, dtype=torch.float64, device=device)
        self.total = torch.zeros(2, dtype=torch.float64, device=device)
        # the latest verdicts' weight, [1], changed in place (a 0-dim tensor's in-place change is lost when compiled)
        self.weight = torch.ones(1, dtype=torch.float64, device=device)
        self.table = torch.full((BUCKETS,), self.prior, dtype=torch.float32, device=device)  # [BUCKETS]

    def reset(self) -> None:
        for counts in (self.fine, self.coarse, self.total):
            counts.zero_()
        self.weight.fill_(1.0)
        self.table.fill_(self.prior)

    def observe(
        self,
        bucket: torch.Tensor,  # [n] int64, each judged-or-not slot's bucket
        judged: torch.Tensor,  # [n] bool, whether the engine judged it
        hit: torch.Tensor,  # [n] bool, whether it was accepted (read where judged)
    ) -> None:
        """One step's verdicts into the counts, then the table anew."""
        b = torch.where(judged, bucket, 0)
        seen = torch.zeros(BUCKETS, dtype=torch.int64, device=b.device).index_add_(0, b, judged.long())
        took = torch.zeros(BUCKETS, dtype=torch.int64, device=b.device).index_add_(0, b, (judged & hit).long())
        n = seen.sum()
        self.weight.mul_(torch.exp(-self.log_decay * n.double()))
        fine = torch.stack([took, seen], dim=1)  # [BUCKETS, 2] int64: sums in any order are the same
        coarse = torch.zeros(self.coarse.shape, dtype=torch.int64, device=b.device).index_add_(0, self.coarse_of, fine)
        self.fine += fine.double() * self.weight
        self.coarse += coarse.double() * self.weight
        self.total += fine.sum(dim=0).double() * self.weight
        factor = torch.where(self.weight > RESCALE_AT, 1.0 / self.weight, torch.ones_like(self.weight))
        for counts in (self.fine, self.coarse, self.total):
            counts.mul_(factor)
        self.weight.mul_(factor)
        self._predict()

    def _predict(self) -> None:
        k = self.strength * self.weight  # the prior's weight, in current verdicts
        overall = (self.total[0] + k * self.prior) / (self.total[1] + k)
        middle = (self.coarse[:, 0] + k * overall) / (self.coarse[:, 1] + k)
        self.table.copy_((self.fine[:, 0] + k * middle[self.coarse_of]) / (self.fine[:, 1] + k))
