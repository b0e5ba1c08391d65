"""One problem, one finding (grouping.py): the reads of one step and the uses of one mask are one
finding at the first line, the others its related lines, in every output format, through the
installed command; suppression stays per line, and the scorers count the related lines."""

from __future__ import annotations

import collections
import importlib.util
import json
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from loopaudit.findings.finding import Finding, Location
from loopaudit.rule_api.rule import Group
from loopaudit.scan.grouping import one_finding_per_problem
from loopaudit.scan.plain_data import from_plain, to_plain
from loopaudit.scan.project_scan import Outcome

from .conftest import REPO, run_cli, scanned_text
from .test_output_formats import sarif_validator

STEP = textwrap.dedent("""\
    import torch
    model = model.cuda()
    for x, y in train_loader:
        loss = model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
        loss.backward()
        optimizer.step()
        total += loss.item()
        if epoch > 0:
            print(loss.item())
        for name, value in metrics.items():
            log(name, value.item())
        acc = (out.argmax(1) == y.cuda(non_blocking=True)).float().mean().item()
""")


def grouped(source: str, code: str) -> list[tuple[int, list[int]]]:
    """(line, related lines) of each finding of `code` in `source`."""
    return [(f.location.row, [p.location.row for p in f.related]) for f in scanned_text(source) if f.code == code]


def test_the_reads_of_one_body_are_one_finding_and_another_body_has_its_own():
    assert grouped(STEP, "LA101") == [(7, [9, 12]), (11, [])]
    (finding, alone) = [f for f in scanned_text(STEP) if f.code == "LA101"]
    assert finding.message.endswith(
        "; and 2 more reads in this step, lines 9, 12: stack them (`torch.stack([a, b]).tolist()`) and read once, "
        "or read them every N steps"
    )
    assert [p.message for p in finding.related] == ["another read in this step"] * 2
    assert [p.source_line for p in finding.related] == ["        print(loss.item())", STEP.splitlines()[11]]
    assert "more" not in alone.message and alone.related == ()
    assert finding.rows() == frozenset({7, 9, 12})


def test_the_reads_of_two_per_step_functions_are_two_findings():
    source = textwrap.dedent("""\
        import torch
        def log_losses(a, b):
            print(a.item(), b.item())
            print(b.item())
        def log_acc(acc):
            print(acc.item())
        model = model.cuda()
        for x, y in train_loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            optimizer.step()
            log_losses(loss, loss * 2)
            log_acc(loss)
    """)
    assert grouped(source, "LA101") == [(3, [4]), (6, [])]


@pytest.mark.parametrize(
    ("suppressed_line", "expected"),
    [(7, [(9, [12]), (11, [])]), (9, [(7, [12]), (11, [])]), (12, [(7, [9]), (11, [])])],
    ids=["first", "middle", "last"],
)
def test_a_noqa_suppresses_its_own_read_only(suppressed_line, expected):
    lines = STEP.splitlines(keepends=True)
    lines[suppressed_line - 1] = lines[suppressed_line - 1].rstrip("\n") + "  # noqa: LA101\n"
    assert grouped("".join(lines), "LA101") == expected


def test_a_noqa_on_the_first_read_through_the_command(tmp_path):
    (tmp_path / "train.py").write_text(STEP.replace("total += loss.item()", "total += loss.item()  # noqa: LA101"))
    result = run_cli("scan", "train.py", "--select", "LA101", "--output-format", "concise", cwd=tmp_path)
    first = result.out.splitlines()[0]
    assert first.startswith("train.py:9:15: LA101 ") and "; and 1 more read in this step, line 12:" in first


def test_the_uses_of_one_mask_are_one_finding_until_it_is_assigned_again():
    source = textwrap.dedent("""\
        import torch
        device = 'cuda'
        for x, y in train_loader:
            out = model(x.to(device, non_blocking=True))
            t = y.to(device, non_blocking=True)
            mask = t > 0
            kept = out[mask]
            if log_kept:
                labels = t[mask]
            mask = t < 3
            low = out[mask]
            ones = out[t != 1]
            other = t[t != 1]
            loss = kept.sum() + low.sum() + ones.sum()
            loss.backward()
            optimizer.step()
    """)
    assert grouped(source, "LA105") == [(7, [9]), (11, []), (12, [13])]
    (first, _, _) = [f for f in scanned_text(source) if f.code == "LA105"]
    assert "; and 1 more use of this mask in this step, line 9: find its indices once" in first.message


