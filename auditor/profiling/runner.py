"""Running a script under the probe, from the `loopaudit` process.

The script runs in a child process (`python -m loopaudit.profiling.child`), so that its crash, its
`os._exit`, or a segfault in an extension cannot take the auditor down, and so that this process
never imports torch. The two talk through files: a JSON configuration in, the probe's report out.
Ctrl-C reaches both processes; the child then writes what it measured so far, and so does a child
that runs past `--timeout` (it is interrupted the same way, and killed if it does not stop).
"""

from __future__ import annotations

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
from typing import TextIO

from .report import ProbeReport

# How long a child interrupted by Ctrl-C or --timeout gets to write its report before it is killed.
_GRACE_SECONDS = 20


@dataclass
class RunRequest:
    script: str
    args: list[str] = field(default_factory=list)
    warmup: int = 5
    steps: int = 20
    profile: bool = False
    trace_out: str | None = None
    stop: bool = True
    timeout: float | None = None
    script_output: TextIO | None = None  # where the script's stdout goes; None: this process's
    # told the number of steps seen so far, as they pass (polled a few times a second)
    on_progress: Callable[[int], None] | None = None


@dataclass
class RunOutcome:
    report: ProbeReport | None  # None: the child ended before writing one (killed, segfault)
    status: int  # the script's exit status; 0 when loopaudit stopped it after the window
    timed_out: bool = False
    interrupted: bool = False


def torch_is_installed() -> bool:
    """Asked without importing torch, which takes seconds."""
    return importlib.util.find_spec("torch") is not None


def run_script(request: RunRequest, while_running: Callable[[], None] | None = None) -> RunOutcome:
    """Run the script to the end of the window (or its own end); `while_running` is called once
    the child has started (the static scan of the script runs then, in parallel)."""
    with tempfile.TemporaryDirectory(prefix="loopaudit-") as work:
        report_path = os.path.join(work, "report.json")
        config_path = os.path.join(work, "config.json")
        started_path = os.path.join(work, "started")
        progress_path = os.path.join(work, "progress")
        with open(config_path, "w", encoding="utf-8") as stream:
            json.dump({
                "warmup": request.warmup, "steps": request.steps, "profile": request.profile,
                "trace_out": request.trace_out, "report": report_path, "stop": request.stop,
                "started": started_path, "progress": progress_path if request.on_progress else None,
            }, stream)
        command = [sys.executable, "-m", "loopaudit.profiling.child", config_path, request.script, *request.args]
        child = subprocess.Popen(command, stdout=request.script_output)
        timed_out = interrupted = False
        try:
            if while_running is not None:
                while_running()
            if request.timeout is not None:
                _wait_for_start(child, started_path)
            status = _wait(child, request.timeout, progress_path, request.on_progress)
        except subprocess.TimeoutExpired:
            timed_out = True
            status = _interrupt(child)
        except KeyboardInterrupt:  # the terminal sent SIGINT to the child as well
            interrupted = True
            status = _interrupt(child, already_signalled=True)
        report = ProbeReport.load(report_path) if os.path.exists(report_path) else None
    if status < 0:  # killed by a signal: report it the way a shell does
        status = 128 - status
    return RunOutcome(report, status, timed_out, interrupted)


def _wait(child: subprocess.Popen, timeout: float | None, progress_path: str, on_progress) -> int:
    """child.wait(timeout), telling `on_progress` of the steps seen while it runs."""
    if on_progress is None:
        return child.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    told = 0
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(child.args, timeout)
        try:
            status = child.wait(timeout=0.25 if left is None else min(0.25, left))
        except subprocess.TimeoutExpired:
            status = None
        seen = _steps_seen(progress_path)
        if seen > told:  # also once the child has ended: a short run may end between two looks
            told = seen
            on_progress(seen)
        if status is not None:
            return status


def _steps_seen(progress_path: str) -> int:
    try:
        with open(progress_path, encoding="utf-8") as stream:
            return int(stream.read() or 0)
    except (OSError, ValueError):
        return 0


def _wait_for_start(child: subprocess.Popen, started_path: str) -> None:
    """Until the child has imported torch and starts the script (or ends): --timeout is the script's
    time, and importing torch takes seconds on a busy machine."""
    while not os.path.exists(started_path) and child.poll() is None:
        time.sleep(0.02)


def _interrupt(child: subprocess.Popen, already_signalled: bool = False) -> int:
    if not already_signalled:
        child.send_signal(signal.SIGINT)
    while True:
        try:
            return child.wait(timeout=_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting politely
            child.kill()
