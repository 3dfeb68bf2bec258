"""`params`: one check of a value against its type and range, and of a parameter dataclass's fields."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from specrl_openrlhf.params import check_fields, check_lenience, check_value, limits


@dataclass(frozen=True, kw_only=True)
class Example:
    mode: Literal["fast", "slow"] = "fast"
    steps: int = field(default=4, metadata=limits(at_least=1, at_most=64, means="steps a round takes"))
    share: float = field(default=0.5, metadata=limits(at_least=0.0, below=1.0))
    on: bool = True
    path: str | None = None

    def __post_init__(self):
        check_fields(self, owner="example")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "medium"}, "example: mode must be one of 'fast', 'slow', got 'medium'"),
        ({"steps": 0}, r"example: steps must be an integer in \[1, 64\], got 0 \(steps a round takes\)"),
        ({"steps": True}, "steps must be an integer"),  # a bool is never a count
        ({"steps": 2.0}, "steps must be an integer"),
        ({"share": 1.0}, r"share must be a number in \[0.0, 1.0\), got 1.0"),
        ({"share": float("nan")}, "share must be a number"),
        ({"on": 1}, "on must be true or false, got 1"),
        ({"path": 3}, "path must be a str, got 3"),
    ],
)
def test_each_field_is_checked_against_its_annotation_naming_it_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Example(**kwargs)


def test_good_values_pass_and_an_int_is_a_number():
    assert Example(mode="slow", steps=64, share=0, on=False, path="x").share == 0


def test_a_flag_names_itself_and_the_error_is_the_callers():
    with pytest.raises(KeyError, match="--seed must be an integer >= 0, got -1"):
        check_value("--seed", -1, int, at_least=0, error=KeyError)
    with pytest.raises(ValueError, match="--shards must be a positive integer, got 0"):
        check_value("--shards", 0, int, at_least=1)
    check_value("--rate", 2, float, above=0)
    with pytest.raises(ValueError, match="--rate must be a positive number, got 0.0"):
        check_value("--rate", 0.0, float, above=0)
    with pytest.raises(ValueError, match=r"--rate must be a number > 1, got inf"):
        check_value("--rate", float("inf"), float, above=1)


def test_lenience_must_be_a_positive_number():
    with pytest.raises(TypeError, match="--lenience: lenience must be a number"):
        check_lenience("--lenience", True)
    with pytest.raises(ValueError, match="lenience must be > 0"):
        check_lenience("--lenience", 0)
