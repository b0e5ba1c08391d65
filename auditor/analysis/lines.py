"""A source text's lines, broken where Python and libcst break them.

`str.splitlines` also breaks at form feeds, vertical tabs and other separators that Python reads as
whitespace inside a line, which would shift every line number after them.
"""

from __future__ import annotations

import re

NEWLINE = re.compile(r"\r\n|\r|\n")  # a line break as Python and libcst read one


def source_lines(text: str) -> list[str]:
    """The text's lines, broken where Python breaks them (as line_starts), without their ends."""
    lines = NEWLINE.split(text)
    return lines[:-1] if lines[-1] == "" else lines


def line_starts(text: str) -> list[int]:
    """Offset of each line's first character, with libcst's idea of a line break (not str.splitlines',
    which also breaks at form feeds and other separators)."""
    return [0, *(match.end() for match in NEWLINE.finditer(text))]
