"""From a rule's reports to findings: where each reported node is, the fix as a text edit, the
other places of the problem, and the text that says how the line is reached once per step."""

from __future__ import annotations

import bisect
from typing import cast

import libcst as cst

from loopaudit.analysis.lines import source_lines
from loopaudit.analysis.stepmodel import StepReason
from loopaudit.findings.finding import Edit, Finding, FixInfo, Location, Related, rule_url
from loopaudit.rule_api.rule import Fix, Group, Report
from loopaudit.scan.grouping import one_finding_per_problem
from loopaudit.scan.positions import Positions, print_rewritten
from loopaudit.scan.suppression import suppressing, suppressions


def call_describer(module: cst.Module, display_name: str, line_of):
    """Why a call runs once per step, for the module it enters: "step loop `for x in loader`
    (main.py:120) → `engine.step()` (main.py:124)", with the lines as marks (origins.py)."""

    def describe(reason: StepReason, call: cst.Call) -> str:
        where = _describe(reason, line_of, module, display_name)
        callee = " ".join(module.code_for_node(call.func).split())
        return f"{where} → `{callee}()` ({display_name}:{line_of(call)})"

    return describe


def _fix_info(fix: Fix, module: cst.Module, text: str, starts: list[int], positions: Positions) -> FixInfo | None:
    """The fix as text edits: the span where the text with the rewrite differs from the text. None
    when libcst cannot print the module back as the text (then no edit can be trusted)."""
    edits = []
    for old, new in fix.replacements:
        rewrite = _rewrite(old, new, module, text, positions)
        if rewrite is None:
            return None
        rewritten, same_before, same_after = rewrite
        start = same_before
        limit = min(len(text), len(rewritten))
        while start < limit and text[start] == rewritten[start]:
            start += 1
        tail = min(len(text) - same_after, limit - start)
        while tail < limit - start and text[len(text) - 1 - tail] == rewritten[len(rewritten) - 1 - tail]:
            tail += 1
        end = len(text) - tail
        edits.append(
            Edit(start, end, rewritten[start : len(rewritten) - tail], _location(start, starts), _location(end, starts))
        )
    return FixInfo("safe" if fix.safe else "unsafe", fix.description, tuple(sorted(edits, key=lambda e: e.start)))


def _rewrite(old: cst.CSTNode, new, module: cst.Module, text: str, positions: Positions) -> tuple[str, int, int] | None:
    """The module's text with `old` rewritten, and the offsets before and from which it is the same
    as `text`. Only the statement around the rewrite is printed again (positions.py), in the text's
    place, unless no statement around it can be placed: then the whole module is (a node printed
    alone would lose the indentation of its blocks' continuation lines)."""
    removing = new is cst.RemovalSentinel.REMOVE
    placed = None
    if module.has_trailing_newline:
        # A removal can empty the statement it is in, which its parent then drops: print the parent.
        placed = positions.place(old, above=positions.innermost_statement(old) if removing else None)
    if placed is None:
        rewritten = cast(cst.Module, module.deep_remove(old) if removing else module.deep_replace(old, new)).code
        # libcst drops what a module cannot hold, such as the last `\r` of a file with classic-Mac
        # line ends: that tail of the text stays as it was. Any other difference: no safe edit.
        printed = module.code
        if not text.startswith(printed):
            return None
        return rewritten + text[len(printed) :], 0, len(text)
    statement = placed.statement
    changed = statement.deep_remove(old) if removing else statement.deep_replace(old, new)
    end = placed.offset + len(placed.code)
    return text[: placed.offset] + print_rewritten(placed, changed, module) + text[end:], placed.offset, end


def _location(offset: int, starts: list[int]) -> Location:
    line = bisect.bisect_right(starts, offset)
    return Location(line, offset - starts[line - 1] + 1)


def to_findings(
    module: cst.Module,
    text: str,
    display_name: str,
    raw,
    positions: Positions,
    used: set[tuple[int, str]] | None = None,
    suppressed: dict[int, frozenset[str]] | None = None,
) -> list[Finding]:
    """`used` receives the (line, code) of each suppression comment that silenced a report;
    `suppressed`: the text's suppression comments, when the caller has read them already."""
    starts = positions.line_starts
    lines = source_lines(text)
    if suppressed is None:
        suppressed = suppressions(text)
    # One per rule and line, with the group it is part of; suppressed line by line, then grouped.
    findings: dict[tuple[str, int], tuple[Finding, Group | None]] = {}
    for rule_class, report, reason in raw:
        span = positions[report.node]
        row = span.start.line
        key = (rule_class.code, row)
        if key in findings:
            continue
        silenced = suppressing(rule_class.code, positions.suppression_rows(report.node), suppressed)
        if silenced:
            if used is not None:
                used.update(silenced)
            continue
        related = _places(report, row, positions, lines)
        findings[key] = (
            Finding(
                code=rule_class.code,
                message=(report.message or rule_class.message)
                + "".join(f"; {place.message} at line {place.location.row}" for place in related),
                filename=display_name,
                location=Location(row, span.start.column + 1),
                end_location=Location(span.end.line, span.end.column + 1),
                context=_describe(reason, positions.line_of, module) if reason else None,
                suggestion=report.suggestion or rule_class.suggestion,
                source_line=lines[row - 1] if row - 1 < len(lines) else None,
                url=rule_url(rule_class.code, rule_class.name),
                fix=_fix_info(report.fix, module, text, starts, positions) if report.fix else None,
                related=related,
            ),
            report.group,
        )
    return sorted(one_finding_per_problem(findings.values()), key=Finding.sort_key)


def _places(report: Report, row: int, positions: Positions, lines: list[str]) -> tuple[Related, ...]:
    """A report's other places (Report.places) as the finding's related places, in line order."""
    found = []
    for node, what in report.places:
        span = positions[node]
        if span.start.line != row:
            source = lines[span.start.line - 1] if span.start.line - 1 < len(lines) else None
            found.append(
                Related(
                    Location(span.start.line, span.start.column + 1),
                    Location(span.end.line, span.end.column + 1),
                    what,
                    source,
                    kind="place",
                )
            )
    return tuple(sorted(found, key=lambda place: place.location))


def _describe(reason: StepReason, line_of, module: cst.Module, file: str | None = None) -> str:
    """Why a line runs per step. `file` names the module when the text is read in another one."""
    if reason.kind == "external":
        where = reason.origin or "called once per step from another module"
    else:
        line = line_of(reason.node)
        at = f"{file}:{line}" if file else f"line {line}"
        if reason.kind == "hook":
            where = f"step hook `{reason.hook}` ({at})"
        else:
            header = _loop_header(reason.node, module)
            where = f"step loop `{header}` ({at})"
    if reason.via:
        where += ", through " + " → ".join(f"`{name}()`" for name in reason.via)
    return where


def _loop_header(node: cst.CSTNode, module: cst.Module) -> str:
    if isinstance(node, cst.For):
        header = f"for {module.code_for_node(node.target)} in {module.code_for_node(node.iter)}"
    elif isinstance(node, cst.While):
        header = f"while {module.code_for_node(node.test)}"
    else:
        return "?"
    header = " ".join(header.split())
    return header if len(header) <= 60 else header[:57] + "..."