def group(key: object) -> Group:
    return Group(key, noun="read", where="in this step", advice="read once")


def finding(row: int, code: str = "LA101") -> Finding:
    return Finding(code, "m", "f.py", Location(row, 1), Location(row, 5), source_line=f"line {row}")


def test_the_mechanism_merges_by_rule_and_key_at_the_earliest_line():
    merged = one_finding_per_problem(
        [
            (finding(9), group("a")),
            (finding(3), group("a")),
            (finding(5), group("b")),
            (finding(4, "LA105"), group("a")),
            (finding(6), None),
            (finding(7), group("a")),
        ]
    )
    by_row = {f.location.row: f for f in merged}
    assert sorted(by_row) == [3, 4, 5, 6]
    assert [p.location.row for p in by_row[3].related] == [7, 9]
    assert by_row[3].message == "m; and 2 more reads in this step, lines 7, 9: read once"
    assert [p.source_line for p in by_row[3].related] == ["line 7", "line 9"]
    for alone in (4, 5, 6):
        assert by_row[alone] == finding(alone, by_row[alone].code)  # a group of one is left as it was


def test_a_grouped_finding_goes_through_the_cache_whole():
    """The cache keeps a file's outcome as plain JSON (plain_data.py): the related places come back."""
    (first, *_) = scanned_text(STEP, "LA101")
    outcome = ([first], [], None, None)
    assert from_plain(Outcome, json.loads(json.dumps(to_plain(outcome, Outcome)))) == outcome


