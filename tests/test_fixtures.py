"""The realistic scripts in fixtures/ against the findings recorded next to them by hand."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES, run_cli

SCRIPTS = sorted(FIXTURES.glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_fixture_findings_match_the_recorded_ones(script):
    expected = json.loads(script.with_suffix(".expected.json").read_text())
    result = run_cli("scan", str(script), "--output-format", "json")
    found = [
        # a finding that stands for several lines (the reads of one step) records its other lines
        {
            "line": f["location"]["row"],
            "code": f["code"],
            **({"related": [r["location"]["row"] for r in f["related"]]} if "related" in f else {}),
        }
        for f in json.loads(result.out)
    ]
    assert found == expected
    assert result.returncode == (1 if expected else 0)


def test_every_fixture_has_recorded_findings():
    assert SCRIPTS
    for script in SCRIPTS:
        assert script.with_suffix(".expected.json").is_file(), f"{script.name} has no expected findings"


def test_the_clean_and_cpu_only_fixtures_are_clean():
    result = run_cli("scan", str(FIXTURES / "clean_optimized.py"), str(FIXTURES / "cpu_only.py"))
    assert result.returncode == 0
