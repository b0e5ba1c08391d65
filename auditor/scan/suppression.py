"""Suppression comments: `# noqa`, `# noqa: LA101,LA104` and `# loopaudit: ignore[LA101]`."""

from __future__ import annotations

import io
import re
import tokenize

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)
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
    for row in rows:
        codes = table.get(row)
        if codes and ("*" in codes or code in codes or any(code.startswith(c) for c in codes)):
            return True
    return False
