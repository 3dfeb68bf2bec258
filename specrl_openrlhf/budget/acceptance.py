"""What a slot is worth: the chance that the engine accepts it, learned from the engine's own verdicts
(`AcceptanceModel`), by the bucket of what predicts it (`bucket`, `features`: how the draft was found, where in it the
slot is, how many of the history's responses take its token).

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np

ACCEPTANCE_HALF_LIFE_VERDICTS = 20_000.0  # the counts fade: the policy moves; a verdict is one slot's accepted-or-not

ANCHORED, REENTERED, SHARED, OWN = 0, 1, 2, 3  # how a draft was found (integration.vllm.v1.follow)
POSITION_EDGES = (1, 2, 3, 4, 8)  # positions 0, 1, 2, 3, 4-7, 8+
SUPPORT_EDGES = (0.25, 0.5, 0.75, 0.999)  # share of the paths at the cursor that take the token
MATCH_EDGES = (8, 16)  # a re-entry's match length: < 8, 8-15, 16+
KINDS = 4
SHAPE = (KINDS, len(POSITION_EDGES) + 1, len(SUPPORT_EDGES) + 1, len(MATCH_EDGES) + 1)  # the buckets' axes


def bucket(kind, position, support, match_length):
    """A slot's bucket (a flat index into `SHAPE`): how its draft was found (ANCHORED: the row's whole response is a
    path of the history; REENTERED: a suffix match in it; SHARED: in another prompt's responses; OWN: in the prompt's
    own text), its position in the draft, its support and the match length (anchored: the longest). Plain Python
    over scalars, which the proposer's kernels compile (`integration.vllm.v1.follow`)."""
    p = 0
    while p < len(POSITION_EDGES) and position >= POSITION_EDGES[p]:
        p += 1
    s = 0
    while s < len(SUPPORT_EDGES) and support >= SUPPORT_EDGES[s]:
        s += 1
    m = len(MATCH_EDGES)
    if kind != ANCHORED:
        m = 0
        while m < len(MATCH_EDGES) and match_length >= MATCH_EDGES[m]:
            m += 1
    return ((kind * SHAPE[1] + p) * SHAPE[2] + s) * SHAPE[3] + m


features = np.vectorize(bucket, otypes=[np.int64])  # `bucket` of each slot of arrays (or scalars) of one shape
_KIND, _, _SUPPORT, _ = np.unravel_index(np.arange(int(np.prod(SHAPE))), SHAPE)
COARSE = _KIND * SHAPE[2] + _SUPPORT  # [buckets] int64, each bucket's coarser one (its kind and support)


RESCALE_AT = 1e6  # counts are kept undecayed, the current verdict's weight growing; rescaled before it overflows


def record_verdicts(fine, coarse, total, deciles, table, weight, decay, strength, prior, buckets, hits, predicted):
    """An `AcceptanceModel`'s update by verdicts ([n] `buckets`, `hits`, and `predicted`, empty where not known):
    each weighs 1/decay more than the last (the first: `weight` / decay), counts are rescaled where the weight
    passes RESCALE_AT, and every bucket's prediction is computed anew into `table`. Returns the last verdict's
    weight. Plain Python over arrays, which the proposer compiles (`integration.vllm.v1.follow`)."""
    for i in range(len(buckets)):
        weight /= decay
        b, hit = buckets[i], 1.0 if hits[i] else 0.0
        c = COARSE[b]
        fine[b, 0] += weight * hit
        fine[b, 1] += weight
        coarse[c, 0] += weight * hit
        coarse[c, 1] += weight
        total[0] += weight * hit
        total[1] += weight
        if len(predicted):
            decile = min(int(predicted[i] * 10), 9)
            deciles[decile, 0] += 1.0
            deciles[decile, 1] += predicted[i]
            deciles[decile, 2] += hit
    if weight > RESCALE_AT:
        factor = 1.0 / weight
        fine *= factor
        coarse *= factor
        total *= factor
        weight = 1.0
    k = strength * weight  # the prior's weight, in current verdicts
    overall = (total[0] + k * prior) / (total[1] + k)
    middle = (coarse[:, 0] + k * overall) / (coarse[:, 1] + k)  # [kinds x supports]
    table[:] = (fine[:, 0] + k * middle[COARSE]) / (fine[:, 1] + k)
    return weight


class AcceptanceModel:
    """The chance that a slot is accepted given its row's earlier slots were, learned from verdicts: decayed counts
    per bucket (`features`), each shrunk towards a coarser bucket (kind and support), that one towards all slots,
    and that one towards `prior`. Predicted against observed acceptance is kept per predicted decile (`calibration`).
    Array in, array out: a step's slots are predicted and observed at once.

    >>> model = AcceptanceModel()
    >>> likely, unlikely = features(ANCHORED, 0, 1.0, 0), features(REENTERED, 3, 0.2, 5)
    >>> for _ in range(200):
    ...     model.observe(np.array([likely, unlikely]), np.array([True, False]))
    >>> np.round(model.predict(np.array([likely, unlikely])), 2).tolist()
    [1.0, 0.0]
    """

    def __init__(
        self,
        prior: float = 0.5,
        strength: float = 4.0,
        half_life: float = ACCEPTANCE_HALF_LIFE_VERDICTS,
        record=record_verdicts,
    ):
        if not 0 < prior < 1 or not strength > 0 or not half_life > 0:
            raise ValueError(f"bad acceptance model settings: {prior=}, {strength=}, {half_life=}")
        self.prior, self.strength = float(prior), float(strength)
        self.decay = 0.5 ** (1.0 / half_life)
        self.weight = 1.0  # the current verdict's weight: counts are kept undecayed and rescaled (cheap decay)
        self.fine = np.zeros((int(np.prod(SHAPE)), 2))  # per bucket: [accepted, seen], weighted
        self.coarse = np.zeros((SHAPE[0] * SHAPE[2], 2))  # per (kind, support)
        self.total = np.zeros(2)
        self.deciles = np.zeros((10, 3))  # per predicted decile: verdicts, sum of predictions, acceptances
        self.table = np.full(len(self.fine), self.prior)  # [buckets] every bucket's predicted acceptance
        self.record = record  # `record_verdicts`, or the proposer's compiled copy of it
        self._no_predictions = np.zeros(0)

    @property
    def calibration(self) -> np.ndarray:
        """[10, 3] per decile of the predicted acceptance: verdicts, sum of predictions, sum of acceptances."""
        return self.deciles.copy()

    def predict(self, buckets: np.ndarray) -> np.ndarray:
        """Each slot's predicted acceptance (float64, the shape of `buckets`)."""
        return self.table[buckets]

    def observe(self, buckets: np.ndarray, accepted: np.ndarray, predicted: np.ndarray | None = None) -> None:
        """Verdicts on slots ([n] each); `predicted`: what `predict` said when they were drafted (the calibration)."""
        if not len(buckets):
            return
        predicted = self._no_predictions if predicted is None else np.asarray(predicted, np.float64)
        tables = (self.fine, self.coarse, self.total, self.deciles, self.table)
        buckets, accepted = np.asarray(buckets), np.asarray(accepted)
        settings = (self.weight, self.decay, self.strength, self.prior)
        self.weight = float(self.record(*tables, *settings, buckets, accepted, predicted))
