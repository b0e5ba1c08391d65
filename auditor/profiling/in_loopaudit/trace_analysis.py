"""What a profiler trace says about a training loop: step time, data-loader wait, sync stalls,
pageable copies, allocator churn and GPU idle time.

The rules follow the tools people already trust, so the numbers can be compared:
- Data-loader wait is the time inside `enumerate(DataLoader)#...__next__` ranges that the GPU is
  not busy and the host is not in a CUDA runtime call (TensorBoard's profiler plugin ranks kernels,
  copies, memsets and runtime calls before the data loader when it splits a step's time).
- GPU idle share follows HolisticTraceAnalysis: over the GPU work launched before the last
  (incomplete) step, the share of the span from its first to its last activity with nothing running.
- A sync is proven by a synchronizing runtime call (`cudaStreamSynchronize` and kin), not by the
  name of the operator above it: `.item()` of a CPU tensor does not wait for anything.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

from loopaudit.profiling.in_loopaudit.intervals import IntervalSet
from loopaudit.profiling.in_loopaudit.timing import median_and_p90
from loopaudit.profiling.in_loopaudit.trace import GPU_ACTIVITY, Category, Event, Trace
from loopaudit.profiling.in_script.sites import is_own_file

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_DATALOADER_PREFIX = "enumerate(DataLoader)"
# Runtime calls that block the host until the device (or a stream, or an event) is done.
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
        "hipMemcpyWithStream",
    }
)
ALLOCATOR_CALLS = frozenset({"cudaMalloc", "cudaFree", "hipMalloc", "hipFree", "cudaMallocHost", "cudaFreeHost"})
FREE_CALLS = frozenset({"cudaFree", "hipFree"})
# Operators that would wait for the device if their input lived there: on a CPU-only trace they are
# reported as "would synchronize on CUDA".
SYNCING_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::nonzero_static",
    }
)
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<function>.+)$")
_LIBRARY_PARTS = ("site-packages", "dist-packages", "/torch/", "\\torch\\", "/lib/python", "<built-in", "<frozen")


@dataclass
class StepBreakdown:
    name: str
    start_us: float
    duration_us: float
    dataloader_us: float
    sync_us: float
    comm_us: float = 0.0  # in collectives: NCCL kernels on the GPU, or the host's gloo/nccl calls


@dataclass
class SourceFrame:
    file: str
    line: int | None
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass
class SyncSite:
    """Syncs grouped by the operator that made them and the Python frame above it."""

    call: str  # cudaStreamSynchronize, ... (or the operator, for "would sync" sites)
    operator: str | None  # the outermost operator around it: aten::item, aten::is_nonzero
    frame: SourceFrame | None
    count: int = 0
    stall_us: float = 0.0
    proven: bool = True  # False on CPU-only traces: it would synchronize on CUDA
    steps: int = 0  # profiler steps in which it happened (0 when the trace marks no steps)


@dataclass
class CopySite:
    kind: str  # "HtoD pageable", "DtoH pageable"
    operator: str | None
    frame: SourceFrame | None
    count: int = 0
    bytes: int = 0
    duration_us: float = 0.0
    steps: int = 0


@dataclass
class TraceAnalysis:
    path: str
    device: str
    steps: list[StepBreakdown]
    dataloader_fraction: float | None
    gpu_idle_fraction: float | None
    syncs: list[SyncSite] = field(default_factory=list)
    copies: list[CopySite] = field(default_factory=list)
    allocator_calls: dict[str, int] = field(default_factory=dict)
    allocator_us: float = 0.0
    # Steps in which the caching allocator handed memory back to the driver (cudaFree/hipFree),
    # and the Python frame of the first such call: what `torch.cuda.empty_cache()` looks like.
    gpu_idle_us: float | None = None  # the idle time behind gpu_idle_fraction
    steps_freeing: int = 0
    free_frame: SourceFrame | None = None
    dataloader_frame: SourceFrame | None = None  # the loop that waits in DataLoader `next()`
    dataloader_names: list[str] = field(default_factory=list)
    rank: int | None = None  # the rank that recorded it, in a distributed job

    @property
    def step_times_ms(self) -> list[float]:
        return [step.duration_us / 1000 for step in self.steps]

    def step_time_summary(self) -> dict[str, float | None]:
        return median_and_p90(self.step_times_ms)

    @property
    def marks_steps(self) -> bool:
        return bool(self.steps) and self.steps[0].name != "whole trace"

    def on_step_path(self, site) -> bool:
        """In more than half of the steps; a trace that marks no steps is one long step."""
        if not self.marks_steps:
            return site.count > 0
        return site.steps * 2 > len(self.steps)


def analyze_trace(trace: Trace) -> TraceAnalysis:
    index = _HostIndex(trace)
    steps = _steps(trace)
    gpu = [event for event in trace.events if event.category in GPU_ACTIVITY]
    runtime = trace.of(Category.RUNTIME)
    device_busy = IntervalSet((e.ts, e.end) for e in gpu + runtime)
    loaders = [
        e
        for e in trace.events
        if e.name.startswith(_DATALOADER_PREFIX) and e.category in (Category.CPU_OP, Category.ANNOTATION)
    ]
    step_of = _step_finder(steps) if steps and steps[0][0] != "whole trace" else (lambda event: 0)
    in_steps = lambda event: step_of(event) is not None  # noqa: E731
    syncs = _sync_sites(trace, [e for e in runtime if in_steps(e)], index, in_steps, step_of)
    communication = _communication(trace, gpu)
    breakdowns = []
    for name, start, end in steps:
        waiting = sum(
            loader.dur - device_busy.covered(loader.ts, loader.end) for loader in loaders if start <= loader.ts < end
        )
        stalled = sum(e.dur for e in runtime if e.name in SYNC_CALLS and start <= e.ts < end)
        comm = communication.covered(start, end) if communication is not None else 0.0
        breakdowns.append(StepBreakdown(name, start, end - start, waiting, stalled, comm))
    total = sum(step.duration_us for step in breakdowns)
    dataloader_fraction = (
        sum(step.dataloader_us for step in breakdowns) / total if total and loaders else (0.0 if total else None)
    )
    allocator: defaultdict[str, int] = defaultdict(int)
    allocator_us = 0.0
    freeing_steps: set[int] = set()
    free_frame = None
    for event in runtime:
        if event.name in ALLOCATOR_CALLS:
            allocator[event.name] += 1
            allocator_us += event.dur
            step = step_of(event)
            if event.name in FREE_CALLS and step is not None:
                freeing_steps.add(step)
                free_frame = free_frame or index.user_frame(event, index.operators_around(event))
    idle = _gpu_idle(gpu + _stream_syncs(trace), runtime, steps)
    return TraceAnalysis(
        path=trace.path,
        device=", ".join(sorted(set(trace.devices)))
        if trace.has_gpu and trace.devices
        else ("gpu" if trace.has_gpu else "cpu"),
        steps=breakdowns,
        dataloader_fraction=dataloader_fraction,
        gpu_idle_fraction=idle[1] if idle else None,
        gpu_idle_us=idle[0] if idle else None,
        syncs=syncs,
        copies=_pageable_copies(trace, runtime, index, step_of),
        allocator_calls=dict(allocator),
        allocator_us=allocator_us,
        steps_freeing=len(freeing_steps),
        free_frame=free_frame,
        dataloader_frame=next((f for f in (index.user_frame(e, []) for e in loaders) if f is not None), None),
        dataloader_names=sorted({loader.name for loader in loaders}),
        rank=trace.rank,
    )


# Collectives in a trace: the GPU's NCCL kernels (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`,
# `ncclKernel_AllReduce_...`), or on the host the process group's record_function ranges
# (`gloo:all_reduce`, `nccl:all_reduce`), which on gloo last until the collective is done.
_NCCL_KERNEL = re.compile(r"^nccl(Dev)?Kernel")
_HOST_COLLECTIVE = re.compile(r"^(gloo|nccl|mpi|ucc):")


def _communication(trace: Trace, gpu: list) -> IntervalSet | None:
    """The time spent in collectives, as an interval set: on the GPU when the trace has NCCL kernels,
    else on the host; None when the trace shows no collective at all."""
    kernels = [(e.ts, e.end) for e in gpu if _NCCL_KERNEL.match(e.name)]
    if kernels:
        return IntervalSet(kernels)
    host = [
        (e.ts, e.end)
        for e in trace.events
        if _HOST_COLLECTIVE.match(e.name) and e.category in (Category.CPU_OP, Category.ANNOTATION)
    ]
    return IntervalSet(host) if host else None


def _steps(trace: Trace) -> list[tuple[str, float, float]]:
    """(name, start, end) of each ProfilerStep#N; the whole host span when the trace marks none."""
    marked: dict[str, tuple[str, float, float]] = {}
    for event in trace.events:
        if _STEP.match(event.name) and event.category in (Category.CPU_OP, Category.ANNOTATION):
            marked.setdefault(event.name, (event.name, event.ts, event.end))
    if marked:
        return sorted(marked.values(), key=lambda step: step[1])
    host = [e for e in trace.events if e.category in (Category.CPU_OP, Category.ANNOTATION, Category.RUNTIME)]
    if not host:
        return []
    return [("whole trace", min(e.ts for e in host), max(e.end for e in host))]


