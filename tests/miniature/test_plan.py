"""The quickstart's plans (`plan`): what the flags plan is tests/miniature/test_quickstart_args.py."""

import pytest

from specrl_openrlhf.miniature.plan import REGIMES, Method, describe_plan, plan


def test_plans_refuse_the_same_rule_twice():
    with pytest.raises(ValueError, match="the same rule twice: spec@1.65"):
        plan([Method.of("spec", 1.65), Method.of("spec", 1.65)], [REGIMES["default"]], [0])


def test_a_plan_is_described_a_line_a_group():
    groups = plan([Method.of("spec", 1.65)], [REGIMES["default"], REGIMES["many-visits"]], [0])
    assert describe_plan(groups).splitlines() == [
        "default/s0: 384 prompts x 3 epochs, lr 0.00015, held-out at the end: default-s0-off, default-s0-spec@1.65",
        "many-visits/s0: 96 prompts x 12 epochs, lr 0.00015, held-out at the end: many-visits-s0-off, "
        "many-visits-s0-spec@1.65",
    ]
