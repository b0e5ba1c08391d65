"""The scan's progress bar: only on a terminal, only for human-readable output, only after a second."""

from __future__ import annotations

from loopaudit.commands import progress as progress_module
from loopaudit.commands.progress import ScanProgress

from .conftest import FIXTURES, run_cli


def test_the_bar_waits_a_second_and_shows_only_when_enabled(monkeypatch):
    with ScanProgress("scanning", enabled=True) as quick:
        quick(1, 10)
        assert quick._bar is None  # a scan shorter than the delay shows nothing
    monkeypatch.setattr(progress_module, "DELAY_SECONDS", 0.0)
    with ScanProgress("scanning", enabled=True) as slow:
        slow(1, 10)
        slow(5, 10)
        assert slow._bar is not None and slow._bar.tasks[0].completed == 5
    with ScanProgress("scanning", enabled=False) as off:
        off(1, 10)
        assert off._bar is None


def test_a_piped_scan_prints_no_progress():
    result = run_cli("scan", str(FIXTURES), "--output-format", "concise", "--exit-zero")
    assert result.returncode == 0
    assert "scanning" not in result.err and "━" not in result.err + result.out