def _step_finder(steps):
    """The index of the step a host event starts in, or None: the profiler's own
    `cudaDeviceSynchronize` when it stops, say, is not the training loop's."""
    starts = [start for _, start, _ in steps]
    ends = [end for _, _, end in steps]

    def step_of(event: Event) -> int | None:
        position = bisect_right(starts, event.ts) - 1
        return position if position >= 0 and event.ts < ends[position] else None

    return step_of


def _stream_syncs(trace: Trace) -> list[Event]:
    """Device-side sync events that occupy a stream (`Stream Sync` on stream 7). HTA counts these as
    busy time; `Event Sync` and `Context Sync` (no stream, tid -1) it does not."""
    return [e for e in trace.of(Category.GPU_SYNC) if not (isinstance(e.tid, int) and e.tid < 0)]


def _gpu_idle(gpu: list[Event], runtime: list[Event], steps) -> tuple[float, float] | None:
    """(idle microseconds, idle share of the GPU's active span), or None without GPU activity."""
    if not gpu:
        return None
    if len(steps) >= 2:
        # Like HTA, leave out the last step: the trace may stop before its GPU work does.
        cutoff = steps[-1][1]
        launched = {e.correlation: e.ts for e in runtime if e.correlation is not None}
        gpu = [e for e in gpu if launched.get(e.correlation, e.ts) < cutoff]
    busy = IntervalSet((e.ts, e.end) for e in gpu)
    if not busy:
        return None
    span = busy.last - busy.first
    idle = span - busy.total()
    return (idle, idle / span) if span > 0 else (0.0, 0.0)


