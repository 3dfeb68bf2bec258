"""What a proposer's budget measured (`specrl_openrlhf.budget.proposer_report`): sums that decay, and the step
cost's terms."""

import numpy as np
import pytest

from specrl_openrlhf.budget.proposer_report import BudgetReport


def test_verdicts_are_summed_the_newest_weighing_one():
    report = BudgetReport(half_life=1.0)  # each older verdict weighs half the next
    report.verdicts(np.array([0.5, 0.5, 0.5]), np.array([True, False, True]))
    assert report.sums["verdicts"] == pytest.approx(1.75) and report.sums["accepted"] == pytest.approx(1.25)
    assert report.sums["predicted"] == pytest.approx(0.875)


def test_the_report_names_the_step_costs_four_terms_and_the_details_each_decile():
    report = BudgetReport()
    report.cost = np.array([0.004, 0.0001, 0.00005, 1e-7])
    report.step(slots=3)
    sent = report.as_dict()
    assert (sent["cost_base_s"], sent["cost_kv_s"], sent["steps"], sent["slots"]) == (0.004, 1e-7, 1.0, 3.0)
    details = report.details()
    assert {"margin", "plain_scale", "propose_s", "decile9_accepted"} <= set(details)
