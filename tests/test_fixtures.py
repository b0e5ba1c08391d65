"""The realistic scripts in fixtures/ against the findings recorded next to them by hand."""

from __future__ import annotations

import json
import re

import pytest

from loopaudit.rule_api.registry import all_rules

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


# Scripts that show a whole training setup rather than one rule's problem.
SCENARIOS = {
    "clean_optimized",
    "cpu_only",
    "hf_trainer_subclass",
    "lightning_module",
    "mnist_cuda",
    "nanogpt_style",
    "torch_aliases",
}
RULE_FIXTURE = re.compile(r"^(?P<family>[a-z]+)_(?P<rule>[a-z0-9_]+?)_(?:bad|fixed)(?:_[a-z0-9]+)?$")


def test_rule_fixtures_are_named_after_their_rule():
    rules = {(rule.__module__.split(".")[2], rule.name.replace("-", "_")) for rule in all_rules()}
    for script in SCRIPTS:
        if script.stem in SCENARIOS:
            continue
        named = RULE_FIXTURE.match(script.stem)
        assert named, f"{script.name}: name it <family>_<rule_name>_bad.py / _fixed.py, or list it in SCENARIOS"
        assert (named["family"], named["rule"]) in rules, f"{script.name} names no rule of that family"
