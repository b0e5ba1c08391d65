"""Adopting loopaudit on a legacy repository: baselines that survive line shifts, and `--since REV`
for pull requests, through the installed command."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from loopaudit.findings.finding import Finding, Location
from loopaudit.findings.fingerprint import fingerprints

from .conftest import run_cli

LEGACY = textwrap.dedent("""\
    import torch
    model = torch.nn.Linear(4, 2).cuda()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        loss.backward()
        optimizer.step()
        print(loss.item())
        total = loss.item()
""")
# LEGACY's two reads as findings of their own, as loopaudit reported them before it grouped them.
LEGACY_LINES = [
    Finding("LA101", "", "train.py", Location(7, 11), Location(7, 22), source_line="    print(loss.item())"),
    Finding("LA101", "", "train.py", Location(8, 13), Location(8, 24), source_line="    total = loss.item()"),
]
# A read added to the training step: one more line of its one finding (grouping.py).
NEW_SYNC = "    again = loss.item()\n"
# A new problem: a sync in another step, on a line identical to one the legacy step has.
NEW_LOOP = textwrap.dedent("""\
    for x, y in val_loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        print(loss.item())
""")


def codes_and_lines(tmp_path: Path, *args: str) -> list[tuple[str, int]]:
    result = run_cli("scan", "train.py", "--output-format", "json", *args, cwd=tmp_path)
    assert result.returncode in (0, 1), result.err
    return [(f["code"], f["location"]["row"]) for f in json.loads(result.out)]


def test_a_baseline_hides_old_findings_after_lines_shift_and_shows_new_ones(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LEGACY + NEW_LOOP)
    assert codes_and_lines(tmp_path) == [("LA101", 7), ("LA101", 11)]  # the step's two reads are one
    written = run_cli("scan", "train.py", "--write-baseline", "loopaudit-baseline.json", cwd=tmp_path)
    assert written.returncode == 0 and "Wrote a baseline of 2 findings" in written.err
    # A file to commit: the usual permissions, not the temporary file's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "loopaudit-baseline.json").st_mode) == 0o666 & ~umask
    assert codes_and_lines(tmp_path, "--baseline", "loopaudit-baseline.json") == []
    # Unrelated edits move every line down by three: still nothing new.
    script.write_text('"""Train."""\nimport os\n\n' + LEGACY + NEW_LOOP)
    result = run_cli("scan", "train.py", "--baseline", "loopaudit-baseline.json", cwd=tmp_path)
    assert result.returncode == 0 and "not shown: 2 in the baseline" in result.out
    # A new sync in a new step, identical in text to an old one, is reported, and only it.
    script.write_text('"""Train."""\nimport os\n\n' + LEGACY + NEW_LOOP + NEW_LOOP)
    assert codes_and_lines(tmp_path, "--baseline", "loopaudit-baseline.json") == [("LA101", 17)]


def sarif_fingerprints(tmp_path: Path) -> list[str]:
    document = json.loads(run_cli("scan", "train.py", "--output-format", "sarif", cwd=tmp_path).out)
    return [result["partialFingerprints"]["loopaudit/v1"] for result in document["runs"][0]["results"]]


def test_a_read_added_to_a_baselined_step_is_new_and_keeps_the_findings_fingerprint(tmp_path):
    """The baseline holds each line of a grouped finding: a read joining the step's finding is new
    code that syncs, and the gate shows the finding, with the line. Its own fingerprint, the first
    line's, stays (code scanning keeps one alert)."""
    script = tmp_path / "train.py"
    script.write_text(LEGACY)
    run_cli("scan", "train.py", "--write-baseline", "base.json", cwd=tmp_path)
    (entry,) = json.loads((tmp_path / "base.json").read_text())["findings"]
    assert entry["line"] == 7 and [place["line"] for place in entry["related"]] == [8]
    before = sarif_fingerprints(tmp_path)
    script.write_text(LEGACY + NEW_SYNC)
    result = run_cli("scan", "train.py", "--baseline", "base.json", "--output-format", "json", cwd=tmp_path)
    (finding,) = json.loads(result.out)
    assert result.returncode == 1 and finding["location"]["row"] == 7 and "lines 8, 9" in finding["message"]
    assert sarif_fingerprints(tmp_path) == before
    # A read added before the first one moves the finding, and its fingerprint, to it.
    script.write_text(LEGACY.replace("    print(loss.item())\n", NEW_SYNC + "    print(loss.item())\n"))
    assert codes_and_lines(tmp_path, "--baseline", "base.json") == [("LA101", 7)]
    assert sarif_fingerprints(tmp_path) != before


