"""Word problems for the real model: two to four steps of arithmetic in a short story, the answer in \\boxed{}.

Names, items, numbers and the story's structure vary, so a chat model's reasoning diverges and rejoins as real chains
of thought do (responses of 100-400 tokens from SmolLM2-135M-Instruct). Answers are whole numbers, graded by
math-verify as in the quickstart (`rewards.math_grader`). The held-out split is drawn first and never overlaps the
training prompts.

>>> train, held_out = splits(train_size=4, held_out_size=2, seed=0)
>>> len(train), len(held_out), all(p.answer.lstrip("-").isdigit() for p in train + held_out)
(4, 2, True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam", "Maya")
ITEMS = ("apples", "stickers", "marbles", "books", "cookies", "pencils", "stamps", "shells", "cards", "beads")
INSTRUCTION = "Solve it step by step, then give the final answer as \\boxed{number}."


@dataclass(frozen=True)
class Problem:
    prompt: str  # the user's message
    answer: str


def _packs(rng: random.Random) -> tuple[str, int]:
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c, d = rng.randint(3, 30), rng.randint(2, 6), rng.randint(2, 12), rng.randint(1, 10)
    if other == name:
        other = "a friend"
    text = (
        f"{name} has {a} {item}. {name} buys {b} packs with {c} {item} in each pack, then gives {d} {item} to "
        f"{other}. How many {item} does {name} have now?"
    )
    return text, a + b * c - d


def _wages(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(NAMES)
    rate, monday, tuesday, spent = rng.randint(5, 20), rng.randint(2, 8), rng.randint(2, 8), rng.randint(5, 40)
    text = (
        f"{name} earns {rate} dollars per hour. {name} works {monday} hours on Monday and {tuesday} hours on Tuesday, "
        f"then spends {spent} dollars on lunch. How many dollars does {name} have left from this pay?"
    )
    return text, rate * (monday + tuesday) - spent


def _trip(rng: random.Random) -> tuple[str, int]:
    vehicle = rng.choice(("A train", "A bus", "A car", "A cyclist"))
    a, b, c, d = rng.randint(10, 60), rng.randint(2, 5), rng.randint(10, 60), rng.randint(1, 4)
    text = (
        f"{vehicle} travels at {a} kilometers per hour for {b} hours, then at {c} kilometers per hour for {d} hours. "
        "How many kilometers does it travel in total?"
    )
    return text, a * b + c * d


def _chairs(rng: random.Random) -> tuple[str, int]:
    rows, per_row, broken, guests = rng.randint(3, 12), rng.randint(4, 15), rng.randint(1, 9), rng.randint(5, 30)
    total = rows * per_row - broken
    if guests > total:
        guests = total // 2
    text = (
        f"A hall has {rows} rows of chairs with {per_row} chairs in each row. {broken} chairs are broken and "
        f"{guests} guests have already sat down. How many good chairs are still free?"
    )
    return text, total - guests


def _bakery(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(NAMES)
    per_day, days, sold, gift = rng.randint(6, 40), rng.randint(2, 7), rng.randint(5, 50), rng.randint(1, 9)
    made = per_day * days
    sold = min(sold, made - gift)
    text = (
        f"{name} bakes {per_day} loaves of bread every day for {days} days. {name} sells {sold} loaves and gives "
        f"{gift} loaves to neighbours. How many loaves are left?"
    )
    return text, made - sold - gift


def _sharing(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each, extra = rng.randint(2, 8), rng.randint(2, 9), rng.randint(1, 12)
    text = (
        f"{name} shares {friends * each + extra} {item} equally among {friends} friends, keeping the {extra} "
        f"{item} that are left over. Then each friend gets {extra} more {item} from a teacher. How many {item} "
        "does each friend have?"
    )
    return text, each + extra


STORIES = (_packs, _wages, _trip, _chairs, _bakery, _sharing)


def problem(rng: random.Random) -> Problem:
    text, answer = rng.choice(STORIES)(rng)
    return Problem(f"{text} {INSTRUCTION}", str(answer))


def splits(train_size: int, held_out_size: int, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and held-out problems; the held-out split is drawn first, so it does not depend on
    `train_size`."""
    rng, seen = random.Random(seed), set()
    out = []
    for size in (held_out_size, train_size):
        split = []
        while len(split) < size:
            item = problem(rng)
            if item.prompt not in seen:
                seen.add(item.prompt)
                split.append(item)
        out.append(split)
    held_out, train = out
    return train, held_out


def chat_prompt(tokenizer, item: Problem) -> list[int]:
    """The problem in the model's chat template, ready for the assistant's turn."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": item.prompt}], add_generation_prompt=True, tokenize=True
    )
