"""What runs inside the audited script's process: finds its steps, times them, and watches the
measured window.

Steps are found without touching the script. PyTorch's global optimizer hook
(`register_optimizer_step_post_hook`) fires after every `optimizer.step()`: each one of the first
optimizer that steps ends a training step (a GAN's second optimizer does not start another). A script
that never steps an optimizer (an evaluation loop) gets one step per batch its DataLoader hands out.
Every `DataLoader` iterator's `__next__` is timed: that is how long the step waited for its batch.

After `warmup` steps the window opens: the sync spy is installed, `empty_cache` calls are counted,
on CUDA torch's own sync check (`set_sync_debug_mode("warn")`) is turned on, and with `--profile`
torch.profiler records. After `steps` more steps the report is written and the script is stopped
(unless `stop` is false).

When loopaudit stops the run early (--timeout, a signal), it asks for the report from another thread
(`halt`, see runner.py): the measurement ends there, and the hooks let everything after it pass.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import time
import warnings
from collections import Counter
from typing import TYPE_CHECKING, cast

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter, _SingleProcessDataLoaderIter

from loopaudit.profiling.in_script.collectives import CollectiveSpy
from loopaudit.profiling.in_script.ddp_syncs import DdpSyncCounter
from loopaudit.profiling.in_script.report import LoaderRecord, ProbeReport, SiteRecord, StepRecord
from loopaudit.profiling.in_script.sites import user_frame, user_site
from loopaudit.profiling.in_script.spy import SYNC_WARNING, BatchTracker, SyncSpy
from loopaudit.profiling.in_script.stability import settled

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.profiler import profile as TorchProfile  # the name `profile` is a flag here

    _ShowWarning = Callable[..., None]  # warnings.showwarning's kind


class AuditComplete(BaseException):
    """Raised inside the script once the window is measured, to stop it. A BaseException, so the
    script's own `except Exception:` does not swallow it."""


