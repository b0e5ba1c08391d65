"""The default, for people: each finding with its source line, the span underlined (and so the other
lines of a grouped finding's problem, each labelled), why it runs per step, and what to write
instead. Colour comes from rich when the output is a terminal.

Names and code are shown through safe_text.terminal_ready (control characters as their pictures,
as ruff shows them) and in what the stream's encoding can carry; the underline is measured on the
line as shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO, cast

from rich.console import Console
from rich.text import Text

from loopaudit.findings.finding import Finding, Related
from loopaudit.reporting.safe_text import EncodableStream, encodable, terminal_ready

NAME = "full"  # as `--output-format` and `output-format` name it


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    stream = EncodableStream(out)
    console = Console(
        file=cast(TextIO, stream), force_terminal=color, no_color=not color, highlight=False, soft_wrap=True
    )
    for f in findings:
        console.print(_finding(f, stream.encoding))


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


def _finding(f: Finding, encoding: str) -> Text:
    def shown(part: str) -> str:
        return encodable(terminal_ready(part), encoding)

    style = "bold red" if f.severity == "error" else "bold yellow"
    text = Text()
    text.append(shown(f.place()), style="bold")
    text.append(": ")
    text.append(f.code, style=style)
    if f.fix is not None and f.fix.applicability == "safe":
        text.append(" [*]")  # fixable with --fix, as ruff marks it
    text.append(f" {shown(f.message)}\n")
    # The related places are further down the file: the widest line number is the last one's.
    gutter = " " * len(str(f.related[-1].location.row if f.related else f.location.row))
    if f.source_line is not None:
        text.append(f"{gutter} |\n", style="blue")
        _snippet(text, f, f.code, gutter, style, shown)
        previous = f.location.row
        for place in f.related:
            if place.source_line is None:
                continue
            if place.location.row > previous + 1:
                text.append(f"{gutter} :\n", style="blue")  # lines left out between the places
            _snippet(text, place, place.message, gutter, style, shown)
            previous = place.location.row
        text.append(f"{gutter} |\n", style="blue")
    if f.context:
        text.append(f"{gutter} = ", style="blue")
        text.append("per step: ", style="bold")
        text.append(f"{shown(f.context)}\n")
    if f.observed:
        text.append(f"{gutter} = ", style="blue")
        text.append("measured: ", style="bold")
        text.append(f"{describe_observed(f.observed)}\n")
    if f.suggestion:
        text.append(f"{gutter} = ", style="blue")
        text.append("help: ", style="bold cyan")
        text.append(f"{shown(f.suggestion)}\n")
    return text


def _snippet(text: Text, where: Finding | Related, label: str, gutter: str, style: str, shown) -> None:
    """The source line of a finding or of one of its related places, its span underlined and labelled."""
    source = cast(str, where.source_line)  # the callers pass only places with one
    row = where.location.row
    line = source.expandtabs(4) if "\t" not in source[: where.location.column] else source
    text.append(f"{row:>{len(gutter)}} | ", style="blue")
    text.append(f"{shown(line)}\n")
    start = where.location.column - 1
    end = where.end_location.column - 1 if where.end_location.row == row else len(line)
    # An escaped character (`\xe9` on an ASCII terminal) is wider than one column.
    start, end = len(shown(line[:start])), len(shown(line[:end]))
    width = max(1, end - start)
    text.append(f"{gutter} | ", style="blue")
    text.append(" " * start + "^" * width, style=style)
    text.append(f" {shown(label)}\n")
