"""The long corpus's task: count a distance down to zero in steps of 2 or 3, one line a step.

    prompt:   "231\\n"
    solution: "-3=228\\n-2=226\\n...-2=0\\n"

A line is the step and what is left after it. The step is a real fork (either reaches zero, save near the end), what
is left is arithmetic: certain once learned. So a response is mostly certain tokens with a fork a line, as an RL
policy's chain of thought is, and it is long (about 90 lines of 7 characters for a distance of 230, one token each
with the tiny model's character tokenizer) without looping (what is left never repeats). Each line depends on the one
before only, so a model trained on short walks and on the first lines of long ones walks long ones. The warm start imitates a teacher that picks each step
at random and gets what is left wrong by 1 now and then, carrying on from it: RL is rewarded for lines that are right
and a walk that ends on zero.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

STEPS = (2, 3)
LINE = re.compile(r"-(\d)=(\d+)\n")


@dataclass(frozen=True, kw_only=True)
class WalkTaskConfig:
    """Distances (the recorded problems' and the warm start's) and the warm start's teacher; `seed` fixes every
    problem."""

    min_distance: int = 220
    max_distance: int = 290
    warm_start_lines: int = 16  # the warm start's walks stop after this many lines (but those that end before)
    teacher_error_rate: float = 0.15  # chance that what is left is off by one
    teacher_short_step: float = 0.5  # chance of a step of 2 where either step keeps zero reachable
    seed: int = 0

    def __post_init__(self):
        if not 4 <= self.min_distance <= self.max_distance <= 999 or self.warm_start_lines < 1:
            raise ValueError(
                "need 4 <= min_distance <= max_distance <= 999 and warm_start_lines >= 1, got "
                f"{self.min_distance}, {self.max_distance}, {self.warm_start_lines}"
            )
        if not 0.0 <= self.teacher_error_rate < 1.0 or not 0.0 < self.teacher_short_step < 1.0:
            raise ValueError(
                f"teacher_error_rate must be in [0, 1) and teacher_short_step in (0, 1), got "
                f"{self.teacher_error_rate}, {self.teacher_short_step}"
            )

    def problems(self, count: int) -> list[int]:
        """`count` distinct distances, the same for the same seed."""
        if count > self.max_distance - self.min_distance + 1:
            raise ValueError(f"{count} distinct problems need max_distance - min_distance >= {count - 1}")
        return random.Random(self.seed).sample(range(self.min_distance, self.max_distance + 1), count)

    def warm_start_examples(self, count: int, seed: int) -> list[tuple[str, str, bool]]:
        """(prompt, the teacher's solution, whether it is whole): half of them walks from a distance up to
        `max_distance` cut after `warm_start_lines` lines, half whole walks as short as that. Short sequences train
        fast on a CPU, and each line depends on the one before only, so the policy walks the long distances too."""
        rng, examples = random.Random(seed), []
        short = 3 * self.warm_start_lines  # a walk of about warm_start_lines lines
        for i in range(count):
            distance = rng.randint(2, self.max_distance) if i % 2 else rng.randint(2, short)
            lines = solve(distance, rng, self).splitlines(keepends=True)
            examples.append((prompt(distance), "".join(lines[: self.warm_start_lines]), len(lines) <= self.warm_start_lines))
        return examples


def prompt(distance: int) -> str:
    return f"{distance}\n"


def solve(distance: int, rng: random.Random, config: WalkTaskConfig) -> str:
    """The teacher's walk: a step that keeps zero reachable (never leaves 1), what is left now and then off by one;
    it ends on zero, or where zero is out of reach (1 left)."""
    lines, left = [], distance
    while left >= 2:
        choices = [s for s in STEPS if left - s != 1 and left - s >= 0]
        step = 2 if len(choices) == 2 and rng.random() < config.teacher_short_step else choices[-1]
        left -= step
        if left > 1 and rng.random() < config.teacher_error_rate:
            left += rng.choice((-1, 1))
        lines.append(f"-{step}={left}\n")
    return "".join(lines)


def reward(text: str, distance: int) -> float:
    """Half for the share of lines whose step is 2 or 3 and whose result is what was left less the step, half for a
    walk that reaches zero."""
    left, right, lines = distance, 0, 0
    for step, stated in LINE.findall(text):
        lines += 1
        right += int(stated) == left - int(step) and int(step) in STEPS
        left = int(stated)
    return 0.5 * right / max(lines, 1) + 0.5 * (lines > 0 and left == 0)
