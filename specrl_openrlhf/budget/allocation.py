"""Which slots a step drafts (`DraftBudget`): the goodput-maximising set, by survival, best first (`goodput_allocate`,
plain Python over arrays that the proposer compiles), with an exploring slot after idle steps, or every candidate slot
in the `static` mode.

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np

EXPLORE_EVERY = 16  # steps without a drafted slot, after which the likeliest one is drafted anyway: verdicts go on
EXPLORE_MARGIN = 0.02  # no exploring slot while drafting gains less than predicted by more than this
BUDGET_MODES = ("goodput", "static")


def survival_floor(rows, base, per_row, per_token):
    """The survival at or below which a slot never pays: a slot pays when its survival exceeds per_token x the goodput
    so far, which admitting paying slots only raises, so slots below per_token x the goodput without drafts never do
    (most of them, in a busy step)."""
    return per_token * rows / max(base + (per_row + per_token) * rows, 1e-12)


def goodput_allocate(acceptance, lengths, rows, base, per_row, per_token, floor, admit_all, counts, room=-1):
    """Adds to `counts` ([n]) each row's count in the goodput-maximising set of slots (`admit_all`: every slot) and
    returns the set's predicted gain: slots by survival (the product of a row's acceptances up to the slot), best
    first, while the next one raises (rows + expected tokens) / step time; slots at or below `floor` never pay
    (`survival_floor`; -1 with `admit_all`). `room`: the most slots the step carries (the engine's token budget
    less its rows; -1: no limit), the likeliest that many where the set holds more. `lengths`: [n] int64. Plain Python
    over arrays, which the proposer compiles (`integration.vllm.v1.follow`).

    No sort: a slot raises the goodput g of the slots before it where its survival exceeds per_token x g, and g only
    rises while slots are admitted, so the set is every slot whose survival exceeds per_token x the set's own
    goodput (best first, the goodput rises, then never again; equal survivals stay together). Dinkelbach's iteration
    finds it: from the goodput without drafts, the slots above per_token x g, then g of those, until they stay the
    same (each set holds the next one, so a few passes). A `room` smaller than the set sorts its slots once."""
    survival, owner = np.empty(lengths.sum()), np.empty(lengths.sum(), np.int64)  # the slots above `floor`, by row
    total = 0
    for i in range(len(lengths)):
        alive = 1.0
        for j in range(lengths[i]):
            alive *= acceptance[i, j]
            if alive <= floor:
                break
            survival[total], owner[total] = alive, i
            total += 1
    if total == 0:
        return 0.0
    fixed = base + per_row * rows
    plain = rows / max(fixed + per_token * rows, 1e-12)
    goodput, threshold, admitted = plain, -1.0 if admit_all else per_token * plain, -1
    while True:
        n, gained = 0, 0.0
        for j in range(total):
            if survival[j] > threshold:
                n += 1
                gained += survival[j]
        if n == admitted:
            break
        admitted, goodput = n, (rows + gained) / max(fixed + per_token * (rows + n), 1e-12)
        if admit_all:
            break
        threshold = per_token * goodput
    if 0 <= room < admitted:  # the likeliest `room` slots: those above the room-th survival, then its equals in turn
        if room == 0:
            return 0.0
        threshold = np.sort(survival[:total])[total - room]
        ties = room
        for j in range(total):
            if survival[j] > threshold:
                ties -= 1
        gained = 0.0
        for j in range(total):
            if survival[j] > threshold or (ties > 0 and survival[j] == threshold):
                if survival[j] == threshold:
                    ties -= 1
                counts[owner[j]] += 1
                gained += survival[j]
        goodput = (rows + gained) / max(fixed + per_token * (rows + room), 1e-12)
        return goodput / plain - 1.0
    for j in range(total):
        if survival[j] > threshold:
            counts[owner[j]] += 1
    return goodput / plain - 1.0


def within_room(counts: np.ndarray, room: int) -> np.ndarray:
    """`counts` [n] cut to `room` slots in all (-1: no limit) row by row, as the engine cuts drafts its token budget
    can't carry.

    >>> within_room(np.array([3, 2, 4]), 4).tolist()
    [3, 1, 0]
    """
    if room < 0:
        return counts.copy()
    before = np.cumsum(counts) - counts  # slots of the rows before each
    return np.clip(room - before, 0, counts)


class DraftBudget:
    """How many slots each row of a step drafts: in the `goodput` mode, the prefix of each row's candidates that the
    goodput-maximising set of slots holds, and after `explore_every` steps without a slot the likeliest one; in the
    `static` mode (the ablation without a budget), every candidate slot.

    >>> budget = DraftBudget()
    >>> cost = np.array([0.004, 0.0001, 0.00005])  # base, per row, per token (s)
    >>> budget.allocate(np.array([[0.9, 0.9, 0.9], [0.3, 0.3, 0.0]]), np.array([3, 2]), 2, cost).tolist()  # long
    [3, 2]
    >>> budget.allocate(np.array([[0.9, 0.9, 0.9], [0.1, 0.9, 0.0]]), np.array([3, 2]), 256, cost).tolist()  # busy
    [3, 0]
    """

    def __init__(self, explore_every: int = EXPLORE_EVERY, goodput=goodput_allocate):
        self.explore_every = explore_every
        self.goodput = goodput  # `goodput_allocate`, or the proposer's compiled copy of it
        self.idle_steps = 0  # steps since a slot was last drafted
        self.predicted_gain: float | None = 0.0  # of the last allocation (None: static, which predicts nothing)

    def allocate(
        self,
        acceptance: np.ndarray,
        lengths: np.ndarray,
        rows: int,
        cost: np.ndarray,
        mode: str = "goodput",
        margin: float = 0.0,
        room: int = -1,
    ) -> np.ndarray:
        """`acceptance`: [n, k] the conditional acceptance of each candidate row's slots, the first `lengths[i]` of
        row i valid; `rows`: the rows the step serves (each produces one token whatever is drafted); `cost`: [3]
        (base, per_row, per_token), the step's linear cost (`pricing.online.OnlineStepCost.at`, or a GPU price's
        `budget_cost`); `mode`: one of `BUDGET_MODES`; `margin`: the predicted gain a goodput step's drafts must
        clear (`DraftingCheck.margin`; inf: a probe, nothing drafted); `room`: the most slots the step carries (-1:
        no limit; `static` fills it row by row, as the engine would cut). Returns each candidate row's count ([n])."""
        lengths = np.asarray(lengths, np.int64)
        if mode == "static":
            self.predicted_gain = None
            return within_room(lengths, room)
        counts, gain = self.goodput_counts(acceptance, lengths, rows, cost, room=room)
        if gain <= margin:
            counts, gain = np.zeros_like(lengths), 0.0
        if len(lengths) and not counts.any():
            self.idle_steps += 1
            if self.idle_steps >= self.explore_every and margin <= EXPLORE_MARGIN and lengths.any() and room != 0:
                first = np.where(lengths > 0, acceptance[:, 0], -1.0)
                best = int(np.argmax(first))  # the likeliest slot
                counts[best], self.idle_steps = 1, 0
                gain = self.goodput_counts(acceptance[best : best + 1, :1], np.ones(1, np.int64), rows, cost, True)[1]
        else:
            self.idle_steps = 0
        self.predicted_gain = gain
        return counts

    def goodput_counts(self, acceptance, lengths, rows: int, cost: np.ndarray, admit_all: bool = False, room=-1):
        """Each row's count in the goodput-maximising set of slots (`admit_all`: every slot; at most `room` of
        them, -1: no limit), and their gain."""
        counts = np.zeros(len(lengths), np.int64)
        if not len(lengths) or not lengths.any():
            return counts, 0.0
        base, per_row, per_token = (float(x) for x in cost)
        floor = -1.0 if admit_all else survival_floor(rows, base, per_row, per_token)
        gain = self.goodput(acceptance, lengths, rows, base, per_row, per_token, floor, admit_all, counts, int(room))
        return counts, float(gain)
