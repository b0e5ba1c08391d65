"""Fingerprints that name a finding by its code, not its line number.

A baseline taken today must still recognise a finding after unrelated edits move it: the fingerprint
hashes the rule, the file and the reported line's text with its whitespace collapsed, plus how many
identical (rule, file, text) findings come before it in the file, so that two `loss.item()` lines in
one file stay two findings. Editing the reported line itself makes it a new finding, as it should.

The file is hashed by the exact bytes of its name, so a name that is not UTF-8 has a fingerprint
(the same in every run and locale) and two names that differ in such bytes have two. For UTF-8
names on a UTF-8 file system these are the bytes hashed before: baselines written then still match.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence

from .finding import Finding


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
    """One fingerprint per finding, in the order given (occurrences counted in file order)."""
    seen: Counter[tuple[str, str, str]] = Counter()
    order = sorted(range(len(findings)), key=lambda index: findings[index].sort_key())
    result = [""] * len(findings)
    for index in order:
        finding = findings[index]
        key = (finding.code, finding.filename.replace("\\", "/"), _normalized(finding.source_line))
        occurrence = seen[key]
        seen[key] += 1
        code, filename, text = key
        # surrogatepass: valid text hashes as its UTF-8, as before, and no str can make hashing fail
        hashed = (code.encode("utf-8"), filename_bytes(filename), text.encode("utf-8", "surrogatepass"), str(occurrence).encode("utf-8"))
        digest = hashlib.sha256(b"\0".join(hashed)).hexdigest()
        result[index] = digest[:32]
    return result
