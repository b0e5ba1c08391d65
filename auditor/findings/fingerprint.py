"""Fingerprints that name a finding by its code, not its line number.

A baseline taken today must still recognise a finding after unrelated edits move it: the fingerprint
hashes the rule, the file and the reported line's text with its whitespace collapsed, plus how many
identical (rule, file, text) lines are reported before it in the file, so that two `loss.item()` lines
in one file stay two. Editing the reported line itself makes it a new finding, as it should.

Each line a finding reports has a fingerprint: a grouped finding (grouping.py: the reads of one step)
has its first line's, which names it (SARIF's and GitLab's fingerprint), and its related lines' each,
counted among the identical lines as if they were findings of their own, so that they are exactly the
fingerprints the lines had before they were grouped. The finding's own fingerprint stays when a read
is added later in the step or one is removed (code scanning keeps one alert, whose message lists one
line more); a baseline holds every line's fingerprint (baseline.py), so the read added to an old step
still fails the gate, shown as the step's finding. A read added before the first moves the finding to
it: a new fingerprint.

The file is hashed by the exact bytes of its name, so a name that is not UTF-8 has a fingerprint
(the same in every run and locale) and two names that differ in such bytes have two. For UTF-8
names on a UTF-8 file system these are the bytes hashed before: baselines written then still match.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from typing import cast

from loopaudit.findings.finding import Finding, Related


def _normalized(text: str | None) -> str:
    return " ".join((text or "").split())


def filename_bytes(filename: str) -> bytes:
    """The name as the file system holds it: os.fsencode undoes os.fsdecode, so a name that is not
    UTF-8 gets its own bytes back. A name no file system gave us (a lone surrogate read from a
    trace's JSON) has none; its UTF-8 with the surrogates passed through stands in for them."""
    try:
        return os.fsencode(filename)
    except UnicodeEncodeError:
        return filename.encode("utf-8", "surrogatepass")


def fingerprints(findings: Sequence[Finding]) -> list[str]:
    """One fingerprint per finding, in the order given: its first line's."""
    return [lines[0] for lines in line_fingerprints(findings)]


def line_fingerprints(findings: Sequence[Finding]) -> list[tuple[str, ...]]:
    """Per finding, in the order given, the fingerprints of the lines it reports: its own, then its
    related places' (occurrences counted over every reported line, in file order)."""
    lines = sorted(
        (finding.filename, where.location, finding.code, index, place)
        for index, finding in enumerate(findings)
        for place, where in enumerate(cast("tuple[Finding | Related, ...]", (finding, *finding.related)))
    )
    seen: Counter[tuple[str, str, str]] = Counter()
    result: list[list[str]] = [[""] * (1 + len(finding.related)) for finding in findings]
    for filename, _, code, index, place in lines:
        where = findings[index] if place == 0 else findings[index].related[place - 1]
        key = (code, filename.replace("\\", "/"), _normalized(where.source_line))
        occurrence = seen[key]
        seen[key] += 1
        code, filename, text = key
        # surrogatepass: valid text hashes as its UTF-8, as before, and no str can make hashing fail
        hashed = (
            code.encode("utf-8"),
            filename_bytes(filename),
            text.encode("utf-8", "surrogatepass"),
            str(occurrence).encode("utf-8"),
        )
        result[index][place] = hashlib.sha256(b"\0".join(hashed)).hexdigest()[:32]
    return [tuple(fingerprints) for fingerprints in result]
