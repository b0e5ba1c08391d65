"""Which files a scan reads: the paths given, and the *.py and *.ipynb files under given folders.

Walking a folder skips what is never the user's own code (.git, virtual environments, build and cache
folders) and honours every .gitignore from the repository root down, through pathspec's
implementation of git's own matching rules.

A walk takes any tree the file system allows: it reads only regular files (a FIFO named `x.py` would
block the scan forever), does not follow links to folders (so a link loop cannot trap it), and goes
past a symbolic link loop, a dangling link or a folder it may not read, noting each in `skipped` for
the command to say once.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

SKIPPED_FOLDERS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "build",
        "dist",
        "node_modules",
        "site-packages",
        "__pypackages__",
        ".direnv",
    }
)


@dataclass(frozen=True)
class SourceFile:
    path: str  # what to open
    display: str  # what to print
    explicit: bool  # named on the command line (always parsed) rather than found in a folder


class MissingPath(Exception):
    pass


def discover(
    paths: list[str], cwd: Path | None = None, skipped: list[tuple[str, str]] | None = None
) -> list[SourceFile]:
    """The files to scan, by display name. `skipped` receives (path, why) for each entry of a walked
    folder that was passed over for what it is rather than by choice (not a regular file, unreadable)."""
    cwd_text = str((cwd or Path.cwd()).resolve())
    skipped = [] if skipped is None else skipped
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise MissingPath(", ".join(missing))
    files: dict[str, SourceFile] = {}
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for found, absolute in _walk(path, skipped):
                files.setdefault(absolute, SourceFile(str(found), _display(found, absolute, cwd_text), False))
        else:
            absolute = str(path.resolve())
            files[absolute] = SourceFile(str(path), _display(path, absolute, cwd_text), True)
    return sorted(files.values(), key=lambda f: f.display)


def _display(path: Path, absolute: str, cwd: str) -> str:
    """The path from the current folder when the file is under it, else as given."""
    inside = cwd if cwd.endswith(os.sep) else cwd + os.sep
    return absolute[len(inside) :] if absolute.startswith(inside) else str(path)


def _is_virtualenv(folder: Path) -> bool:
    try:
        return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()
    except OSError:  # a folder it may not read: the walk notes it when it tries to
        return False


def _walk(root: Path, skipped: list[tuple[str, str]]) -> Iterator[tuple[Path, str]]:
    """(path, resolved path) of each *.py and *.ipynb file under `root` that is not skipped or ignored."""
    # The .gitignore files that apply in each folder: those above it, then its own.
    inherited = {root.resolve(): _ignores_above(root)}

    def unreadable(error: OSError) -> None:
        skipped.append((str(error.filename), error.strerror or str(error)))

    for folder, subfolders, filenames in os.walk(root, onerror=unreadable):
        here = Path(folder)
        resolved = here.resolve()
        specs = inherited.pop(resolved, [])
        local = _load_gitignore(here)
        if local is not None:
            specs = [*specs, (resolved, local)]
        kept = []
        for name in sorted(subfolders):
            sub = here / name
            if name in SKIPPED_FOLDERS or name.endswith(".egg-info") or _is_virtualenv(sub):
                continue
            if _ignored(sub, specs, is_dir=True):
                continue
            kept.append(name)
            inherited[sub.resolve()] = specs
        subfolders[:] = kept
        for name in sorted(filenames):
            if not name.endswith((".py", ".ipynb")):  # scripts and Jupyter notebooks
                continue
            file = here / name
            # Resolving every file costs a system call per folder of its path: only a link needs it.
            # realpath, not resolve: a link loop gives a path that is not there, not an exception.
            absolute = os.path.realpath(file) if os.path.islink(file) else os.path.join(resolved, name)
            if _ignored(file, specs, is_dir=False, absolute=absolute):
                continue
            problem = _not_a_file(file)
            if problem is not None:
                skipped.append((str(file), problem))
                continue
            yield file, absolute


def _not_a_file(path: Path) -> str | None:
    """Why the walk must not read `path` (through its links), or None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:  # a dangling link, a link loop (ELOOP), no permission to look
        return error.strerror or str(error)
    if stat.S_ISREG(mode):
        return None
    kind = (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
    )
    return f"not a regular file: {kind}"


def _load_gitignore(folder: Path) -> pathspec.PathSpec | None:
    gitignore = folder / ".gitignore"
    try:
        if not gitignore.is_file():
            return None
        lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:  # unreadable: its folder's files are read as if it said nothing
        return None
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except ValueError:  # a line git would not understand either: keep the others
        return pathspec.GitIgnoreSpec.from_lines([line for line in lines if _valid_pattern(line)])


def _valid_pattern(line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except ValueError:
        return False
    return True


def _ignores_above(root: Path) -> list[tuple[Path, pathspec.PathSpec]]:
    """.gitignore files above the scanned folder, up to its repository's root, apply to it too."""
    resolved = root.resolve()
    above = list(resolved.parents)
    repo_root = next((folder for folder in [resolved, *above] if (folder / ".git").exists()), None)
    if repo_root is None or repo_root == resolved:
        return []
    chain = []
    for folder in reversed(above):
        if folder == repo_root or repo_root in folder.parents:
            spec = _load_gitignore(folder)
            if spec is not None:
                chain.append((folder, spec))
    if _ignored(resolved, chain, is_dir=True):
        return []  # the user named an ignored folder: they asked for it, so scan it
    return chain


def _ignored(
    path: Path, specs: list[tuple[Path, pathspec.PathSpec]], *, is_dir: bool, absolute: str | None = None
) -> bool:
    if not specs:
        return False
    resolved = Path(absolute) if absolute is not None else path.resolve()
    for base, spec in specs:
        try:
            relative = resolved.relative_to(base).as_posix()
        except ValueError:
            continue
        if spec.match_file(relative + "/" if is_dir else relative):
            return True
    return False
