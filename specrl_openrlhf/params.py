"""Parameter values and their checks: one check of a value against its type and range (`check_value`), the same
for every field of a parameter dataclass from its annotation (`check_fields`), and the lenience (`check_lenience`).

Each error names the parameter (or flag), the value and what it takes. Core module: standard library only (the
config checks its flags with it, without torch).

>>> from dataclasses import dataclass, field
>>> @dataclass(frozen=True, kw_only=True)
... class Example:
...     mode: Literal["fast", "slow"] = "fast"
...     steps: int = field(default=4, metadata=limits(at_least=1, at_most=64))
...
...     def __post_init__(self):
...         check_fields(self)
>>> Example(steps=True)
Traceback (most recent call last):
...
ValueError: steps must be an integer in [1, 64], got True
>>> Example(mode="medium")
Traceback (most recent call last):
...
ValueError: mode must be one of 'fast', 'slow', got 'medium'
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Literal

DEFAULT_LENIENCE = math.exp(0.5)  # the paper's GRPO default


def is_integer(value) -> bool:
    """An int that is not a bool (True is an int to Python, never a count to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def limits(*, at_least=None, at_most=None, above=None, below=None, means: str = "") -> dict:
    """A field's range, as `dataclasses.field(metadata=...)`: `check_fields` reads it. `means` says what the value
    is, for the error."""
    return {"at_least": at_least, "at_most": at_most, "above": above, "below": below, "means": means}


def _range(at_least=None, at_most=None, above=None, below=None) -> str:
    low = ("[", at_least) if at_least is not None else ("(", above) if above is not None else None
    high = ("]", at_most) if at_most is not None else (")", below) if below is not None else None
    if low and high:
        return f" in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f" {'>=' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f" {'<=' if high[0] == ']' else '<'} {high[1]}"
    return ""


def check_value(name: str, value, kind, *, error=ValueError, means: str = "", **bounds) -> None:
    """Raise `error` naming `name`, the value and what it takes unless `value` is a `kind` (int, float, bool, str, or
    the choices of a `Literal[...]`) within `bounds` (`limits`' keywords). An int passes as a float; a bool passes
    only as a bool; a float must be finite where it has bounds."""
    choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
    if choices is not None:
        ok = any(value == choice and type(value) is type(choice) for choice in choices)
        wanted = "one of " + ", ".join(repr(choice) for choice in choices)
    elif kind is bool:
        ok, wanted = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, wanted = is_integer(value), "an integer"
    elif kind is float:
        ok = is_number(value) and (math.isfinite(value) or not any(v is not None for v in bounds.values()))
        wanted = "a number"
    else:
        ok, wanted = isinstance(value, kind), f"a {kind.__name__}"
    if ok and kind in (int, float):
        low, high = bounds.get("at_least"), bounds.get("at_most")
        above, below = bounds.get("above"), bounds.get("below")
        ok = not (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (above is not None and value <= above)
            or (below is not None and value >= below)
        )
    if not ok:
        given = {key: bound for key, bound in bounds.items() if bound is not None}
        if kind is int and given == {"at_least": 1}:
            wanted = "a positive integer"
        elif kind is float and given == {"above": 0}:
            wanted = "a positive number"
        elif kind in (int, float):
            wanted += _range(**bounds)
        raise error(f"{name} must be {wanted}, got {value!r}" + (f" ({means})" if means else ""))


@functools.cache
def _annotations(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except NameError:  # a string annotation its module cannot resolve: such a field is checked by its class
        return {spec.name: spec.type for spec in dataclasses.fields(cls)}


def _checkable(kind):
    """The type `check_value` checks for an annotation, and whether None passes; None where it checks nothing."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(kind) if member is not type(None)]
        if len(members) != 1:
            return None, False  # a union of several kinds: the class checks it itself
        return members[0], True
    return kind, False


def check_fields(params, *, owner: str = "") -> None:
    """Check every init field of the dataclass `params` against its annotation (`check_value`) and the `limits` in
    its metadata; `owner` prefixes each error (a plugin's name)."""
    hints = _annotations(type(params))
    for spec in dataclasses.fields(params):
        if not spec.init:
            continue
        kind, optional = _checkable(hints[spec.name])
        value = getattr(params, spec.name)
        if kind is None or (optional and value is None):
            continue
        if typing.get_origin(kind) is not Literal and not isinstance(kind, type):
            continue  # a generic alias (dict[str, int]) or an unresolved name: the class checks it itself
        bounds = {k: v for k, v in spec.metadata.items() if k in ("at_least", "at_most", "above", "below")}
        name = f"{owner}: {spec.name}" if owner else spec.name
        check_value(name, value, kind, means=spec.metadata.get("means", ""), **bounds)


def check_lenience(owner: str, value) -> None:
    """Validate a lenience value, naming the owner, the value and the fix."""
    if not is_number(value):
        raise TypeError(
            f"{owner}: lenience must be a number, got {value!r} ({type(value).__name__}); "
            f"pass a positive float such as --lenience 1.6487 (e^0.5)"
        )
    if math.isnan(value) or value <= 0:
        raise ValueError(
            f"{owner}: lenience must be > 0, got {value!r}; use 1.0 for exact speculative acceptance, "
            f"e^0.5 = 1.6487 for the paper's GRPO default, or the policy 'full' for unlimited reuse"
        )
