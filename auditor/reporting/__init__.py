"""Output formats. Each module renders a list of findings; `FORMATS` maps a format's name to it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TextIO

from loopaudit.findings.finding import Finding
from loopaudit.reporting import concise, full, github, gitlab, json_format, junit, sarif

Renderer = Callable[[Sequence[Finding], TextIO, bool], None]

# The registry of output formats, in the order help texts list them: a new format is a module with a
# `NAME` and a `render`, added here. The command-line choices, the configuration's accepted values
# and the help texts all come from this.
_MODULES = (full, concise, json_format, github, sarif, gitlab, junit)
FORMATS: dict[str, Renderer] = {module.NAME: module.render for module in _MODULES}


def format_names() -> str:
    """The formats as a help text lists them: "full, concise, json, github, sarif, gitlab or junit"."""
    names = list(FORMATS)
    return ", ".join(names[:-1]) + " or " + names[-1]
