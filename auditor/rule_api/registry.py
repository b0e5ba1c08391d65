"""Every rule, found by walking the `loopaudit.rules` package: a new rule is one new file."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from loopaudit.rule_api.rule import FileRule, Rule, RuntimeRule


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    package = importlib.import_module("loopaudit.rules")
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value not in (Rule, FileRule)
                and "code" in vars(value)  # shared base classes of a family declare no code
                and value.__module__ == module.__name__
            ):
                if value.code in found:
                    raise RuntimeError(f"two rules claim {value.code}: {found[value.code]} and {value}")
                found[value.code] = value
    return tuple(found[code] for code in sorted(found))


def static_rules() -> tuple[type[Rule], ...]:
    """The rules `loopaudit scan` checks: every one but the measured LA6xx rules."""
    return tuple(rule for rule in all_rules() if not issubclass(rule, RuntimeRule))


def rule_by_code(code: str) -> type[Rule] | None:
    return next((rule for rule in all_rules() if rule.code == code.upper()), None)


def select_rules(select: list[str] | None, ignore: list[str] | None) -> tuple[type[Rule], ...]:
    """ruff's semantics: `--select` codes or prefixes (default: all), minus `--ignore` ones. A file
    that cannot be read or parsed (the FileRules, LA001-LA003) is said whatever the selection: a
    `--select LA1` that hid a syntax error would pass a file it never checked. Only `--ignore` (or a
    per-file ignore) naming one silences it."""
    chosen = all_rules()
    if select:
        prefixes = [code.upper() for code in select]
        chosen = tuple(
            rule
            for rule in chosen
            if (issubclass(rule, FileRule) and rule.always_selected) or any(rule.code.startswith(p) for p in prefixes)
        )
    if ignore:
        prefixes = [code.upper() for code in ignore]
        chosen = tuple(rule for rule in chosen if not any(rule.code.startswith(p) for p in prefixes))
    return chosen


def unknown_codes(codes: list[str]) -> list[str]:
    """Codes or prefixes that match no rule (a typo such as `LA1O1` should not pass silently). An
    empty code is one too: as a prefix it would match every rule, so `select = [""]` selected all."""
    return [code for code in codes if not code or not any(rule.code.startswith(code.upper()) for rule in all_rules())]


def describe_unknown(codes: list[str]) -> str:
    """The error for unknown codes, an empty one named as such."""
    distinct = list(dict.fromkeys(codes))
    named = ", ".join(code or '"" (an empty code)' for code in distinct)
    return f"unknown rule code{'s' if len(distinct) > 1 else ''}: {named} (see `loopaudit rules`)"
