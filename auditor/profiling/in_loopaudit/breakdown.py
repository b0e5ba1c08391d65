"""Where each measured step's time went: waiting for data, stalled in syncs, and the rest (compute,
which on a GPU machine includes launching kernels). Built from a live run or from a trace, so both
commands print and export the same table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
from loopaudit.profiling.in_loopaudit.timing import median_and_p90
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
from loopaudit.profiling.in_script.stability import Estimate

PARTS = ("compute", "data_wait", "sync_stall")


@dataclass
class StepRow:
    label: str  # "6" (the step's number in the run) or "ProfilerStep#6"
    total_ms: float
    data_wait_ms: float
    sync_stall_ms: float
    data_not_ready_ms: float | None = None  # of the data wait, batches not yet loaded (a live run only)

    @property
    def compute_ms(self) -> float:
        return max(0.0, self.total_ms - self.data_wait_ms - self.sync_stall_ms)

    def part(self, name: str) -> float:
        return getattr(self, f"{name}_ms")

    def to_json(self, data_measured: bool, sync_measured: bool) -> dict:
        """A part that was not measured is null, not 0: no GPU is not "no stall"."""
        return {
            "step": self.label,
            "time_ms": round(self.total_ms, 3),
            "compute_ms": round(self.compute_ms, 3),
            "data_wait_ms": round(self.data_wait_ms, 3) if data_measured else None,
            "sync_stall_ms": round(self.sync_stall_ms, 3) if sync_measured else None,
            "data_not_ready_ms": (
                round(self.data_not_ready_ms, 3) if data_measured and self.data_not_ready_ms is not None else None
            ),
        }


@dataclass
class Breakdown:
    rows: list[StepRow]
    # On a machine without a GPU nothing stalls: the sync column is unknown, not zero.
    sync_measured: bool
    # None when no DataLoader was seen: data loaded some other way is not measured.
    data_measured: bool
    # A live run's estimates, over its steady steps (the rows not in `transient`), with intervals.
    step_time: Estimate | None = None
    data_not_ready: Estimate | None = None  # the share of waits for batches not yet loaded
    transient: frozenset[str] = field(default_factory=frozenset)  # labels of the rows left out

    @property
    def step_time_ms(self) -> dict[str, float | None]:
        """Median and p90 of the steady steps; the median is `step_time`'s when there is one."""
        times = median_and_p90([row.total_ms for row in self.rows if row.label not in self.transient])
        if self.step_time is not None and times["median"] is not None:
            times["median"] = round(self.step_time.value, 3)
        return times

    def median(self, part: str) -> float | None:
        return statistics.median(row.part(part) for row in self.rows) if self.rows else None

    def share(self, part: str) -> float | None:
        total = sum(row.total_ms for row in self.rows)
        if (
            not total
            or (part == "sync_stall" and not self.sync_measured)
            or (part == "data_wait" and not self.data_measured)
        ):
            return None
        return sum(row.part(part) for row in self.rows) / total


def from_run(run: RunEvidence) -> Breakdown:
    first = run.report.warmup + 1
    rows = [
        StepRow(
            str(first + number),
            step.seconds * 1000,
            step.data_wait_seconds * 1000,
            step.sync_seconds * 1000,
            step.data_starved_seconds * 1000,
        )
        for number, step in enumerate(run.report.steps)
    ]
    transient = run.transient
    left_out = (
        frozenset(rows[i].label for i in range(transient.first, transient.last + 1)) if transient else frozenset()
    )
    return Breakdown(
        rows,
        sync_measured=run.cuda,
        data_measured=run.data_wait_fraction is not None,
        step_time=run.step_time,
        data_not_ready=run.data_starvation,
        transient=left_out,
    )


def from_trace(trace: TraceAnalysis) -> Breakdown:
    rows = [
        StepRow(step.name, step.duration_us / 1000, step.dataloader_us / 1000, step.sync_us / 1000)
        for step in trace.steps
    ]
    gpu = trace.gpu_idle_fraction is not None
    return Breakdown(rows, sync_measured=gpu, data_measured=bool(trace.dataloader_names))
