"""Baselines: start on a legacy repository without fixing everything first.

`--write-baseline FILE` records today's findings by fingerprint (see fingerprint.py); `--baseline
FILE` then reports only findings whose fingerprint is not in it. A finding moved by unrelated edits
keeps its fingerprint and stays hidden; a new one, or an old line rewritten, is reported.

A finding that stands for several lines (grouping.py: the reads of one step) is in the baseline
with each of its lines, and `--baseline` hides it only while every line it reports is there: a read
added to a step that had reads is new code that syncs, and the gate reports the step's finding (whose
own fingerprint, SARIF's, has not changed: fingerprint.py).

The file is a JSON object: `loopaudit_baseline` (the format's version), `written_by`, and `findings`,
a list of objects whose `fingerprint` is what `--baseline` reads, with `related`, the other lines of a
grouped finding (each a `fingerprint` read too, and its `line`); their `code`, `filename`, `line`
and `message` are for people reading the file. Anything else is not a baseline, and says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from loopaudit import __version__
from loopaudit.atomic import write_atomically
from loopaudit.findings.finding import Finding
from loopaudit.findings.fingerprint import line_fingerprints
from loopaudit.reporting.safe_text import json_ready

FORMAT_VERSION = 1
_FINGERPRINT = re.compile(r"[0-9a-f]{32}")  # what fingerprint.py writes


class BaselineError(Exception):
    pass


def write(path: Path, findings: Sequence[Finding]) -> None:
    """Atomically: a crash half-way must not leave a truncated baseline behind."""
    entries = []
    for f, (fingerprint, *others) in zip(findings, line_fingerprints(findings)):
        entry = {
            "fingerprint": fingerprint,
            "code": f.code,
            "filename": f.filename,
            "line": f.location.row,
            "message": f.message,
        }
        if others:
            entry["related"] = [
                {"fingerprint": other, "line": place.location.row} for other, place in zip(others, f.related)
            ]
        entries.append(entry)
    document = {"loopaudit_baseline": FORMAT_VERSION, "written_by": f"loopaudit {__version__}", "findings": entries}
    folder = path.resolve().parent
    if not folder.is_dir():
        raise BaselineError(f"--write-baseline: the folder of {path} does not exist")
    if path.is_dir():
        raise BaselineError(f"--write-baseline: {path} is a folder; give the baseline file's name")
    # json_ready: a file name that is not UTF-8 is written `\xff`; the fingerprint keeps its bytes.
    write_atomically(path, (json.dumps(json_ready(document), indent=2) + "\n").encode("utf-8"))


def load(path: Path) -> frozenset[str]:
    """The fingerprints of the baseline at `path`; BaselineError, saying what is wrong, for a file
    that is missing, unreadable, not JSON or not shaped as `write` writes it."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"--baseline: no such file: {path} (create it with --write-baseline)") from None
    except RecursionError:  # json's parser recurses once per nested array or object
        raise BaselineError(f"--baseline: {path} is not a loopaudit baseline: its JSON is nested too deeply") from None
    except (OSError, ValueError) as error:  # ValueError: not UTF-8, not JSON, an integer of 5,000 digits
        raise BaselineError(f"--baseline: {path} is not a loopaudit baseline: {error}") from None
    problem = _shape_problem(document)
    if problem is not None:
        raise BaselineError(f"--baseline: {path} is not a loopaudit baseline (version {FORMAT_VERSION}): {problem}")
    return frozenset(
        fingerprinted["fingerprint"]
        for entry in document["findings"]
        for fingerprinted in (entry, *entry.get("related", ()))
    )


def _shape_problem(document: object) -> str | None:
    """What keeps `document` from being a baseline `write` wrote, or None."""
    if not isinstance(document, dict):
        return "the file holds no JSON object"
    version = document.get("loopaudit_baseline")
    if type(version) is not int or version != FORMAT_VERSION:  # type(): True == 1, but is no version
        return f"`loopaudit_baseline` is not {FORMAT_VERSION}"
    if not isinstance(document.get("findings"), list):
        return "`findings` is not a list"
    for number, entry in enumerate(document["findings"]):
        if not _fingerprinted(entry):
            return f"findings[{number}] has no `fingerprint` of 32 hexadecimal digits"
        related = entry.get("related", [])
        if not isinstance(related, list):
            return f"findings[{number}].related is not a list"
        for place, other in enumerate(related):
            if not _fingerprinted(other):
                return f"findings[{number}].related[{place}] has no `fingerprint` of 32 hexadecimal digits"
    return None


def _fingerprinted(entry: object) -> bool:
    fingerprint = entry.get("fingerprint") if isinstance(entry, dict) else None
    return isinstance(fingerprint, str) and _FINGERPRINT.fullmatch(fingerprint) is not None


def new_findings(findings: Sequence[Finding], known: frozenset[str]) -> list[Finding]:
    """The findings with a line the baseline does not hold (a grouped finding is new when any is)."""
    return [f for f, lines in zip(findings, line_fingerprints(findings)) if not known.issuperset(lines)]
