"""GitHub Actions workflow commands: each finding becomes an annotation on the pull request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from ..finding import Finding


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    for f in findings:
        level = "error" if f.severity == "error" else "warning"
        properties = ",".join([
            f"title={_escape_property('loopaudit ' + f.code)}",
            f"file={_escape_property(f.filename)}",
            f"line={f.location.row}",
            f"col={f.location.column}",
            f"endLine={f.end_location.row}",
            f"endColumn={f.end_location.column}",
        ])
        out.write(f"::{level} {properties}::{_escape_data(f'{f.code} {f.message}')}\n")
