"""Output formats. Each module renders a list of findings; `FORMATS` maps a format's name to it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TextIO

from loopaudit.findings.finding import Finding
from loopaudit.reporting import concise, full, github, gitlab, json_format, junit, sarif

Renderer = Callable[[Sequence[Finding], TextIO, bool], None]

FORMATS: dict[str, Renderer] = {
    "full": full.render,
    "concise": concise.render,
    "json": json_format.render,
    "github": github.render,
    "sarif": sarif.render,
    "gitlab": gitlab.render,
    "junit": junit.render,
}
