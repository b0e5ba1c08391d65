"""Reading a torch.profiler (kineto) trace, in every era of its format.

A trace is Chrome-trace JSON (optionally gzipped): `{"traceEvents": [...], "deviceProperties": [...]}`.
The categories changed over time: 2021 traces say `Operator`, `Runtime`, `Kernel`, `Memcpy`,
`Memset`; 2022 and later say `cpu_op`, `cuda_runtime`, `kernel`, `gpu_memcpy`, `gpu_memset`; ROCm
traces keep the CUDA categories but name the runtime calls `hip*`. Everything is mapped here onto
one small vocabulary (`Category`), so the analysis never looks at the raw strings.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path


class TraceError(Exception):
    """The file cannot be read as a profiler trace; the message says why."""


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
    name: str
    category: str
    ts: float  # microseconds
    dur: float
    pid: object
    tid: object
    args: dict

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def correlation(self) -> int | None:
        return self.args.get("correlation")

    @property
    def external_id(self) -> int | None:
        return self.args.get("External id", self.args.get("external id"))

    def __repr__(self) -> str:
        return f"Event({self.category} {self.name!r} ts={self.ts} dur={self.dur})"


@dataclass
class Trace:
    path: str
    events: list[Event]
    devices: list[str] = field(default_factory=list)  # GPU names from deviceProperties

    def of(self, *categories: str) -> list[Event]:
        return [event for event in self.events if event.category in categories]

    @cached_property  # asked several times per analysis; a trace holds tens of thousands of events
    def has_gpu(self) -> bool:
        return any(event.category in GPU_ACTIVITY or event.category == Category.RUNTIME for event in self.events)


def load_trace(path: str | Path) -> Trace:
    """Read a `.json` or `.json.gz` trace. Raises TraceError with a message fit for the user."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror or error}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise TraceError(f"{path} is not a valid gzip file: {error}") from None
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceError(f"{path} is not JSON: {error}") from None
    if isinstance(document, list):
        raw_events, properties = document, []  # the bare-array form of the Chrome trace format
    elif isinstance(document, dict) and isinstance(document.get("traceEvents"), list):
        raw_events, properties = document["traceEvents"], document.get("deviceProperties") or []
    else:
        raise TraceError(f"{path} is not a profiler trace: no `traceEvents` list")
    events = []
    for raw_event in raw_events:
        if not isinstance(raw_event, dict) or raw_event.get("ph") != "X":
            continue  # only complete events carry durations; flows and metadata are not needed
        try:
            ts, dur = float(raw_event["ts"]), float(raw_event.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        category = _CATEGORIES.get(str(raw_event.get("cat", "")).lower(), Category.OTHER)
        args = raw_event.get("args") if isinstance(raw_event.get("args"), dict) else {}
        events.append(Event(str(raw_event.get("name", "")), category, ts, dur, raw_event.get("pid"), raw_event.get("tid"), args))
    if not events:
        raise TraceError(f"{path} holds no timed events (\"ph\": \"X\"): not a torch.profiler trace, or an empty one")
    events.sort(key=lambda event: (event.ts, -event.dur))
    devices = [str(p.get("name")) for p in properties if isinstance(p, dict) and p.get("name")]
    return Trace(str(path), events, devices)
