"""One line per finding: `path:row:col: CODE message`, the shape editors and grep understand.

A name or message cannot break the line or reach the terminal as a control character
(safe_text.terminal_ready), and the stream gets only what its encoding can carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from loopaudit.findings.finding import Finding
from loopaudit.reporting.safe_text import EncodableStream, terminal_ready

NAME = "concise"  # as `--output-format` and `output-format` name it


# ANSI styles, as ruff's concise output colours it: the place bold, the code red and bold.
_BOLD, _CODE, _RESET = "\x1b[1m", "\x1b[1;31m", "\x1b[0m"


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    """`[*]` after the code marks a finding `--fix` fixes, as ruff marks it."""
    stream = EncodableStream(out)
    for f in findings:
        place, message = terminal_ready(f.place()), terminal_ready(f.message)
        marker = " [*]" if f.fix is not None and f.fix.applicability == "safe" else ""
        if color:
            stream.write(f"{_BOLD}{place}{_RESET}: {_CODE}{f.code}{_RESET}{marker} {message}\n")
        else:
            stream.write(f"{place}: {f.code}{marker} {message}\n")
