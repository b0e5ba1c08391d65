"""GitHub Actions workflow commands: each finding becomes an annotation on the pull request.

The runner reads stdout line by line, splits a command's properties at `,` and its key from its
value at `=`, and undoes exactly these escapes (actions/runner, ActionCommand.cs): `%`, CR and LF
in the message; those and `:` and `,` in a property. Any file name and message survive them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from loopaudit.findings.finding import Finding
from loopaudit.reporting.safe_text import EncodableStream

NAME = "github"  # as `--output-format` and `output-format` name it


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    stream = EncodableStream(out)  # the runner reads UTF-8: a name that is not gets its bytes as `\xff`
    for f in findings:
        level = "error" if f.severity == "error" else "warning"
        fields = [f"title={_escape_property('loopaudit ' + f.code)}", f"file={_escape_property(f.filename)}"]
        message = f"{f.code} {f.message}"
        if f.cell is None:
            fields += [
                f"line={f.location.row}",
                f"col={f.location.column}",
                f"endLine={f.end_location.row}",
                f"endColumn={f.end_location.column}",
            ]
        else:
            # A notebook's lines are not the JSON file's the pull request shows: the annotation goes
            # on the file, and the message says the cell and its line.
            message = f"cell {f.cell}, line {f.location.row}: {message}"
        stream.write(f"::{level} {','.join(fields)}::{_escape_data(message)}\n")
