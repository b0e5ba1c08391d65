"""Every rule's own VALID and INVALID examples, run as tests (as Fixit does with its rules).

An INVALID example marks each line that must be reported with `# expect: CODE`, each line that a
finding groups with it as another place of its problem (the other reads of a step) with
`# related: CODE`, and each other line its one problem involves (where a moved tensor is built) with
`# place: CODE`; a VALID example must produce no finding of its rule. Adding a rule file adds its
examples here with no further wiring.
"""

from __future__ import annotations

import re

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.rule_api.rule import FileRule, RuntimeRule

from .conftest import findings_of, scanned_text

# Rules that read source; runtime rules' examples are scripts to run (test_runtime_rule_examples.py).
SOURCE_RULES = [rule for rule in all_rules() if not issubclass(rule, (FileRule, RuntimeRule))]
EXPECT = re.compile(r"#\s*expect:\s*(LA\d+(?:\s*,\s*LA\d+)*)")
RELATED = re.compile(r"#\s*related:\s*(LA\d+(?:\s*,\s*LA\d+)*)")
PLACE = re.compile(r"#\s*place:\s*(LA\d+(?:\s*,\s*LA\d+)*)")


def expected_findings(example: str, code: str, marker: re.Pattern = EXPECT) -> list[tuple[int, str]]:
    expected = []
    for row, line in enumerate(example.splitlines(), 1):
        match = marker.search(line)
        if match:
            expected.extend((row, c.strip()) for c in match.group(1).split(",") if c.strip() == code)
    return expected


def cases(kind: str) -> list:
    return [
        pytest.param(rule, example, id=f"{rule.code}-{kind}-{number}")
        for rule in SOURCE_RULES
        for number, example in enumerate(getattr(rule, kind))
    ]


@pytest.mark.parametrize("rule, example", cases("valid"))
def test_valid_example_has_no_finding(rule, example):
    assert [f for f in findings_of(example) if f[1] == rule.code] == []


@pytest.mark.parametrize("rule, example", cases("invalid"))
def test_invalid_example_reports_exactly_the_marked_lines(rule, example):
    expected = expected_findings(example, rule.code)
    assert expected, "an INVALID example must mark at least one line with `# expect: CODE`"
    found = [f for f in scanned_text(example) if f.code == rule.code]
    assert [(f.location.row, f.code) for f in found] == expected
    related = sorted((place.location.row, f.code) for f in found for place in f.related if place.kind == "member")
    assert related == expected_findings(example, rule.code, RELATED)
    places = sorted((place.location.row, f.code) for f in found for place in f.related if place.kind == "place")
    assert places == expected_findings(example, rule.code, PLACE)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.code)
def test_rule_is_documented(rule):
    assert re.fullmatch(r"LA\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    for field in (
        "summary",
        "message",
        "suggestion",
        "what_it_flags",
        "why_it_costs",
        "example",
        "use_instead",
        "fix_safety",
    ):
        assert getattr(rule, field).strip(), f"{rule.code} has no {field}"


@pytest.mark.parametrize("rule", SOURCE_RULES, ids=lambda rule: rule.code)
def test_source_rule_has_valid_and_invalid_examples(rule):
    assert rule.valid and rule.invalid


def test_rule_codes_and_names_are_unique():
    rules = all_rules()
    assert len({r.code for r in rules}) == len(rules)
    assert len({r.name for r in rules}) == len(rules)
