"""vLLM 0.34's adaptive verification as the simulator runs it (`simulator.adaptive`): its draft budget against a
brute-force search, its admission's threshold and ties, the step shape it prices, and the confidences it reads one
step stale for the count and current for the choice."""

import doctest

import numpy as np
import pytest

from specrl_openrlhf.simulator import adaptive
from specrl_openrlhf.simulator.adaptive import AdaptiveVerification, admit_slots, draft_budget, step_shape
from specrl_openrlhf.simulator.requests import Request


def test_doctests():
    assert doctest.testmod(adaptive).failed == 0


@pytest.mark.parametrize("seed", range(20))
def test_the_budget_maximises_expected_tokens_per_second_over_every_count(seed):
    rng = np.random.default_rng(seed)
    rows, k = rng.integers(1, 6), rng.integers(1, 6)
    stale = rng.random((rows, k)).astype(np.float32)
    scheduled = rng.integers(0, k + 1, rows)
    most = int(scheduled.sum()) if seed % 3 else int(scheduled.sum()) // 2  # a chunk limit below the slots
    costs = 1.0 + rng.random() * np.arange(most + 1) ** rng.uniform(0.5, 1.5)
    sampling = int(rng.integers(0, rows + 1))
    slots = sorted(
        (float(np.prod(stale[r, : s + 1], dtype=np.float64)) for r in range(rows) for s in range(scheduled[r])),
        reverse=True,
    )  # each slot's survival; a prefix of each row is the best, since survival only falls along a row
    best = max(range(most + 1), key=lambda b: ((sampling + sum(slots[:b])) / costs[b], -b))
    assert draft_budget(stale, scheduled, sampling, costs, most) == best


def test_admission_takes_the_best_survival_a_prefix_of_each_row_and_hands_ties_out_in_row_order():
    confidences = np.array([[0.5, 1.0, 1.0], [0.5, 0.5, 0.5], [0.9, 0.1, 1.0]], np.float32)
    capacities = np.array([3, 3, 2])
    # survival: [.5 .5 .5], [.5 .25 .125], [.9 .09 -]: 4 slots are .9 and three .5s of row 0, one .5 of row 1 tied
    assert admit_slots(confidences, capacities, 4).tolist() == [3, 0, 1]
    assert admit_slots(confidences, capacities, 5).tolist() == [3, 1, 1]
    assert admit_slots(confidences, capacities, 8).tolist() == [3, 3, 2]  # the budget holds every slot
    assert admit_slots(confidences, capacities, 0).tolist() == [0, 0, 0]
    assert admit_slots(confidences, np.array([1, 3, 2]), 2).tolist() == [1, 0, 1]  # a row's slots past its capacity
    for budget in range(9):  # exactly the budget, never past a capacity, always a prefix by survival
        admitted = admit_slots(confidences, capacities, budget)
        assert admitted.sum() == min(budget, capacities.sum()) and np.all(admitted <= capacities)
    zeros = np.zeros((2, 3), np.float32)  # fillers: survival 0, ties in row order
    assert admit_slots(zeros, np.array([3, 3]), 4).tolist() == [3, 1]


def rows_of(*shapes):
    """Requests in slots: (prompt, prefilled, taken, draft) each."""
    out = []
    for i, (prompt, prefilled, taken, draft) in enumerate(shapes):
        request = Request(f"r{i}", 0, list(range(prompt)), list(range(50)), prefilled=prefilled, taken=taken)
        request.draft, request.admitted = list(draft), i
        out.append(request)
    return out


def test_the_step_shape_is_the_step_the_engine_runs_next():
    rows = rows_of((10, 10, 3, [1, 2]), (20, 4, 0, []), (30, 0, 0, []), (8, 8, 5, [1]))
    shape = step_shape(rows, prefill_budget=20)  # the second row's 16 left, then 4 of the third's 30
    assert (shape.decode_rows, shape.decode_context) == (2, 13 + 13)
    assert (shape.prefill_tokens, shape.prefill_rows, shape.prefill_context) == (20, 2, 4)
    assert (shape.rows, shape.sampling_rows, shape.non_draft_tokens) == (4, 3, 22)  # the second completes its prompt


