import doctest
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("math_verify")
PATH = Path(__file__).resolve().parents[2] / "specrl_openrlhf" / "rewards" / "math_verify_reward.py"


@pytest.fixture(scope="module")
def reward():
    from specrl_openrlhf.rewards import math_grader

    yield math_grader
    math_grader._reset_pool()


def test_entry_file_loads_by_path_like_openrlhf():
    spec = importlib.util.spec_from_file_location("reward_func", PATH)  # OpenRLHF's own loading
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.reward_func(["Q \\boxed{4}"], ["Q"], ["4"])
    assert out["rewards"].tolist() == [1.0]


@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("so the answer is \\boxed{42}", "42", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("the result is 7", "7", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("\\boxed{", "42", 0.0),  # malformed
        ("", "42", 0.0),
        ("\\boxed{3}", None, 0.0),
        (None, "3", 0.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
    ],
)
def test_scores(reward, response, label, expected):
    assert reward.score(response, label) == expected


def test_reward_func_in_openrlhf_format(reward):
    out = reward.reward_func(["Q: 2+2? \\boxed{4}", "Q: 2+2? 5"], ["Q: 2+2?", "Q: 2+2?"], ["4", "4"])
    assert out["rewards"].tolist() == [1.0, 0.0] and out["scores"].tolist() == [1.0, 0.0]
    assert out["extra_logs"]["reward/math_verify_accuracy"].item() == 0.5


def test_many_concurrent_callers_all_get_their_grade(reward):
    """OpenRLHF grades each sample in its own thread: hundreds of calls at once must not time each other out."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [(f"\\boxed{{{i % 7}}}", str(i % 5)) for i in range(300)]
    with ThreadPoolExecutor(64) as threads:
        got = list(threads.map(lambda case: reward.score(*case), cases))
    assert got == [float(i % 7 == i % 5) for i in range(300)]


def test_a_stuck_pool_scores_zero_and_recovers(reward, monkeypatch):
    import time

    pool = reward._get_pool()
    for _ in range(reward.WORKERS):  # every worker busy well past the caller's patience
        pool.submit(time.sleep, 3)
    monkeypatch.setattr(reward, "STUCK_S", 0.5)
    assert reward.score("\\boxed{2} while stuck", "2") == 0.0  # gave up; the pool was replaced
    monkeypatch.undo()
    assert reward.score("\\boxed{2} while stuck", "2") == 1.0  # a timeout is not kept as a grade


def test_docstring_examples(reward):
    assert doctest.testmod(reward).failed == 0


def test_a_batch_is_graded_in_parallel_and_each_distinct_response_once(reward):
    """Reuse makes identical responses common: they cost one parse, within a call and across calls."""
    before = reward.submitted
    queries = ["Q \\boxed{7} once more"] * 8 + ["Q \\boxed{8} once more"] * 8
    assert reward.math_verify_reward(queries, ["Q"] * 16, ["7"] * 16) == [1.0] * 8 + [0.0] * 8
    assert reward.submitted - before == 2
    assert reward.math_verify_reward(queries[:3], ["Q"] * 3, ["7"] * 3) == [1.0] * 3
    assert reward.submitted - before == 2  # already graded: no parse
    assert reward.math_verify_reward(["Q \\boxed{7} once more"], ["Q"], ["8"]) == [0.0]  # another label: graded
    assert reward.submitted - before == 3
