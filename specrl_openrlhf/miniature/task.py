"""The quickstart's task: sums of single-digit numbers, solved step by step, the answer in \\boxed{}.

    prompt:   "7+5+9+3=?\\n"
    solution: "7+5=12\\n12+9=21\\n21+3=24\\n\\\\boxed{24}"      (label: "24")

Responses are 20-40 characters (one token each with the quickstart's character tokenizer) and their length varies
with the number of terms. The warm start imitates a noisy teacher that gets each step wrong by 1 or 2 a quarter of
the time and carries on from its wrong value: the model starts sensible and peaked, and often wrong, like a base
model. RL can fix that, and held-out problems show whether it did.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """Problem sizes and splits; `seed` fixes every problem."""

    min_terms: int = 3
    max_terms: int = 5
    max_term: int = 9
    train_size: int = 512
    held_out_size: int = 200
    teacher_error_rate: float = 0.25  # the warm start's teacher: chance of a wrong step
    seed: int = 0

    def __post_init__(self):
        if not 2 <= self.min_terms <= self.max_terms:
            raise ValueError(f"need 2 <= min_terms <= max_terms, got {self.min_terms}, {self.max_terms}")
        if not 0.0 <= self.teacher_error_rate < 1.0:
            raise ValueError(f"teacher_error_rate must be in [0, 1), got {self.teacher_error_rate}")

    def warm_start_examples(self, count: int, seed: int) -> list[tuple[str, str]]:
        """The warm start's (prompt, noisy solution) pairs: none from the held-out split."""
        _, held_out = splits(self)
        return teacher_examples(self, count, seed, exclude=[p.prompt for p in held_out])


@dataclass(frozen=True)
class Problem:
    prompt: str
    solution: str  # step by step, ending in \boxed{answer}
    answer: str


def solve(terms: list[int], rng: random.Random | None = None, error_rate: float = 0.0) -> tuple[str, int]:
    """The step-by-step solution and its final value; with `rng` and `error_rate`, some steps are off by 1 or 2
    and the solution carries on from the wrong value (as a careless teacher would)."""
    steps, total = [], terms[0]
    for term in terms[1:]:
        result = total + term
        if rng is not None and rng.random() < error_rate:
            result += rng.choice((-2, -1, 1, 2))
        steps.append(f"{total}+{term}={result}")
        total = result
    return "\n".join(steps) + f"\n\\boxed{{{total}}}", total


def random_terms(rng: random.Random, config: TaskConfig) -> list[int]:
    return [rng.randint(1, config.max_term) for _ in range(rng.randint(config.min_terms, config.max_terms))]


def problem(terms: list[int]) -> Problem:
    solution, total = solve(terms)
    return Problem("+".join(map(str, terms)) + "=?\n", solution, str(total))


def splits(config: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and held-out problems from the same distribution. The held-out split is drawn first, so it
    does not depend on `train_size` (nor does the warm start, which must never see it)."""
    rng = random.Random(config.seed)
    held_out: dict[str, Problem] = {}
    train: dict[str, Problem] = {}
    for split, size in ((held_out, config.held_out_size), (train, config.train_size)):
        for _ in range(100 * size):
            if len(split) == size:
                break
            item = problem(random_terms(rng, config))
            if item.prompt not in held_out and item.prompt not in train:
                split[item.prompt] = item
        if len(split) < size:
            raise ValueError(
                f"only {len(held_out) + len(train)} distinct problems for {config.held_out_size + config.train_size} "
                "wanted; allow more terms (max_terms) or fewer problems"
            )
    return list(train.values()), list(held_out.values())


def teacher_examples(config: TaskConfig, count: int, seed: int, exclude=()) -> list[tuple[str, str]]:
    """(prompt, noisy solution) pairs for the warm start: problems from the same distribution, none of whose
    prompts is in `exclude` (the held-out split)."""
    rng, excluded, examples = random.Random(seed), set(exclude), []
    while len(examples) < count:
        terms = random_terms(rng, config)
        prompt = "+".join(map(str, terms)) + "=?\n"
        if prompt not in excluded:
            examples.append((prompt, solve(terms, rng, config.teacher_error_rate)[0]))
    return examples
