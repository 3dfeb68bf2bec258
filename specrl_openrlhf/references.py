"""Rule references: `path/to/rule.py:ClassName` or `package.module:ClassName`, how a rule that no registry holds is
named on command lines, in grids and in traces. Standard library only (the grid and the report use it)."""

from __future__ import annotations

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
