"""Fingerprints that name a finding by its code, not its line number.

A baseline taken today must still recognise a finding after unrelated edits move it: the fingerprint
hashes the rule, the file and the reported line's text with its whitespace collapsed, plus how many
identical (rule, file, text) findings come before it in the file, so that two `loss.item()` lines in
one file stay two findings. Editing the reported line itself makes it a new finding, as it should.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

from .finding import Finding


def _normalized(text: str | None) -> str:
    return " ".join((text or "").split())


def fingerprints(findings: Sequence[Finding]) -> list[str]:
    """One fingerprint per finding, in the order given (occurrences counted in file order)."""
    seen: Counter[tuple[str, str, str]] = Counter()
    order = sorted(range(len(findings)), key=lambda index: findings[index].sort_key())
    result = [""] * len(findings)
    for index in order:
        finding = findings[index]
        key = (finding.code, finding.filename.replace("\\", "/"), _normalized(finding.source_line))
        occurrence = seen[key]
        seen[key] += 1
        digest = hashlib.sha256("\0".join((*key, str(occurrence))).encode("utf-8")).hexdigest()
        result[index] = digest[:32]
    return result
