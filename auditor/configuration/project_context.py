"""The project around files named on the command line.

A per-step `.item()` in `helpers.py` is per-step because `train.py` calls it in its loop. So
`loopaudit scan helpers.py` (and the pre-commit hook, which names only the changed files) analyses
the named files inside the project they lie in: the nearest folder above them holding a repository
marker (`pyproject.toml`, `setup.py`, `setup.cfg`, `.git`). The other files of that project are
found as a folder scan finds them (`.gitignore`, `exclude`), analysed as context, and never reported
on. The cache keeps their analyses, so a warm run costs little more than the named files.

No context is added when a folder is named (the folder is the scan), when the files lie in no
project, or when the project is too large to analyse as context (`MAX_CONTEXT_FILES`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from loopaudit.analysis.layout import REPOSITORY_MARKERS, ProjectLayout
from loopaudit.configuration.discovery import SourceFile, discover

# A project with more Python files than this is not analysed as context: a cold scan of it would
# cost a pre-commit run tens of seconds.
MAX_CONTEXT_FILES = 3000


def project_root(paths: list[str]) -> str | None:
    """The nearest folder above all the named files that holds a repository marker, or None."""
    folders = {os.path.dirname(os.path.abspath(path)) for path in paths}
    if not folders:
        return None
    folder = os.path.commonpath(sorted(folders))
    home = os.path.expanduser("~")
    while True:
        if folder == home:
            return None  # a marker in the home folder marks no project
        if any(os.path.exists(os.path.join(folder, marker)) for marker in REPOSITORY_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def context_files(paths: list[str], named: list[SourceFile], excluded: Callable[[Path], bool]) -> list[SourceFile]:
    """The files of the project around the named `paths` that are not named themselves, as a folder
    scan of the project finds them; empty when there is no such context (see the module's doc)."""
    if not paths or not all(os.path.isfile(path) for path in paths):
        return []
    root = project_root(paths)
    if root is None:
        return []
    taken = {os.path.abspath(file.path) for file in named}
    found = [
        file for file in discover([root]) if os.path.abspath(file.path) not in taken and not excluded(Path(file.path))
    ]
    if len(found) > MAX_CONTEXT_FILES:
        return []
    # A known library's own sources are analysed on their own in any scan (project.py): context
    # changes nothing for them, and they give a project file none.
    layout = ProjectLayout([*taken, *(os.path.abspath(file.path) for file in found)])
    if all(layout.is_library(path) for path in taken):
        return []
    return [
        SourceFile(file.path, file.display, False)
        for file in found
        if not layout.is_library(os.path.abspath(file.path))
    ]
