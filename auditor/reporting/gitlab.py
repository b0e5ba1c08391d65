"""GitLab's Code Quality report (a JSON list, read by the `codequality` artifact of a CI job)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from loopaudit.findings.finding import Finding
from loopaudit.findings.fingerprint import fingerprints
from loopaudit.reporting.safe_text import json_ready

NAME = "gitlab"  # as `--output-format` and `output-format` name it

# Code Quality's severities: info, minor, major, critical, blocker.
_SEVERITIES = {"error": "critical", "warning": "major", "info": "info"}


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    report = [
        {
            "description": (f"cell {finding.cell}, line {finding.location.row}: " if finding.cell else "")
            + f"{finding.code} {finding.message}",
            "check_name": finding.code,
            "fingerprint": fingerprint,
            "severity": _SEVERITIES.get(finding.severity, "major"),
            "location": {
                "path": Path(finding.filename).as_posix(),
                # A notebook's cell lines are not the file's: the widget gets its first line.
                "lines": {"begin": finding.location.row, "end": finding.end_location.row}
                if finding.cell is None
                else {"begin": 1, "end": 1},
            },
        }
        for finding, fingerprint in zip(findings, fingerprints(findings))
    ]
    json.dump(json_ready(report), out, indent=2)
    out.write("\n")
