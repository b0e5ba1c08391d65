"""Reading a torch.profiler (kineto) trace, in every era of its format.

A trace is Chrome-trace JSON (optionally gzipped): `{"traceEvents": [...], "deviceProperties": [...]}`.
The categories changed over time: 2021 traces say `Operator`, `Runtime`, `Kernel`, `Memcpy`,
`Memset`; 2022 and later say `cpu_op`, `cuda_runtime`, `kernel`, `gpu_memcpy`, `gpu_memset`; ROCm
traces keep the CUDA categories but name the runtime calls `hip*`. Everything is mapped here onto
one small vocabulary (`Category`), so the analysis never looks at the raw strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from pathlib import Path

from loopaudit.profiling.in_loopaudit.trace_stream import RECORD_FEWER_STEPS, TraceError, TraceReader

# Bounds on what is kept, so that `loopaudit analyze` stays under 500 MB whatever the file: a kept
# event takes about 200 bytes, and the analysis about 70 more (measured: 893,320 events of real
# steps, 20 copies of the ResNet50 trace of the test data, peak 290 MB). That trace holds 44,666
# complete events for its 6 steps and 95 KB of distinct names and stacks.
MAX_EVENTS = 1_000_000
MAX_TEXT_BYTES = 64 << 20
# The args the analysis reads; the rest of each event's args is dropped as it is read.
_KEPT_ARGS = frozenset(("correlation", "bytes", "Call stack"))


class Category:
    CPU_OP = "cpu_op"  # an aten operator or a record_function range on the host
    ANNOTATION = "annotation"  # ProfilerStep#N, DataLoader ranges, user record_function ranges
    RUNTIME = "runtime"  # CUDA / HIP runtime and driver calls made by the host
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    GPU_SYNC = "gpu_sync"  # the device-side view of a sync (enable_cuda_sync_events)
    PYTHON = "python"  # Python frames (with_stack=True)
    OTHER = "other"


_CATEGORIES = {
    "operator": Category.CPU_OP,
    "cpu_op": Category.CPU_OP,
    "user_annotation": Category.ANNOTATION,
    "gpu_user_annotation": Category.OTHER,  # the GPU-side copy of an annotation: not host time
    "runtime": Category.RUNTIME,
    "cuda_runtime": Category.RUNTIME,
    "driver": Category.RUNTIME,
    "cuda_driver": Category.RUNTIME,
    "kernel": Category.KERNEL,
    "memcpy": Category.MEMCPY,
    "gpu_memcpy": Category.MEMCPY,
    "memset": Category.MEMSET,
    "gpu_memset": Category.MEMSET,
    "cuda_sync": Category.GPU_SYNC,
    "python_function": Category.PYTHON,
}
GPU_ACTIVITY = (Category.KERNEL, Category.MEMCPY, Category.MEMSET)


@dataclass(slots=True, repr=False)
class Event:
    """A complete event, with only what the analysis reads: a trace holds hundreds of thousands."""

    name: str
    category: str
    ts: float  # microseconds
    dur: float
    pid: object
    tid: object
    correlation: object = None  # args["correlation"]: links a runtime call to the GPU work it launched
    byte_count: float | None = None  # args["bytes"]: what a memcpy copied
    call_stack: str | None = None  # args["Call stack"]: an operator's Python frames (2021 and verbose traces)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def __repr__(self) -> str:
        return f"Event({self.category} {self.name!r} ts={self.ts} dur={self.dur})"


@dataclass
class Trace:
    path: str
    events: list[Event]
    devices: list[str] = field(default_factory=list)  # GPU names from deviceProperties
    rank: int | None = None  # distributedInfo.rank, in a distributed job's trace

    def of(self, *categories: str) -> list[Event]:
        return [event for event in self.events if event.category in categories]

    @cached_property  # asked several times per analysis; a trace holds tens of thousands of events
    def has_gpu(self) -> bool:
        return any(event.category in GPU_ACTIVITY or event.category == Category.RUNTIME for event in self.events)


def load_trace(path: str | Path) -> Trace:
    """Read a `.json` or `.json.gz` trace as a stream (trace_stream.TraceReader says what it skips and
    what it refuses), keeping of each complete event only what the analysis reads, and each distinct
    name, category, call stack, pid and tid once: a trace repeats them at every step, and their copies
    would take more memory than the events. Raises TraceError with a message fit for the user, also
    for a trace with more than MAX_EVENTS complete events or MAX_TEXT_BYTES of distinct text in those
    fields: more than the analysis holds within its memory bound."""
    path = Path(path)
    reader = TraceReader(path, _KEPT_ARGS)
    held: dict = {}
    text_bytes = 0

    def hold(value):
        """The one copy of a string or an integer (not of a bool or float: True == 1 == 1.0 would
        turn one into another), counting the text held."""
        nonlocal text_bytes
        if type(value) is str:
            shared = held.setdefault(value, value)
            text_bytes += len(value) if shared is value else 0
            return shared
        return held.setdefault(value, value) if type(value) is int else value

    categories: dict = {}  # by the `cat` value as the file has it
    events: list[Event] = []
    for name, cat, ts, dur, pid, tid, args in reader:
        if len(events) == MAX_EVENTS:
            raise TraceError(
                f"{path} holds more than {MAX_EVENTS:,} complete events, more than `loopaudit analyze` keeps "
                f"in memory: {RECORD_FEWER_STEPS}"
            )
        category = categories.get(cat)
        if category is None:
            category = categories[cat] = _CATEGORIES.get(hold(str(cat)).lower(), Category.OTHER)
        if args:
            byte_count, stack = args.get("bytes"), args.get("Call stack")
            event = Event(
                hold(str(name)),
                category,
                ts,
                dur,
                hold(pid),
                hold(tid),
                args.get("correlation"),
                byte_count if isinstance(byte_count, (int, float)) else None,
                hold(stack) if type(stack) is str else None,
            )
        else:
            event = Event(hold(str(name)), category, ts, dur, hold(pid), hold(tid))
        events.append(event)
        if text_bytes > MAX_TEXT_BYTES:
            raise TraceError(
                f"{path} is not a profiler trace: the names, categories, call stacks, pids and tids of its events "
                f"come to more than {MAX_TEXT_BYTES >> 20} MiB of distinct text (a real trace has well under 1 MiB)"
            )
    if not reader.has_event_list:
        raise TraceError(f"{path} is not a profiler trace: no `traceEvents` list")
    if not events:
        raise TraceError(f'{path} holds no timed events ("ph": "X"): not a torch.profiler trace, or an empty one')
    # Two stable sorts on one key each give the order of one sort on (ts, -dur), without building a
    # tuple and a negated float for every event: at this point that would double the memory held.
    events.sort(key=attrgetter("dur"), reverse=True)
    events.sort(key=attrgetter("ts"))
    return Trace(str(path), events, reader.devices, reader.rank)
