"""`--since REV`: only findings on lines changed since a git revision (a pull request's base).

The changed lines are those `git diff REV` adds or rewrites in the working tree, plus every line of
files git does not track yet. A finding counts when any line of its span changed.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from loopaudit.findings.finding import Finding

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class SinceError(Exception):
    pass


def _git(*args: str, cwd: Path) -> str:
    try:
        completed = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, errors="replace")
    except FileNotFoundError:
        raise SinceError("--since needs git, which is not installed") from None
    if completed.returncode != 0:
        command = " ".join(arg for arg in args if not arg.startswith("-") and "=" not in arg)[:60]
        raise SinceError(f"--since: `git {command}` failed: {completed.stderr.strip() or completed.returncode}")
    return completed.stdout


def changed_lines(revision: str, cwd: Path | None = None) -> dict[str, set[int] | None]:
    """Absolute path -> changed line numbers (None: the whole file is new)."""
    cwd = cwd or Path.cwd()
    try:
        top = Path(_git("rev-parse", "--show-toplevel", cwd=cwd).strip())
    except SinceError:
        raise SinceError(f"--since: {cwd} is not inside a git repository") from None
    try:
        _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", cwd=cwd)
    except SinceError:
        raise SinceError(f"--since: no such git revision: {revision}") from None
    changes: dict[str, set[int] | None] = {}
    current: str | None = None
    diff = _git(
        "-c",
        "core.quotePath=false",
        "diff",
        "--unified=0",
        "--no-color",
        "--no-ext-diff",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        revision,
        "--",
        cwd=top,
    )
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:]
            current = None if name == "/dev/null" else os.path.normpath(top / name[2:])
            if current is not None:
                changes.setdefault(current, set())
        elif current is not None and (match := _HUNK.match(line)):
            start, count = int(match.group(1)), int(match.group(2) or 1)
            cast("set[int]", changes[current]).update(range(start, start + count))  # set by its "+++ " line
    for name in _git("ls-files", "--others", "--exclude-standard", cwd=top).splitlines():
        changes[os.path.normpath(top / name)] = None
    return changes


def changed_lines_under(revision: str, paths: Sequence[str]) -> dict[str, set[int] | None]:
    """changed_lines in every git repository the scanned paths are in (asked from each path, not
    from the working directory: `cd /tmp && loopaudit scan --since HEAD ~/repo` is the repository's
    diff). `-` (stdin) asks from the working directory."""
    folders = []
    for path in paths:
        if path == "-":
            folders.append(Path.cwd())
            continue
        folder = Path(path).resolve()
        while not folder.is_dir() and folder != folder.parent:  # a file, or a path that is not there
            folder = folder.parent
        folders.append(folder)
    tops: dict[Path, Path] = {}
    for folder in dict.fromkeys(folders or [Path.cwd()]):
        try:
            tops[Path(_git("rev-parse", "--show-toplevel", cwd=folder).strip())] = folder
        except SinceError:
            raise SinceError(f"--since: {folder} is not inside a git repository") from None
    changes: dict[str, set[int] | None] = {}
    for top in tops:
        changes.update(changed_lines(revision, top))
    return changes


def on_changed_lines(findings: Sequence[Finding], changes: dict[str, set[int] | None]) -> list[Finding]:
    kept = []
    for finding in findings:
        path = os.path.normpath(os.path.abspath(finding.filename))
        if path not in changes:
            continue
        lines = changes[path]
        # A grouped finding is reported when any of its lines changed: a read added to a step shows.
        if lines is None or not lines.isdisjoint(finding.rows()):
            kept.append(finding)
    return kept
