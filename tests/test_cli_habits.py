"""The command-line habits a ruff user reaches for, each run through the installed command:
`-o`, `$LOOPAUDIT_OUTPUT_FORMAT`, NO_COLOR/FORCE_COLOR, `-q`/`-v`, `--show-files`, `--show-fixes`,
`--exit-non-zero-on-fix`, `--add-noqa`, and the `[*]` mark on what `--fix` fixes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .conftest import run_cli

# LA201 and LA202 have safe fixes; LA203 has none; LA101 is a read in the step.
SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset, batch_size=32)
    for x in loader:
        loss = model(x.cuda()).sum()
        loss.backward()
        optimizer.step()
        print(loss.item())
""")
ESC = "\x1b["


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def concise(project: Path, *args: str, env: dict | None = None):
    return run_cli("scan", "train.py", "--output-format", "concise", *args, cwd=project, env=env)


def test_output_file_takes_the_report_and_stdout_stays_empty(project):
    result = concise(project, "-o", "report.txt")
    assert result.returncode == 1 and result.out == ""
    report = (project / "report.txt").read_text()
    assert report.startswith("train.py:6:10: LA201 [*] ") and "Found 4 findings" in report
    result = run_cli("scan", "train.py", "--output-file", "missing/folder/r.txt", cwd=project)
    assert result.returncode == 2 and "--output-file missing/folder/r.txt" in result.err


def test_the_output_format_can_come_from_the_environment_and_the_flag_wins(project):
    result = run_cli("scan", "train.py", cwd=project, env={"LOOPAUDIT_OUTPUT_FORMAT": "concise"})
    assert result.out.startswith("train.py:6:10: LA201")
    result = run_cli(
        "scan", "train.py", "--output-format", "json", cwd=project, env={"LOOPAUDIT_OUTPUT_FORMAT": "concise"}
    )
    assert result.out.startswith("[")


@pytest.mark.parametrize(
    ("env", "flags", "coloured"),
    [
        ({}, (), False),  # piped: no colour
        ({"FORCE_COLOR": "1"}, (), True),
        ({"FORCE_COLOR": "0"}, (), False),
        ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, (), False),
        ({"NO_COLOR": "1"}, ("--color",), True),  # the flag decides over the environment
    ],
)
def test_colour_follows_no_color_and_force_color(project, env, flags, coloured):
    for output_format in ("full", "concise"):
        result = run_cli("scan", "train.py", "--output-format", output_format, *flags, cwd=project, env=env)
        assert (ESC in result.out) == coloured, (output_format, result.out[:200])


def test_quiet_prints_the_findings_alone_and_verbose_says_what_was_scanned_on_stderr(project):
    quiet = concise(project, "-q")
    assert [line.split(":")[0] for line in quiet.out.splitlines()] == ["train.py"] * 4
    verbose = concise(project, "-v")
    assert verbose.out == concise(project).out
    assert "loopaudit: scanned train.py" in verbose.err and "1 file in" in verbose.err


def test_show_files_lists_what_a_scan_reads(project):
    (project / "notebook.ipynb").write_text("{}")
    (project / "notes.txt").write_text("not code")
    (project / "pyproject.toml").write_text('[tool.loopaudit]\nexclude = ["skipped.py"]\n')
    (project / "skipped.py").write_text("import torch\n")
    result = run_cli("scan", ".", "--show-files", cwd=project)
    assert (result.returncode, result.out.splitlines()) == (0, ["notebook.ipynb", "train.py"])


def test_show_fixes_and_exit_non_zero_on_fix(project):
    result = concise(project, "--fix", "--select", "LA201,LA202", "--show-fixes")
    assert result.returncode == 0, result.out + result.err  # everything selected was fixed
    assert "Fixed 2 findings:\n- train.py:\n    1 × LA201 (dataloader-without-pin-memory)\n" in result.out
    (project / "train.py").write_text(SCRIPT)
    result = concise(project, "--fix", "--select", "LA201,LA202", "--exit-non-zero-on-fix")
    assert result.returncode == 1  # a file changed: a pre-commit hook must stop the commit
    result = concise(project, "--fix", "--select", "LA201,LA202", "--exit-non-zero-on-fix")
    assert result.returncode == 0  # nothing left to change