class Probe:
    def __init__(
        self,
        warmup: int,
        steps: int,
        profile: bool,
        trace_out: str | None,
        report: str,
        stop: bool,
        progress: str | None = None,
        longest: int | None = None,
        thresholds: tuple[float, ...] = (),
    ) -> None:
        self.warmup, self.window, self.profile, self.trace_out = warmup, steps, profile, trace_out
        # The window goes on past `steps`, up to `longest`, until the data-wait share is decided against
        # every threshold (stability.py). A profiled window keeps its length: the profiler's schedule
        # is set when it starts.
        self.longest = steps if profile or longest is None else max(steps, longest)
        self.thresholds = tuple(thresholds)
        self.report_path, self.stop = report, stop
        self.pid = os.getpid()
        self._main_thread = threading.get_ident()
        self.cuda = torch.cuda.is_available()
        self.result = ProbeReport(
            device=torch.cuda.get_device_name() if self.cuda else "cpu",
            cuda=self.cuda,
            torch_version=torch.__version__,
            cpu_count=os.cpu_count() or 1,
            warmup=warmup,
            window=steps,
            longest=self.longest,
            rank=_environment_number("RANK"),
            world_size=_environment_number("WORLD_SIZE"),
        )
        self.batches = BatchTracker()
        self._primary_optimizer: int | None = None
        self._batches_fetched = 0  # by any loader, in the whole run
        self._step_sites: Counter[tuple[str, int]] = Counter()
        self._last_boundary = time.perf_counter()
        self._wait = 0.0
        self._starved = 0.0  # of the wait, the part spent on batches that were not loaded yet
        # With --warmup 0 the first step's start is not a step boundary: it is the first batch
        # fetched, when there is one; a first step without one began with the script (start-up).
        self._first_step_began = False
        self._spy: SyncSpy | None = None
        self._collectives: CollectiveSpy | None = None
        self._ddp_syncs: DdpSyncCounter | None = None
        self._profiler: TorchProfile | None = None
        self._measuring = False
        self._halted = False  # loopaudit stopped the measurement (halt): nothing after it counts
        self._reported = False  # the final report is written
        self._writing = threading.Lock()  # halt writes from loopaudit's thread, the rest from the script's
        self._loaders: dict[int, tuple[LoaderRecord, int]] = {}  # id(loader) -> (record, index)
        self._empty_cache: dict[tuple[str, int], SiteRecord] = {}
        self._original_showwarning: _ShowWarning | None = None
        self._progress_path = progress  # where the runner reads how many steps have passed

    # --- installing --------------------------------------------------------------------------

    def install(self) -> None:
        register_optimizer_step_post_hook(self._after_optimizer_step)
        self._wrap_dataloader()
        self._wrap_empty_cache()
        if self.warmup == 0:
            self._open_window()

    def _wrap_dataloader(self) -> None:
        probe = self
        original_init, original_iter, original_next = (
            DataLoader.__init__,
            DataLoader.__iter__,
            _BaseDataLoaderIter.__next__,
        )

        def __init__(loader, *args, **kwargs):
            original_init(loader, *args, **kwargs)
            loader._loopaudit_site = user_site()

        def __iter__(loader):
            iterator = original_iter(loader)
            if os.getpid() == probe.pid:
                iterator._loopaudit_loader = probe._loader_record(loader)
                iterator._loopaudit_fresh = True
                if probe._measuring:
                    iterator._loopaudit_loader[0].iterators += 1
            return iterator

        def __next__(iterator):
            entry = getattr(iterator, "_loopaudit_loader", None)
            if entry is None or os.getpid() != probe.pid or probe._halted:
                return original_next(iterator)
            record, index = entry
            if probe._primary_optimizer is None and probe._batches_fetched:
                probe._boundary("batch")  # no optimizer has stepped: each batch is a step
            probe._batches_fetched += 1
            if probe.result.steps_seen == 0 and not probe._first_step_began:
                probe._first_step_began = True
                probe._last_boundary, probe._wait, probe._starved = time.perf_counter(), 0.0, 0.0
            spy = probe._spy
            if spy is not None:
                spy.fetching = True
            ready = _batch_ready(iterator)
            started = time.perf_counter()
            try:
                batch = original_next(iterator)  # StopIteration passes through, as it must
            finally:
                if spy is not None:
                    spy.fetching = False
            waited = time.perf_counter() - started
            probe._wait += waited
            starved = 0.0 if ready else waited
            probe._starved += starved
            if probe._primary_optimizer is None:
                site = user_site()
                if site is not None:
                    probe._step_sites[site] += 1
            if probe._measuring:
                record.batches += 1
                record.wait_seconds += waited
                record.starved_seconds += starved
                if iterator.__dict__.pop("_loopaudit_fresh", False):
                    record.first_batch_wait_seconds += waited
                probe.batches.tag(batch, index)
            else:
                iterator.__dict__.pop("_loopaudit_fresh", None)
            return batch

        # torch's DataLoader patched on purpose: the type checker refuses assignments to methods.
        DataLoader.__init__, DataLoader.__iter__, _BaseDataLoaderIter.__next__ = __init__, __iter__, __next__  # type: ignore[method-assign, assignment]

    def _loader_record(self, loader) -> tuple[LoaderRecord, int]:
        entry = self._loaders.get(id(loader))
        if entry is None:
            site = getattr(loader, "_loopaudit_site", None) or (None, None)
            workers = loader.num_workers
            record = LoaderRecord(
                file=site[0],
                line=site[1],
                dataset=type(loader.dataset).__name__,
                batch_size=loader.batch_size,
                num_workers=workers,
                pin_memory=bool(loader.pin_memory),
                persistent_workers=bool(loader.persistent_workers),
                prefetch_factor=loader.prefetch_factor if workers else None,
            )
            entry = self._loaders[id(loader)] = (record, len(self._loaders))
        return entry

    def _wrap_empty_cache(self) -> None:
        original = torch.cuda.empty_cache
        probe = self

        def empty_cache():
            if not probe._measuring or os.getpid() != probe.pid:
                return original()
            site = user_site()
            started = time.perf_counter()
            try:
                return original()
            finally:
                if site is not None:
                    record = probe._empty_cache.get(site)
                    if record is None:
                        record = probe._empty_cache[site] = SiteRecord("empty_cache", "torch.cuda.empty_cache", *site)
                    record.seen(time.perf_counter() - started)

        torch.cuda.empty_cache = empty_cache
        torch.cuda.memory.empty_cache = empty_cache

    # --- steps -------------------------------------------------------------------------------

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        if os.getpid() != self.pid or self._halted:
            return
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
            if self.result.step_kind == "batch":
                self._restart()  # it looked like evaluation, but it trains: count training steps
        if id(optimizer) == self._primary_optimizer:
            site = user_site()
            if site is not None:
                self._step_sites[site] += 1
            self._boundary("optimizer")

    def _restart(self) -> None:
        self._close_window()
        self.result.steps.clear()
        self.result.steps_seen = 0
        self._step_sites.clear()
        self._empty_cache.clear()
        for record, _ in self._loaders.values():
            record.batches = record.iterators = 0
            record.wait_seconds = record.first_batch_wait_seconds = record.starved_seconds = 0.0

    def _boundary(self, kind: str) -> None:
        now = time.perf_counter()
        self.result.step_kind = kind
        self.result.steps_seen += 1
        seen = self.result.steps_seen
        startup = seen == 1 and not self._first_step_began  # (only measured with --warmup 0)
        if self._measuring and startup:
            self.result.startup_excluded = True
            if self._spy is not None:
                self._spy.discard_step()
            if self._collectives is not None:
                self._collectives.discard_step()
            if self._ddp_syncs is not None:
                self._ddp_syncs.discard_step()
            for record in self._empty_cache.values():
                record.discard()
        elif self._measuring:
            stalled = self._spy.end_step() if self._spy is not None else 0.0
            comm = self._collectives.end_step() if self._collectives is not None else 0.0
            reductions = self._ddp_syncs.end_step() if self._ddp_syncs is not None else 0
            for record in self._empty_cache.values():
                record.commit()
            self.result.steps.append(
                StepRecord(now - self._last_boundary, self._wait, stalled, self._starved, comm, reductions)
            )
        if self._profiler is not None:
            self._profiler.step()
        if self.profile and seen == self.warmup - 1 and self._profiler is None:
            self._start_profiler()
        if seen == self.warmup:
            self._open_window()
        if self._progress_path is not None:
            try:
                with open(self._progress_path, "w", encoding="utf-8") as stream:
                    stream.write(str(seen))
            except OSError:
                self._progress_path = None  # progress is a courtesy, never a failure
        if self._measuring and self._window_done():
            with self._writing:
                self.result.window_complete = True
                self.result.stopped = self.stop
                self._close_window()
                self._write_final()
            if self.stop:
                raise AuditComplete()
        # The next step starts now: what the probe itself did above is not the script's time.
        self._last_boundary, self._wait, self._starved = time.perf_counter(), 0.0, 0.0

    def _window_done(self) -> bool:
        steps = self.result.steps
        if len(steps) < self.window:
            return False
        if len(steps) >= self.longest:
            return True
        return settled(
            [step.seconds for step in steps],
            [step.data_starved_seconds for step in steps],
            self.window,
            self.thresholds,
        )

    # --- the measured window -------------------------------------------------------------------

    def _open_window(self) -> None:
        if self._halted:
            return  # halted inside the step that would have opened it
        if self.profile and self._profiler is None:
            self._start_profiler()
        self._measuring = True
        self.batches.enabled = True
        self._spy = SyncSpy(self.cuda)
        self._spy.install()
        self._collectives = CollectiveSpy()
        self._collectives.install()
        self._ddp_syncs = DdpSyncCounter()
        self._ddp_syncs.install()
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
            self._original_showwarning = warnings.showwarning
            warnings.showwarning = self._on_warning
            warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")

    def _close_window(self) -> None:
        if self._spy is not None:
            self._spy.uninstall()
            self.result.syncs = list(self._spy.sites.values())
            self.result.batch_moves = list(self._spy.batch_moves.values())
            self._spy = None
        if self._collectives is not None:
            self._collectives.uninstall()
            self.result.collectives = list(self._collectives.sites.values())
            self._collectives = None
        if self._ddp_syncs is not None:
            self._ddp_syncs.uninstall()
            self.result.ddp_syncs = list(self._ddp_syncs.sites.values())
            self._ddp_syncs = None
        if self._measuring and self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = cast("_ShowWarning", self._original_showwarning)  # set when the window opened
        self._measuring = False
        self.batches.enabled = False
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):
            return self._original_showwarning(message, category, filename, lineno, file, line)
        if self._spy is not None:
            self._spy.note_sync_warning(user_site())
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
        if os.getpid() != self.pid:
            return
        with self._writing:
            if not self._reported:
                self._close_window()
                self._write_final()

    def halt(self) -> None:
        """loopaudit is stopping the run (--timeout, a signal): end the measurement now, whatever the
        script does next (ignore SIGINT, catch KeyboardInterrupt and evaluate), and write the report.

        Called from loopaudit's thread while the script's main thread runs on, so it only switches off
        what the hooks look at and writes what they recorded; the spy and the profiler stay installed.
        If the script then stops on the SIGINT that follows, `finish` writes the report again: the same
        measurements, and the trace."""
        with self._writing:
            if self._reported:
                return  # the window was complete, or the script ended: its report is written
            self._halted = True
            self._measuring = False
            self.result.halted_at = _main_thread_line(self._main_thread)
            self.batches.enabled = False
            if self._spy is not None:
                self._spy.disable()
            if self._collectives is not None:
                self._collectives.disable()
            self._write()

    def _write_final(self) -> None:
        self._reported = True
        self._write()

    def _write(self) -> None:
        spy = self._spy
        if spy is not None:  # halted inside the window: what the spy has counted so far
            self.result.syncs = list(spy.sites.values())
            self.result.batch_moves = list(spy.batch_moves.values())
        if self._collectives is not None:
            self.result.collectives = list(self._collectives.sites.values())
        if self._ddp_syncs is not None:
            self.result.ddp_syncs = list(self._ddp_syncs.sites.values())
        self.result.loaders = [record for record, _ in sorted(self._loaders.values(), key=lambda entry: entry[1])]
        self.result.empty_cache = list(self._empty_cache.values())
        self.result.batches_seen = self._batches_fetched
        if self._step_sites:
            self.result.step_site = self._step_sites.most_common(1)[0][0]
        self.result.dump(self.report_path)

    @staticmethod
    def stop_workers() -> None:
        """The script was cut off mid-epoch: end its DataLoader workers (and any other child
        processes) now, rather than leave them polling for a parent that is gone."""
        for child in multiprocessing.active_children():
            child.terminate()
        for child in multiprocessing.active_children():
            child.join(timeout=2)


