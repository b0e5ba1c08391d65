"""The installed `loopaudit` command, end to end: formats, exit codes, selection, suppression, bad
input, stdin, discovery. Every run goes through the real console script in a subprocess."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from loopaudit.rule_api.registry import all_rules

from .conftest import run_cli

TRAIN = textwrap.dedent("""\
    import torch
    device = torch.device("cuda")
    model = model.to(device)
    for epoch in range(10):
        for step, (x, y) in enumerate(train_loader):
            loss = criterion(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
            loss.backward()
            optimizer.step()
            running += loss.item()
            print(loss)
            torch.cuda.synchronize()
            if step % 100 == 0:
                print(loss.item())
""")
TRAIN_FINDINGS = [(9, "LA101"), (10, "LA104"), (11, "LA106")]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def codes_and_rows(json_text: str) -> list[tuple[int, str]]:
    return [(f["location"]["row"], f["code"]) for f in json.loads(json_text)]


def test_json_output_is_shaped_like_ruffs(project):
    result = run_cli("scan", "train.py", "--output-format", "json", cwd=project)
    assert result.returncode == 1
    findings = json.loads(result.out)
    assert [(f["location"]["row"], f["code"]) for f in findings] == TRAIN_FINDINGS
    first = findings[0]
    assert {"code", "message", "filename", "location", "end_location", "fix", "url"} <= set(first)
    assert first["filename"] == "train.py"
    assert first["location"] == {"row": 9, "column": 20}
    assert first["end_location"] == {"row": 9, "column": 31}
    assert first["fix"] is None
    assert first["severity"] == "warning"
    assert "enumerate(train_loader)" in first["context"]
    assert first["url"].endswith("docs/rules.md#la101-item-in-step")
    assert "once per step" in first["message"]


def test_full_output_shows_the_line_the_span_and_the_fix(project):
    result = run_cli("scan", "train.py", cwd=project)
    assert result.returncode == 1
    assert "train.py:9:20: LA101" in result.out
    assert "running += loss.item()" in result.out
    assert "^^^^^^^^^^^ LA101" in result.out
    assert "per step: step loop `for step, (x, y) in enumerate(train_loader)` (line 5)" in result.out
    assert "help: keep the running value on the device" in result.out
    assert "Found 3 findings in 1 file (1 scanned)." in result.out
    assert "\x1b[" not in result.out  # no colour codes when the output is not a terminal


def test_concise_output_is_one_line_per_finding(project):
    result = run_cli("scan", "train.py", "--output-format", "concise", cwd=project)
    lines = result.out.splitlines()
    assert lines[0].startswith("train.py:9:20: LA101 ")
    assert lines[1].startswith("train.py:10:9: LA104 ")
    assert lines[2].startswith("train.py:11:9: LA106 ")
    assert lines[3] == "Found 3 findings in 1 file (1 scanned)."


def test_github_output_is_workflow_annotations(project):
    result = run_cli("scan", "train.py", "--output-format", "github", cwd=project)
    lines = result.out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(
        "::warning title=loopaudit LA101,file=train.py,line=9,col=20,endLine=9,endColumn=31::LA101 "
    )


def test_exit_codes(project):
    (project / "clean.py").write_text("import torch\nx = torch.ones(3)\n")
    assert run_cli("scan", "clean.py", cwd=project).returncode == 0
    assert run_cli("scan", "train.py", cwd=project).returncode == 1
    assert run_cli("scan", "train.py", "--exit-zero", cwd=project).returncode == 0
    missing = run_cli("scan", "nope.py", cwd=project)
    assert missing.returncode == 2
    assert "no such file or folder: nope.py" in missing.err
    assert run_cli("scan", "train.py", "--output-format", "xml", cwd=project).returncode == 2
    assert run_cli("scan", "train.py", "--select", "LA9", cwd=project).returncode == 2


def test_clean_scan_says_so(project):
    (project / "clean.py").write_text("import torch\n")
    result = run_cli("scan", "clean.py", cwd=project)
    assert result.out.strip() == "All checks passed (1 file scanned)."


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--select", "LA101"], [(9, "LA101")]),
        (["--select", "LA101,LA106"], [(9, "LA101"), (11, "LA106")]),
        (["--select", "LA101", "--select", "LA104"], [(9, "LA101"), (10, "LA104")]),
        (["--select", "LA1", "--ignore", "LA104"], [(9, "LA101"), (11, "LA106")]),
        (["--ignore", "LA10"], []),
        (["--select", "la106"], [(11, "LA106")]),
    ],
)
def test_select_and_ignore_take_codes_and_prefixes(project, args, expected):
    result = run_cli("scan", "train.py", "--output-format", "json", *args, cwd=project)
    assert codes_and_rows(result.out) == expected


def test_a_file_that_does_not_parse_is_said_whatever_the_selection(project):
    (project / "broken.py").write_text("for x in loader\n    pass\n")
    result = run_cli("scan", "broken.py", "--select", "LA1", "--output-format", "concise", cwd=project)
    assert result.returncode == 1 and "broken.py:1:16: LA001 syntax error" in result.out
    # Naming it in --ignore is asking not to hear of it.
    result = run_cli("scan", "broken.py", "--select", "LA1", "--ignore", "LA001", cwd=project)
    assert result.returncode == 0


def test_unknown_codes_are_usage_errors(project):
    result = run_cli("scan", "train.py", "--ignore", "LA1O1", cwd=project)
    assert result.returncode == 2
    assert "unknown rule code: LA1O1" in result.err


@pytest.mark.parametrize(
    "comment, expected",
    [
        ("# noqa: LA101", [(10, "LA104"), (11, "LA106")]),
        ("# noqa", [(10, "LA104"), (11, "LA106")]),
        ("# NOQA:LA104", TRAIN_FINDINGS),
        # LA104 is not reported on that line: the comment's LA104 is unused (LA004).
        ("# noqa: LA104, LA101", [(9, "LA004"), (10, "LA104"), (11, "LA106")]),
        ("# loopaudit: ignore[LA101]", [(10, "LA104"), (11, "LA106")]),
        ("# loopaudit: ignore", [(10, "LA104"), (11, "LA106")]),
        ("# noqa: LA1", [(10, "LA104"), (11, "LA106")]),
    ],
)
def test_suppression_comments(project, comment, expected):
    source = TRAIN.replace("running += loss.item()", f"running += loss.item()  {comment}")
    (project / "train.py").write_text(source)
    result = run_cli("scan", "train.py", "--output-format", "json", cwd=project)
    assert codes_and_rows(result.out) == expected


def test_noqa_inside_a_string_is_not_a_suppression(project):
    source = TRAIN.replace("running += loss.item()", "running += loss.item() + len('# noqa')")
    (project / "train.py").write_text(source)
    result = run_cli("scan", "train.py", "--output-format", "json", cwd=project)
    assert codes_and_rows(result.out) == TRAIN_FINDINGS


def test_statistics(project):
    result = run_cli("scan", "train.py", "--statistics", cwd=project)
    assert result.returncode == 1
    assert result.out.splitlines() == [
        "count  code       rule",
        "    1  LA101      item-in-step",
        "    1  LA104      format-tensor-in-step",
        "    1  LA106      explicit-synchronize-in-step",
        "    3  total in 3 rules",
    ]
    data = json.loads(run_cli("scan", "train.py", "--statistics", "--output-format", "json", cwd=project).out)
    assert data[0] == {"code": "LA101", "name": "item-in-step", "count": 1, "fixable": 0}
    (project / "clean.py").write_text("import torch\n")
    result = run_cli("scan", "clean.py", "--statistics", cwd=project)
    assert (result.returncode, result.out) == (0, "All checks passed: no findings to count.\n")


def test_a_noqa_on_any_line_of_the_statement_counts(project):
    # The comment after the closing parenthesis of a call spread over lines, and after the colon of
    # an `if` whose condition is spread over lines.
    source = TRAIN.replace(
        "running += loss.item()", "running += float(\n            loss.item()\n        )  # noqa: LA101"
    )
    (project / "train.py").write_text(source)
    result = run_cli("scan", "train.py", "--output-format", "json", "--select", "LA101", cwd=project)
    assert codes_and_rows(result.out) == []
    source = TRAIN.replace(
        "running += loss.item()", "if (\n            loss.item() > 0\n        ):  # noqa: LA101\n            pass"
    )
    (project / "train.py").write_text(source)
    result = run_cli("scan", "train.py", "--output-format", "json", "--select", "LA101", cwd=project)
    assert codes_and_rows(result.out) == []
    # A comment on another statement does not.
    source = TRAIN.replace("running += loss.item()", "running += loss.item()\n        pass  # noqa: LA101")
    (project / "train.py").write_text(source)
    result = run_cli("scan", "train.py", "--output-format", "json", "--select", "LA101", cwd=project)
    assert codes_and_rows(result.out) == [(9, "LA101")]


def test_stdin_with_a_filename(project):
    result = run_cli(
        "scan",
        "-",
        "--stdin-filename",
        "pipeline/train.py",
        "--output-format",
        "concise",
        stdin=TRAIN.encode(),
        cwd=project,
    )
    assert result.returncode == 1
    assert result.out.splitlines()[0].startswith("pipeline/train.py:9:20: LA101")
    unnamed = run_cli("scan", "-", "--output-format", "concise", stdin=TRAIN.encode(), cwd=project)
    assert unnamed.out.startswith("<stdin>:9:20: LA101")


def test_syntax_error_is_a_finding_and_the_scan_goes_on(project):
    (project / "broken.py").write_text("import torch\nfor x in loader\n    x.item()\n")
    result = run_cli("scan", "broken.py", "train.py", "--output-format", "json", cwd=project)
    findings = json.loads(result.out)
    assert result.returncode == 1
    broken = [f for f in findings if f["filename"] == "broken.py"]
    assert [(f["code"], f["location"]["row"], f["severity"]) for f in broken] == [("LA001", 2, "error")]
    assert "syntax error" in broken[0]["message"]
    assert len([f for f in findings if f["filename"] == "train.py"]) == 3


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"\x00\x01\x02binary", "binary file"),
        (b"x = '\xff\xfe'\n", "not readable as Python source"),
    ],
)
def test_unreadable_files_are_findings(project, content, reason):
    (project / "odd.py").write_bytes(content)
    result = run_cli("scan", "odd.py", "--output-format", "json", cwd=project)
    assert result.returncode == 1
    [finding] = json.loads(result.out)
    assert finding["code"] == "LA002"
    assert reason in finding["message"]


def test_a_declared_encoding_is_honoured(project):
    source = "# -*- coding: latin-1 -*-\n" + TRAIN.replace("import torch", "import torch  # caf\xe9")
    (project / "latin.py").write_bytes(source.encode("latin-1"))
    result = run_cli("scan", "latin.py", "--output-format", "json", cwd=project)
    assert [(row - 1, code) for row, code in codes_and_rows(result.out)] == TRAIN_FINDINGS


def test_a_fifo_is_not_read(project):
    os.mkfifo(project / "pipe.py")
    result = run_cli("scan", "pipe.py", "--output-format", "json", cwd=project)
    assert [(f["code"], f["message"]) for f in json.loads(result.out)] == [("LA002", "not a regular file")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_a_file_without_read_permission(project):
    target = project / "secret.py"
    target.write_text(TRAIN)
    target.chmod(0)
    result = run_cli("scan", "secret.py", "--output-format", "json", cwd=project)
    assert json.loads(result.out)[0]["code"] == "LA002"


def test_folders_are_walked_honouring_gitignore_and_skipping_environments(project):
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("generated/\n*_tmp.py\n")
    for relative in [
        "src/pkg/train2.py",
        "generated/train.py",
        "scratch_tmp.py",
        ".venv/lib/train.py",
        "env/lib/train.py",
        "build/train.py",
        "node_modules/x/train.py",
        "src/__pycache__/train.py",
    ]:
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(TRAIN)
    (project / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    (project / "src" / "pkg" / ".gitignore").write_text("ignored_here.py\n")
    (project / "src" / "pkg" / "ignored_here.py").write_text(TRAIN)
    (project / "notes.txt").write_text(TRAIN)
    result = run_cli("scan", "--output-format", "json", cwd=project)
    assert sorted({f["filename"] for f in json.loads(result.out)}) == ["src/pkg/train2.py", "train.py"]
    # A subfolder scanned on its own still honours the .gitignore above it.
    sub = run_cli("scan", "generated", "--output-format", "json", cwd=project)
    assert json.loads(sub.out)  # an explicitly named ignored folder is scanned: the user asked for it
    nested = run_cli("scan", "src", "--output-format", "json", cwd=project)
    assert sorted({f["filename"] for f in json.loads(nested.out)}) == ["src/pkg/train2.py"]


def test_many_files_are_scanned_in_parallel_with_the_same_result(project):
    for number in range(40):
        (project / f"train_{number:02d}.py").write_text(TRAIN)
    serial = run_cli("scan", ".", "--output-format", "json", "--jobs", "1", cwd=project)
    parallel = run_cli("scan", ".", "--output-format", "json", "--jobs", "2", cwd=project)
    assert serial.out == parallel.out
    assert len(json.loads(parallel.out)) == 41 * 3


def test_rules_lists_every_rule():
    result = run_cli("rules")
    assert result.returncode == 0
    for rule in all_rules():
        assert rule.code in result.out and rule.name in result.out
    data = json.loads(run_cli("rules", "--output-format", "json").out)
    assert [entry["code"] for entry in data] == [rule.code for rule in all_rules()]


def test_rule_prints_the_documentation():
    result = run_cli("rule", "LA101")
    assert result.returncode == 0
    for heading in ("What it flags", "Why it costs", "Example", "Use instead", "Fix safety"):
        assert f"### {heading}" in result.out  # piped: the Markdown itself
    assert not any(line != line.rstrip() for line in result.out.splitlines())  # no padding to a width
    assert run_cli("rule", "item-in-step").returncode == 0
    unknown = run_cli("rule", "LA999")
    assert unknown.returncode == 2
    assert "no rule 'LA999'" in unknown.err


def test_version_and_module_entry_point():
    result = run_cli("--version")
    assert result.returncode == 0 and result.out.startswith("loopaudit ")
    import subprocess
    import sys

    module = subprocess.run([sys.executable, "-m", "loopaudit", "--version"], capture_output=True, text=True)
    assert module.returncode == 0 and module.stdout == result.out


def test_help_says_what_each_command_and_parameter_is_without_python_types():
    top = run_cli("-h")
    assert top.returncode == 0 and "Commands:" in top.out
    commands = top.out.split("Commands:")[1]
    assert "..." not in commands  # no summary cut short
    for command in ("scan", "config", "rules", "rule", "run", "analyze"):
        result = run_cli(command, "-h")
        assert result.returncode == 0, result.err
        assert "<str>" not in result.out and "<list[" not in result.out and "range>" not in result.out, result.out
    run_help = " ".join(run_cli("run", "--help").out.split())  # help wraps at the terminal's width
    assert "--steps STEPS" in run_help and "full, concise, json, github, sarif, gitlab or junit" in run_help


def test_a_chain_of_calls_is_written_with_one_kind_of_arrow(tmp_path):
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def log(loss):
            print(loss.item())
        def train_step(x):
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            log(loss)
        for x in loader:
            train_step(x.cuda(non_blocking=True))
        """)
    )
    (finding,) = json.loads(run_cli("scan", "train.py", "--output-format", "json", cwd=tmp_path).out)
    assert finding["context"] == "step loop `for x in loader` (line 11), through `train_step()` → `log()`"
    # A stream that cannot carry the arrow gets the ASCII one.
    ascii_out = run_cli("scan", "train.py", cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"}).out
    assert "through `train_step()` -> `log()`" in ascii_out
