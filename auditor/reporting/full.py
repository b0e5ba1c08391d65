"""The default, for people: each finding with its source line, the span underlined, why it runs per
step, and what to write instead. Colour comes from rich when the output is a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from rich.console import Console
from rich.text import Text

from ..finding import Finding


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    console = Console(file=out, force_terminal=color, no_color=not color, highlight=False, soft_wrap=True)
    for f in findings:
        console.print(_finding(f))


def describe_observed(observed: dict) -> str:
    """`1 per step, 20 in all, 61.3 ms`: the measurement of a runtime finding, in words."""
    parts = []
    if observed.get("per_step") is not None:
        parts.append(f"{observed['per_step']:g} per step")
    if observed.get("total") is not None:
        parts.append(f"{observed['total']} in all")
    if observed.get("share") is not None:
        parts.append(f"{observed['share']:.1%} of the time")
    if observed.get("time_ms") is not None:
        parts.append(f"{observed['time_ms']:.2f} ms")
    elif "time_ms" in observed and observed.get("per_step") is not None:
        parts.append("no stall time without a GPU")
    return ", ".join(parts)


def _finding(f: Finding) -> Text:
    text = Text()
    text.append(f"{f.filename}:{f.location.row}:{f.location.column}", style="bold")
    text.append(": ")
    text.append(f.code, style="bold red" if f.severity == "error" else "bold yellow")
    text.append(f" {f.message}\n")
    gutter = " " * len(str(f.location.row))
    if f.source_line is not None:
        line = f.source_line.expandtabs(4) if "\t" not in f.source_line[: f.location.column] else f.source_line
        text.append(f"{gutter} |\n", style="blue")
        text.append(f"{f.location.row} | ", style="blue")
        text.append(f"{line}\n")
        start = f.location.column - 1
        end = f.end_location.column - 1 if f.end_location.row == f.location.row else len(line)
        width = max(1, end - start)
        text.append(f"{gutter} | ", style="blue")
        text.append(" " * start + "^" * width, style="bold red" if f.severity == "error" else "bold yellow")
        text.append(f" {f.code}\n")
        text.append(f"{gutter} |\n", style="blue")
    if f.context:
        text.append(f"{gutter} = ", style="blue")
        text.append("per step: ", style="bold")
        text.append(f"{f.context}\n")
    if f.observed:
        text.append(f"{gutter} = ", style="blue")
        text.append("measured: ", style="bold")
        text.append(f"{describe_observed(f.observed)}\n")
    if f.suggestion:
        text.append(f"{gutter} = ", style="blue")
        text.append("help: ", style="bold cyan")
        text.append(f"{f.suggestion}\n")
    return text