def _main_thread_line(thread: int) -> list | None:
    """The user's line the script's main thread is running (or stuck at) now, as [file, line]."""
    frame = user_frame(sys._current_frames().get(thread))
    return [frame.f_code.co_filename, frame.f_lineno] if frame is not None else None


def _environment_number(name: str) -> int | None:
    """RANK / WORLD_SIZE as torchrun, `accelerate launch` or `loopaudit run --nproc-per-node` set them."""
    value = os.environ.get(name)
    return int(value) if value is not None and value.isdigit() else None


def _batch_ready(iterator) -> bool | None:
    """Whether the iterator's next batch is already loaded, so that `next()` only hands it over:
    False for a single-process iterator (it loads the batch now, on the step's time), None when the
    iterator is of a kind this does not know. A worker-fed iterator's hand-over (unpickling, receiving
    the shared memory from the worker) costs a millisecond or two, however many workers there are;
    only a wait for a batch not yet loaded is one that more workers, or cheaper samples, would cut."""
    if isinstance(iterator, _SingleProcessDataLoaderIter):
        return False
    try:  # torch's multiprocessing iterator, read as torch 1.x to 2.x lays it out
        arrived = iterator._task_info.get(iterator._rcvd_idx)
        if arrived is not None and len(arrived) == 2:  # came early, out of order
            return True
        data = iterator._data_queue
        if isinstance(data, queue.Queue):  # filled by the pin-memory thread
            return not data.empty()
        return bool(data._reader.poll())  # a multiprocessing queue: a batch is waiting in its pipe
    except Exception:
        return None
