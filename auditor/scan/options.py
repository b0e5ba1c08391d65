"""What one file's scan runs with: the rules selected for it and the settings the rules read.

The configuration (configuration/settings.py) builds one per file, from the configuration file
closest to it and the command line; the engine and the fixer take it as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopaudit.rule_api.rule import Rule


@dataclass(frozen=True)
class ScanOptions:
    rules: tuple[type[Rule], ...]
    extra_hooks: frozenset[str] = frozenset()  # method names that run once per step (configuration)
    periodic_names: frozenset[str] = frozenset()  # names that make an `if` a periodic guard
    device: str = "auto"  # "cuda" / "cpu": the user says whether the code targets CUDA

    @property
    def enabled_codes(self) -> frozenset[str]:
        return frozenset(rule.code for rule in self.rules)
