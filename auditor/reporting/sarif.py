"""SARIF 2.1.0, as GitHub code scanning reads it: one run, the rules that were reported with their
documentation, one result per finding with its region and a fingerprint that survives line shifts,
and the other lines of a grouped finding's problem as its `relatedLocations`.

Paths are relative to the working directory, marked with `%SRCROOT%` (run the scan from the
repository root, as the upload action expects). SARIF wants URI references there, not names: each is
the exact bytes of the file's name, percent-encoded (`artifact_uri`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO
from urllib.parse import quote_from_bytes

from loopaudit import __version__
from loopaudit.findings.finding import Finding, Related
from loopaudit.findings.fingerprint import filename_bytes, fingerprints
from loopaudit.reporting.safe_text import json_ready
from loopaudit.rule_api.registry import rule_by_code

NAME = "sarif"  # as `--output-format` and `output-format` name it

INFORMATION_URI = "https://github.com/loopaudit/loopaudit"
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# SARIF's levels for our severities.
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def artifact_uri(filename: str) -> str:
    """The file as a relative URI reference (RFC 3986): the bytes of its name, every one but the
    unreserved ones and `/` percent-encoded. Exact and reversible (a consumer decodes `rate%2525.py`
    to `rate%25.py`, `bad%FFname.py` to the bytes on disk), never a scheme (`co:m.py` is `co%3Am.py`)."""
    return quote_from_bytes(filename_bytes(Path(filename).as_posix()), safe="/")


def _rule_descriptor(code: str, url: str | None) -> dict:
    rule = rule_by_code(code)
    descriptor: dict[str, object] = {"id": code}
    if rule is not None:
        descriptor.update(
            {
                "name": rule.name,
                "shortDescription": {"text": rule.summary},
                "fullDescription": {"text": rule.what_it_flags},
                "help": {"text": f"{rule.why_it_costs}\n\nUse instead:\n{rule.use_instead}"},
                "defaultConfiguration": {"level": "warning"},
                "properties": {"tags": ["performance", "pytorch"]},
            }
        )
    if url:
        descriptor["helpUri"] = url
    return descriptor


def _physical_location(filename: str, where: Finding | Related) -> dict:
    """Where a finding, or one of its related places, is: the file and the region of its span (in a
    notebook, the file alone: its cells' lines are not the JSON file's; the message names the cell)."""
    artifact = {"artifactLocation": {"uri": artifact_uri(filename), "uriBaseId": "%SRCROOT%"}}
    if where.cell is not None:
        return artifact
    region: dict[str, object] = {
        "startLine": where.location.row,
        "startColumn": where.location.column,
        "endLine": where.end_location.row,
        "endColumn": where.end_location.column,
    }
    if where.source_line is not None:
        region["snippet"] = {"text": where.source_line}
    return {**artifact, "region": region}


def _in_cell(where: Finding | Related) -> str:
    return f"cell {where.cell}, line {where.location.row}: " if where.cell is not None else ""


def document(findings: Sequence[Finding]) -> dict:
    codes = sorted({f.code for f in findings})
    index = {code: number for number, code in enumerate(codes)}
    urls = {f.code: f.url for f in findings}
    results = []
    for finding, fingerprint in zip(findings, fingerprints(findings)):
        result = {
            "ruleId": finding.code,
            "ruleIndex": index[finding.code],
            "level": _LEVELS.get(finding.severity, "warning"),
            "message": {
                "text": _in_cell(finding)
                + finding.message
                + (f"\nHelp: {finding.suggestion}" if finding.suggestion else "")
            },
            "locations": [{"physicalLocation": _physical_location(finding.filename, finding)}],
            "partialFingerprints": {"loopaudit/v1": fingerprint},
        }
        if finding.related:  # the other lines of the same problem (grouping.py), each with what it is
            result["relatedLocations"] = [
                {
                    "id": number,
                    "physicalLocation": _physical_location(finding.filename, place),
                    "message": {"text": _in_cell(place) + place.message},
                }
                for number, place in enumerate(finding.related, 1)
            ]
        results.append(result)
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "loopaudit",
                        "version": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": [_rule_descriptor(code, urls[code]) for code in codes],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().resolve().as_uri() + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    json.dump(json_ready(document(findings)), out, indent=2)
    out.write("\n")
