"""Does drafting pay, as measured (`specrl_openrlhf.budget.drafting_check`): the margin a step's predicted gain must
clear, and the probes that keep the counterfactual without drafts measured."""

import doctest

import pytest

from specrl_openrlhf.budget import drafting_check
from specrl_openrlhf.budget.drafting_check import FIRST_PROBE, DraftingCheck


def test_doctests():
    assert doctest.testmod(drafting_check).failed == 0


def test_probes_come_at_doubling_intervals_up_to_probe_every():
    check, probes = DraftingCheck(probe_every=8), []
    for step in range(40):
        probe = check.probe()
        probes += [step] if probe else []
        check.observe(rows=8, drafted=0 if probe else 4, produced=9, seconds=0.01, plain_s=0.01, predicted_gain=0.1)
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:])]  # drafted steps between probes
    assert probes[0] == 0 and gaps[:3] == [FIRST_PROBE * 2, 8, 8]


def test_where_drafts_gain_what_they_predict_the_margin_stays_near_zero():
    check = DraftingCheck()
    for _ in range(200):
        check.observe(rows=32, drafted=0, produced=32, seconds=0.010, plain_s=0.010)
        check.observe(rows=32, drafted=8, produced=40, seconds=0.010, plain_s=0.010, predicted_gain=0.25)
    assert check.margin == pytest.approx(0.0, abs=1e-9) and check.mean_realized_gain == pytest.approx(0.25)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="drafting check"):
        DraftingCheck(probe_every=1)
