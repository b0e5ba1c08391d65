"""From measurements to findings: the runtime rules applied to a run's evidence (or to a trace's
analysis), their observations turned into findings like the scan's, and each static finding of the
script set against what was measured.

A static finding is *confirmed* when a runtime rule that its rule names in `confirmed_by` reported
at one of its lines (LA101's `loss.item()` by an LA601 there; LA203's DataLoader by an LA602 there).
It is *measurable* only when the run could have confirmed it: a copy to the GPU (LA202) cannot be
seen on a machine without one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from loopaudit.findings.finding import Finding, Location, rule_url
from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
from loopaudit.profiling.in_script.report import SiteRecord
from loopaudit.rule_api.registry import rule_by_code
from loopaudit.rule_api.rule import Observation, Rule, RuntimeRule, Undecided


def display_path(path: str) -> str:
    """Relative to the working directory when the file is under it, as the scan names files."""
    if not os.path.isabs(path):
        return path
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive, on Windows
        return path
    return path if relative.startswith("..") else relative


class SourceLines:
    """The lines of the files findings point at, read once each; None for a file not here (a trace
    recorded on another machine names its files)."""

    def __init__(self) -> None:
        self._files: dict[str, list[str] | None] = {}

    def line(self, path: str, row: int | None) -> str | None:
        if row is None:
            return None
        if path not in self._files:
            try:
                with open(path, encoding="utf-8", errors="replace") as stream:
                    # Text mode ends lines at \n, \r\n and \r, as Python does; splitlines() would also
                    # end them at a form feed and other separators, shifting every later line.
                    self._files[path] = stream.read().split("\n")
            except OSError:
                self._files[path] = None
        lines = self._files[path]
        return lines[row - 1] if lines is not None and 0 < row <= len(lines) else None


def to_finding(rule: type[RuntimeRule], observation: Observation, sources: SourceLines) -> Finding:
    source = sources.line(observation.file, observation.line)
    row = observation.line or 1
    if source is not None:  # underline the statement: a run knows lines, not columns
        start = len(source) - len(source.lstrip()) + 1
        end = len(source.rstrip()) + 1
    else:
        start = end = 1
    return Finding(
        code=rule.code,
        message=observation.message,
        filename=display_path(observation.file),
        location=Location(row, start),
        end_location=Location(row, end),
        suggestion=observation.suggestion or rule.suggestion,
        source_line=source,
        url=rule_url(rule.code, rule.name),
        observed=observation.observed,
        details=observation.details or None,
    )


@dataclass
class StaticCheck:
    """A finding of `loopaudit scan` on the script, next to what the run measured."""

    finding: Finding
    measurable: bool
    confirmed: bool
    measurement: Finding | None = None  # the runtime finding that confirms it
    unmeasurable_because: str | None = None  # "needs a GPU", "no run-time counterpart"

    def to_json(self) -> dict:
        data = self.finding.to_json()
        data["confirmed"] = self.confirmed
        data["measurable"] = self.measurable
        data["unmeasurable_because"] = self.unmeasurable_because
        data["measurement"] = (
            {"code": self.measurement.code, "observed": self.measurement.observed} if self.measurement else None
        )
        return data


@dataclass
class SiteView:
    """A sync site for the report's table: periodic ones too, with the static codes at its line."""

    record: SiteRecord
    filename: str
    on_step_path: bool
    static_codes: list[str] = field(default_factory=list)


@dataclass
class RunAudit:
    evidence: RunEvidence
    findings: list[Finding]
    static: list[StaticCheck]
    sites: list[SiteView]
    # (code, message): verdicts the measurement could not settle, said with the report, never findings
    undecided: list[tuple[str, str]] = field(default_factory=list)


def _static_codes_at(static: Sequence[Finding], filename: str, line: int) -> list[str]:
    return sorted({f.code for f in static if f.filename == filename and line in f.rows()})


def audit_run(evidence: RunEvidence, rules: Iterable[type[RuntimeRule]], static: Sequence[Finding]) -> RunAudit:
    sources = SourceLines()
    findings = []
    undecided = []
    for rule in rules:
        for observation in rule().from_run(evidence):
            if isinstance(observation, Undecided):
                undecided.append((rule.code, observation.message))
                continue
            finding = to_finding(rule, observation, sources)
            if rule.code == "LA601":  # a sync the scan missed is worth saying so
                codes = _static_codes_at(static, finding.filename, finding.location.row)
                details = {**(finding.details or {}), "static": codes, "missed_by_scan": not codes}
                message = finding.message if codes else finding.message + " (not found by `loopaudit scan`)"
                finding = replace(finding, message=message, details=details)
            findings.append(finding)
    findings.sort(key=Finding.sort_key)
    checks = [_check(f, findings, evidence.cuda) for f in static]
    sites = []
    for record in sorted(evidence.report.syncs, key=lambda r: (-r.count, r.file, r.line)):
        name = display_path(record.file)
        sites.append(SiteView(record, name, evidence.on_step_path(record), _static_codes_at(static, name, record.line)))
    return RunAudit(evidence, findings, checks, sites, undecided)


def _check(finding: Finding, measured: Sequence[Finding], cuda: bool) -> StaticCheck:
    rule = rule_by_code(finding.code)
    codes = rule.confirmed_by if rule else ()
    if not codes:
        return StaticCheck(finding, measurable=False, confirmed=False, unmeasurable_because="no run-time counterpart")
    if not cuda and not cast(type[Rule], rule).confirmable_on_cpu:  # codes came from it
        return StaticCheck(finding, measurable=False, confirmed=False, unmeasurable_because="needs a GPU to measure")
    rows = finding.rows()  # a sync measured at any read of a grouped finding confirms it
    match = next(
        (m for m in measured if m.code in codes and _measured_at(m, finding.filename, rows)),
        None,
    )
    return StaticCheck(finding, measurable=True, confirmed=match is not None, measurement=match)


def _measured_at(measurement: Finding, filename: str, rows) -> bool:
    """Was the measurement made at one of these lines: its own, or a user's line above it on the stack
    (`details["also_at"]`: the step's call of a helper whose `all_reduce` was measured)?"""
    if measurement.filename == filename and measurement.location.row in rows:
        return True
    path = os.path.abspath(filename)
    return any(place == path and line in rows for place, line in (measurement.details or {}).get("also_at", ()))


def audit_trace(analysis: TraceAnalysis, rules: Iterable[type[RuntimeRule]]) -> list[Finding]:
    sources = SourceLines()
    findings = [to_finding(rule, observation, sources) for rule in rules for observation in rule().from_trace(analysis)]
    return sorted(findings, key=Finding.sort_key)