def test_a_baseline_written_before_grouping_hides_the_grouped_finding(tmp_path):
    """A baseline of one entry per line, as loopaudit wrote before it grouped the reads of a step,
    holds the fingerprints of every line of the grouped finding."""
    (tmp_path / "train.py").write_text(LEGACY)
    (tmp_path / "old.json").write_bytes(
        baseline_of([{"fingerprint": fingerprint} for fingerprint in fingerprints(LEGACY_LINES)])
    )
    assert codes_and_lines(tmp_path, "--baseline", "old.json") == []
    (tmp_path / "half.json").write_bytes(baseline_of([{"fingerprint": fingerprints(LEGACY_LINES)[0]}]))
    assert codes_and_lines(tmp_path, "--baseline", "half.json") == [("LA101", 7)]


def test_identical_lines_are_counted_not_merged(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY + NEW_LOOP + NEW_LOOP)
    run_cli("scan", "train.py", "--write-baseline", "base.json", cwd=tmp_path)
    (tmp_path / "train.py").write_text(LEGACY + NEW_LOOP + NEW_LOOP + NEW_LOOP)
    assert codes_and_lines(tmp_path, "--baseline", "base.json") == [("LA101", 17)]


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ("--baseline", "missing.json"), "--baseline: no such file: missing.json"),
        ("not json", ("--baseline", "bad.json"), "is not a loopaudit baseline"),
        ('{"findings": []}', ("--baseline", "bad.json"), "is not a loopaudit baseline"),
        (None, ("--baseline", "a.json", "--write-baseline", "b.json"), "cannot be combined"),
        (None, ("--write-baseline", "no/such/folder/b.json"), "does not exist"),
        (None, ("--write-baseline", "."), "is a folder"),
    ],
    ids=["missing", "not-json", "not-a-baseline", "both", "bad-folder", "a-folder"],
)
def test_bad_baseline_use_is_a_clear_error(tmp_path, setup, args, message):
    (tmp_path / "train.py").write_text(LEGACY)
    if setup is not None:
        (tmp_path / "bad.json").write_text(setup)
    result = run_cli("scan", "train.py", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.err


VALID_ENTRY = {
    "fingerprint": "5e2dd45f9c15a168806f3cddd900b831",
    "code": "LA101",
    "filename": "train.py",
    "line": 7,
    "message": "m",
}


def baseline_of(findings: object, version: object = 1) -> bytes:
    return json.dumps({"loopaudit_baseline": version, "written_by": "loopaudit 0.1.0", "findings": findings}).encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"findings": ' + b"[" * 100_000, "nested too deeply"),
        (b"\xff\xfe{}", "can't decode"),
        (b'{"loopaudit_baseline": 1' + b"0" * 5000 + b"}", "not a loopaudit baseline"),
        (baseline_of([VALID_ENTRY]) + b" trailing", "Extra data"),
        (b"[]", "holds no JSON object"),
        (b'"a string"', "holds no JSON object"),
        (b"null", "holds no JSON object"),
        (baseline_of([], version=True), "`loopaudit_baseline` is not 1"),
        (baseline_of([], version=1.0), "`loopaudit_baseline` is not 1"),
        (baseline_of([], version="1"), "`loopaudit_baseline` is not 1"),
        (baseline_of([], version=2), "`loopaudit_baseline` is not 1"),
        (baseline_of({"a": 1}), "`findings` is not a list"),
        (baseline_of(None), "`findings` is not a list"),
        (baseline_of([VALID_ENTRY, 7]), "findings[1] has no `fingerprint`"),
        (baseline_of([["5e2dd45f9c15a168806f3cddd900b831"]]), "findings[0] has no `fingerprint`"),
        (baseline_of([{"code": "LA101"}]), "findings[0] has no `fingerprint`"),
        (baseline_of([{"fingerprint": None}]), "findings[0] has no `fingerprint`"),
        (baseline_of([{"fingerprint": 12345678901234567890123456789012}]), "findings[0] has no `fingerprint`"),
        (baseline_of([{"fingerprint": ["5e2dd45f9c15a168806f3cddd900b831"]}]), "findings[0] has no `fingerprint`"),
        (baseline_of([{"fingerprint": "5e2dd45f"}]), "findings[0] has no `fingerprint`"),
        (baseline_of([{"fingerprint": "\udcff" * 32}]), "findings[0] has no `fingerprint`"),
        (baseline_of([{**VALID_ENTRY, "related": {"line": 8}}]), "findings[0].related is not a list"),
        (baseline_of([{**VALID_ENTRY, "related": [{"line": 8}]}]), "findings[0].related[0] has no `fingerprint`"),
    ],
    ids=[
        "nested-arrays",
        "nested-in-object",
        "not-utf-8",
        "5000-digit-version",
        "trailing-data",
        "a-list",
        "a-string",
        "null",
        "version-true",
        "version-float",
        "version-string",
        "version-2",
        "findings-object",
        "findings-null",
        "entry-number",
        "entry-list",
        "no-fingerprint",
        "fingerprint-null",
        "fingerprint-number",
        "fingerprint-list",
        "fingerprint-short",
        "fingerprint-surrogates",
        "related-object",
        "related-without-fingerprint",
    ],
)
def test_a_malformed_baseline_is_not_a_baseline_and_says_why(tmp_path, content, message):
    (tmp_path / "train.py").write_text(LEGACY)
    (tmp_path / "bad.json").write_bytes(content)
    result = run_cli("scan", "train.py", "--baseline", "bad.json", cwd=tmp_path)
    assert result.returncode == 2, result.err
    assert "--baseline: bad.json is not a loopaudit baseline" in result.err and message in result.err