class LinearCost:
    """A step's cost: `base` + `per_token` a token, the drafter `drafter` seconds."""

    def __init__(self, base=1.0, per_token=0.1, drafter=0.0):
        self.base, self.per_token, self.drafter = base, per_token, drafter
        self.shapes = []

    def verify(self, shape, drafts):
        self.shapes.append(shape)
        return self.base + self.per_token * (shape.non_draft_tokens + np.asarray(drafts))

    def draft(self, rows):
        return self.drafter


def test_the_count_reads_confidences_one_draft_stale_and_the_choice_the_current_ones():
    verification = AdaptiveVerification(3, LinearCost(per_token=0.2), max_drafts=lambda rows: 100)
    rows = rows_of((10, 10, 3, [7, 7, 7]), (10, 10, 3, [7, 7, 7]))
    # first drafts: the count reads ones (no draft before), which pays every slot: nothing trimmed
    verification.record(["r0", "r1"], np.array([[0.1, 0.1, 0.1], [0.9, 0.9, 0.9]], np.float32))
    assert not verification.admit(rows, 0) and [len(r.draft) for r in rows] == [3, 3]
    # the next drafts: the count reads the first ones (row 1's 3 slots pay, row 0's do not), the choice the current
    verification.record(["r0", "r1"], np.array([[0.95, 0.95, 0.95], [0.1, 0.1, 0.1]], np.float32))
    assert verification.admit(rows, 0) and [len(r.draft) for r in rows] == [3, 0]
    assert verification.binding == 1
    verification.added("r0")  # a request that comes back: ones again for its count
    rows = rows_of((10, 10, 3, [7, 7, 7]), (10, 10, 3, [7, 7, 7]))
    verification.record(["r0", "r1"], np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], np.float32))
    verification.admit(rows, 0)
    assert sum(len(r.draft) for r in rows) >= 3  # r0's stale ones pay its 3 slots at least


def test_the_drafts_never_pass_one_verification_chunks_logits_nor_the_budget_the_step_scheduled():
    cost = LinearCost(per_token=0.0)  # drafts free: every slot pays
    verification = AdaptiveVerification(4, cost, max_drafts=lambda rows: 5)
    rows = rows_of(*[(10, 10, 3, [1, 2, 3, 4])] * 3)
    verification.record([r.id for r in rows], np.full((3, 4), 0.9, np.float32))
    verification.record([r.id for r in rows], np.full((3, 4), 0.9, np.float32))
    assert verification.admit(rows, 0) and sum(len(r.draft) for r in rows) == 5
    rows[2].draft = [1]  # scheduled fewer (the token budget cut it): its capacity
    rows[0].draft, rows[1].draft = [], [1, 2]
    assert not verification.admit(rows, 0) and [len(r.draft) for r in rows] == [0, 2, 1]


def test_every_budget_is_priced_at_the_steps_own_shape():
    cost = LinearCost()
    verification = AdaptiveVerification(2, cost, max_drafts=lambda rows: 100)
    rows = rows_of((10, 10, 3, [1, 2]), (20, 4, 0, []))
    verification.admit(rows, prefill_budget=5)
    assert cost.shapes[-1].prefill_tokens == 5 and cost.shapes[-1].decode_context == 13


def test_a_row_with_nothing_scheduled_is_left_alone():
    verification = AdaptiveVerification(2, LinearCost(), max_drafts=lambda rows: 100)
    rows = rows_of((10, 10, 3, []), (20, 4, 0, [5]))  # the second is prefilling: its draft is not verified
    assert not verification.admit(rows, 0) and rows[1].draft == [5]


def test_brute_force_agrees_with_the_threshold_on_random_confidences():
    rng = np.random.default_rng(7)
    for _ in range(50):
        confidences = rng.choice([0.25, 0.5, 1.0], size=(4, 3)).astype(np.float32)
        capacities = rng.integers(0, 4, 4)
        for budget in range(int(capacities.sum()) + 1):
            admitted = admit_slots(confidences, capacities, budget)
            survival = np.cumprod(confidences, axis=1)
            taken = [survival[r, s] for r in range(4) for s in range(admitted[r])]
            left = [survival[r, s] for r in range(4) for s in range(admitted[r], capacities[r])]
            assert len(taken) == budget and (not taken or not left or min(taken) >= max(left))
