"""OpenRLHF reward file for the paper's math-verify reward: pass `--reward.remote_url /abs/path/to/this/file`.

OpenRLHF loads this file by path and calls `reward_func(queries, prompts, labels)`; the grading lives in the
importable module `specrl_openrlhf.rewards.math_grader` so its worker processes can find it.
"""

from specrl_openrlhf.rewards.math_grader import reward_func  # noqa: F401
