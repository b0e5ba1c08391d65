"""The per-step table of `loopaudit run` and `loopaudit analyze`: a bar per step, outliers marked."""

from __future__ import annotations


def test_a_step_far_slower_than_the_median_is_marked_in_the_step_table():
    from rich.console import Console

    from loopaudit.profiling.in_loopaudit.breakdown import Breakdown, StepRow
    from loopaudit.reporting.measured import _bars

    rows = [StepRow("1", 2900.0, 0.0, 0.0)] + [StepRow(str(n), 25.0, 0.0, 0.0) for n in range(2, 7)]
    console = Console(record=True, width=120)
    _bars(console, Breakdown(rows, sync_measured=False, data_measured=False))
    lines = console.export_text().splitlines()
    assert "116x the median" in lines[0]
    assert not any("the median" in line for line in lines[1:])
