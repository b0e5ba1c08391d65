"""The settings a scan runs with: the configuration file closest to each file, then the command
line on top of it.

Rule selection follows ruff: `select` (default: every rule) plus `extend-select`, minus `ignore`,
minus the file's `per-file-ignores`. `--select` on the command line starts a new selection (the
file's `select`, `extend-select` and `ignore` no longer apply, its `per-file-ignores` still do);
`--extend-select` and `--ignore` add to the file's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopaudit.configuration.config_file import ConfigFinder, FileConfig
from loopaudit.rule_api.registry import select_rules
from loopaudit.rule_api.rule import Rule, RuntimeRule
from loopaudit.scan.options import ScanOptions

KEYS = (
    "select",
    "extend-select",
    "ignore",
    "per-file-ignores",
    "exclude",
    "extend-exclude",
    "output-format",
    "step-methods",
    "periodic-names",
    "device",
)
DEFAULTS: dict[str, Any] = {
    "select": None,
    "extend-select": [],
    "ignore": [],
    "per-file-ignores": {},
    "exclude": [],
    "extend-exclude": [],
    "output-format": "full",
    "step-methods": [],
    "periodic-names": [],
    "device": "auto",
}


@dataclass(frozen=True)
class CommandLine:
    """What the user typed that overrides a configuration file (None or empty: not given)."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    output_format: str | None = None


@dataclass
class Settings:
    finder: ConfigFinder
    command_line: CommandLine = field(default_factory=CommandLine)
    _options: dict = field(default_factory=dict)

    def effective(self, config: FileConfig) -> dict[str, tuple[Any, str]]:
        """Every key's value and where it came from: "command line", the file, or "default"."""
        cli = self.command_line
        result = {
            key: (config.get(key), config.table) if key in config.values else (DEFAULTS[key], "default") for key in KEYS
        }
        if cli.select is not None:  # a new selection, as in ruff: the file's no longer applies
            result["select"] = (list(cli.select), "command line")
            result["extend-select"] = ([], "command line (--select replaces it)")
            result["ignore"] = ([], "command line (--select replaces it)")
        if cli.extend_select:
            value, source = result["extend-select"]
            result["extend-select"] = ([*value, *cli.extend_select], _joined(source))
        if cli.ignore:
            value, source = result["ignore"]
            result["ignore"] = ([*value, *cli.ignore], _joined(source))
        if cli.output_format is not None:
            result["output-format"] = (cli.output_format, "command line")
        return result

    def rules_for(self, file: Path | str) -> tuple[type[Rule], ...]:
        """Every rule that applies to `file`, static and runtime."""
        config = self.finder.for_file(file)
        values = {name: value for name, (value, _) in self.effective(config).items()}
        selected = select_rules(values["select"], None)
        extra = select_rules(values["extend-select"], None) if values["extend-select"] else ()
        chosen = {rule.code: rule for rule in (*selected, *extra)}
        dropped = tuple(code.upper() for code in (*values["ignore"], *config.ignored_codes(Path(file))))
        return tuple(
            rule for code, rule in sorted(chosen.items()) if not any(code.startswith(prefix) for prefix in dropped)
        )

    def options_for(self, file: Path | str) -> ScanOptions:
        """The scan options for one file (shared by every file with the same configuration and
        per-file ignores)."""
        config = self.finder.for_file(file)
        per_file = tuple(config.ignored_codes(Path(file)))
        key = (config.path, per_file)
        options = self._options.get(key)
        if options is None:
            values = {name: value for name, (value, _) in self.effective(config).items()}
            options = ScanOptions(
                rules=tuple(rule for rule in self.rules_for(file) if not issubclass(rule, RuntimeRule)),
                extra_hooks=frozenset(values["step-methods"]),
                periodic_names=frozenset(values["periodic-names"]),
                device=values["device"],
            )
            self._options[key] = options
        return options

    def output_format(self, folder: Path) -> str:
        return self.effective(self.finder.for_folder(folder))["output-format"][0]

    def excluded(self, file: Path) -> bool:
        """Is a file found by walking a folder excluded by its configuration?"""
        config = self.finder.for_file(file)
        if not config.has_excludes:
            return False  # the usual case: nothing to resolve the file's folders for
        if config.excludes(file):
            return True
        # A pattern naming a folder (`data/`, `legacy`) excludes everything under it.
        for parent in Path(os.path.realpath(file)).parents:
            if parent == config.root or config.root not in parent.parents:
                break
            if config.excludes(parent, is_dir=True):
                return True
        return False


def _joined(source: str) -> str:
    return "command line" if source == "default" else f"{source} + command line"
