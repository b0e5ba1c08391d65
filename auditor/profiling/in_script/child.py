"""The process the audited script runs in: `python -m loopaudit.profiling.in_script.child CONFIG SCRIPT [ARGS...]`.

It makes the script see what `python SCRIPT ARGS...` would give it (`__name__ == "__main__"`,
`sys.argv`, `sys.path[0]` the script's folder, the same working directory), installs the probe, and
runs it. A crash in the script ends this process, never the auditor, which reads the report file.
A thread listens to loopaudit meanwhile (`_Listener`; runner.py says how a run is stopped).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import sys
import threading
import time
import traceback

# typing.TYPE_CHECKING without importing typing, which this process must not load before the script
# does (the type checker takes any TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from loopaudit.profiling.in_script.probe import Probe

EXIT_SCRIPT_FAILED = 1
EXIT_NO_PROBE = 2
# Under a launcher: where this rank leaves its exit status for loopaudit (the launcher keeps it).
_STATUS_FILE: str | None = None


def main() -> tuple[int, bool]:
    """The exit status for the script, and whether the probe stopped it."""
    config_path, script, *script_args = sys.argv[1:]
    with open(config_path, encoding="utf-8") as stream:
        config = json.load(stream)
    launched = config.pop("launched", None)
    halt = None
    if launched is not None:
        # Under the user's launcher (torchrun, `accelerate launch`): one config for every rank, whose
        # files are named by the rank the launcher gave this process.
        config, halt = _for_this_rank(config, launched)
    listener = _Listener(config.pop("control"), config.pop("work")) if "control" in config else None
    # loopaudit stops the script with SIGINT (runner.py), also when it runs as a background job, whose
    # SIGINT the shell ignores (and this process inherited): in a session of its own, no terminal's
    # Ctrl-C reaches it anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))

    try:
        from loopaudit.profiling.in_script.probe import (  # imports torch: after argv is set, as for the script
            AuditComplete,
            Probe,
        )
    except ImportError as error:
        _report_missing_torch(config["report"], error)
        return EXIT_NO_PROBE, False

    started = config.pop("started", None)
    probe = Probe(**config)
    probe.install()
    if listener is not None:
        listener.probe = probe
    if halt is not None:
        halt.probe = probe
    if started:
        # The script starts now: --timeout counts from here, not from importing torch, and loopaudit
        # may ask the probe for its report.
        with open(started, "w", encoding="utf-8"):
            pass
    try:
        # By its absolute path, as `python SCRIPT` does since Python 3.9: `__file__` and the code's
        # file name are absolute, so the probe's records and the scan name the same file.
        runpy.run_path(os.path.abspath(script), run_name="__main__")
    except AuditComplete:
        return 0, True
    except SystemExit as exit_:
        return _exit_status(exit_.code), False
    except KeyboardInterrupt:
        return 130, False
    except BaseException as error:  # the script's own failure: show it as Python would
        _print_script_traceback(error, script)
        return EXIT_SCRIPT_FAILED, False
    finally:
        probe.finish()
    return 0, False


def _for_this_rank(config: dict, folder: str) -> tuple[dict, _HaltFile]:
    """The rank's own report, progress and start files in `folder`; its pid noted there, so that
    loopaudit can end the rank's process group whatever the launcher does; and a thread that halts the
    measurement when loopaudit leaves a `halt` file there (no pipe passes through a launcher)."""
    global _STATUS_FILE
    rank = os.environ.get("RANK", "0")
    _STATUS_FILE = os.path.join(folder, f"status.{rank}")
    config = dict(config)
    for key in ("report", "progress", "started"):
        config[key] = os.path.join(folder, f"{key}.{rank}")
    with open(os.path.join(folder, f"pid.{rank}"), "w", encoding="utf-8") as stream:
        stream.write(str(os.getpid()))
    return config, _HaltFile(os.path.join(folder, "halt"))


class _HaltFile:
    """Polls for loopaudit's `halt` file and then asks the probe for its report (`Probe.halt`), as
    `_Listener` does for a byte on the pipe."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.probe: Probe | None = None  # set once installed
        threading.Thread(target=self._watch, name="loopaudit-halt", daemon=True).start()

    def _watch(self) -> None:
        while not os.path.exists(self.path):
            time.sleep(0.1)
        if self.probe is not None:
            try:
                self.probe.halt()
            except OSError:
                pass  # no room to write the report: loopaudit says it has none


class _Listener:
    """The child's end of loopaudit's control pipe, read by a thread of its own, so that the script's
    signal handlers and a main thread stuck in a long call make no difference. A byte asks for the
    report now (`Probe.halt`). The pipe closing means loopaudit is gone (killed): nobody is left to
    read the report or remove the temporary folder, so this process removes it and kills its process
    group, the script's workers and itself with it (loopaudit started it as the group's leader)."""

    def __init__(self, control: int, work: str) -> None:
        os.set_inheritable(control, False)  # the script's own subprocesses have no business with it
        self.control, self.work = control, work
        self.probe: Probe | None = None  # set once installed; loopaudit asks for the report only after that
        threading.Thread(target=self._listen, name="loopaudit-control", daemon=True).start()

    def _listen(self) -> None:
        while os.read(self.control, 1):
            if self.probe is not None:
                try:
                    self.probe.halt()
                except OSError:
                    pass  # no room to write the report: loopaudit says it has none, and this thread goes on
        shutil.rmtree(self.work, ignore_errors=True)
        os.killpg(os.getpid(), signal.SIGKILL)


def _report_missing_torch(report_path: str, error: ImportError) -> None:
    from loopaudit.profiling.in_script.report import ProbeReport

    report = ProbeReport(device="", cuda=False, torch_version="", cpu_count=os.cpu_count() or 1, warmup=0, window=0)
    report.error = f"the dynamic mode needs torch, which cannot be imported here ({error})"
    report.dump(report_path)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # `sys.exit("message")`, as the interpreter does
    return 1


def _print_script_traceback(error: BaseException, script: str) -> None:
    """The traceback from the script's first frame on: runpy's and loopaudit's frames are noise."""
    frames = traceback.extract_tb(error.__traceback__)
    script_path = os.path.abspath(script)
    start = next((i for i, frame in enumerate(frames) if os.path.abspath(frame.filename) == script_path), None)
    lines = []
    if start is not None:  # a SyntaxError has no frame in the script: its message says where
        lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames[start:])]
    lines += traceback.format_exception_only(type(error), error)
    sys.stderr.write("".join(lines))
    sys.stderr.flush()


def _note_status(status: int) -> None:
    if _STATUS_FILE is not None:
        try:
            with open(_STATUS_FILE, "w", encoding="utf-8") as stream:
                stream.write(str(status))
        except OSError:
            pass


if __name__ == "__main__":
    status, stopped = main()
    _note_status(status)
    if stopped:
        # The script was cut off mid-loop: its DataLoader workers and other non-daemon threads must
        # not keep the process alive, and its exit handlers expect a finished run.
        from loopaudit.profiling.in_script.probe import Probe

        Probe.stop_workers()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
