"""What runs inside the audited script's process: finds its steps, times them, and watches the
measured window.

Steps are found without touching the script. PyTorch's global optimizer hook
(`register_optimizer_step_post_hook`) fires after every `optimizer.step()`: each one of the first
optimizer that steps ends a training step (a GAN's second optimizer does not start another). A script
that never steps an optimizer (an evaluation loop) gets one step per batch its DataLoader hands out.
Every `DataLoader` iterator's `__next__` is timed: that is how long the step waited for its batch.

After `warmup` steps the window opens: the sync spy (a TorchDispatchMode) is entered, `empty_cache`
calls are counted, and with `--profile` torch.profiler records. After `steps` more steps the report
is written and the script is stopped (unless `stop` is false).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from .sites import user_site
from .spy import SyncSpy


class AuditComplete(BaseException):
    """Raised inside the script once the window is measured, to stop it. A BaseException, so the
    script's own `except Exception:` does not swallow it."""


@dataclass
class LoaderRecord:
    file: str | None
    line: int | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    batches: int = 0
    wait_seconds: float = 0.0


@dataclass
class StepRecord:
    seconds: float
    data_wait_seconds: float


@dataclass
class Measurement:
    """What the probe hands to the parent process, as JSON."""

    device: str
    step_kind: str | None = None  # "optimizer" or "batch"
    steps_seen: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    syncs: list[dict] = field(default_factory=list)
    sync_warnings: list[dict] = field(default_factory=list)
    empty_cache: list[dict] = field(default_factory=list)
    loaders: list[LoaderRecord] = field(default_factory=list)
    window_complete: bool = False
    trace: str | None = None


