"""JUnit XML, for CI systems that show test reports: one test case per file scanned with findings,
one failure per finding (as ruff's junit format)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TextIO
from xml.etree import ElementTree

from ..finding import Finding


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    suites = ElementTree.Element("testsuites", name="loopaudit", tests=str(len(findings)), failures=str(len(findings)))
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        by_file[finding.filename].append(finding)
    for filename, found in sorted(by_file.items()):
        suite = ElementTree.SubElement(suites, "testsuite", name=filename, tests=str(len(found)), failures=str(len(found)), errors="0")
        for finding in found:
            case = ElementTree.SubElement(
                suite, "testcase", name=f"{finding.code} at {filename}:{finding.location.row}:{finding.location.column}",
                classname=filename, file=filename, line=str(finding.location.row),
            )
            failure = ElementTree.SubElement(case, "failure", message=finding.message, type=finding.code)
            failure.text = f"{filename}:{finding.location.row}:{finding.location.column}: {finding.code} {finding.message}"
    ElementTree.indent(suites)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ElementTree.tostring(suites, encoding="unicode"))
    out.write("\n")
