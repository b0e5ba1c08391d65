"""`loopaudit run` stopped from outside (SIGTERM, SIGINT, `--timeout`, loopaudit itself killed), whatever
the script does with its own signals: no process of the script outlives loopaudit, its temporary
folder goes, and what was measured until then is still reported.

The script takes 10 steps and then hangs in its 11th (a stuck file system, a dead peer), so that the
count measured before the stop is known exactly: 10 steps seen, 2 of them warm-up, 8 measured. It
loads its batches in two worker processes, and every process of it writes its pid into `pids/`, so
that the test can look for survivors.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
import weakref
from pathlib import Path

import pytest

from .conftest import as_a_foreground_command, loopaudit_command

pytest.importorskip("torch", reason="`loopaudit run` needs torch (pip install 'loopaudit[profile]')")
pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the test looks for survivors in /proc"),
    pytest.mark.slow,
]

SCRIPT = textwrap.dedent("""\
    import os
    import signal
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Decoded(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            time.sleep(0.002)
            return torch.randn(8), index % 2


    def note_pid(worker_id=None):
        with open(f"pids/{os.getpid()}", "w"):
            pass


    def train():
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(Decoded(), batch_size=4, num_workers=2, worker_init_fn=note_pid)
        for step, (x, y) in enumerate(loader):
            if step == 10:
                time.sleep(3600)  # the 11th step hangs
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            with open("steps.log", "a") as log:
                log.write(f"{step}\\n")


    def evaluate():
        while True:
            time.sleep(0.1)


    if __name__ == "__main__":
        os.makedirs("pids", exist_ok=True)
        note_pid()
        HANDLING
""")
HANDLING = {
    "plain": "train()",
    # pytorch/examples' word_language_model: Ctrl-C ends the training, then the script evaluates.
    "catches-keyboard-interrupt": (
        "try:\n    train()\nexcept KeyboardInterrupt:\n    print('Exiting from training early')\n    evaluate()"
    ),
    "ignores-sigint": "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntrain()",
    # A cluster job's handler that saves a checkpoint on SIGTERM and carries on, deaf to Ctrl-C too.
    "own-sigterm-handler": (
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, lambda number, frame: print('SIGTERM: saving a checkpoint'))\n"
        "train()"
    ),
}
SEEN, MEASURED = 10, 8  # with --warmup 2
# Generous: the 10 steps take well under a second, on a busy machine too; the 11th never ends.
TIMEOUT = "8"


class Run:
    """`loopaudit run` on the script, its temporary folders under tmp_path/tmp: in the background, its
    output in files (`start`), or in a terminal of its own (`start_in_a_terminal`)."""

    def __init__(self, folder: Path, handling: str) -> None:
        self.folder = folder
        # Short, whatever the test's folder is called: torch's DataLoader workers share tensors through
        # a unix socket in TMPDIR, and a socket's path may not exceed 107 bytes (pytest's folders under
        # xdist, `/tmp/pytest-of-root/pytest-123/popen-gw1/test_a_signal_to_loopaudit_sto0/tmp/...`, do).
        self.temp = Path(tempfile.mkdtemp(prefix="la-"))
        weakref.finalize(self, shutil.rmtree, self.temp, True)
        (folder / "train.py").write_text(
            SCRIPT.replace("HANDLING", textwrap.indent(HANDLING[handling], "    ").lstrip())
        )
        self.environment = {**os.environ, "TMPDIR": str(self.temp)}
        self.process: subprocess.Popen | None = None
        self.processes: dict[int, int] = {}  # the script's processes: pid -> start time

    def start(self, *options: str) -> Run:
        with open(self.folder / "out", "wb") as out, open(self.folder / "err", "wb") as err:
            self.process = subprocess.Popen(
                self.command("--output-format", "json", *options),
                cwd=self.folder,
                stdout=out,
                stderr=err,
                env=self.environment,
                preexec_fn=as_a_foreground_command,
            )
        return self

    def start_in_a_terminal(self) -> tuple[int, int]:
        """loopaudit's pid, and the terminal's end to type into and read from."""
        command = self.command("--no-color")
        pid, terminal = pty.fork()
        if pid == 0:  # the new process, leading a session whose controlling terminal is the pty
            try:
                as_a_foreground_command()
                os.chdir(self.folder)
                os.execve(command[0], command, self.environment)
            finally:
                os._exit(127)
        return pid, terminal

    def command(self, *options: str) -> list[str]:
        return [*loopaudit_command(), "run", "train.py", "--warmup", "2", "--steps", "1000", *options]

    def wait_for_the_hang(self) -> None:
        """Until the script has taken its 10 steps (and started its workers), noting its processes."""
        log = self.folder / "steps.log"
        deadline = time.monotonic() + 120
        while not (log.exists() and len(log.read_text().splitlines()) >= SEEN):
            assert self.process is None or self.process.poll() is None, self.err()
            assert time.monotonic() < deadline, "the script did not take its 10 steps in 2 minutes"
            time.sleep(0.05)
        self.processes = {int(path.name): start_time(int(path.name)) for path in (self.folder / "pids").iterdir()}
        assert len(self.processes) == 3 and None not in self.processes.values()  # the script and its 2 workers

    def finish(self) -> tuple[int, dict | None]:
        status = self.process.wait(timeout=120)
        out = (self.folder / "out").read_text()
        return status, (json.loads(out) if out.strip() else None)

    def err(self) -> str:
        return (self.folder / "err").read_text()

    def survivors(self) -> list[int]:
        return [pid for pid, started in self.processes.items() if start_time(pid) == started]

    def temporary_folders(self) -> list[str]:
        return sorted(path.name for path in self.temp.glob("loopaudit-*"))


def start_time(pid: int) -> int | None:
    """When the process began (clock ticks since boot), or None once it has ended: a zombie has ended
    too, and a pid that names another process by now has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state, *fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return None if state == "Z" else int(fields[18])


@pytest.mark.parametrize(
    ("stop", "status"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_to_loopaudit_stops_the_script_and_its_workers_and_reports(tmp_path, stop, status):
    run = Run(tmp_path, "plain").start("--profile")
    run.wait_for_the_hang()
    run.process.send_signal(stop)  # to loopaudit alone, as `kill` or a job scheduler sends it
    returncode, document = run.finish()
    assert returncode == status, run.err()
    assert document["interrupted_by"] == stop.name and document["steps_measured"] == MEASURED
    # The script stopped on the SIGINT loopaudit gave it, in time to write the measured steps' trace.
    assert document["trace"] == str(tmp_path / "train.pt.trace.json") and Path(document["trace"]).is_file()
    assert run.survivors() == [] and run.temporary_folders() == []


def test_sigterm_to_loopaudit_ends_a_script_with_handlers_of_its_own(tmp_path):
    run = Run(tmp_path, "own-sigterm-handler").start()
    run.wait_for_the_hang()
    run.process.send_signal(signal.SIGTERM)
    returncode, document = run.finish()
    assert returncode == 143, run.err()
    assert document["steps_measured"] == MEASURED
    assert run.survivors() == [] and run.temporary_folders() == []


@pytest.mark.parametrize("handling", ["catches-keyboard-interrupt", "ignores-sigint"])
def test_timeout_reports_what_was_measured_whatever_the_script_does_with_sigint(tmp_path, handling):
    run = Run(tmp_path, handling).start("--timeout", TIMEOUT)
    run.wait_for_the_hang()
    returncode, document = run.finish()
    assert returncode in (0, 1), run.err()  # by the findings: not the 137 of a killed script, not 2
    assert document["timed_out"] and document["steps_measured"] == MEASURED
    assert "interrupted at --timeout" in run.err()
    assert run.survivors() == [] and run.temporary_folders() == []


def test_if_loopaudit_is_killed_the_script_and_its_temporary_folder_go_too(tmp_path):
    run = Run(tmp_path, "plain").start()
    run.wait_for_the_hang()
    run.process.kill()  # SIGKILL: loopaudit cannot clean up after itself
    run.process.wait(timeout=60)
    deadline = time.monotonic() + 60
    while (run.survivors() or run.temporary_folders()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.survivors() == [] and run.temporary_folders() == []


def test_ctrl_c_in_a_terminal_reaches_loopaudit_alone_which_stops_the_script(tmp_path):
    """The terminal sends Ctrl-C to its foreground process group, loopaudit's; the script, in a session
    of its own, hears of it from loopaudit."""
    run = Run(tmp_path, "plain")
    pid, terminal = run.start_in_a_terminal()
    run.wait_for_the_hang()
    os.write(terminal, b"\x03")
    shown, closed = b"", False
    deadline = time.monotonic() + 120
    while not closed and select.select([terminal], [], [], max(0.0, deadline - time.monotonic()))[0]:
        try:
            shown += os.read(terminal, 65536)
        except OSError:  # EIO: every process that had the terminal open has ended
            closed = True
    os.close(terminal)
    if not closed:
        os.kill(pid, signal.SIGKILL)  # still running after 2 minutes: end it, and fail below
    _, status = os.waitpid(pid, 0)
    text = shown.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 130, text
    assert (
        f"{MEASURED} optimizer steps measured" in text and "Interrupted: what was measured until then is below." in text
    )
    assert run.survivors() == [] and run.temporary_folders() == []
