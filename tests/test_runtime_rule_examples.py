"""Every runtime rule's own examples, run for real: the VALID and INVALID scripts under the installed
`loopaudit run`, the trace examples under `loopaudit analyze`. As for the source rules, an INVALID
script marks each line that must be reported with `# expect: CODE`.

A rule whose script examples only show on a GPU (`requires_cuda`) has them skipped here, with the
reason, on a machine without one; its trace examples run everywhere.
"""

from __future__ import annotations

import json

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.rule_api.rule import RuntimeRule

from .conftest import run_cli
from .test_rule_examples import expected_findings

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` leaves these out

RUNTIME_RULES = [rule for rule in all_rules() if issubclass(rule, RuntimeRule)]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def script_cases(kind: str) -> list:
    cases = []
    for rule in RUNTIME_RULES:
        for number, example in enumerate(getattr(rule, kind)):
            marks = (
                [
                    pytest.mark.skipif(
                        not _cuda_available(),
                        reason=f"{rule.code}'s scripts show only on a CUDA GPU; its trace examples run here",
                    )
                ]
                if rule.requires_cuda
                else []
            )
            cases.append(pytest.param(rule, example, id=f"{rule.code}-{kind}-{number}", marks=marks))
    return cases


def trace_cases(kind: str) -> list:
    return [
        pytest.param(rule, trace, id=f"{rule.code}-{kind}-{number}")
        for rule in RUNTIME_RULES
        for number, trace in enumerate(getattr(rule, kind))
    ]


def run_example(tmp_path, rule, example: str) -> list[tuple[int, str]]:
    pytest.importorskip("torch", reason="runtime rules' scripts need torch (pip install 'loopaudit[profile]')")
    (tmp_path / "example.py").write_text(example)
    result = run_cli(
        "run",
        "example.py",
        "--warmup",
        "2",
        "--steps",
        "6",
        "--select",
        rule.code,
        "--output-format",
        "json",
        *(["--profile"] if rule.needs_trace else []),
        cwd=tmp_path,
    )
    assert result.returncode in (0, 1), result.err
    document = json.loads(result.out)
    # At least the 6 asked for; more when a verdict was undecided or a transient left out (stability.py).
    assert document["steps_measured"] >= 6, "the example must run at least 8 steps"
    return [(f["location"]["row"], f["code"]) for f in document["findings"]]


@pytest.mark.parametrize("rule, example", script_cases("valid"))
def test_valid_script_has_no_finding(tmp_path, rule, example):
    assert run_example(tmp_path, rule, example) == []


@pytest.mark.parametrize("rule, example", script_cases("invalid"))
def test_invalid_script_reports_exactly_the_marked_lines(tmp_path, rule, example):
    expected = expected_findings(example, rule.code)
    assert expected, "an INVALID example must mark at least one line with `# expect: CODE`"
    assert sorted(run_example(tmp_path, rule, example)) == expected


def analyze_example(tmp_path, rule, trace: str) -> list[str]:
    (tmp_path / "trace.json").write_text(trace)
    result = run_cli("analyze", "trace.json", "--select", rule.code, "--output-format", "json", cwd=tmp_path)
    assert result.returncode in (0, 1), result.err
    return [f["code"] for f in json.loads(result.out)["findings"]]


@pytest.mark.parametrize("rule, trace", trace_cases("valid_traces"))
def test_valid_trace_has_no_finding(tmp_path, rule, trace):
    assert analyze_example(tmp_path, rule, trace) == []


@pytest.mark.parametrize("rule, trace", trace_cases("invalid_traces"))
def test_invalid_trace_is_reported(tmp_path, rule, trace):
    assert rule.code in analyze_example(tmp_path, rule, trace)


@pytest.mark.parametrize("rule", RUNTIME_RULES, ids=lambda rule: rule.code)
def test_runtime_rule_has_examples_it_can_be_checked_on(rule):
    assert rule.valid and rule.invalid
    if rule.requires_cuda:  # checked here on every machine through traces
        assert rule.valid_traces and rule.invalid_traces