@pytest.fixture
def step_file(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(STEP)
    return tmp_path


def scan(folder: Path, fmt: str) -> str:
    result = run_cli("scan", "train.py", "--select", "LA101", "--output-format", fmt, cwd=folder)
    assert result.returncode == 1, result.err
    return result.out


def test_full_format_shows_each_line_of_the_problem(step_file):
    out = scan(step_file, "full")
    assert out.startswith("train.py:7:14: LA101 `loss.item()` copies a GPU value to the host")
    assert (
        " 7 |     total += loss.item()\n"
        "   |              ^^^^^^^^^^^ LA101\n"
        "   :\n"
        " 9 |         print(loss.item())\n"
        "   |               ^^^^^^^^^^^ another read in this step\n"
        "   :\n"
        "12 |     acc = (out.argmax(1) == y.cuda(non_blocking=True)).float().mean().item()\n"
    ) in out


def test_concise_github_gitlab_and_junit_name_the_other_lines(step_file):
    concise = scan(step_file, "concise").splitlines()
    assert concise[0].startswith("train.py:7:14: LA101 ") and "and 2 more reads in this step, lines 9, 12" in concise[0]
    github = scan(step_file, "github").splitlines()
    assert github[0].startswith("::warning ") and "line=7," in github[0] and "lines 9, 12" in github[0]
    (issue, _) = json.loads(scan(step_file, "gitlab"))
    assert issue["location"]["lines"]["begin"] == 7 and "lines 9, 12" in issue["description"]
    failures = ElementTree.fromstring(scan(step_file, "junit")).findall(".//failure")
    assert len(failures) == 2 and "lines 9, 12" in failures[0].get("message")


def test_json_carries_the_related_lines_and_only_findings_with_other_places_have_the_key(step_file):
    (first, alone) = json.loads(scan(step_file, "json"))
    assert first["related"] == [
        {
            "location": {"row": 9, "column": 15},
            "end_location": {"row": 9, "column": 26},
            "message": "another read in this step",
            "kind": "member",
        },
        {
            "location": {"row": 12, "column": 11},
            "end_location": {"row": 12, "column": 77},
            "message": "another read in this step",
            "kind": "member",
        },
    ]
    assert "related" not in alone


def test_sarif_carries_related_locations_and_stays_valid(step_file):
    document = json.loads(scan(step_file, "sarif"))
    sarif_validator().validate(document)
    (first, alone) = document["runs"][0]["results"]
    assert [
        (
            place["id"],
            place["physicalLocation"]["region"]["startLine"],
            place["physicalLocation"]["region"]["snippet"]["text"],
            place["message"]["text"],
        )
        for place in first["relatedLocations"]
    ] == [
        (1, 9, "        print(loss.item())", "another read in this step"),
        (2, 12, STEP.splitlines()[11], "another read in this step"),
    ]
    assert (
        first["relatedLocations"][0]["physicalLocation"]["artifactLocation"]
        == first["locations"][0]["physicalLocation"]["artifactLocation"]
    )
    assert "relatedLocations" not in alone


def test_form_feeds_move_the_related_places_too(tmp_path):
    (tmp_path / "train.py").write_text(STEP.replace("        print(loss.item())", "\f        print(loss.item())"))
    (first, _) = json.loads(
        run_cli("scan", "train.py", "--select", "LA101", "--output-format", "json", cwd=tmp_path).out
    )
    assert first["related"][0]["location"] == {"row": 9, "column": 16}


def load_scorer(name: str):
    path = REPO / "benchmarks" / "precision" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scorers_count_each_related_line_as_found(monkeypatch, step_file):
    score = load_scorer("score")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks" / "precision"))
    blind = load_scorer("score_blind")
    findings = json.loads(scan(step_file, "json"))
    assert [row for row, _ in score.reported_lines(findings)] == [7, 9, 11, 12]
    counts = collections.defaultdict(collections.Counter)
    # Line 9, a related line, is found; line 12, another, is reported where a read is periodic.
    entry = {
        "project": "p",
        "path": "train.py",
        "families": ["SYNC"],
        "labels": [
            {"line": 7, "family": "SYNC"},
            {"line": 9, "family": "SYNC"},
            {"line": 12, "family": "SYNC", "periodic": True},
            {"line": 30, "family": "SYNC"},
        ],
    }
    blind.score_file(entry, findings, counts, show=False)
    assert (counts["SYNC"]["tp"], counts["SYNC"]["fp"], counts["SYNC"]["fn"]) == (2, 2, 1)


EVALUATION = """\
import torch
model = Net().cuda()
def test(model, loader):
    model.eval()
    for x, y in loader:
        x = x.cuda(non_blocking=True)
        edges = edge_model(x)
        out = model(x, edges)
"""


def test_the_blind_scorer_matches_a_no_grad_label_anywhere_in_its_loop(monkeypatch, tmp_path):
    # The guide does not say which line of an evaluation loop carries NOGRAD: a label on the loop's
    # header and a finding on a forward pass in it name the same loop; with --lines-only they do not.
    monkeypatch.syspath_prepend(str(REPO / "benchmarks" / "precision"))
    blind = load_scorer("score_blind")
    (tmp_path / "test.py").write_text(EVALUATION)
    findings = json.loads(run_cli("scan", "test.py", "--select", "LA501", "--output-format", "json", cwd=tmp_path).out)
    assert [row for row, _ in load_scorer("score").reported_lines(findings)] == [7, 8]
    entry = {"project": "p", "path": "test.py", "families": ["NOGRAD"], "labels": [{"line": 5, "family": "NOGRAD"}]}
    by_loop, by_line = (collections.defaultdict(collections.Counter) for _ in range(2))
    blind.score_file(entry, findings, by_loop, show=False, loop_at=blind.innermost_loops(EVALUATION))
    blind.score_file(entry, findings, by_line, show=False)
    assert dict(by_loop["NOGRAD"]) == {"tp": 1, "duplicate": 1}
    assert dict(by_line["NOGRAD"]) == {"fp": 2, "fn": 1}


def test_a_tensor_built_on_one_line_and_moved_on_another_names_both_places(tmp_path):
    """One problem, two lines: the finding is where the copy is made and names where the tensor is
    built (the fix goes there); the JSON says which related places are such lines (`"kind": "place"`),
    and the scorers count the finding once, at whichever of its lines a label is on."""
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "for x in train_loader:\n"
        "    ids = torch.arange(0, 100, dtype=torch.long)\n"
        "    ids = ids.cuda()\n"
        "    loss = model(x.cuda(non_blocking=True), ids).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    (finding,) = json.loads(
        run_cli("scan", "train.py", "--select", "LA205", "--output-format", "json", cwd=tmp_path).out
    )
    assert finding["location"]["row"] == 4
    assert [(place["location"]["row"], place["kind"]) for place in finding["related"]] == [(3, "place")]
    assert finding["message"].endswith("it is built on the host at line 3")
    score = load_scorer("score")
    assert score.reported_places([finding]) == [((4, 3), finding)]
    assert score.reported_lines([finding]) == [(4, finding)]
