"""How a rule is named: references (`path/to/rule.py:ClassName` or `package.module:ClassName`, how a rule that no
registry holds is named on command lines, in grids and in traces) and spellings (`NAME[@LENIENCE][,key=value ...]`, a
rule and its parameters in one word, as `--rollout_reuse` and `bench_at_scale.py --rules` take them). Standard library
only (the grid and the report use it)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def is_reference(name) -> bool:
    """Whether `name` names a class (registered names never hold a colon)."""
    return isinstance(name, str) and ":" in name


def absolute_reference(name: str, base: str | Path | None = None) -> str:
    """`rule.py:Class` with the file made absolute, resolved against `base` (a folder; default: the current one), so
    that Ray processes with another working folder find it. Names and `package.module:Class` are left as they are."""
    if not is_reference(name):
        return name
    target, _, attr = name.rpartition(":")
    if not target.endswith(".py"):
        return name
    path = Path(target).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return f"{path.resolve()}:{attr}"


def short_name(reference: str) -> str:
    """A rule's name for tables and folders: a rule loaded as `path/rule.py:Class` goes by `Class`."""
    return reference.rpartition(":")[2]


def spelled_rule(text: str, flag: str = "--rollout_reuse") -> tuple[str, float | None, dict]:
    """(name, lenience or None, parameters) of `NAME`, `NAME@LENIENCE` or `path/rule.py:Class[@LENIENCE]`, each
    optionally followed by `,key=value` parameters (a value is JSON where it reads as JSON). Errors name `flag`.

    >>> spelled_rule('rules.py:Mine@2,decay=0.25,mode=fast')
    ('rules.py:Mine', 2.0, {'decay': 0.25, 'mode': 'fast'})
    """
    head, *assignments = _pieces(text)
    name, _, value = head.partition("@")
    lenience = None
    if value:
        try:
            lenience = float(value)
        except ValueError:
            raise ValueError(f"{flag} {text}: the lenience after @ must be a number, e.g. spec@1.65") from None
    params = {}
    for assignment in assignments:
        key, equals, raw = assignment.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"{flag} {text}: give parameters as key=value after the rule, e.g. RULE,decay=0.5")
        try:
            params[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            params[key.strip()] = raw
    return name, lenience, params


def split_rules(text: str, flag: str = "--rules") -> list[str]:
    """Rules in `parse_rule`'s spelling, comma-separated, one spelling each: a piece `key=value` is a parameter of the
    rule before it.

    >>> split_rules('off,spec@1.65,lossless,verify=requests,vllm,speculative_config={"method":"ngram","x":[1,2]}')
    ['off', 'spec@1.65', 'lossless,verify=requests', 'vllm,speculative_config={"method":"ngram","x":[1,2]}']
    """
    rules: list[str] = []
    for piece in (p.strip() for p in _pieces(text)):
        if not piece:
            continue
        if _PARAMETER.match(piece):
            if not rules:
                raise ValueError(f"{flag} {text}: {piece} comes before any rule; write RULE,{piece}")
            rules[-1] += "," + piece
        else:
            rules.append(piece)
    return rules


_PARAMETER = re.compile(r"\s*[A-Za-z_]\w*\s*=")  # `key=value`: a parameter, not a rule


def _pieces(text: str) -> list[str]:
    """`text` cut at its commas outside brackets and quotes, so that a JSON value keeps its own."""
    pieces, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == '"' and text[i - 1 : i] != "\\":
            quoted = not quoted
        elif not quoted and char in "[{":
            depth += 1
        elif not quoted and char in "]}":
            depth -= 1
        elif char == "," and not quoted and depth <= 0:
            pieces.append(text[start:i])
            start = i + 1
    return [*pieces, text[start:]]
