"""A JSON list shaped like ruff's `--output-format json`, plus `severity`, `context` and `suggestion`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from ..finding import Finding


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    json.dump([f.to_json() for f in findings], out, indent=2)
    out.write("\n")
