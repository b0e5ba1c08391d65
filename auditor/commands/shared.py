"""What every `loopaudit` command shares: exit codes, the output formats, usage errors, rule codes,
the way help lists parameters."""

from __future__ import annotations

import enum
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer
from typer.core import TyperCommand

from loopaudit.configuration.config_file import ConfigError, ConfigFinder
from loopaudit.configuration.settings import CommandLine, Settings
from loopaudit.reporting import FORMATS
from loopaudit.rule_api.registry import describe_unknown, unknown_codes

# As ruff's: 0 nothing found, 1 findings, 2 a usage error, a missing path or an internal error.
EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
# A shell's status for a process ended by SIGINT (Ctrl-C).
EXIT_INTERRUPTED = 130


# The `--output-format` choices: the registered formats (reporting/__init__.py).
if TYPE_CHECKING:
    # What the type checker sees, as it cannot read members out of the registry: the members the
    # code names (a format that no code names needs no line here).
    class OutputFormat(str, enum.Enum):
        full = "full"
        concise = "concise"
        json = "json"

else:
    OutputFormat = enum.Enum("OutputFormat", {name: name for name in FORMATS}, type=str)


def usage_error(message: str) -> typer.Exit:
    typer.echo(f"loopaudit: error: {message}", err=True)
    return typer.Exit(EXIT_ERROR)


def split_codes(values: list[str] | None) -> list[str]:
    """`--select LA1,LA2 --select LA6` -> ["LA1", "LA2", "LA6"]. Empty pieces stay (`--ignore ""`,
    `LA1,`), for check_codes to refuse: dropped, `--ignore ""` would pass as if it said something."""
    return [code.strip() for value in values or [] for code in value.split(",")]


def wants_color(flag: bool | None) -> bool:
    """--color/--no-color when given; else NO_COLOR (any value: no colour) and FORCE_COLOR (colour
    even when piped), the conventions of no-color.org and force-color.org; else whether stdout is a
    terminal."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    return sys.stdout.isatty()


def check_codes(codes: list[str]) -> None:
    """Unknown codes are an error: a typo such as `LA1O1` must not pass silently."""
    bad = unknown_codes(codes)
    if bad:
        raise usage_error(describe_unknown(bad))


def build_settings(select, extend_select, ignore, output_format, config: str | None, isolated: bool) -> Settings:
    """The command line's rule flags and configuration options, checked, over the configuration files."""
    select_codes, extend_codes, ignore_codes = split_codes(select), split_codes(extend_select), split_codes(ignore)
    check_codes(select_codes + extend_codes + ignore_codes)
    if config is not None and not Path(config).is_file():
        raise usage_error(f"--config: no such file: {config}")
    command_line = CommandLine(
        select=tuple(select_codes) if select_codes else None,
        extend_select=tuple(extend_codes),
        ignore=tuple(ignore_codes),
        output_format=output_format.value if output_format is not None else None,
    )
    try:
        return Settings(ConfigFinder(Path(config) if config else None, isolated), command_line)
    except ConfigError as error:
        raise usage_error(str(error)) from None


class PlainHelpCommand(TyperCommand):
    """A command whose help lists parameters as argparse does (`script`, `--steps STEPS`): typer
    appends a Python type to every one (`script <str>`, `--select <list[str]>`, `--steps <int
    range>`), which says nothing the help text does not. A choice's values stay
    (`--output-format <full|concise|...>`)."""

    def format_options(self, ctx, formatter) -> None:
        arguments: list[tuple[str, str]] = []
        options: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            if "|" not in name:
                # argparse's way: a value-taking option shows its value by name (`--steps STEPS`)
                takes_value = param.param_type_name == "option" and not getattr(param, "is_flag", False)
                name = _TYPE_SUFFIX.sub(f" {cast(str, param.name).upper()}" if takes_value else "", name)
            (arguments if param.param_type_name == "argument" else options).append((name, text))
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


_TYPE_SUFFIX = re.compile(r" <[^<>]*>$")
