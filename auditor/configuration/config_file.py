"""Configuration files: `[tool.loopaudit]` in pyproject.toml, or a standalone loopaudit.toml.

As ruff does, each scanned file gets the configuration closest to it: the first folder, walking up
from the file's own, that holds a `loopaudit.toml` (which wins) or a `pyproject.toml` with a
`[tool.loopaudit]` table. Command-line flags win over the file. Keys are kebab-case, as ruff's:

    select, ignore, extend-select      rule codes or prefixes (LA1, LA101)
    per-file-ignores                   {glob: [codes]}, globs relative to the file's folder
    exclude, extend-exclude            globs of files and folders a folder walk skips
    output-format                      a registered output format (reporting/__init__.py)
    step-methods                       method names that run once per step (a house `train_step`)
    periodic-names                     names that make an `if` a periodic guard (`if log_now:`)
    device                             "auto" (infer from the code), "cuda" or "cpu"

Anything else (an unknown key, a wrong type, an unknown rule code, a TOML syntax error) is a
ConfigError naming the file and the key; the command exits 2 with it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pathspec

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from loopaudit.reporting import FORMATS
from loopaudit.rule_api.registry import describe_unknown, unknown_codes

CONFIG_FILES = ("loopaudit.toml", "pyproject.toml")
OUTPUT_FORMATS = tuple(FORMATS)
DEVICES = ("auto", "cuda", "cpu")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    def __init__(self, path: Path | str, key: str | None, message: str) -> None:
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class FileConfig:
    """One configuration file's settings, validated. `root` is the folder its globs are relative to."""

    path: Path | None  # None: no file, the defaults
    root: Path
    values: dict = field(default_factory=dict)  # the keys the file sets, kebab-case, validated

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    @property
    def table(self) -> str:
        if self.path is None:
            return "defaults"
        return str(self.path) if self.path.name == "loopaudit.toml" else f"{self.path} [tool.loopaudit]"

    def excludes(self, file: Path, is_dir: bool = False) -> bool:
        """Is `file` (under this configuration's folder) excluded from folder walks?"""
        return _matches(self._exclude_spec, self.root, file, is_dir)

    @property
    def has_excludes(self) -> bool:
        return self._exclude_spec is not None

    def ignored_codes(self, file: Path) -> list[str]:
        """The codes `per-file-ignores` drops for `file`."""
        return [
            code for spec, codes in self._per_file_specs for code in codes if _matches(spec, self.root, file, False)
        ]

    @property
    def _exclude_spec(self) -> pathspec.PathSpec | None:
        patterns = [*self.get("exclude", []), *self.get("extend-exclude", [])]
        return _spec(tuple(patterns)) if patterns else None

    @property
    def _per_file_specs(self) -> list[tuple[pathspec.PathSpec, list[str]]]:
        return [(_spec((pattern,)), codes) for pattern, codes in self.get("per-file-ignores", {}).items()]


@lru_cache(maxsize=256)
def _spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    return pathspec.GitIgnoreSpec.from_lines(patterns)


def _matches(spec: pathspec.PathSpec | None, root: Path, file: Path, is_dir: bool) -> bool:
    if spec is None:
        return False
    try:
        relative = Path(os.path.realpath(file)).relative_to(root).as_posix()
    except ValueError:
        return False
    return spec.match_file(relative + "/" if is_dir else relative)


def load(path: Path) -> FileConfig | None:
    """The file's loopaudit settings; None for a pyproject.toml without a [tool.loopaudit] table."""
    try:
        with open(path, "rb") as stream:
            document = tomllib.load(stream)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(path, None, f"not valid TOML: {error}") from None
    except RecursionError:  # tomllib recurses once per nested array or table
        raise ConfigError(path, None, "not valid TOML: it nests too deeply to read") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            path, None, f"not UTF-8 text, as TOML must be (byte {error.start} cannot be decoded)"
        ) from None
    except OSError as error:
        raise ConfigError(path, None, f"cannot read it: {error.strerror or error}") from None
    if path.name == "pyproject.toml":
        table = document.get("tool", {}).get("loopaudit") if isinstance(document.get("tool"), dict) else None
        if table is None:
            return None
        prefix = "[tool.loopaudit] "
    else:
        # A standalone file may hold the keys at the top, or under [tool.loopaudit] like pyproject.
        table = (
            document.get("tool", {}).get("loopaudit", document) if isinstance(document.get("tool"), dict) else document
        )
        prefix = ""
    if not isinstance(table, dict):
        raise ConfigError(path, "[tool.loopaudit]", "must be a table")
    return FileConfig(path, path.parent.resolve(), _validate(table, path, prefix))