def test_a_baseline_needs_no_more_than_its_fingerprints(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY + NEW_LOOP)
    step = fingerprints(LEGACY_LINES)
    (tmp_path / "other.json").write_bytes(baseline_of([*({"fingerprint": f} for f in step), {"fingerprint": "0" * 32}]))
    assert codes_and_lines(tmp_path, "--baseline", "other.json") == [("LA101", 11)]


def test_fingerprints_of_utf_8_names_are_those_baselines_were_written_with():
    """The fingerprint hashes a name's bytes (os.fsencode, so that a name that is not UTF-8 has
    one): for a UTF-8 name those are the bytes hashed when these fingerprints were first written."""
    written = [
        Finding("LA101", "m", "src/train.py", Location(7, 11), Location(7, 22), source_line="    total = loss.item()"),
        Finding(
            "LA101", "m", "src/train.py", Location(9, 11), Location(9, 22), source_line="  total =   loss.item()  "
        ),
        Finding("LA202", "m", "café\\x.py", Location(1, 1), Location(1, 2)),
    ]
    assert fingerprints(written) == [
        "5e2dd45f9c15a168806f3cddd900b831",
        "7ff1ea41e2abd4bf271666762eba29d2",
        "c8c86c97f04754094217cef04603fd59",
    ]


def git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_since_reports_only_findings_on_changed_lines(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    git("init", "-q", "-b", "main", cwd=tmp_path)
    git("add", "train.py", cwd=tmp_path)
    git("commit", "-q", "-m", "legacy", cwd=tmp_path)
    (tmp_path / "train.py").write_text("import os\n" + LEGACY + NEW_LOOP)
    assert codes_and_lines(tmp_path, "--since", "HEAD") == [("LA101", 12)]
    # A file git does not track yet is new in every line.
    (tmp_path / "other.py").write_text(LEGACY)
    result = run_cli("scan", "train.py", "other.py", "--since", "HEAD", "--output-format", "concise", cwd=tmp_path)
    assert [line.split()[0] for line in result.out.splitlines() if " LA" in line] == [
        "other.py:7:11:",
        "train.py:12:11:",
    ]
    # A read added to an old step is one of a grouped finding's lines: the finding is shown, at its first.
    (tmp_path / "train.py").write_text("import os\n" + LEGACY + NEW_SYNC)
    assert codes_and_lines(tmp_path, "--since", "HEAD") == [("LA101", 8)]


def test_since_asks_git_where_the_scanned_files_are_not_where_it_runs(tmp_path):
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "train.py").write_text(LEGACY)
    git("init", "-q", "-b", "main", cwd=repository)
    git("add", "train.py", cwd=repository)
    git("commit", "-q", "-m", "legacy", cwd=repository)
    (repository / "train.py").write_text("import os\n" + LEGACY + NEW_LOOP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli(
        "scan", str(repository / "train.py"), "--since", "HEAD", "--output-format", "concise", cwd=elsewhere
    )
    assert result.returncode == 1, result.err
    assert [line.split()[1] for line in result.out.splitlines() if " LA" in line] == ["LA101"]
    result = run_cli("scan", str(repository), "--since", "HEAD", "--output-format", "concise", cwd=elsewhere)
    assert result.returncode == 1, result.err


def test_since_errors(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    result = run_cli("scan", "train.py", "--since", "HEAD", cwd=tmp_path)
    assert result.returncode == 2 and "--since" in result.err  # not a git repository
    git("init", "-q", "-b", "main", cwd=tmp_path)
    git("add", "train.py", cwd=tmp_path)
    git("commit", "-q", "-m", "one", cwd=tmp_path)
    result = run_cli("scan", "train.py", "--since", "no-such-branch", cwd=tmp_path)
    assert result.returncode == 2 and "--since" in result.err
