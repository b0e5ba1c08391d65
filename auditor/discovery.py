"""Which files a scan reads: the paths given, and the *.py files under given folders.

Walking a folder skips what is never the user's own code (.git, virtual environments, build and cache
folders) and honours every .gitignore from the repository root down, through pathspec's
implementation of git's own matching rules.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

SKIPPED_FOLDERS = frozenset({
    ".git", ".hg", ".svn", ".bzr", "__pycache__", ".venv", "venv", ".tox", ".nox", ".eggs",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "build", "dist",
    "node_modules", "site-packages", "__pypackages__", ".direnv",
})


@dataclass(frozen=True)
class SourceFile:
    path: str  # what to open
    display: str  # what to print
    explicit: bool  # named on the command line (always parsed) rather than found in a folder


class MissingPath(Exception):
    pass


def discover(paths: list[str], cwd: Path | None = None) -> list[SourceFile]:
    cwd = str((cwd or Path.cwd()).resolve())
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise MissingPath(", ".join(missing))
    files: dict[str, SourceFile] = {}
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for found, absolute in _walk(path):
                files.setdefault(absolute, SourceFile(str(found), _display(found, absolute, cwd), False))
        else:
            absolute = str(path.resolve())
            files[absolute] = SourceFile(str(path), _display(path, absolute, cwd), True)
    return sorted(files.values(), key=lambda f: f.display)


def _display(path: Path, absolute: str, cwd: str) -> str:
    """The path from the current folder when the file is under it, else as given."""
    inside = cwd if cwd.endswith(os.sep) else cwd + os.sep
    return absolute[len(inside):] if absolute.startswith(inside) else str(path)


def _is_virtualenv(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()


def _walk(root: Path) -> Iterator[tuple[Path, str]]:
    """(path, resolved path) of each *.py file under `root` that is not skipped or ignored."""
    # The .gitignore files that apply in each folder: those above it, then its own.
    inherited = {root.resolve(): _ignores_above(root)}
    for folder, subfolders, filenames in os.walk(root):
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
            if not name.endswith(".py"):
                continue
            file = here / name
            # Resolving every file costs a system call per folder of its path: only a link needs it.
            absolute = str(file.resolve()) if os.path.islink(file) else os.path.join(resolved, name)
            if not _ignored(file, specs, is_dir=False, absolute=absolute):
                yield file, absolute


def _load_gitignore(folder: Path) -> pathspec.PathSpec | None:
    gitignore = folder / ".gitignore"
    if not gitignore.is_file():
        return None
    try:
        lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
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


def _ignored(path: Path, specs: list[tuple[Path, pathspec.PathSpec]], *, is_dir: bool, absolute: str | None = None) -> bool:
    if not specs:
        return False
    absolute = Path(absolute) if absolute is not None else path.resolve()
    for base, spec in specs:
        try:
            relative = absolute.relative_to(base).as_posix()
        except ValueError:
            continue
        if spec.match_file(relative + "/" if is_dir else relative):
            return True
    return False
