"""Worker processes that no single file can take down, and that never outlive the scan.

A scan reads code anyone may send. libcst's native parser can overflow its stack (a segmentation
fault, not an exception) or run for minutes on a machine-written expression, and nothing inside the
process can stop native code. So files are analysed in worker processes, one file at a time each:

- a worker that dies (a signal, an abort, the kernel's out-of-memory killer) costs the file it was
  analysing, which is reported as not analysed, and is replaced by a new worker;
- a file gets a budget of CPU time (RLIMIT_CPU, so the kernel stops native code too, and a machine
  busy with other work does not make a file run over it): past it the worker is killed by SIGXCPU
  and the file reported the same way; a wall-clock limit, far above it, covers a worker blocked on I/O;
- a worker dies with the scan: Linux sends it SIGKILL when its parent dies (PR_SET_PDEATHSIG), even
  by SIGKILL, and elsewhere it ends when the pipe from the parent closes;
- a worker writes no core file into the user's folder when it crashes.

Results come back through a pipe from loopaudit's own code in the worker, so unpickling them trusts
nothing from the scanned files.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait

# A file's CPU time before its analysis is stopped. The slowest real files seen (25,000-line test
# modules, a 2,900-deep subscript chain) take under 20 s on a slow 2-CPU machine.
DEFAULT_CPU_SECONDS = 60.0
_WALL_FACTOR = 10  # the wall-clock limit, in CPU budgets: only a worker stuck without CPU reaches it
_PR_SET_PDEATHSIG = 1


class FileFailure(Exception):
    """Why a worker gave no result for a file (its process died, or ran past its budget)."""


class WorkerPool:
    """`jobs` processes running `function` over items, one item per process at a time."""

    def __init__(
        self,
        jobs: int,
        function: Callable,
        initializer: Callable[[], None] | None = None,
        cpu_seconds: float = DEFAULT_CPU_SECONDS,
    ) -> None:
        self.jobs = max(1, jobs)
        self.cpu_seconds = cpu_seconds
        self._function = function
        self._initializer = initializer
        # fork where the platform has it safely: a worker starts in milliseconds with loopaudit
        # already imported (spawn would import it again, a third of a second per worker).
        self._context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
        self._idle: list[_Worker] = []
        self._started: list[_Worker] = []  # every worker, to stop them all however the scan ends

    def run(self, items: Sequence, on_failure: Callable[[object, FileFailure], object]) -> Iterator[tuple[int, object]]:
        """(index, result) for each item as its analysis ends, in that order; an item whose worker
        died or ran out of time gets `on_failure(item, why)` as its result."""
        pending = list(reversed(range(len(items))))  # popped from the end: handed out in the order given
        busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (item index, wall-clock deadline)
        while pending or busy:
            while pending and len(busy) < self.jobs:
                index = pending.pop()
                worker = self._handed((self.cpu_seconds, items[index]))
                busy[worker] = (index, time.monotonic() + self.cpu_seconds * _WALL_FACTOR)
            soonest = min(deadline for _, deadline in busy.values())
            ready = set(
                wait(
                    [w.connection for w in busy] + [w.process.sentinel for w in busy],
                    timeout=max(0.0, soonest - time.monotonic()),
                )
            )
            for worker, (index, deadline) in list(busy.items()):
                if worker.connection in ready or worker.process.sentinel in ready:
                    try:
                        result = worker.connection.recv()
                    except (EOFError, OSError):  # it died before answering
                        worker.stop()
                        result = on_failure(items[index], FileFailure(self._death(worker.process.exitcode)))
                    else:
                        self._idle.append(worker)
                elif time.monotonic() >= deadline:
                    worker.stop()
                    why = f"its analysis was stopped after {self.cpu_seconds * _WALL_FACTOR:.0f} s without an end"
                    result = on_failure(items[index], FileFailure(why))
                else:
                    continue
                del busy[worker]
                yield index, result

    def _handed(self, message) -> _Worker:
        """An idle worker (or a new one) that was sent `message`. An idle worker may have died since
        its last answer (killed from outside): a new one takes its place."""
        while self._idle:
            worker = self._idle.pop()
            try:
                worker.connection.send(message)
                return worker
            except OSError:
                worker.stop()
        worker = self._start()
        worker.connection.send(message)
        return worker

    def _death(self, exitcode: int | None) -> str:
        if exitcode == -signal.SIGXCPU:
            return f"its analysis ran past the budget of {self.cpu_seconds:.0f} s of CPU time"
        if exitcode is not None and exitcode < 0:
            try:
                name = signal.Signals(-exitcode).name
            except ValueError:
                name = f"signal {-exitcode}"
            return f"the process analysing it crashed ({name})"
        return f"the process analysing it ended unexpectedly (exit status {exitcode})"

    def _start(self) -> _Worker:
        mine, theirs = self._context.Pipe()
        process = self._context.Process(
            target=_serve,
            args=(theirs, self._function, self._initializer, os.getpid()),
            daemon=True,
        )
        process.start()
        theirs.close()
        worker = _Worker(process, mine)
        self._started.append(worker)
        return worker

    def close(self) -> None:
        """Stop every worker: an idle one is asked to end, and any still running after a second is
        killed (a scan interrupted mid-file, or a worker past its budget)."""
        for worker in self._idle:
            with contextlib.suppress(OSError):
                worker.connection.send(None)
        for worker in self._started:
            worker.process.join(timeout=1 if worker in self._idle else 0)
            worker.stop()
        self._idle.clear()
        self._started.clear()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Worker:
    def __init__(self, process, connection: Connection) -> None:
        self.process = process
        self.connection = connection

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()


def _serve(connection: Connection, function: Callable, initializer, parent: int) -> None:
    """A worker's life: one (CPU budget, item) at a time, until the parent says stop or is gone."""
    _die_with(parent)
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash writes no core file where the scan runs
    if initializer is not None:
        initializer()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message is None:
            return
        cpu_seconds, item = message
        _limit_cpu(cpu_seconds)
        connection.send(function(item))


def _die_with(parent: int) -> None:
    """Ask Linux to kill this process when its parent dies, however it dies."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)


def _limit_cpu(seconds: float) -> None:
    """From now, `seconds` more of CPU time; the kernel sends SIGXCPU past it (its default action
    ends the process, even inside native code)."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(usage.ru_utime + usage.ru_stime + seconds) + 1
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
