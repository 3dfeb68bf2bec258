"""The long corpus's task (`miniature.walk_task`): long walks with forks, the teacher's and the reward."""

import random
import statistics

import pytest

from specrl_openrlhf.miniature.walk_task import WARM_START_RUN, WalkTaskConfig, reward, solve
from specrl_openrlhf.simulator.corpus import repeated_tokens


def test_the_teachers_walk_counts_down_to_100_with_two_letters_a_line():
    walk = solve(213, random.Random(0))
    lines = walk.splitlines()
    assert len(lines) == 113 and lines[0][:3] == "212" and lines[-1][:3] == "100"
    assert all(len(line) == 5 and set(line[3:]) <= set("abc") for line in lines)
    assert repeated_tokens(list(walk)) == 0  # numbers never repeat: no loops


def test_the_recorded_walks_are_long_and_their_letters_are_forks():
    config = WalkTaskConfig()
    rng = random.Random(1)
    walks = [solve(start, rng) for start in config.problems(32)]
    assert statistics.mean(len(w) for w in walks) >= 600 and max(len(w) for w in walks) < 1024
    letters = "".join(line[3:] for w in walks for line in w.splitlines())
    assert 0.5 < letters.count("a") / len(letters) < 0.7


def test_the_reward_pays_each_number_of_the_walk_written_with_matching_letters_and_a_walk_that_ends_at_100():
    assert reward("102aa\n101bb\n100cc\n", 103) == 1.0
    assert reward("102ab\n101bb\n100cc\n", 103) == pytest.approx(0.5 * 2 / 3 + 0.5)
    assert reward("102aa\n101bb\n", 103) == pytest.approx(0.5 * 2 / 3)  # stopped short: 100 pays nothing
    assert reward("102aa\n101bb\n101bb\n101cc\n", 103) == pytest.approx(0.5 * 2 / 3)  # a repeat pays nothing more
    assert reward("102aa\n100bb\n99cc\n", 103) == pytest.approx(0.5 * 2 / 3)  # miscounted: 99 is not the walk's
    assert reward("no walk", 103) == 0.0


def test_the_warm_start_trains_on_whole_walks_in_runs_of_about_the_same_length():
    config = WalkTaskConfig()
    examples = config.warm_start_examples(64, seed=2)
    assert len(examples) == 64 and all(s.endswith("\n") and s[-6:-3] == "100" for _, s in examples)
    for start in range(0, 64, WARM_START_RUN):
        starts = [int(p[:3]) for p, _ in examples[start : start + WARM_START_RUN]]
        assert max(starts) - min(starts) <= 6
    with pytest.raises(ValueError, match="min_start <= max_start <= 999"):
        WalkTaskConfig(max_start=1200)
    assert len(set(config.problems(32))) == 32 and config.problems(32) == WalkTaskConfig().problems(32)
