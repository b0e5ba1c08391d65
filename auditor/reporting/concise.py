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


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    stream = EncodableStream(out)
    for f in findings:
        stream.write(terminal_ready(f"{f.place()}: {f.code} {f.message}") + "\n")
