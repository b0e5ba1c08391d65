"""A JSON list shaped like ruff's `--output-format json`, plus `severity`, `context` and `suggestion`,
and `related` for a finding that stands for several lines (grouping.py): each one's `location`,
`end_location` and `message`. Strings are exact, but for the bytes of a file name that is not UTF-8,
written `\\xff` (safe_text.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from loopaudit.findings.finding import Finding
from loopaudit.reporting.safe_text import json_ready

NAME = "json"  # as `--output-format` and `output-format` name it


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    json.dump(json_ready([f.to_json() for f in findings]), out, indent=2)
    out.write("\n")
