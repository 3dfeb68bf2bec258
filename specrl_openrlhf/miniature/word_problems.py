"""Word problems for the real model: two steps of small-number arithmetic in a short story, the answer in \\boxed{}.

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
INSTRUCTION = "Think step by step. At the end, write the answer as a number inside \\boxed{}, like \\boxed{7}."


@dataclass(frozen=True)
class Problem:
    prompt: str  # the user's message
    answer: str


def _packs(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 12), rng.randint(2, 4), rng.randint(2, 5)
    text = (
        f"{name} has {a} {item}. {name} buys {b} bags with {c} {item} in each bag. How many {item} does {name} have?"
    )
    return text, a + b * c


def _gift(rng: random.Random) -> tuple[str, int]:
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(8, 20), rng.randint(1, 6), rng.randint(1, 6)
    other = "a friend" if other == name else other
    text = f"{name} has {a} {item}, gives {b} to {other} and then finds {c} more. How many {item} does {name} have?"
    return text, a - b + c


def _wages(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(NAMES)
    rate, hours, spent = rng.randint(2, 9), rng.randint(2, 6), rng.randint(1, 9)
    text = f"{name} earns {rate} dollars an hour, works {hours} hours, then spends {spent} dollars. How many are left?"
    return text, rate * hours - spent


def _trip(rng: random.Random) -> tuple[str, int]:
    vehicle = rng.choice(("A train", "A bus", "A car", "A cyclist", "A boat"))
    speed, hours, extra = rng.randint(2, 9) * 10, rng.randint(2, 4), rng.randint(1, 9)
    text = (
        f"{vehicle} goes {speed} kilometers an hour for {hours} hours, then {extra} kilometers more. How far is that?"
    )
    return text, speed * hours + extra


def _chairs(rng: random.Random) -> tuple[str, int]:
    rows, per_row, taken = rng.randint(2, 6), rng.randint(3, 8), rng.randint(1, 5)
    text = f"A room has {rows} rows of {per_row} chairs, and {taken} chairs are taken. How many chairs are free?"
    return text, rows * per_row - taken


def _sharing(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each, extra = rng.randint(2, 5), rng.randint(2, 6), rng.randint(1, 5)
    text = (
        f"{name} shares {friends * each} {item} equally among {friends} friends. Each friend then gets {extra} more "
        f"{item}. How many {item} does each friend have?"
    )
    return text, each + extra


STORIES = (_packs, _gift, _wages, _trip, _chairs, _sharing)


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
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": item.prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]
