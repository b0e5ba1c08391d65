"""What the probe measures inside the script's process and hands to the auditor as JSON.

Both sides use these classes: the probe (which imports torch) fills them in, the `loopaudit` process
(which never imports torch) reads them back with `ProbeReport.load`. Paths are absolute, as the
script's process saw them; durations are seconds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from loopaudit.atomic import write_atomically


class _CountedPerStep:
    """Calls counted by step: those of the step now running wait in `pending` until it ends."""

    count: int
    steps: int
    pending: int

    def commit(self) -> None:
        """The step ended: its calls count. Calls in a step cut short by the end of the run do not."""
        if self.pending:
            self.count += self.pending
            self.steps += 1
            self.pending = 0

    def discard(self) -> None:
        """The step ended but is left out of the measurement (the start-up step): its calls do not count."""
        self.pending = 0


@dataclass
class SiteRecord(_CountedPerStep):
    """One line that made the host wait for the device (or would, on CUDA), in the window."""

    kind: str  # item, nonzero, boolean-mask index, device-to-host copy, empty_cache, cuda sync, ...
    call: str  # the entry point: Tensor.item, torch.nonzero, Tensor.__getitem__
    file: str
    line: int
    via: str | None = None  # the library function that made the call, when the user's line did not
    count: int = 0
    steps: int = 0  # measured steps in which it happened at least once
    seconds: float = 0.0  # time inside the call: the stall, on CUDA
    proven: int = 0  # CUDA: calls during which torch's sync check (set_sync_debug_mode) fired
    pending: int = 0  # calls in the step now running: counted when it ends; not reported
    # Collectives: the user's lines on the stack, innermost first ([file, line] each): a helper's
    # `all_reduce` is also known by the step's call of the helper
    stack: list[list] = field(default_factory=list)

    def seen(self, seconds: float = 0.0) -> None:
        self.pending += 1
        self.seconds += seconds


@dataclass
class BatchMove(_CountedPerStep):
    """A line that moves DataLoader output with `.to(...)`/`.cuda()` (the evidence for LA603)."""

    loader: int  # index into ProbeReport.loaders
    file: str
    line: int
    pageable: bool  # the source was not in pinned memory
    count: int = 0
    steps: int = 0
    bytes: int = 0
    seconds: float = 0.0
    pending: int = 0

    def seen(self, size: int, seconds: float) -> None:
        self.pending += 1
        self.bytes += size
        self.seconds += seconds


@dataclass
class LoaderRecord:
    """A DataLoader as it really runs (its live attributes, not the source text)."""

    file: str | None
    line: int | None
    dataset: str
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    batches: int = 0  # batches handed out in the measured window
    wait_seconds: float = 0.0  # time the script waited in `next()` in the window
    first_batch_wait_seconds: float = 0.0  # of that, waiting for a fresh iterator's first batch
    iterators: int = 0  # iterators started in the window (a new epoch, or a loader per call)
    # of wait_seconds, the waits for batches that were not loaded yet (not a worker's batch handed over)
    starved_seconds: float = 0.0


@dataclass
class StepRecord:
    seconds: float
    data_wait_seconds: float
    sync_seconds: float  # time inside calls that synchronized (CUDA only; 0 on a CPU machine)
    # of data_wait_seconds, the waits for batches that were not loaded yet (see probe._batch_ready)
    data_starved_seconds: float = 0.0
    comm_seconds: float = 0.0  # time inside torch.distributed's collectives (collectives.py)
    ddp_syncs: int = 0  # DDP forwards that armed a gradient all-reduce (ddp_syncs.py)


@dataclass
class ProbeReport:
    device: str  # "cpu" or the GPU's name
    cuda: bool
    torch_version: str
    cpu_count: int
    warmup: int
    window: int  # the number of steps asked for
    longest: int = 0  # how far the window could go on until its estimates were decided
    step_kind: str | None = None  # "optimizer" (optimizer.step() ends a step) or "batch"
    steps_seen: int = 0
    step_site: tuple[str, int] | None = None  # the line whose call ends a step
    steps: list[StepRecord] = field(default_factory=list)
    syncs: list[SiteRecord] = field(default_factory=list)
    empty_cache: list[SiteRecord] = field(default_factory=list)
    loaders: list[LoaderRecord] = field(default_factory=list)
    batch_moves: list[BatchMove] = field(default_factory=list)
    collectives: list[SiteRecord] = field(default_factory=list)
    ddp_syncs: list[SiteRecord] = field(default_factory=list)  # backward calls that all-reduced under DDP
    # The process's place in a distributed job, from the launcher's environment (RANK, WORLD_SIZE)
    rank: int | None = None
    world_size: int | None = None
    batches_seen: int = 0  # batches any DataLoader handed out, in the whole run
    # Where the script's main thread was when loopaudit stopped the measurement (halt): the user's
    # line it was stuck at, for a rank that hung ([file, line])
    halted_at: list | None = None
    window_complete: bool = False
    # With --warmup 0, the first step ran from the script's start (imports, building the model): left
    # out of the measured steps, which are then the ones after it.
    startup_excluded: bool = False
    stopped: bool = False  # loopaudit stopped the script after the window
    trace: str | None = None
    error: str | None = None  # the probe itself could not run (torch missing)

    def dump(self, path: str) -> None:
        data = asdict(self)
        for key in ("syncs", "empty_cache", "batch_moves", "collectives", "ddp_syncs"):
            for record in data[key]:
                record.pop("pending")
        write_atomically(path, json.dumps(data).encode("utf-8"))  # the reader never sees half a report

    @classmethod
    def load(cls, path: str) -> ProbeReport:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
        nested = {
            "steps": StepRecord,
            "syncs": SiteRecord,
            "empty_cache": SiteRecord,
            "loaders": LoaderRecord,
            "batch_moves": BatchMove,
            "collectives": SiteRecord,
            "ddp_syncs": SiteRecord,
        }
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for key, kind in nested.items():
            values[key] = [kind(**item) for item in values.get(key, [])]
        if values.get("step_site") is not None:
            values["step_site"] = tuple(values["step_site"])
        return cls(**values)


# How a report names what synchronized, by the spy's kind of site.
_KIND_LABELS = {
    "item": "`.item()`",
    "tolist": "`.tolist()`",
    "bool": "a tensor used as a Python bool (`if t:`, `while t:`, `and`/`or`)",
    "float": "`float(tensor)`",
    "int": "`int(tensor)`",
    "index": "a tensor used as a Python index",
    "format": "printing or formatting a tensor",
    "boolean-mask index": "boolean-mask indexing `x[mask]`",
    "cuda sync": "a synchronizing CUDA call (reported by torch's sync check)",
    "empty_cache": "`torch.cuda.empty_cache()`",
}


def describe_site(kind: str, call: str) -> str:
    """`.item()`, `torch.nonzero()`, `.cpu()`: the call as the user wrote it, as far as we know."""
    if kind in _KIND_LABELS:
        return _KIND_LABELS[kind]
    owner, _, name = call.rpartition(".")
    return f"`.{name}()`" if owner == "Tensor" else f"`{call}()`"
