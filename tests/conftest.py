"""Shared helpers: the installed `loopaudit` command as a subprocess, and the library in-process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopaudit.findings.finding import Finding
from loopaudit.rule_api.registry import all_rules, select_rules
from loopaudit.scan.engine import analyze_text
from loopaudit.scan.options import ScanOptions

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


def pytest_configure(config) -> None:
    # The commands the tests run keep their cache in one temporary folder, not in the checkout (or
    # wherever they run). The cache stays on, as for users; tests about its location unset this.
    if "LOOPAUDIT_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["LOOPAUDIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="loopaudit-test-cache-")


def loopaudit_command() -> list[str]:
    """The console script pip installed; the tests exercise the real entry point, not a shortcut."""
    exe = shutil.which("loopaudit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        pytest.fail("the `loopaudit` command is not installed: run `pip install -e '.[test]'` first")
    return [exe]


def run_cli(
    *args: str,
    cwd: Path | str | None = None,
    stdin: bytes | None = None,
    env: dict | None = None,
    script_may_fail: bool = False,
):
    """Run the installed command. loopaudit itself must never show a traceback; a script that
    `loopaudit run` runs may (`script_may_fail`), and then its traceback must be the script's alone."""
    result = subprocess.run(
        [*loopaudit_command(), *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    result.out = result.stdout.decode("utf-8", "replace")
    result.err = result.stderr.decode("utf-8", "replace")
    if script_may_fail:
        assert "runpy" not in result.err and "profiling/in_script/child.py" not in result.err, result.err
    else:
        assert "Traceback" not in result.err, result.err
    return result


def scanned_text(source: str, select: str | None = None) -> list[Finding]:
    """Every finding in `source`, optionally only of codes starting with `select`."""
    rules = select_rules([select], None) if select else all_rules()
    return analyze_text(source, "example.py", ScanOptions(rules=rules))


def findings_of(source: str, select: str | None = None) -> list[tuple[int, str]]:
    """(line, code) of every finding in `source`, optionally only codes starting with `select`."""
    return [(f.location.row, f.code) for f in scanned_text(source, select)]


# The real torch.profiler traces captured on GPUs by others (../shared/traces beside the project):
# the tests that read them skip without them, and the run says so once, loudly, at its end.
SHARED_TRACES = REPO.parent / "shared" / "traces"


def pytest_terminal_summary(terminalreporter) -> None:
    if SHARED_TRACES.is_dir():
        return
    skipped = [report for report in terminalreporter.stats.get("skipped", []) if "traces" in str(report.longrepr)]
    if skipped:
        terminalreporter.write_sep(
            "!",
            f"{len(skipped)} tests did not run: the real GPU traces are missing ({SHARED_TRACES})",
            red=True,
            bold=True,
        )


def as_a_foreground_command() -> None:
    """loopaudit started as a user starts it at a prompt: SIGINT at its default. A suite launched in
    the background (`nohup .ci/run &`, some CI runners) passes its children SIGINT ignored, and
    loopaudit rightly leaves an ignored SIGINT ignored, so these tests would wait for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
