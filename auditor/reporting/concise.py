"""One line per finding: `path:row:col: CODE message`, the shape editors and grep understand."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from ..finding import Finding


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    for f in findings:
        out.write(f"{f.filename}:{f.location.row}:{f.location.column}: {f.code} {f.message}\n")