def test_fixable_findings_are_marked_in_concise_output_and_statistics(project):
    marked = {line.split()[1]: "[*]" in line for line in concise(project).out.splitlines() if ": LA" in line}
    assert marked == {"LA201": True, "LA202": True, "LA203": False, "LA101": False}
    statistics = run_cli("scan", "train.py", "--statistics", cwd=project).out.splitlines()
    assert "    1  LA201  [*] dataloader-without-pin-memory" in statistics
    assert "    1  LA203      training-loader-without-workers" in statistics


def test_add_noqa_silences_each_finding_once_and_keeps_the_code_the_same(project):
    script = project / "train.py"
    script.write_text(
        SCRIPT.replace("print(loss.item())", 'print(loss.item())  # noqa: E501\n    note = f"""{loss.item()}\n"""')
    )
    result = run_cli("scan", "train.py", "--add-noqa", cwd=project)
    assert result.returncode == 0 and "Added 4 noqa comments." in result.err
    text = script.read_text()
    assert "loader = DataLoader(dataset, batch_size=32)  # noqa: LA201, LA203\n" in text
    assert "print(loss.item())  # noqa: E501, LA101\n" in text
    assert '\n"""  # noqa: LA101\n' in text  # after the string that spans lines, not inside it
    assert run_cli("scan", "train.py", cwd=project).returncode == 0
    again = run_cli("scan", "train.py", "--add-noqa", cwd=project)
    assert "Added 0 noqa comments." in again.err and script.read_text() == text


def test_watch_scans_again_when_a_file_changes_and_stops_on_ctrl_c(project):
    import signal
    import subprocess
    import time

    from .conftest import as_a_foreground_command, loopaudit_command

    watcher = subprocess.Popen(
        [*loopaudit_command(), "scan", "train.py", "--watch", "--output-format", "concise"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=as_a_foreground_command,  # Ctrl-C must reach it, also when the suite runs in the background
    )

    def wait_for_watching(times: int) -> None:
        deadline = time.monotonic() + 60  # generous: a busy machine
        seen = 0
        while seen < times and time.monotonic() < deadline:
            line = watcher.stderr.readline()
            seen += "Watching for file changes" in line
        assert seen == times, "the watcher did not report"

    try:
        wait_for_watching(1)
        (project / "train.py").write_text(SCRIPT.replace("print(loss.item())", "pass"))
        wait_for_watching(1)
    finally:
        watcher.send_signal(signal.SIGINT)
        out, _ = watcher.communicate(timeout=30)
    runs = out.split("Found ")
    assert len(runs) == 3, out  # two reports, each ended by its summary
    assert " LA101 " in runs[0] and " LA101 " not in runs[1]
    assert watcher.returncode == 130


def test_a_suppression_that_suppresses_nothing_is_reported(project):
    (project / "train.py").write_text(
        SCRIPT.replace("loss.backward()", "loss.backward()  # noqa: LA101")
        .replace("print(loss.item())", "print(loss.item())  # noqa: LA101, E501")
        .replace("optimizer.step()", "optimizer.step()  # noqa: LA1, LA999")  # a prefix, a code of no rule: left alone
    )
    result = concise(project, "--select", "LA101,LA004")
    assert result.out.splitlines()[0] == (
        "train.py:9:22: LA004 `LA101` is suppressed here, but this line has no LA101 finding to suppress"
    )
    assert "Found 1 finding" in result.out
    # A rule that did not run cannot call its suppressions unused.
    assert "LA004" not in concise(project, "--select", "LA2,LA004").out