class Probe:
    def __init__(self, warmup: int, steps: int, profile: bool, trace_out: str | None, report: str, stop: bool) -> None:
        self.warmup, self.window, self.profile, self.trace_out = warmup, steps, profile, trace_out
        self.report_path, self.stop = report, stop
        self.pid = os.getpid()
        self.cuda = torch.cuda.is_available()
        self.result = Measurement(device=torch.cuda.get_device_name() if self.cuda else "cpu")
        self._primary_optimizer: int | None = None
        self._last_boundary = time.perf_counter()
        self._wait = 0.0
        self._spy: SyncSpy | None = None
        self._profiler = None
        self._measuring = False
        self._reported = False
        self._loaders: dict[int, LoaderRecord] = {}
        self._empty_cache: dict[tuple[str, int], int] = {}
        self._sync_warnings: dict[tuple[str, int], int] = {}

    # --- installing --------------------------------------------------------------------------

    def install(self) -> None:
        register_optimizer_step_post_hook(self._after_optimizer_step)
        self._wrap_dataloader()
        self._wrap_empty_cache()
        if self.profile and self.warmup == 0:
            self._start_profiler()

    def _wrap_dataloader(self) -> None:
        probe = self
        original_init, original_iter, original_next = DataLoader.__init__, DataLoader.__iter__, _BaseDataLoaderIter.__next__

        def __init__(loader, *args, **kwargs):
            original_init(loader, *args, **kwargs)
            site = user_site()
            loader._loopaudit_site = site

        def __iter__(loader):
            iterator = original_iter(loader)
            record = probe._loaders.get(id(loader))
            if record is None:
                site = getattr(loader, "_loopaudit_site", None) or (None, None)
                record = probe._loaders[id(loader)] = LoaderRecord(
                    site[0], site[1], loader.num_workers, bool(loader.pin_memory),
                    bool(loader.persistent_workers), loader.prefetch_factor if loader.num_workers else None,
                )
            iterator._loopaudit_loader = record
            return iterator

        def __next__(iterator):
            record = getattr(iterator, "_loopaudit_loader", None)
            if record is not None and probe._primary_optimizer is None and record.batches and os.getpid() == probe.pid:
                probe._boundary("batch")  # no optimizer has stepped: each batch is a step
            started = time.perf_counter()
            batch = original_next(iterator)  # StopIteration passes through, as it must
            if record is not None:
                waited = time.perf_counter() - started
                record.batches += 1
                probe._wait += waited
                if probe._measuring:
                    record.wait_seconds += waited
            return batch

        DataLoader.__init__, DataLoader.__iter__, _BaseDataLoaderIter.__next__ = __init__, __iter__, __next__

    def _wrap_empty_cache(self) -> None:
        original = torch.cuda.empty_cache
        probe = self

        def empty_cache():
            if probe._measuring:
                site = user_site()
                if site is not None:
                    probe._empty_cache[site] = probe._empty_cache.get(site, 0) + 1
            return original()

        torch.cuda.empty_cache = empty_cache

    # --- steps -------------------------------------------------------------------------------

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        if os.getpid() != self.pid:
            return
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
            if self.result.step_kind == "batch":
                self._restart()  # it looked like evaluation, but it trains: count training steps
        if id(optimizer) == self._primary_optimizer:
            self._boundary("optimizer")

    def _restart(self) -> None:
        self._close_window(write=False)
        self.result.steps.clear()
        self.result.steps_seen = 0
        for record in self._loaders.values():
            record.wait_seconds = 0.0

    def _boundary(self, kind: str) -> None:
        now = time.perf_counter()
        self.result.step_kind = kind
        self.result.steps_seen += 1
        seen = self.result.steps_seen
        if self._measuring:
            self.result.steps.append(StepRecord(now - self._last_boundary, self._wait))
        if self._profiler is not None:
            self._profiler.step()
        self._last_boundary, self._wait = now, 0.0
        if self.profile and seen == self.warmup - 1 and self._profiler is None:
            self._start_profiler()
        if seen == self.warmup:
            self._open_window()
        elif seen == self.warmup + self.window and self._measuring:
            self.result.window_complete = True
            self._close_window(write=True)
            if self.stop:
                raise AuditComplete()

    # --- the measured window -------------------------------------------------------------------

    def _open_window(self) -> None:
        if self.profile and self._profiler is None:
            self._start_profiler()
        self._measuring = True
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
            self._original_showwarning = warnings.showwarning
            warnings.showwarning = self._on_warning
            warnings.filterwarnings("always", message=".*synchroniz.*", category=UserWarning)
        self._spy = SyncSpy(self.cuda)
        self._spy.__enter__()

    def _close_window(self, write: bool) -> None:
        if self._spy is not None:
            self._spy.__exit__(None, None, None)
            self.result.syncs = [asdict(site) for site in self._spy.sites.values()]
            self._spy = None
        if self._measuring and self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = self._original_showwarning
        self._measuring = False
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
        if write:
            self.write()

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return self._original_showwarning(message, category, filename, lineno, file, line)
        site = user_site() or (filename, lineno)
        self._sync_warnings[site] = self._sync_warnings.get(site, 0) + 1
        return None

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        warmup = 1 if self.warmup >= 1 else 0
        trace_path = self.trace_out

        def save(prof) -> None:
            prof.export_chrome_trace(trace_path)
            self.result.trace = trace_path

        self._profiler = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=warmup, active=self.window, repeat=1),
            on_trace_ready=save,
            with_stack=True,
            record_shapes=False,
        )
        self._profiler.start()

    # --- the report ----------------------------------------------------------------------------

    def finish(self) -> None:
        """Called when the script ends or stops, so a short run still reports what it measured."""
        if os.getpid() == self.pid and not self._reported:
            self._close_window(write=False)
            self.write()

    def write(self) -> None:
        if os.getpid() != self.pid:
            return
        self._reported = True
        self.result.loaders = list(self._loaders.values())
        self.result.empty_cache = [{"file": f, "line": l, "count": c} for (f, l), c in self._empty_cache.items()]
        self.result.sync_warnings = [{"file": f, "line": l, "count": c} for (f, l), c in self._sync_warnings.items()]
        temporary = self.report_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump(asdict(self.result), stream)
        os.replace(temporary, self.report_path)
