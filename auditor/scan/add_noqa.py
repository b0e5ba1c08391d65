"""`--add-noqa`: a `# noqa: CODE` comment on the line of every finding (and of every read a grouped
finding names), for adopting loopaudit on a legacy codebase one suppression at a time (ruff's
`--add-noqa`).

The comment goes at the end of the line, merged into a `# noqa: ...` already there (a bare `# noqa`
already silences everything). A comment must change nothing but comments: each one is checked by
parsing the file before and after (the same syntax tree). Where it would not (the line ends inside a
string spanning lines), it goes on the line that ends the statement, which suppresses the finding as
well (scan/positions.py, suppression_rows); where that fails too, the line is left as it was.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable

from loopaudit.findings.finding import Finding
from loopaudit.scan.suppression import CODE_LIST

_NOQA_CODES = re.compile(rf"#\s*noqa:\s*(?P<codes>{CODE_LIST})", re.I)
_BARE_NOQA = re.compile(r"#\s*noqa(?!\s*:)", re.I)


def with_noqa(text: str, findings: Iterable[Finding]) -> tuple[str, int]:
    """`text` with the comments added, and how many lines got one."""
    wanted: dict[int, set[str]] = defaultdict(set)
    for finding in findings:
        wanted[finding.location.row].add(finding.code)
        for place in finding.related:
            if place.kind == "member":  # another read of the same problem: suppressed line by line
                wanted[place.location.row].add(finding.code)
    try:
        tree = ast.dump(ast.parse(text))
    except (SyntaxError, ValueError):
        return text, 0  # a file that does not parse gets no comments
    ends = _simple_statement_ends(text)
    lines = text.splitlines(keepends=True)
    added = 0
    for row, codes in sorted(wanted.items()):
        for target in dict.fromkeys((row, ends.get(row, row))):
            commented = _commented(lines, target, codes)
            if commented is None:
                break  # nothing to add: the line says so already
            candidate = "".join(commented)
            try:
                unchanged = ast.dump(ast.parse(candidate)) == tree
            except (SyntaxError, ValueError):
                unchanged = False
            if unchanged:
                lines, added = commented, added + 1
                break
    return "".join(lines), added


def _commented(lines: list[str], row: int, codes: set[str]) -> list[str] | None:
    """The lines with `codes` in a noqa comment at the end of line `row`; None when it has them."""
    if not 0 < row <= len(lines):
        return None
    line = lines[row - 1]
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    if _BARE_NOQA.search(body):
        return None
    present = _NOQA_CODES.search(body)
    if present:
        have = {code.upper() for code in re.split(r"[\s,]+", present.group("codes")) if code}
        if codes <= have:
            return None
        body = body[: present.start("codes")] + ", ".join(sorted(have | codes)) + body[present.end("codes") :]
    else:
        body = f"{body.rstrip()}  # noqa: {', '.join(sorted(codes))}"
    return [*lines[: row - 1], body + ending, *lines[row:]]


def _simple_statement_ends(text: str) -> dict[int, int]:
    """Each line of a simple statement spread over lines -> the statement's last line."""
    ends: dict[int, int] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.end_lineno:
            for row in range(node.lineno, node.end_lineno + 1):
                ends.setdefault(row, node.end_lineno)
    return ends
