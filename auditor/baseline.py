"""Baselines: start on a legacy repository without fixing everything first.

`--write-baseline FILE` records today's findings by fingerprint (see fingerprint.py); `--baseline
FILE` then reports only findings whose fingerprint is not in it. A finding moved by unrelated edits
keeps its fingerprint and stays hidden; a new one, or an old line rewritten, is reported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .atomic import write_atomically
from .finding import Finding
from .fingerprint import fingerprints

FORMAT_VERSION = 1


class BaselineError(Exception):
    pass


def write(path: Path, findings: Sequence[Finding]) -> None:
    """Atomically: a crash half-way must not leave a truncated baseline behind."""
    entries = [
        {"fingerprint": fingerprint, "code": f.code, "filename": f.filename, "line": f.location.row, "message": f.message}
        for f, fingerprint in zip(findings, fingerprints(findings))
    ]
    document = {"loopaudit_baseline": FORMAT_VERSION, "written_by": f"loopaudit {__version__}", "findings": entries}
    folder = path.resolve().parent
    if not folder.is_dir():
        raise BaselineError(f"--write-baseline: the folder of {path} does not exist")
    if path.is_dir():
        raise BaselineError(f"--write-baseline: {path} is a folder; give the baseline file's name")
    write_atomically(path, (json.dumps(document, indent=2) + "\n").encode("utf-8"))


def load(path: Path) -> frozenset[str]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"--baseline: no such file: {path} (create it with --write-baseline)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BaselineError(f"--baseline: {path} is not a loopaudit baseline: {error}") from None
    if not isinstance(document, dict) or document.get("loopaudit_baseline") != FORMAT_VERSION or not isinstance(document.get("findings"), list):
        raise BaselineError(f"--baseline: {path} is not a loopaudit baseline (version {FORMAT_VERSION})")
    return frozenset(str(entry.get("fingerprint")) for entry in document["findings"] if isinstance(entry, dict))


def new_findings(findings: Sequence[Finding], known: frozenset[str]) -> list[Finding]:
    return [f for f, fingerprint in zip(findings, fingerprints(findings)) if fingerprint not in known]
