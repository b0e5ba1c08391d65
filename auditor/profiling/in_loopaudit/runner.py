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
import socket
import subprocess
import sys
import tempfile
import time
import typing
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
        child, control = _start(request, files, request.on_progress is not None, os.environ, request.longest)
        with control:
            try:
                if while_running is not None:
                    while_running()
                timed_out = _watch(child, files, request, signals)
                if timed_out or signals.received:
                    _stop([(child, files, control)], signals)
            finally:
                _end_group(child)  # before the pipe closes, which would tell the child loopaudit is gone
        report = ProbeReport.load(files.report) if os.path.exists(files.report) else None
    return RunOutcome(report, _shell_status(child), timed_out, signals.received[0] if signals.received else None)


def _start(request: RunRequest, files: _Files, progress: bool, environment, longest: int | None):
    """Start the child that runs the script under the probe, in a session of its own; returns it and
    loopaudit's end of its control pipe. `longest`: how far the window may go on (None: exactly the
    steps asked for)."""
    listening, asking = os.pipe()
    control = open(asking, "wb", buffering=0)  # noqa: SIM115 (the caller closes it: its closing tells the child loopaudit is gone)
    try:
        with open(files.config, "w", encoding="utf-8") as stream:
            json.dump(
                {
                    "warmup": request.warmup,
                    "steps": request.steps,
                    "longest": longest,
                    "thresholds": list(request.thresholds),
                    "profile": request.profile,
                    "trace_out": request.trace_out,
                    "report": files.report,
                    "stop": request.stop,
                    "started": files.started,
                    "progress": files.progress if progress else None,
                    "control": listening,
                    "work": files.folder,
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
            env=dict(environment),
        )
    except BaseException:
        control.close()
        raise
    finally:
        os.close(listening)  # the child's end: loopaudit keeps only its own
    return child, control


def _shell_status(child: subprocess.Popen) -> int:
    """The child's exit status, a signal's the way a shell reports it (128 + its number)."""
    status = child.returncode
    return 128 - status if status < 0 else status


class _Files:
    """The run's temporary folder: what loopaudit and the child hand each other."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
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


def _stop(running: list[tuple[subprocess.Popen, _Files, typing.BinaryIO]], signals: _Signals) -> None:
    """Steps 1 and 2 of stopping the script (the module's docstring), for one child or for the ranks
    of a job side by side (their grace periods run together, not one after another); `_end_group`
    takes step 3. A child still importing torch is left to step 3: nothing measured, nothing of the
    script's to let end."""
    patience = len(signals.received)

    def insisted() -> bool:
        return len(signals.received) > patience

    asked = []
    for child, files, control in running:
        if not os.path.exists(files.started):
            continue
        try:
            control.write(b"r")
        except BrokenPipeError:
            continue  # the child has ended meanwhile
        asked.append((child, files))
    _wait_until(lambda: all(os.path.exists(f.report) or _has_ended(c) for c, f in asked) or insisted(), _REPORT_SECONDS)
    for child, _ in asked:
        if not _has_ended(child):
            os.kill(child.pid, signal.SIGINT)
    _wait_until(lambda: all(_has_ended(c) for c, _ in asked) or insisted(), _GRACE_SECONDS)


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


# --- several ranks ------------------------------------------------------------------------------

# Once one rank has ended (its window measured, or failed), how long the others get to end by
# themselves before they are taken to be stuck in a collective that will never complete.
PEER_SECONDS = 15.0


@dataclass
class RankOutcome:
    rank: int
    outcome: RunOutcome
    # Stopped by loopaudit after another rank had ended while this one went on without progress: it
    # was waiting in a collective for a rank that was gone (None: it ended by itself).
    stuck_after: int | None = None
    # When it ended among the ranks that ended by themselves: 0 first (a failure that brought the
    # others down comes first), None when loopaudit stopped it
    ended_order: int | None = None


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What torchrun sets for a single-node job (`torchrun --standalone --nproc-per-node N`), so that
    `init_process_group()` with its default `env://` finds its peers, and scripts that read RANK,
    LOCAL_RANK or WORLD_SIZE see what they would under torchrun."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),  # torchrun's default for several ranks
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(
    request: RunRequest, world_size: int, while_running: Callable[[], None] | None = None
) -> list[RankOutcome]:
    """Run `world_size` copies of the script as the ranks of one job on this machine, each under its
    own probe, in its own session, as `run_script` runs one. loopaudit is the launcher (not torchrun,
    whose workers each take a session of their own, out of reach of one group kill): it sets torchrun's
    environment (rank_environment) and so stops every rank and its workers however the job ends.

    The ranks measure the same steps (a window that does not go on: one rank measuring longer would
    leave the others waiting for it in a collective). Once a rank ends, the others get PEER_SECONDS to
    end too; one still running then, with no step taken meanwhile, is stuck waiting for the rank that
    is gone, and is stopped like a run that timed out."""
    timed_out = False
    stuck: dict[int, int] = {}
    order: list[int] = []  # the ranks in the order they ended by themselves
    with _Signals() as signals, tempfile.TemporaryDirectory(prefix="loopaudit-") as work:
        port = free_port()
        started: list[tuple[subprocess.Popen, _Files, typing.BinaryIO]] = []
        try:
            for rank in range(world_size):
                folder = os.path.join(work, f"rank{rank}")
                os.mkdir(folder)
                files = _Files(folder)
                environment = {**os.environ, **rank_environment(rank, world_size, port)}
                child, control = _start(request, files, True, environment, longest=None)
                started.append((child, files, control))
            if while_running is not None:
                while_running()
            timed_out = _watch_ranks(started, request, signals, stuck, order)
            running = [(c, f, k) for c, f, k in started if not _has_ended(c)]
            if running:
                _stop(running, signals)
        finally:
            for child, _, control in started:
                _end_group(child)
                control.close()
        outcomes = []
        for rank, (child, files, _) in enumerate(started):
            report = ProbeReport.load(files.report) if os.path.exists(files.report) else None
            outcome = RunOutcome(
                report, _shell_status(child), timed_out, signals.received[0] if signals.received else None
            )
            outcomes.append(RankOutcome(rank, outcome, stuck.get(rank), order.index(rank) if rank in order else None))
    return outcomes


def _watch_ranks(started, request: RunRequest, signals: _Signals, stuck: dict[int, int], order: list[int]) -> bool:
    """Until every rank has ended, loopaudit gets a signal (False), --timeout passes (True), or the
    ranks left are stuck after another's end (noted in `stuck`: rank -> the rank that ended first).
    `order` gets the ranks as they end."""
    deadline = None
    told = 0
    first_end: tuple[int, float] | None = None  # (rank, when)
    seen_then: dict[int, int] = {}
    while True:
        ended = [_has_ended(child) for child, _, _ in started]
        order.extend(rank for rank, done in enumerate(ended) if done and rank not in order)
        seen = [_steps_seen(files.progress) for _, files, _ in started]
        if request.on_progress is not None and seen[0] > told:
            told = seen[0]
            request.on_progress(told)
        if all(ended) or signals.received:
            return False
        if first_end is None and any(ended):
            first_end = (order[0], time.monotonic())
            seen_then = dict(enumerate(seen))
        if first_end is not None and time.monotonic() - first_end[1] >= PEER_SECONDS:
            left = [rank for rank, done in enumerate(ended) if not done]
            if all(seen[rank] == seen_then[rank] for rank in left):
                for rank in left:
                    stuck[rank] = first_end[0]
                return False
            first_end = (first_end[0], time.monotonic())  # still taking steps: give them more time
            seen_then = dict(enumerate(seen))
        if request.timeout is not None:
            if deadline is None and all(os.path.exists(files.started) for _, files, _ in started):
                deadline = time.monotonic() + request.timeout
            if deadline is not None and time.monotonic() >= deadline:
                for rank, (child, _, _) in enumerate(started):
                    if not _has_ended(child):
                        stuck.pop(rank, None)
                return True
        time.sleep(_POLL_SECONDS)


def run_launched(
    request: RunRequest, launcher: list[str], while_running: Callable[[], None] | None = None
) -> tuple[list[RankOutcome], int]:
    """Run the script under the user's own launcher (`torchrun --nproc-per-node 2`, `accelerate launch
    --num_processes 2`), which starts each rank as `LAUNCHER -m loopaudit.profiling.in_script.child
    CONFIG SCRIPT ARGS`. Returns each rank's outcome (ranks known by the files they left) and the
    launcher's exit status.

    No pipe passes through a launcher, so each rank leaves its files in one folder: its pid, its report,
    its exit status; loopaudit halts the measurement with a `halt` file there. Stopping: the launcher
    gets SIGTERM (torchrun passes it on to its workers), then every rank's process group is killed by
    the pid it left (torchrun starts each worker in a session of its own, out of the launcher's group)."""
    timed_out = False
    with _Signals() as signals, tempfile.TemporaryDirectory(prefix="loopaudit-") as work:
        config = os.path.join(work, "config.json")
        with open(config, "w", encoding="utf-8") as stream:
            json.dump(
                {
                    "warmup": request.warmup,
                    "steps": request.steps,
                    "longest": None,
                    "thresholds": list(request.thresholds),
                    "profile": False,
                    "trace_out": None,
                    "report": "",
                    "stop": request.stop,
                    "launched": work,
                },
                stream,
            )
        command = [*launcher, "-m", "loopaudit.profiling.in_script.child", config, request.script, *request.args]
        try:
            process = subprocess.Popen(command, stdout=request.script_output, start_new_session=True)
        except OSError as error:
            raise LauncherError(f"cannot start the launcher `{launcher[0]}`: {error.strerror or error}") from None
        try:
            if while_running is not None:
                while_running()
            deadline = None
            while not _has_ended(process) and not signals.received:
                if request.timeout is not None:
                    if deadline is None and _files(work, "started"):
                        deadline = time.monotonic() + request.timeout
                    if deadline is not None and time.monotonic() >= deadline:
                        timed_out = True
                        break
                time.sleep(_POLL_SECONDS)
            if not _has_ended(process):
                with open(os.path.join(work, "halt"), "w", encoding="utf-8"):
                    pass
                started = _files(work, "started")
                _wait_until(
                    lambda: all(os.path.exists(os.path.join(work, f"report.{r}")) for r in started), _REPORT_SECONDS
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
                _wait_until(lambda: _has_ended(process), _GRACE_SECONDS)
        finally:
            for rank in _files(work, "pid"):
                _end_rank_group(os.path.join(work, f"pid.{rank}"))
            _end_group(process)
        outcomes = []
        ended = sorted(_files(work, "status"), key=lambda r: os.path.getmtime(os.path.join(work, f"status.{r}")))
        for rank in sorted(_files(work, "pid")):
            path = os.path.join(work, f"report.{rank}")
            report = ProbeReport.load(path) if os.path.exists(path) else None
            status = _read_number(os.path.join(work, f"status.{rank}"))
            outcome = RunOutcome(
                report,
                status if status is not None else 128 + signal.SIGKILL,
                timed_out,
                signals.received[0] if signals.received else None,
            )
            outcomes.append(RankOutcome(rank, outcome, None, ended.index(rank) if rank in ended else None))
    return outcomes, _shell_status(process)


class LauncherError(Exception):
    """The launcher command could not be started."""


def _files(folder: str, kind: str) -> list[int]:
    """The ranks that left a `kind.RANK` file in the folder."""
    ranks = []
    for name in os.listdir(folder):
        stem, _, rank = name.partition(".")
        if stem == kind and rank.isdigit():
            ranks.append(int(rank))
    return sorted(ranks)


def _read_number(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as stream:
            return int(stream.read().strip())
    except (OSError, ValueError):
        return None


def _end_rank_group(pid_file: str) -> None:
    """Kill the process group a launched rank leads (its DataLoader workers with it): torchrun starts
    each rank as the leader of a session of its own. The group's id cannot go to another process while
    any of its members lives, and it is killed within seconds of the rank's end."""
    pid = _read_number(pid_file)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _wait_until(lambda: not _group_exists(pid), _GROUP_EXIT_SECONDS)
