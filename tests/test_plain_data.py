"""plain_data.py: what the engine stores comes back equal, and nothing else comes back at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopaudit.analysis.cross_module import ModuleSummary, ProjectFacts
from loopaudit.findings.finding import Finding
from loopaudit.scan.engine import analyze_file
from loopaudit.scan.plain_data import InvalidData, from_plain, to_plain
from loopaudit.scan.project_scan import Outcome, ScanResult, analyze_many

from .test_project import OPTIONS, PROJECTS, write_project

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def round_trip(value, kind):
    return from_plain(kind, json.loads(json.dumps(to_plain(value, kind))))


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_scan_results_and_module_summaries_come_back_equal(tmp_path, name):
    write_project(tmp_path, PROJECTS[name])
    items = [(str(p), p.relative_to(tmp_path).as_posix(), False, OPTIONS) for p in sorted(tmp_path.rglob("*.py"))]
    result = analyze_many(items, 1)
    assert round_trip(result, ScanResult) == result
    for path, display, _, options in items:
        summary = analyze_file(
            path, display, options, explicit=True, facts=ProjectFacts(roots=frozenset({"x"}))
        ).summary
        if summary is not None:
            assert round_trip(summary, ModuleSummary) == summary


def test_findings_with_fixes_come_back_equal():
    findings = []
    for script in sorted(FIXTURES.glob("*.py")):
        findings += analyze_many([(str(script), script.name, True, OPTIONS)], 1).findings
    assert any(f.fix for f in findings)
    assert round_trip(findings, list[Finding]) == findings


def test_types_are_kept_where_json_would_blur_them():
    facts = ProjectFacts(
        roots=frozenset({"a", "b"}),
        argument_values=(("f", "workers", 4), ("f", "pin", True), ("g", "x", None)),
        iterates=(("t", "loader", -1, False, True),),
    )
    back = round_trip(facts, ProjectFacts)
    assert back == facts
    assert [type(value) for _, _, value in back.argument_values] == [int, bool, type(None)]
    assert type(back.roots) is frozenset and type(back.iterates[0]) is tuple
    assert round_trip({("loop", 3): 12}, dict[tuple[str, int], int]) == {("loop", 3): 12}


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (int, True),
        (int, "1"),
        (bool, 1),
        (str, None),
        (float, float("nan")),
        (object, [1]),
        (tuple[str, ...], "abc"),
        (tuple[str, int], ["a"]),
        (frozenset[str], [["unhashable"]]),
        (dict[str, int], [["a", 1]]),
        (dict[tuple[str, int], int], [[["a", 1]]]),
        (dict[tuple[str, int], int], [[[["a"], 1], 2]]),
        (ProjectFacts, {"roots": []}),
        (ProjectFacts, []),
        (Outcome, [[], [], None]),
        (dict, [1]),
        (dict, {"a": {"b": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}}),
        (Finding | None, 0),
        (tuple[frozenset[str], frozenset[str]], [list("abcdefgh"), {"same_as": 1}]),  # refers past what was written
        (tuple[frozenset[str], frozenset[str]], [list("abcdefgh"), {"same_as": "0"}]),
        (frozenset[str], {"same_as": 0}),
    ],
)
def test_data_that_does_not_fit_its_type_is_refused(kind, data):
    with pytest.raises(InvalidData):
        from_plain(kind, data)


def test_a_type_it_cannot_carry_is_a_programming_error():
    with pytest.raises(TypeError):
        to_plain(b"bytes", bytes)


def test_a_large_set_held_in_many_places_is_written_once_and_read_back_as_one_object():
    """Every module's project facts hold the project's root names by one object: pickle wrote it once,
    and so must the cache, or a large project's entries grow with modules times roots."""
    roots = frozenset(f"package_{n}" for n in range(1000))
    facts = {f"m{n}.py": ProjectFacts(roots=roots, cuda=n % 2 == 0) for n in range(50)}
    kind = dict[str, ProjectFacts]
    text = json.dumps(to_plain(facts, kind))
    assert text.count("package_999") == 1
    back = from_plain(kind, json.loads(text))
    assert back == facts
    assert len({id(each.roots) for each in back.values()}) == 1
