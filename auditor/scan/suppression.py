"""Suppression comments: `# noqa`, `# noqa: LA101,LA104` and `# loopaudit: ignore[LA101]`."""

from __future__ import annotations

import io
import re
import tokenize

# A list of rule codes, as a noqa comment lists them after its colon (also read by add_noqa.py).
CODE_LIST = r"[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*"
_NOQA = re.compile(rf"#\s*noqa(?::\s*(?P<codes>{CODE_LIST}))?", re.I)
_IGNORE = re.compile(r"#\s*loopaudit:\s*ignore(?:\[(?P<codes>[^\]]*)\])?", re.I)

ALL = frozenset({"*"})


def suppressions(text: str) -> dict[int, frozenset[str]]:
    """Line number -> the codes suppressed on it ({"*"} for all). Reads real comments only."""
    if "noqa" not in text and "loopaudit:" not in text:
        return {}
    found: dict[int, frozenset[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return {}
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        codes: set[str] = set()
        for pattern in (_NOQA, _IGNORE):
            for match in pattern.finditer(token.string):
                listed = match.group("codes")
                if not listed:
                    codes.add("*")
                else:
                    codes.update(code.upper() for code in re.split(r"[\s,]+", listed.strip()) if code)
        if codes:
            found[token.start[0]] = frozenset(codes)
    return found


def is_suppressed(code: str, rows: range, table: dict[int, frozenset[str]]) -> bool:
    return bool(suppressing(code, rows, table))


def suppressing(code: str, rows: range, table: dict[int, frozenset[str]]) -> list[tuple[int, str]]:
    """The (line, listed code) pairs of the comments that suppress `code` on `rows` ("*" for a
    comment without codes)."""
    found = []
    for row in rows:
        for listed in table.get(row, ()):
            if listed == "*" or code.startswith(listed):
                found.append((row, listed))
    return found


_COMMENT_START = re.compile(r"#\s*(?:noqa|loopaudit:)", re.I)


def unused(
    table: dict[int, frozenset[str]], used: set[tuple[int, str]], checked: frozenset[str], lines: list[str]
) -> list[tuple[int, int, str]]:
    """(line, column, code) of each code a comment lists that suppressed nothing, among `checked`
    (the full codes of the rules that ran on the file: a prefix, a bare `# noqa` and a code of a rule
    that did not run are never called unused)."""
    found = []
    for row, codes in sorted(table.items()):
        for code in sorted(codes):
            if code in checked and (row, code) not in used:
                line = lines[row - 1] if 0 < row <= len(lines) else ""
                start = _COMMENT_START.search(line)
                found.append((row, start.start() + 1 if start else 1, code))
    return found