class _HostIndex:
    """Finds what encloses a host event: the operators and Python frames on the same thread."""

    def __init__(self, trace: Trace) -> None:
        self.ops: dict[object, list[Event]] = defaultdict(list)
        self.frames: dict[object, list[Event]] = defaultdict(list)
        for event in trace.events:
            if event.category == Category.CPU_OP:
                self.ops[(event.pid, event.tid)].append(event)
            elif event.category == Category.PYTHON:
                self.frames[(event.pid, event.tid)].append(event)
        self._starts = {key: [e.ts for e in events] for key, events in self.ops.items()}
        self._frame_starts = {key: [e.ts for e in events] for key, events in self.frames.items()}

    @staticmethod
    def _enclosing(events: list[Event], starts: list[float], event: Event) -> list[Event]:
        """Events that contain `event`, outermost first (events are sorted by start)."""
        found = []
        for candidate in events[: bisect_right(starts, event.ts)]:
            if candidate.end >= event.end and candidate is not event:
                found.append(candidate)
        return found

    def operators_around(self, event: Event) -> list[Event]:
        key = (event.pid, event.tid)
        return self._enclosing(self.ops.get(key, []), self._starts.get(key, []), event)

    def user_frame(self, event: Event, operators: list[Event]) -> SourceFrame | None:
        key = (event.pid, event.tid)
        frames = self._enclosing(self.frames.get(key, []), self._frame_starts.get(key, []), event)
        for frame in reversed(frames):  # innermost first
            parsed = _parse_frame(frame.name)
            if parsed is not None and _is_user_file(parsed.file):
                return parsed
        for operator in reversed(operators):
            stack = operator.call_stack
            if stack:
                for part in stack.split(";"):  # innermost first
                    parsed = _parse_frame(part.strip())
                    if parsed is not None and _is_user_file(parsed.file):
                        return parsed
        return None


