"""Running a script under the probe, from the `loopaudit` process.

The script runs in a child process (`python -m loopaudit.profiling.in_script.child`), so that its crash, its
`os._exit`, or a segfault in an extension cannot take the auditor down, and so that this process
never imports torch. The two talk through files in a temporary folder (a JSON configuration in, the
probe's report out) and a control pipe that the child reads.

Stopping it. The child runs in a session of its own, so that loopaudit alone decides when the script
stops: a Ctrl-C in the terminal reaches loopaudit only, and SIGINT, SIGTERM (noted, not raised, while
the script runs) and `--timeout` all stop it the same way (`_stop`):

1. loopaudit asks the probe for its report through the control pipe. A thread of the child's own
   answers, so neither the script's signal handlers nor a main thread stuck in a long call can keep
   the measurements from loopaudit. The measurement ends there: an evaluation that the script runs
   when interrupted is not measured.
2. The script is interrupted as Ctrl-C interrupts `python train.py`, SIGINT to its main process, so
   that its `finally` blocks run and a --profile trace is written; it gets `_GRACE_SECONDS`, which a
   second signal to loopaudit cuts short.
3. Its process group is killed: a script that ignores SIGINT or catches KeyboardInterrupt to go on,
   and its DataLoader workers.

Step 3 ends every run, however the script ended, so that no process of the script outlives loopaudit
(except one that left the group on purpose, a daemon started with `setsid`). If loopaudit itself is
killed, the control pipe closes: the child then removes the temporary folder and kills its own group.

Why not the alternatives: a parent-death signal (`prctl(PR_SET_PDEATHSIG)`) is Linux-only and ends
the child alone, not its workers; a report rewritten at every step would cost each step a JSON dump
and a file written (0.7 ms for 20 steps on this project's 2-CPU machine: more than half of a 1.25 ms
step); a signal to ask for the report could be one the script handles itself (Lightning takes
SIGUSR1 on SLURM).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

from loopaudit.profiling.in_script.report import ProbeReport

# How long the probe gets to write its report when asked: its thread needs only the interpreter's lock.
_REPORT_SECONDS = 5
# How long an interrupted script gets to stop the Python way (its `finally` blocks, the trace) before
# it is killed.
_GRACE_SECONDS = 5
# How long the processes of a killed group get to leave it: SIGKILL takes effect when each is next
# scheduled, not when `killpg` returns.
_GROUP_EXIT_SECONDS = 2
_POLL_SECONDS = 0.05


@dataclass
class RunRequest:
    script: str
    args: list[str] = field(default_factory=list)
    warmup: int = 5
    steps: int = 20
    # The window may go on to this many steps until the data-wait share is decided against every
    # threshold (profiling/in_script/stability.py); None: exactly `steps`.
    longest: int | None = None
    thresholds: tuple[float, ...] = ()
    profile: bool = False
    trace_out: str | None = None
    stop: bool = True
    timeout: float | None = None
    script_output: TextIO | None = None  # where the script's stdout goes; None: this process's
    # told the number of steps seen so far, as they pass (polled several times a second)
    on_progress: Callable[[int], None] | None = None


@dataclass
class RunOutcome:
    report: ProbeReport | None  # None: the child ended before writing one (killed, segfault)
    status: int  # the script's exit status; 0 when loopaudit stopped it after the window
    timed_out: bool = False
    signal: int | None = None  # SIGINT or SIGTERM, when one to loopaudit stopped the run

    @property
    def interrupted(self) -> bool:
        return self.signal is not None


def torch_is_installed() -> bool:
    """Asked without importing torch, which takes seconds."""
    return importlib.util.find_spec("torch") is not None


def run_script(request: RunRequest, while_running: Callable[[], None] | None = None) -> RunOutcome:
    """Run the script to the end of the window (or its own end, a timeout, a signal); `while_running`
    is called once the child has started (the static scan of the script runs then, in parallel).
    Call it from the main thread: it handles SIGINT and SIGTERM while the script runs."""
    timed_out = False
    with _Signals() as signals, tempfile.TemporaryDirectory(prefix="loopaudit-") as work:
        files = _Files(work)
        listening, asking = os.pipe()
        with open(asking, "wb", buffering=0) as control:
            try:
                with open(files.config, "w", encoding="utf-8") as stream:
                    json.dump(
                        {
                            "warmup": request.warmup,
                            "steps": request.steps,
                            "longest": request.longest,
                            "thresholds": list(request.thresholds),
                            "profile": request.profile,
                            "trace_out": request.trace_out,
                            "report": files.report,
                            "stop": request.stop,
                            "started": files.started,
                            "progress": files.progress if request.on_progress else None,
                            "control": listening,
                            "work": work,
                        },
                        stream,
                    )
                command = [
                    sys.executable,
                    "-m",
                    "loopaudit.profiling.in_script.child",
                    files.config,
                    request.script,
                    *request.args,
                ]
                child = subprocess.Popen(
                    command,
                    stdout=request.script_output,
                    pass_fds=(listening,),
                    start_new_session=True,
                )
            finally:
                os.close(listening)  # the child's end: loopaudit keeps only its own
            try:
                if while_running is not None:
                    while_running()
                timed_out = _watch(child, files, request, signals)
                if timed_out or signals.received:
                    _stop(child, files, control, signals)
            finally:
                _end_group(child)  # before the pipe closes, which would tell the child loopaudit is gone
        report = ProbeReport.load(files.report) if os.path.exists(files.report) else None
    status = child.returncode
    if status < 0:  # killed by a signal: report it the way a shell does
        status = 128 - status
    return RunOutcome(report, status, timed_out, signals.received[0] if signals.received else None)


class _Files:
    """The run's temporary folder: what loopaudit and the child hand each other."""

    def __init__(self, folder: str) -> None:
        self.config = os.path.join(folder, "config.json")
        self.report = os.path.join(folder, "report.json")
        self.started = os.path.join(folder, "started")  # the probe is installed; the script starts
        self.progress = os.path.join(folder, "progress")  # the number of steps seen so far


