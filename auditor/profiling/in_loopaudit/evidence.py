"""What the runtime rules read: one measured run of a script, seen through the questions they ask.

A site is on the step path when it happened in more than half of the measured steps, with the whole
Wilson interval of that share above one half: a sync made every tenth step by interval logging is
not (it costs a tenth as much, and is what the docs recommend); one made by every step is, and so is
one made twice per step. One in, say, 11 of 20 steps cannot be told from either: its rule says it is
undecided.

Times are judged on the steady steps, with their intervals (profiling/in_script/stability.py): a run
of steps much slower than the rest (a warm-up that had not ended, another job taking the CPUs) is left
out of them and named; counts are judged on every measured step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from loopaudit.findings.finding import Finding
from loopaudit.profiling.in_loopaudit.timing import steps_phrase
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
from loopaudit.profiling.in_script.report import LoaderRecord, ProbeReport, StepRecord
from loopaudit.profiling.in_script.report import describe_site as describe_site  # the rule API's name for it
from loopaudit.profiling.in_script.stability import (
    Estimate,
    Transient,
    median_interval,
    proportion_interval,
    share_interval,
    steady_indices,
)


@dataclass
class RunEvidence:
    report: ProbeReport
    script: str  # absolute path of the script that was run
    trace: TraceAnalysis | None = None  # the measured window's profiler trace (--profile)
    # Every static rule's findings on the files the run touched, whatever --select shows: on a
    # machine without a GPU some runtime rules need the source's word on what a CUDA run would do.
    scan: Sequence[Finding] = ()

    def scan_reported(self, code: str, file: str | None, line: int | None) -> bool:
        """Did `loopaudit scan` report `code` on an expression spanning this line of this file (or
        on one of the related places of a grouped finding)?"""
        if file is None or line is None:
            return False
        path = os.path.abspath(file)
        return any(
            finding.code == code and os.path.abspath(finding.filename) == path and line in finding.rows()
            for finding in self.scan
        )

    @property
    def cuda(self) -> bool:
        return self.report.cuda

    @property
    def steps_measured(self) -> int:
        return len(self.report.steps)

    def step_path(self, record) -> str:
        """`record` has a `steps` count (in how many measured steps it happened): "above" when it is on
        the step path, "below" when it is not, "inconclusive" when the window cannot tell."""
        return self.in_most_steps(record.steps)

    def in_most_steps(self, steps: int) -> str:
        """ "above" when something seen in `steps` of the measured steps happens in most of them, "below"
        when not, "inconclusive" when the window cannot tell (its 95% interval holds one half)."""
        return proportion_interval(steps, self.steps_measured).against(0.5)

    def on_step_path(self, record) -> bool:
        return self.step_path(record) == "above"

    def undecided_site(self, code: str, what: str, record) -> str:
        """The Undecided message for a site seen in about half of the steps."""
        share = proportion_interval(record.steps, self.steps_measured)
        return (
            f"{code} undecided: {what} at {os.path.basename(record.file)}:{record.line} happened in {record.steps} "
            f"of {steps_phrase(self.steps_measured, 'measured')} ([{share.low:.0%}, {share.high:.0%}] of the steps), "
            f"which cannot tell a per-step call from a periodic one; measure more steps (`--steps "
            f"{max(40, 2 * self.steps_measured)}`) to settle it"
        )

    def per_step(self, count: int) -> float:
        return round(count / self.steps_measured, 3) if self.steps_measured else 0.0

    def counted(self, record) -> str:
        """ "1 per step (20 in 20 measured steps)" for a site record."""
        return f"{self.per_step(record.count):g} per step ({record.count} in {steps_phrase(self.steps_measured, 'measured')})"

    def observed(self, record) -> dict:
        """A site record's `observed`: its time only on CUDA, where the time inside a call is a stall."""
        time_ms = round(record.seconds * 1000, 3) if self.cuda else None
        return {"per_step": self.per_step(record.count), "total": record.count, "time_ms": time_ms}

    @cached_property
    def step_seconds(self) -> float:
        return sum(step.seconds for step in self.report.steps)

    @cached_property
    def _steady(self) -> tuple[list[int], Transient | None]:
        return steady_indices([step.seconds for step in self.report.steps])

    @property
    def transient(self) -> Transient | None:
        """A run of steps at least twice as slow as the rest, left out of the time estimates."""
        return self._steady[1]

    @property
    def steady_steps(self) -> list[StepRecord]:
        return [self.report.steps[i] for i in self._steady[0]]

    @cached_property
    def step_time(self) -> Estimate:
        """The steady steps' median time in milliseconds, with its interval."""
        return median_interval([step.seconds * 1000 for step in self.steady_steps])

    @property
    def median_step_ms(self) -> float | None:
        return self.step_time.value if self.report.steps else None

    @cached_property
    def data_starvation(self) -> Estimate | None:
        """Share of the steady steps' time spent waiting for batches that were not loaded yet (a
        worker-fed batch's hand-over left out), with its interval; None when no DataLoader handed out
        a batch in the window."""
        if not self.loaders_in_window():
            return None
        steps = self.steady_steps
        return share_interval([step.data_starved_seconds for step in steps], [step.seconds for step in steps])

    def loaders_in_window(self) -> list[tuple[int, LoaderRecord]]:
        return [(index, loader) for index, loader in enumerate(self.report.loaders) if loader.batches]

    @property
    def data_wait_fraction(self) -> float | None:
        """Share of the measured steps spent waiting in DataLoader `next()`; None when no
        DataLoader handed out a batch in the window (data loaded some other way is not seen)."""
        if not self.loaders_in_window() or not self.step_seconds:
            return None
        return sum(step.data_wait_seconds for step in self.report.steps) / self.step_seconds

    def location_of_step(self) -> tuple[str, int | None]:
        """Where a finding about the whole step points: the line that ends a step, else the script."""
        if self.report.step_site is not None:
            return self.report.step_site
        return self.script, None
