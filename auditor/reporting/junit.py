"""JUnit XML, for CI systems that show test reports: one test case per file scanned with findings,
one failure per finding (as ruff's junit format).

Every name and message goes through safe_text.xml_ready (XML 1.0 cannot carry most control
characters, even as references), and the document is written in ASCII with character references,
so that it parses whatever the stream's encoding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TextIO
from xml.etree import ElementTree

from loopaudit.findings.finding import Finding
from loopaudit.reporting.safe_text import xml_ready

NAME = "junit"  # as `--output-format` and `output-format` name it


def render(findings: Sequence[Finding], out: TextIO, color: bool) -> None:
    suites = ElementTree.Element("testsuites", name="loopaudit", tests=str(len(findings)), failures=str(len(findings)))
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        by_file[finding.filename].append(finding)
    for filename, found in sorted(by_file.items()):
        name = xml_ready(filename)
        suite = ElementTree.SubElement(
            suites, "testsuite", name=name, tests=str(len(found)), failures=str(len(found)), errors="0"
        )
        for finding in found:
            where = xml_ready(finding.place())
            attributes = {"name": f"{finding.code} at {where}", "classname": name, "file": name}
            if finding.cell is None:  # a notebook's cell lines are not the file's: no `line` there
                attributes["line"] = str(finding.location.row)
            case = ElementTree.SubElement(suite, "testcase", attributes)
            message = xml_ready(finding.message)
            failure = ElementTree.SubElement(case, "failure", message=message, type=finding.code)
            failure.text = f"{where}: {finding.code} {message}"
    ElementTree.indent(suites)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    # us-ascii: ElementTree writes every other character as a reference, and no declaration of its own.
    out.write(ElementTree.tostring(suites, encoding="us-ascii").decode("ascii"))
    out.write("\n")