class _Signals:
    """SIGINT and SIGTERM to loopaudit while the script runs, noted rather than raised, so that the
    run stops the script its own way and still reports. One that the shell set to be ignored (a
    background job, `nohup`) stays ignored."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}  # as signal.signal gives

    def __enter__(self) -> _Signals:
        for number in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(number) != signal.SIG_IGN:
                self._previous[number] = signal.signal(number, self._note)
        return self

    def __exit__(self, *exception) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _note(self, number: int, frame) -> None:
        self.received.append(number)


def _watch(child: subprocess.Popen, files: _Files, request: RunRequest, signals: _Signals) -> bool:
    """Until the script ends or loopaudit gets a signal (False), or --timeout passes (True), telling
    `on_progress` of the steps seen as they pass. --timeout counts from the script's start, not from
    the child's: importing torch takes seconds on a busy machine."""
    deadline = None
    told = 0
    while True:
        ended = _has_ended(child)
        if request.on_progress is not None:
            seen = _steps_seen(files.progress)
            if seen > told:  # also once the child has ended: a short run may end between two looks
                told = seen
                request.on_progress(seen)
        if ended or signals.received:
            return False
        if request.timeout is not None:
            if deadline is None and os.path.exists(files.started):
                deadline = time.monotonic() + request.timeout
            if deadline is not None and time.monotonic() >= deadline:
                return True
        time.sleep(_POLL_SECONDS)


def _steps_seen(progress_path: str) -> int:
    try:
        with open(progress_path, encoding="utf-8") as stream:
            return int(stream.read() or 0)
    except (OSError, ValueError):
        return 0


def _stop(child: subprocess.Popen, files: _Files, control, signals: _Signals) -> None:
    """Steps 1 and 2 of stopping the script (the module's docstring); `_end_group` takes step 3."""
    if not os.path.exists(files.started):
        return  # the child is still importing torch: nothing measured, nothing of the script's to let end
    patience = len(signals.received)

    def insisted() -> bool:
        return len(signals.received) > patience

    try:
        control.write(b"r")
    except BrokenPipeError:
        return  # the child has ended meanwhile
    _wait_until(lambda: os.path.exists(files.report) or _has_ended(child) or insisted(), _REPORT_SECONDS)
    if not _has_ended(child):
        os.kill(child.pid, signal.SIGINT)
        _wait_until(lambda: _has_ended(child) or insisted(), _GRACE_SECONDS)


def _end_group(child: subprocess.Popen) -> None:
    """Kill what is left of the script's process group (its workers, the script itself if it runs
    on), reap the script's process, and wait until the rest of the group is gone."""
    # ProcessLookupError: nothing left, the group ended with the script (reaped already where there is no waitid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    _wait_until(lambda: not _group_exists(child.pid), _GROUP_EXIT_SECONDS)


def _has_ended(child: subprocess.Popen) -> bool:
    """Whether the script's process has ended, leaving it to `child.wait()` to reap: until then its
    pid, which is its process group's id, cannot be given to another process, so signalling the
    group cannot hit anyone else's."""
    if not hasattr(os, "waitid"):  # macOS before Python 3.13: reaped at once, the group swept just after
        return child.poll() is not None
    try:
        return os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_until(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
