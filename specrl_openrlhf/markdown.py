"""The one writer of markdown tables: every table the package prints or writes into a document goes through `table`.

Standard library only, so the config (which loads without torch) can use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ALIGNS = {"left": "---", "right": "---:", "center": ":---:"}


def table(head: Sequence[str], rows: Iterable[Sequence[object]], align: str | Sequence[str] = "left") -> str:
    """A markdown table: `head` names the columns, each row gives one cell a column (`str()` of it; a `|` in a cell
    is escaped). `align` is one alignment for every column, or one a column: "left", "right" or "center"; the usual
    numbers table is `numbers(n_text)`, text first and figures right-aligned."""
    aligns = [align] * len(head) if isinstance(align, str) else list(align)
    if len(aligns) != len(head) or any(a not in ALIGNS for a in aligns):
        raise ValueError(f"align takes one of {sorted(ALIGNS)} a column ({len(head)} columns), got {align!r}")
    lines = [_row(head), "| " + " | ".join(ALIGNS[a] for a in aligns) + " |"]
    for row in rows:
        cells = list(row)
        if len(cells) != len(head):
            raise ValueError(f"a table row has {len(cells)} cells for {len(head)} columns: {cells!r}")
        lines.append(_row(cells))
    return "\n".join(lines)


def numbers(text_columns: int, columns: int) -> list[str]:
    """The alignment of a table whose first `text_columns` columns are text and the rest figures."""
    return ["left"] * text_columns + ["right"] * (columns - text_columns)


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