def _parse_frame(text: str) -> SourceFrame | None:
    match = _FRAME.match(text)
    if match is None:
        return None
    return SourceFrame(match["file"], int(match["line"]), match["function"])


def _is_user_file(path: str) -> bool:
    """Not torch's, another library's, the interpreter's, or loopaudit's own: a trace that `loopaudit
    run --profile` recorded holds the probe's wrappers between the script's line and torch, named
    `loopaudit/profiling/spy.py` (torch writes a path from the sys.path folder it is under) or, for
    a checkout installed in place, by their path on this machine."""
    normalized = path.replace("\\", "/")
    if normalized.startswith(("torch/", "<", "loopaudit/")) or is_own_file(path):
        return False
    return not any(part in normalized for part in _LIBRARY_PARTS)


def _outermost_operator(operators: list[Event]) -> str | None:
    """`aten::item` rather than the `aten::_local_scalar_dense` inside it; record_function ranges
    such as ProfilerStep or DataLoader iteration are not operators."""
    for operator in operators:
        if operator.name.startswith("aten::") or operator.name.startswith("c10d::"):
            return operator.name
    return operators[-1].name if operators else None


def _sync_sites(trace: Trace, runtime: list[Event], index: _HostIndex, in_steps, step_of) -> list[SyncSite]:
    sites: dict[tuple, SyncSite] = {}
    seen_in: dict[tuple, set] = defaultdict(set)
    calls = [e for e in runtime if e.name in SYNC_CALLS]
    proven = True
    if not trace.has_gpu:
        # A CPU-only trace: the operators that would wait for the device if the data were there.
        calls = [e for e in trace.of(Category.CPU_OP) if e.name in SYNCING_OPS and in_steps(e)]
        proven = False
    for call in calls:
        operators = index.operators_around(call)
        frame = index.user_frame(call, operators)
        operator = _outermost_operator(operators) if proven else (_outermost_operator(operators) or call.name)
        key = (call.name, operator, str(frame) if frame else None)
        site = sites.get(key)
        if site is None:
            site = sites[key] = SyncSite(call.name, operator, frame, proven=proven)
        site.count += 1
        site.stall_us += call.dur if proven else 0.0
        seen_in[key].add(step_of(call))
    for key, site in sites.items():
        site.steps = len(seen_in[key] - {None})
    return sorted(sites.values(), key=lambda s: (-s.stall_us, -s.count))


def _pageable_copies(trace: Trace, runtime: list[Event], index: _HostIndex, step_of) -> list[CopySite]:
    launches = {e.correlation: e for e in runtime if e.correlation is not None}
    sites: dict[tuple, CopySite] = {}
    seen_in: dict[tuple, set] = defaultdict(set)
    for copy in trace.of(Category.MEMCPY):
        if "Pageable" not in copy.name:
            continue
        kind = ("HtoD" if "HtoD" in copy.name else "DtoH" if "DtoH" in copy.name else "copy") + " pageable"
        launch = launches.get(copy.correlation)
        operators = index.operators_around(launch) if launch is not None else []
        frame = index.user_frame(launch, operators) if launch is not None else None
        operator = _outermost_operator(operators)
        key = (kind, operator, str(frame) if frame else None)
        site = sites.get(key)
        if site is None:
            site = sites[key] = CopySite(kind, operator, frame)
        site.count += 1
        site.bytes += int(copy.byte_count or 0)
        site.duration_us += copy.dur
        if launch is not None:
            seen_in[key].add(step_of(launch))
    for key, site in sites.items():
        site.steps = len(seen_in[key] - {None})
    return sorted(sites.values(), key=lambda s: -s.duration_us)
