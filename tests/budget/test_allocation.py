"""Which slots a step drafts (`specrl_openrlhf.budget.allocation`): the slots that pay, an exploring slot, the static
mode. Exactness does not rest on any of it (a budget only chooses the proposal); the engine tests check that."""

import doctest
import itertools

import numpy as np
import pytest

from specrl_openrlhf.budget import allocation
from specrl_openrlhf.budget.allocation import DraftBudget, goodput_allocate

CPU = np.array([0.006, 0.00005, 0.00005])  # base, per row, per token (s): a step of 32 rows costs about 9 ms


def test_doctests():
    assert doctest.testmod(allocation).failed == 0


def allocate(budget, acceptance, rows, cost, **kw) -> list[int]:
    """`DraftBudget.allocate` on per-row lists of acceptances (padded into its [n, k] matrix)."""
    k = max((len(a) for a in acceptance), default=0)
    matrix = np.zeros((len(acceptance), max(k, 1)))
    for i, a in enumerate(acceptance):
        matrix[i, : len(a)] = a
    return budget.allocate(matrix, np.array([len(a) for a in acceptance], np.int64), rows, cost, **kw).tolist()


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


def test_it_admits_what_the_sorted_scan_admits_ties_included():
    """The set by its definition: slots by survival, best first (equal survivals by row), while the next one raises
    the goodput; acceptances from a few levels, so that many survivals are equal."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        acceptance = [rng.choice([0.3, 0.6, 0.9, 1.0], rng.integers(0, 6)) for _ in range(int(rng.integers(1, 40)))]
        rows, (base, per_row, per_token) = len(acceptance) * int(rng.integers(1, 8)), CPU * rng.uniform(0.2, 5.0, 3)
        slots = sorted((-s, i) for i, a in enumerate(acceptance) for s in np.cumprod(a))
        counts, gained, best = [0] * len(acceptance), 0.0, rows / (base + (per_row + per_token) * rows)
        for n, (minus_survival, i) in enumerate(slots, 1):
            goodput = (rows + gained - minus_survival) / (base + per_row * rows + per_token * (rows + n))
            if goodput <= best:
                break
            best, gained, counts[i] = goodput, gained - minus_survival, counts[i] + 1
        assert allocate(DraftBudget(), acceptance, rows, np.array([base, per_row, per_token])) == counts


def test_within_the_engines_room_it_keeps_the_likeliest_slots_of_the_set_ties_in_row_order():
    """`room` slots at most (the engine's token budget less its rows): of the goodput set, the likeliest that many,
    equal survivals taken in row order (so each row keeps a prefix); its gain is that set's."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        acceptance = [rng.choice([0.3, 0.6, 0.9, 1.0], rng.integers(0, 6)) for _ in range(int(rng.integers(1, 30)))]
        rows, cost = len(acceptance) * int(rng.integers(1, 4)), CPU * rng.uniform(0.2, 5.0, 3)
        free = allocate(DraftBudget(), acceptance, rows, cost)
        room = int(rng.integers(0, sum(free) + 2))
        budget = DraftBudget()
        counts = allocate(budget, acceptance, rows, cost, room=room)
        slots = sorted(
            (-s, i, j) for i, a in enumerate(acceptance) for j, s in enumerate(np.cumprod(a)) if j < free[i]
        )
        expected = [0] * len(acceptance)
        for _, i, _ in slots[:room]:
            expected[i] += 1
        assert counts == expected
        if sum(expected):
            plain = rows / (cost[0] + (cost[1] + cost[2]) * rows)
            assert budget.predicted_gain == pytest.approx(goodput(acceptance, expected, rows, cost) / plain - 1)


def test_the_static_mode_fills_the_room_row_by_row():
    static = allocate(DraftBudget(), [[0.01, 0.01], [0.9], [0.5]], rows=256, cost=CPU, mode="static", room=2)
    assert static == [2, 0, 0]


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


def test_slots_at_or_below_the_floor_are_never_admitted_even_where_every_slot_is():
    """The survival loop ends a row at its first slot whose survival is at or below `floor` (`survival_floor`)."""
    counts = np.zeros(2, np.int64)
    acceptance = np.array([[0.9, 0.5, 1.0], [0.4, 1.0, 1.0]])  # survivals 0.9, 0.45, 0.45; 0.4, 0.4, 0.4
    goodput_allocate(acceptance, np.array([3, 3], np.int64), 2, 0.0, 0.0, 1.0, 0.45, True, counts)
    assert counts.tolist() == [1, 0]
