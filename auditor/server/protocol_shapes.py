"""Findings in the Language Server Protocol's shapes: a diagnostic per finding (its related places
as related information), a code action per safe fix, the rule's documentation as a hover.

LSP positions are 0-based lines and, by default, UTF-16 code units; findings are 1-based lines and
columns in code points: each column is converted on its line's text.
"""

from __future__ import annotations

from lsprotocol import types

from loopaudit.findings.finding import Finding, Location

SOURCE = "loopaudit"


def position(lines: list[str], location: Location) -> types.Position:
    row = location.row - 1
    text = lines[row] if 0 <= row < len(lines) else ""
    prefix = text[: max(0, location.column - 1)]
    return types.Position(line=max(0, row), character=len(prefix.encode("utf-16-le")) // 2)


def diagnostic(finding: Finding, lines: list[str], uri: str) -> types.Diagnostic:
    severity = types.DiagnosticSeverity.Error if finding.severity == "error" else types.DiagnosticSeverity.Warning
    message = finding.message + (f"\n{finding.context}" if finding.context else "")
    return types.Diagnostic(
        range=types.Range(start=position(lines, finding.location), end=position(lines, finding.end_location)),
        severity=severity,
        code=finding.code,
        code_description=types.CodeDescription(href=finding.url) if finding.url else None,
        source=SOURCE,
        message=message,
        related_information=[
            types.DiagnosticRelatedInformation(
                location=types.Location(
                    uri=uri,
                    range=types.Range(start=position(lines, place.location), end=position(lines, place.end_location)),
                ),
                message=place.message,
            )
            for place in finding.related
        ]
        or None,
    )


def fix_action(finding: Finding, lines: list[str], uri: str, shown: types.Diagnostic) -> types.CodeAction | None:
    """The finding's safe fix as a quick fix; None when it has none (unsafe fixes need the CLI's consent)."""
    fix = finding.fix
    if fix is None or fix.applicability != "safe":
        return None
    edits = [
        types.TextEdit(
            range=types.Range(start=position(lines, edit.location), end=position(lines, edit.end_location)),
            new_text=edit.content,
        )
        for edit in fix.edits
    ]
    return types.CodeAction(
        title=f"{finding.code}: {fix.message}",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[shown],
        edit=types.WorkspaceEdit(changes={uri: edits}),
        is_preferred=True,
    )


def covers(finding: Finding, lines: list[str], at: types.Position) -> bool:
    start, end = position(lines, finding.location), position(lines, finding.end_location)
    return (start.line, start.character) <= (at.line, at.character) <= (end.line, end.character)
