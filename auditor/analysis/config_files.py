"""Settings a project keeps in YAML configuration files: `num_workers: 2` in
egs/*/conf/parallel_wavegan.v1.yaml, `n_workers: 16` under `training:` in configs/fcn8s.yml.

A script that loads one (`config = yaml.load(f)`) and builds its loader with
`num_workers=config["num_workers"]` runs with whatever the shipped configurations say. The files are
read as text, one `key: value` line at a time, for integers and booleans only (the values the loader
rules ask about), so that the static mode needs no YAML library. A key keeps a value when at least
three in four of the files that set it give that value (ParallelWaveGAN's recipes: `num_workers: 2`
in 70 of 79, 0 in two of them), or, for worker counts and the like, a positive number (then the
smallest of those stands: what matters is that workers start at all).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

# `  num_workers: 4  # comment`, `pin_memory: true`, `- shuffle: false`
_LINE = re.compile(r"^\s*(?:-\s+)?([A-Za-z_][\w-]*)\s*:\s*(true|false|True|False|\d+)\s*(?:#.*)?$")
_SKIPPED_FOLDERS = frozenset({"node_modules", "site-packages", "venv", "__pycache__", "build", "dist"})
# Bounds on a walk through a big repository: enough for research code's configuration folders.
_MAX_FILES = 400
_MAX_BYTES = 256_000


def config_file_values(folder: str) -> dict[str, int | bool]:
    """Key -> value of the integer and boolean settings the YAML files under `folder` agree on."""
    found: dict[str, list[set[tuple[type, int | bool]]]] = {}  # key -> what each file sets it to
    read = 0
    for here, folders, files in os.walk(folder):
        folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
        for name in sorted(files):
            if not name.endswith((".yaml", ".yml")):
                continue
            read += 1
            if read > _MAX_FILES:
                return _agreed(found)
            in_file: dict[str, set[tuple[type, int | bool]]] = {}
            for key, value in _settings(os.path.join(here, name)):
                in_file.setdefault(key, set()).add((type(value), value))
            for key, seen in in_file.items():
                found.setdefault(key, []).append(seen)
    return _agreed(found)


def _settings(path: str) -> Iterator[tuple[str, int | bool]]:
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            return
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return
    for line in lines:
        match = _LINE.match(line)
        if match:
            text = match.group(2)
            yield match.group(1), int(text) if text.isdigit() else text in ("true", "True")


def _agreed(found: dict[str, list[set[tuple[type, int | bool]]]]) -> dict[str, int | bool]:
    values: dict[str, int | bool] = {}
    for key, files in found.items():
        needed = 3 * len(files) / 4
        alone = [next(iter(seen)) for seen in files if len(seen) == 1]  # files that set it one way only
        for candidate in set(alone):
            if alone.count(candidate) >= needed:
                values[key] = candidate[1]
        positive = [value for kind, value in alone if kind is int and value > 0]
        if key not in values and positive and len(positive) >= needed:
            values[key] = min(positive)
    return values


def read_config_values(folder: str) -> tuple[tuple[str, object], ...]:
    """`config_file_values` as sorted pairs, the form project facts and the cache keep."""
    return tuple(sorted(config_file_values(folder).items()))
