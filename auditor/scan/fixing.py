"""Applying fixes to files: `--fix`, `--unsafe-fixes` and `--diff`.

A file is fixed in passes: scan, apply every fix that does not overlap another, scan again, until no
fix applies (at most a few passes: fixes that touch the same call wait for the next one). The result
must parse, or the file is left alone. Writing keeps the file's encoding, its line endings (only the
changed spans are replaced) and its mode, goes through a temporary file renamed over the original,
and is skipped when the file changed on disk since it was read.
"""

from __future__ import annotations

import difflib
import io
import os
import tokenize
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from loopaudit.analysis.cross_module import ProjectFacts
from loopaudit.atomic import write_atomically
from loopaudit.findings.finding import Finding, FixInfo
from loopaudit.scan.engine import analyze_text
from loopaudit.scan.notebooks import NotebookError, code_cells, is_notebook, located, read_notebook, with_new_text
from loopaudit.scan.options import ScanOptions

MAX_PASSES = 8


@dataclass
class FileFix:
    path: str
    display: str
    fixed: int = 0  # findings the fixes removed
    fixed_codes: Counter[str] = field(default_factory=Counter)  # of them, how many of each rule
    remaining: list[Finding] = field(default_factory=list)  # findings after the fixes
    diff: str = ""
    problem: str | None = None  # why the file was left alone (it changed on disk, ...)

    @property
    def changed(self) -> bool:
        return bool(self.diff)


# What reading a file as Python source can raise: it cannot be read, its coding line names no codec,
# or its bytes are not that codec.
UNREADABLE_SOURCE = (OSError, SyntaxError, LookupError, UnicodeDecodeError)


def read_source(path: str) -> tuple[bytes, str, str]:
    """The file's bytes, its encoding (PEP 263, else UTF-8) and its text, for rewriting it in place."""
    with open(path, "rb") as stream:
        original = stream.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(original).readline)
    return original, encoding, original.decode(encoding)


def applicable(finding: Finding, unsafe: bool) -> bool:
    return finding.fix is not None and (finding.fix.applicability == "safe" or unsafe)


def fix_file(
    path: str, display: str, options: ScanOptions, *, unsafe: bool, write: bool, facts: ProjectFacts | None = None
) -> FileFix:
    """`facts`: what the rest of the scanned project said about the file, so each pass finds what the scan found."""
    result = FileFix(path, display)
    if is_notebook(path):
        return _fix_notebook(result, options, unsafe=unsafe, write=write, facts=facts)
    try:
        original, encoding, text = read_source(path)
    except UNREADABLE_SOURCE as error:
        result.problem = f"cannot be fixed: {error}"
        return result
    before = text
    text, first, findings, problem = _passes(text, display, options, unsafe, facts)
    if problem is not None:
        result.problem = problem
        return result
    result.remaining = findings
    result.fixed_codes = _removed_by_rule(first, findings)
    result.fixed = sum(result.fixed_codes.values())
    if text == before:
        return result
    names = (display, display) if os.path.isabs(display) else (f"a/{display}", f"b/{display}")
    result.diff = "".join(
        difflib.unified_diff(before.splitlines(keepends=True), text.splitlines(keepends=True), *names)
    )
    if write:
        result.problem = write_if_unchanged(path, original, text.encode(encoding))
    return result


def _passes(
    text: str, display: str, options: ScanOptions, unsafe: bool, facts: ProjectFacts | None
) -> tuple[str, list[Finding], list[Finding], str | None]:
    """Fix `text` in passes: (the fixed text, the findings before, the findings after, a problem)."""
    findings = analyze_text(text, display, options, facts=facts)
    first = findings
    for _ in range(MAX_PASSES):
        edits = _non_overlapping([e for f in findings if applicable(f, unsafe) for e in cast(FixInfo, f.fix).edits])
        if not edits:
            break
        candidate = _apply(text, edits)
        if candidate == text:
            break
        try:
            cst.parse_module(candidate)
        except cst.ParserSyntaxError:
            problem = "a fix produced code that does not parse; the file was left alone (please report this)"
            return text, first, findings, problem
        text = candidate
        findings = analyze_text(text, display, options, facts=facts)
    return text, first, findings, None


def _fix_notebook(
    result: FileFix, options: ScanOptions, *, unsafe: bool, write: bool, facts: ProjectFacts | None
) -> FileFix:
    """A notebook's code cells fixed as one module, the changed cells written back (notebooks.py);
    the diff is one per changed cell, `a/train.ipynb:cell 3`."""
    try:
        with open(result.path, "rb") as stream:
            original = stream.read()
        notebook = read_notebook(original)
    except (OSError, NotebookError) as error:
        result.problem = f"cannot be fixed: {error}"
        return result
    before_cells = dict(code_cells(notebook))
    text, first, findings, problem = _passes(notebook.text, result.display, options, unsafe, facts)
    if problem is not None:
        result.problem = problem
        return result
    result.fixed_codes = _removed_by_rule(first, findings)
    result.fixed = sum(result.fixed_codes.values())
    if text == notebook.text:
        result.remaining = located(findings, notebook)
        return result
    try:
        data = with_new_text(notebook, text)
        fixed = read_notebook(data)
    except NotebookError as error:
        result.remaining = located(first, notebook)
        result.fixed, result.fixed_codes = 0, Counter()
        result.problem = f"was left alone: {error}"
        return result
    result.remaining = located(analyze_text(fixed.text, result.display, options, facts=facts), fixed)
    diffs = []
    for number, source in code_cells(fixed):
        if source != before_cells.get(number):
            where = f"{result.display}:cell {number}"
            names = (where, where) if os.path.isabs(result.display) else (f"a/{where}", f"b/{where}")
            old, new = before_cells.get(number, ""), source
            lines = difflib.unified_diff(_lines(old), _lines(new), *names)
            diffs.append("".join(lines))
    result.diff = "".join(diffs)
    if write:
        result.problem = write_if_unchanged(result.path, original, data)
    return result


def _lines(source: str) -> list[str]:
    """A cell's lines for a diff, each ended (a cell's last line often has no line end)."""
    return [line if line.endswith("\n") else line + "\n" for line in source.splitlines(keepends=True)]


def _non_overlapping(edits) -> list:
    """The edits that can go in one pass: the first of any that overlap waits for the next scan."""
    chosen, end = [], -1
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start >= end:
            chosen.append(edit)
            end = edit.end
    return chosen


def _apply(text: str, edits) -> str:
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        text = text[: edit.start] + edit.content + text[edit.end :]
    return text


def _removed(before: Sequence[Finding], after: Sequence[Finding]) -> int:
    """How many findings the fixes removed (messages quote code a fix may rewrite, and lines move,
    so findings are counted rather than matched)."""
    return sum(_removed_by_rule(before, after).values())


def _removed_by_rule(before: Sequence[Finding], after: Sequence[Finding]) -> Counter[str]:
    left = Counter(f.code for f in after)
    removed = Counter({code: count - left[code] for code, count in Counter(f.code for f in before).items()})
    return +removed  # the rules whose count went down


def write_if_unchanged(path: str, original: bytes, data: bytes) -> str | None:
    """Write `data` over `path` atomically, unless the file changed since `original` was read."""
    try:
        with open(path, "rb") as stream:
            if stream.read() != original:
                return "changed on disk while loopaudit fixed it; not overwritten"
        write_atomically(path, data)
    except OSError as error:
        return f"could not be written: {error.strerror or error}"
    return None
