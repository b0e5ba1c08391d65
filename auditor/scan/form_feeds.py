"""Form feeds before code at the start of a line: CPython reads them, libcst does not.

Editors of the Emacs school put a form feed (^L) at a page break. CPython's tokenizer resets the
indentation count at each one, so `\\f    x = 1` is indented by four spaces. libcst's tokenizer keeps
no such rule: it either rejects the line ("no matching outer block for dedent") or parses it and
drops the form feed from the tree, whose printed code then differs from the file.

So such a line is analysed without the whitespace up to its last form feed, which is what CPython
sees. Lines keep their numbers; the columns of a changed line move, and the engine gives them back
(`engine._restore_form_feeds`).
A form feed on a line of its own, or after code, is whitespace to both parsers and stays.
"""

from __future__ import annotations

import re

from loopaudit.analysis.lines import NEWLINE

# Leading whitespace holding a form feed, up to and including the last one, before something other
# than the end of the line.
_LEADING = re.compile(r"(?:\A|(?<=[\r\n]))[ \t\f]*\f(?=[ \t]*[^\s])")


def without_leading_form_feeds(text: str) -> tuple[str, dict[int, int]]:
    """`text` as CPython indents it, and for each changed line (1-based) the characters removed
    from its start. The text itself and an empty dict where no line needs it (the usual case)."""
    if "\f" not in text:
        return text, {}
    removed: dict[int, int] = {}
    parts = []
    line, counted_to, kept_from = 1, 0, 0
    for match in _LEADING.finditer(text):
        line += len(NEWLINE.findall(text, counted_to, match.start()))
        counted_to = match.start()
        removed[line] = match.end() - match.start()
        parts.append(text[kept_from : match.start()])
        kept_from = match.end()
    if not removed:
        return text, {}
    parts.append(text[kept_from:])
    return "".join(parts), removed