def _validate(table: dict, path: Path, prefix: str) -> dict:
    values: dict[str, Any] = {}
    for key, value in table.items():
        where = prefix + key
        if key in ("select", "ignore", "extend-select"):
            values[key] = _codes(value, path, where)
        elif key == "per-file-ignores":
            if not isinstance(value, dict):
                raise ConfigError(path, where, "must be a table of glob = [rule codes]")
            _globs(list(value), path, where)
            values[key] = {pattern: _codes(codes, path, f"{where}.{pattern}") for pattern, codes in value.items()}
        elif key in ("exclude", "extend-exclude"):
            values[key] = _globs(_strings(value, path, where), path, where)
        elif key in ("step-methods", "periodic-names"):
            names = _strings(value, path, where)
            bad = [name for name in names if not _IDENTIFIER.match(name)]
            if bad:
                raise ConfigError(path, where, f"not Python names: {', '.join(map(repr, bad))}")
            values[key] = names
        elif key == "output-format":
            values[key] = _choice(value, OUTPUT_FORMATS, path, where)
        elif key == "device":
            values[key] = _choice(value, DEVICES, path, where)
        else:
            known = "select, ignore, extend-select, per-file-ignores, exclude, extend-exclude, output-format, step-methods, periodic-names, device"
            raise ConfigError(path, where, f"unknown key (known: {known})")
    return values


def _strings(value, path: Path, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(path, where, f"must be a list of strings, not {_describe(value)}")
    return value


def _globs(patterns: list[str], path: Path, where: str) -> list[str]:
    for pattern in patterns:
        try:
            _spec((pattern,))
        except ValueError as error:  # pathspec's pattern errors are ValueErrors
            raise ConfigError(path, where, f"{pattern!r} is not a valid glob: {error}") from None
    return patterns


def _codes(value, path: Path, where: str) -> list[str]:
    codes = [code.strip().upper() for code in _strings(value, path, where)]
    bad = unknown_codes(codes)
    if bad:
        raise ConfigError(path, where, describe_unknown(bad))
    return codes


def _choice(value, choices: tuple[str, ...], path: Path, where: str) -> str:
    if value not in choices:
        raise ConfigError(path, where, f"must be one of {', '.join(map(repr, choices))}, not {_describe(value)}")
    return value


def _describe(value) -> str:
    return f"{type(value).__name__} {value!r}"


class ConfigFinder:
    """Finds and caches the configuration for each folder (one read per file, however many
    scanned files share it)."""

    def __init__(self, forced: Path | None = None, isolated: bool = False) -> None:
        self._forced = forced
        self._isolated = isolated
        self._by_folder: dict[Path, FileConfig] = {}
        self._defaults = FileConfig(None, Path.cwd().resolve())
        self._by_file_folder: dict[str, FileConfig] = {}
        if forced is not None:
            loaded = load(forced)
            if loaded is None:
                raise ConfigError(forced, None, "has no [tool.loopaudit] table")
            self._forced_config = loaded

    def for_file(self, file: Path | str) -> FileConfig:
        # Files of one folder share its configuration: resolve each folder once, not each file.
        if os.path.islink(file):
            # Its configuration is its target's (realpath: a link loop has none, and no exception).
            return self.for_folder(Path(os.path.realpath(file)).parent)
        folder = os.path.dirname(os.path.abspath(file))
        known = self._by_file_folder.get(folder)
        if known is None:
            known = self._by_file_folder[folder] = self.for_folder(Path(os.path.realpath(file)).parent)
        return known

    def for_folder(self, folder: Path) -> FileConfig:
        if self._isolated:
            return self._defaults
        if self._forced is not None:
            return self._forced_config
        folder = Path(os.path.realpath(folder))
        known = self._by_folder.get(folder)
        if known is not None:
            return known
        found = None
        for name in CONFIG_FILES:
            candidate = folder / name
            if candidate.is_file():
                found = load(candidate)
                if found is not None:
                    break
        if found is None:
            found = self.for_folder(folder.parent) if folder.parent != folder else self._defaults
        self._by_folder[folder] = found
        return found
