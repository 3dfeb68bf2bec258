"""The long corpus's task (`miniature.walk_task`): long walks with a fork a line, the teacher's and the reward."""

import random
import statistics

import pytest

from specrl_openrlhf.analysis.corpus import repeated_tokens
from specrl_openrlhf.miniature.walk_task import WalkTaskConfig, reward, solve


def test_a_careful_teachers_walk_reaches_zero_in_steps_of_2_or_3_and_earns_the_whole_reward():
    config = WalkTaskConfig(teacher_error_rate=0.0)
    walk = solve(231, random.Random(0), config)
    lines = walk.splitlines()
    assert lines[-1].endswith("=0") and all(line[1] in "23" for line in lines)
    assert 231 / 3 <= len(lines) <= 231 / 2 + 1 and reward(walk, 231) == 1.0
    assert repeated_tokens(list(walk)) == 0  # what is left never repeats: no loops


def test_the_recorded_walks_are_long_and_their_steps_are_forks():
    config = WalkTaskConfig()
    rng = random.Random(1)
    walks = [solve(d, rng, config) for d in config.problems(32)]
    assert statistics.mean(len(w) for w in walks) >= 600
    steps = [line[1] for w in walks for line in w.splitlines()]
    assert 0.3 < steps.count("2") / len(steps) < 0.7


def test_the_reward_counts_right_lines_and_a_walk_that_ends_on_zero():
    assert reward("-3=7\n-2=5\n-3=2\n-2=0\n", 10) == 1.0
    assert reward("-3=7\n-2=6\n-3=3\n-3=0\n", 10) == pytest.approx(0.5 * 3 / 4 + 0.5)  # one wrong line
    assert reward("-3=7\n-2=5\n", 10) == 0.5  # stopped short
    assert reward("no walk", 10) == 0.0


def test_the_warm_start_trains_on_short_walks_whole_and_long_ones_cut():
    config = WalkTaskConfig()
    examples = config.warm_start_examples(200, seed=2)
    assert max(len(s.splitlines()) for _, s, _ in examples) == config.warm_start_lines
    assert any(whole for *_, whole in examples) and not all(whole for *_, whole in examples)
    assert all(s.endswith("=0\n") or not whole for _, s, whole in examples if "=1\n" not in s[-4:])
    with pytest.raises(ValueError, match="max_distance <= 999"):
        WalkTaskConfig(max_distance=1200)
    assert len(set(config.problems(32))) == 32 and config.problems(32) == WalkTaskConfig().problems(32)
