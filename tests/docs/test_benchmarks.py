"""docs/benchmarks.md shows today's results: at most 650 lines (git keeps the past), and each section of results with
the command that produced it and the commit it ran at."""

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MAX_LINES = 650
COMMAND = re.compile(r"```bash|`(python|bash|git clone) [^`]+`")
COMMIT = re.compile(r"\b[0-9a-f]{7}\b")


def sections(text: str) -> dict[str, str]:
    """The page's sections and subsections by title, each with its text up to the next heading."""
    parts = re.split(r"\n(?=#{2,3} )", text)
    return {part.splitlines()[0].lstrip("# "): part for part in parts[1:]}


def test_the_page_stays_within_650_lines():
    lines = PAGE.read_text().count("\n")
    assert lines <= MAX_LINES, f"docs/benchmarks.md has {lines} lines: cut what is past (git keeps it), not results"


def test_each_section_of_results_shows_its_command_and_commit():
    found = sections(PAGE.read_text())
    assert len(found) > 10 and "How to read this page" in found
    for title, text in found.items():
        if title == "How to read this page":
            continue
        assert COMMAND.search(text), f"docs/benchmarks.md, {title!r}: no command"
        assert COMMIT.search(text), f"docs/benchmarks.md, {title!r}: no commit"
