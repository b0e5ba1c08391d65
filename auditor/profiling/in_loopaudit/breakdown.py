"""Where each measured step's time went: waiting for data, stalled in syncs, and the rest (compute,
which on a GPU machine includes launching kernels). Built from a live run or from a trace, so both
commands print and export the same table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
from loopaudit.profiling.in_loopaudit.timing import median_and_p90
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis

PARTS = ("compute", "data_wait", "sync_stall")


@dataclass
class StepRow:
    label: str  # "6" (the step's number in the run) or "ProfilerStep#6"
    total_ms: float
    data_wait_ms: float
    sync_stall_ms: float

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
        }


@dataclass
class Breakdown:
    rows: list[StepRow]
    # On a machine without a GPU nothing stalls: the sync column is unknown, not zero.
    sync_measured: bool
    # None when no DataLoader was seen: data loaded some other way is not measured.
    data_measured: bool

    @property
    def step_time_ms(self) -> dict[str, float | None]:
        return median_and_p90([row.total_ms for row in self.rows])

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
        StepRow(str(first + number), step.seconds * 1000, step.data_wait_seconds * 1000, step.sync_seconds * 1000)
        for number, step in enumerate(run.report.steps)
    ]
    return Breakdown(rows, sync_measured=run.cuda, data_measured=run.data_wait_fraction is not None)


def from_trace(trace: TraceAnalysis) -> Breakdown:
    rows = [
        StepRow(step.name, step.duration_us / 1000, step.dataloader_us / 1000, step.sync_us / 1000)
        for step in trace.steps
    ]
    gpu = trace.gpu_idle_fraction is not None
    return Breakdown(rows, sync_measured=gpu, data_measured=bool(trace.dataloader_names))
