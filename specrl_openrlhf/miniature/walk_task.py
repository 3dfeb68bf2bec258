"""The long corpus's task: walk down from a start to 100 one number a line, each number followed by two letters.

    prompt:   "213aa\\n"
    solution: "212ab\\n211aa\\n210ca\\n...100bb\\n"

The number is certain once learned (the line above's less one), the letters are forks: the policy's entropy is an RL
policy's, mostly certain with a fork here and there. A response is long (about 110 lines of 6 tokens, one a character
with the tiny model's character tokenizer) without looping (numbers never repeat), and each line depends on the one
above only, at a fixed distance, which a tiny model learns quickly. The warm start imitates a teacher that draws the
letters at random; RL is rewarded for the walk's numbers written with two matching letters, which the teacher does
by chance only, and for a walk that counts right and ends at 100.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

END = 100
LETTERS = "abc"
TEACHER_LETTERS = (0.6, 0.3, 0.1)  # the teacher's chance of each letter
LINE = re.compile(r"(\d+)([a-z])([a-z])\n")
WARM_START_RUN = 8  # the warm start's batch: walks of about the same length


@dataclass(frozen=True, kw_only=True)
class WalkTaskConfig:
    """Starts (the recorded problems') and the warm start's walks; `seed` fixes every problem."""

    min_start: int = 200
    max_start: int = 240
    seed: int = 0

    def __post_init__(self):
        if not END < self.min_start <= self.max_start <= 999:
            raise ValueError(f"need {END} < min_start <= max_start <= 999, got {self.min_start}, {self.max_start}")

    def problems(self, count: int) -> list[int]:
        """`count` distinct starts, the same for the same seed."""
        if count > self.max_start - self.min_start + 1:
            raise ValueError(f"{count} distinct problems need max_start - min_start >= {count - 1}")
        return random.Random(self.seed).sample(range(self.min_start, self.max_start + 1), count)

    def warm_start_examples(self, count: int, seed: int) -> list[tuple[str, str]]:
        """(prompt, the teacher's solution) pairs, walks from starts up to `max_start`, drawn in runs of
        `WARM_START_RUN` of about the same start: a batch of them needs little padding."""
        rng, examples = random.Random(seed), []
        while len(examples) < count:
            around = rng.randint(END + 1, self.max_start)
            for _ in range(WARM_START_RUN):
                start = min(max(around + rng.randint(-3, 3), END + 1), self.max_start)
                examples.append((prompt(start), solve(start, rng)))
        return examples[:count]


def prompt(start: int) -> str:
    """The start written as a line of the walk: the first line is the one above's less one, as every other."""
    return f"{start}aa\n"


def solve(start: int, rng: random.Random) -> str:
    """The teacher's walk: each number less one down to 100, the letters drawn at random (`TEACHER_LETTERS`)."""
    letters = rng.choices(LETTERS, TEACHER_LETTERS, k=2 * (start - END))
    return "".join(f"{n}{letters[2 * i]}{letters[2 * i + 1]}\n" for i, n in enumerate(range(start - 1, END - 1, -1)))


def reward(text: str, start: int) -> float:
    """Half for the share of the walk's numbers written with two matching letters, half for a walk that counts down
    right to 100. The share is of the numbers the walk should hold, each counted once: a walk that stops early or
    skips numbers loses their share, one that repeats numbers gains nothing (a share of the lines written would pay
    short walks, whose share varies most, and RL would learn to stop early)."""
    lines = LINE.findall(text)
    expected = range(start - 1, END - 1, -1)
    matched = {int(n) for n, first, second in lines if first == second} & set(expected)
    counted = [int(n) for n, _, _ in lines] == list(expected)
    return 0.5 * len(matched) / len(expected) + 0.5 * counted
